"""Does fla (flash-linear-attention, Triton) beat transformers' pure-torch Gated DeltaNet on the H200 at
the toy hybrid's training and decoding shapes? Prints agreement and times; every part is optional.
Run with fla NOT importable when transformers' qwen3_5 module loads (so its torch fallback is chosen),
then fla's directory is put on sys.path."""
import sys, time, traceback
import torch
import transformers.models.qwen3_5.modeling_qwen3_5 as q
import inspect
torch_chunk = inspect.unwrap(q.torch_chunk_gated_delta_rule)
torch_rec = inspect.unwrap(q.torch_recurrent_gated_delta_rule)
sys.path.insert(0, sys.argv[1])
dev = "cuda"

def bench(fn, n=10):
    fn(); torch.cuda.synchronize()
    t = time.time()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.time() - t) / n * 1e3

def inputs(B, T, Hk=4, Hv=8, d=32, grad=False):
    g = torch.Generator(device=dev).manual_seed(0)
    mk = lambda *s: torch.randn(*s, device=dev, generator=g)
    qq, kk = mk(B, T, Hk, d).bfloat16(), mk(B, T, Hk, d).bfloat16()
    vv = mk(B, T, Hv, d).bfloat16()
    gg = -torch.nn.functional.softplus(mk(B, T, Hv)).float()
    bb = torch.sigmoid(mk(B, T, Hv)).bfloat16()
    ts = [qq, kk, vv, gg, bb]
    if grad:
        ts = [t.requires_grad_() for t in ts]
    return ts

print("torch", torch.__version__, "gpu", torch.cuda.get_device_name())
B, T = 64, 1024
for name, fn in (("torch", torch_chunk),):
    a = inputs(B, T, grad=True)
    def fb():
        o, _ = fn(*a, use_qk_l2norm_in_kernel=True)
        o.float().sum().backward()
    print(f"{name} chunk fwd+bwd B={B} T={T}: {bench(fb, 5):.2f} ms")
try:
    t0 = time.time()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    print(f"fla imported in {time.time() - t0:.1f}s")
    a = inputs(2, 256)
    ref, _ = torch_chunk(*a, use_qk_l2norm_in_kernel=True)
    t0 = time.time()
    got, _ = chunk_gated_delta_rule(*a, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    print(f"fla chunk first call (compile) {time.time() - t0:.1f}s; max |fla - torch| = {(got.float() - ref.float()).abs().max().item():.4f}")
    a = inputs(B, T, grad=True)
    def fb():
        o, _ = chunk_gated_delta_rule(*a, use_qk_l2norm_in_kernel=True)
        o.float().sum().backward()
    t0 = time.time(); fb(); torch.cuda.synchronize()
    print(f"fla chunk fwd+bwd first call {time.time() - t0:.1f}s")
    print(f"fla chunk fwd+bwd B={B} T={T}: {bench(fb, 5):.2f} ms")
    Bd = 1024
    a = inputs(Bd, 1)
    S = torch.zeros(Bd, 8, 32, 32, device=dev)
    print(f"torch recurrent step B={Bd}: {bench(lambda: torch_rec(*a, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True), 20):.3f} ms")
    t0 = time.time()
    fused_recurrent_gated_delta_rule(*a, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True); torch.cuda.synchronize()
    print(f"fla recurrent first call {time.time() - t0:.1f}s")
    print(f"fla recurrent step B={Bd}: {bench(lambda: fused_recurrent_gated_delta_rule(*a, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True), 20):.3f} ms")
except Exception:
    traceback.print_exc()
