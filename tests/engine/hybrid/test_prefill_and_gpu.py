"""(d) The chunked prefill (64-token WY blocks) agrees with the step form and with transformers, across
chunk boundaries; the plain loop and the batched plain loop run a hybrid target on CUDA and emit the CPU's
tokens (marker gpu)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.generate import Engine


@pytest.mark.parametrize("name", ["qwen3_5_text", "qwen3_next"])
def test_chunked_prefill_equals_step_form_and_transformers(hybrid_worlds, name):
    w = hybrid_worlds(name)
    t = w.target
    seq = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    out, states = {}, {}
    for form in ("chunked", "step"):
        t.prefill_form = form
        try:
            cache = t.new_cache(200)
            with torch.inference_mode():
                out[form], _ = t(torch.tensor(seq), torch.arange(150), cache, 0)
            states[form] = [cache.states[i].S.clone() for i in cache.gdn_layers]
        finally:
            t.prefill_form = "chunked"
    ref = w.oracle_logits(seq)
    d_forms = float((out["chunked"] - out["step"]).abs().max())
    d_ref = float((out["chunked"] - ref).abs().max())
    print(f"{name}: chunked vs step max |dlogit| {d_forms:.1e}, vs transformers {d_ref:.1e}")
    assert d_forms < 1e-4 and d_ref < 1e-4
    assert torch.equal(out["chunked"].argmax(-1), out["step"].argmax(-1))
    for a, b in zip(states["chunked"], states["step"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_plain_loop_runs_hybrid_on_cuda(hybrid_worlds):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from ddtree_bench.engine.loading import load_drafter, load_target

    w = hybrid_worlds("qwen3_5_text")
    t = load_target(w.dirs.target, "float32", "cuda")
    d = load_drafter(w.dirs.draft, t.cfg, "float32", "cuda")
    prompt = list(range(5, 25))
    for method in ("ar", "dflash", "ddtree"):
        cpu = Engine(w.target, w.drafter).generate(prompt, method, budget=16, max_new_tokens=32).output_ids
        gpu = Engine(t, d).generate(prompt, method, budget=16, max_new_tokens=32).output_ids
        assert gpu == cpu, method
        from ddtree_bench.engine.batch import BatchLoop, BatchRequest

        eng = Engine(t, d)
        batched = BatchLoop(t, eng.proposer, method, 16, max_batch=2).run([BatchRequest(prompt, 32), BatchRequest(prompt[:7], 32)])
        assert batched[0].output_ids == cpu, f"batched {method} on CUDA"
