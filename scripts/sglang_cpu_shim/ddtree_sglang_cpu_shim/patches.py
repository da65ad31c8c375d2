"""The import-time patches of the CPU shim, one small function each, and the module each one waits for.

Each is what an out-of-tree CPU platform (or a one-line upstream fix) would supply; none touches DFlash's
drafting, verification, acceptance or cache commit. Facts behind each: docs/sglang-cpu.md of ddtree-bench.
A patch receives the module object right after SGLang's own code in it ran.
"""

from __future__ import annotations


def p1_cpu_platform_declares_dflash(speculative_hook) -> None:
    """Replaces the platform answers `arg_groups/speculative_hook.py::_handle_dflash` and
    `_resolve_dflash_draft_attention_backend` read. In-tree, `_handle_dflash` accepts DFLASH only on
    CUDA/NPU/XPU ("DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'"); an
    out-of-tree platform answers through `supports_speculative_algorithm` & co. This module's view of
    `current_platform` becomes the CPU platform declaring DFLASH with the `torch_native` draft backend;
    every other attribute is the real CpuSRTPlatform's, and no other module sees the change."""
    real = speculative_hook.current_platform

    class CpuPlatformWithDflash:
        def __getattr__(self, name):
            return getattr(real, name)

        def is_out_of_tree(self) -> bool:
            return True

        def supports_speculative_algorithm(self, algorithm: str) -> bool:
            return algorithm == "DFLASH"

        def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
            return algorithm == "DFLASH" and backend == "torch_native"

        def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
            return "torch_native"

    speculative_hook.current_platform = CpuPlatformWithDflash()


def p2_torch_native_draft_backend_choice(choices) -> None:
    """Adds `torch_native` to `arg_groups/choices.py::DRAFT_ATTENTION_BACKEND_CHOICES` through SGLang's own
    extension hook (`add_draft_attention_backend_choices`). Without it
    `speculative/draft_worker_common.py` replaces the draft worker's backend by flashinfer (CUDA only)."""
    if "torch_native" not in choices.DRAFT_ATTENTION_BACKEND_CHOICES:
        choices.add_draft_attention_backend_choices(["torch_native"])


def p3_record_stream_noop_on_cpu(dflash_worker_v2) -> None:
    """`speculative/dflash_worker_v2.py` calls `batch.seq_lens.record_stream(torch.get_device_module(device)
    .current_stream())` unguarded; on CPU that stream is a `torch.cpu.Stream`, not a `torch.Stream`, and torch
    raises "unknown parameter type". Recording a stream on a CPU tensor means nothing (no caching allocator
    to inform), so `Tensor.record_stream` becomes a no-op for CPU tensors (SGLang's uno worker guards the
    same call with `if t.is_cuda`). CUDA tensors keep torch's own method."""
    import torch

    original = torch.Tensor.record_stream
    if getattr(original, "_ddtree_bench_cpu_noop", False):
        return

    def record_stream(self, stream):
        if self.device.type == "cpu":
            return None
        return original(self, stream)

    record_stream._ddtree_bench_cpu_noop = True
    torch.Tensor.record_stream = record_stream


def p5_torch_native_target_verify(torch_native_backend) -> None:
    """`layers/attention/torch_native_backend.py::TorchNativeAttnBackend.forward_extend` has no TARGET_VERIFY
    branch: a verify batch (the target checking a draft block, and DFlash's draft forward, which SGLang also
    runs in TARGET_VERIFY mode) carries `seq_lens` = the committed prefix and no `extend_prefix_lens`, so it
    fails. Such a batch is what an extend of N = tokens / batch size tokens over a prefix of `seq_lens` is:
    present it that way for the call (prefix lens = seq_lens, extend lens = N, seq_lens + N) and restore
    the batch after. Causality stays SGLang's: causal for the target's layers, non-causal for the draft's
    ENCODER_ONLY layers."""
    import torch

    cls = torch_native_backend.TorchNativeAttnBackend
    original = cls.forward_extend

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        fb = forward_batch
        if fb.extend_prefix_lens is not None or not fb.forward_mode.is_target_verify():
            return original(self, q, k, v, layer, fb, save_kv_cache)
        prefix = fb.seq_lens
        n = q.shape[0] // prefix.shape[0]
        saved = (fb.seq_lens, fb.extend_prefix_lens, fb.extend_seq_lens)
        try:
            fb.extend_prefix_lens = prefix
            fb.extend_seq_lens = torch.full_like(prefix, n)
            fb.seq_lens = prefix + n
            return original(self, q, k, v, layer, fb, save_kv_cache)
        finally:
            fb.seq_lens, fb.extend_prefix_lens, fb.extend_seq_lens = saved

    cls.forward_extend = forward_extend


def p6_input_embeds_in_model_dtype(model_runner) -> None:
    """SGLang bug, not CPU-specific: `model_executor/model_runner.py::ModelRunner._extend_forward_kwargs` sends
    `forward_batch.input_embeds.bfloat16()`; DFlash passes its draft block's embeddings that way, so a drafter
    in any dtype but bf16 crashes ("expected m1 and m2 to have the same dtype, BFloat16 != float"). The
    upstream fix is `.to(self.dtype)`; here the kwargs are rebuilt from the batch in the runner's dtype
    (identical for bf16 models)."""
    cls = model_runner.ModelRunner
    original = cls._extend_forward_kwargs

    def _extend_forward_kwargs(self, forward_batch, pp_proxy_tensors):
        kwargs = original(self, forward_batch, pp_proxy_tensors)
        if forward_batch.input_embeds is not None and forward_batch.replace_embeds is None:
            kwargs["input_embeds"] = forward_batch.input_embeds.to(self.dtype)
        return kwargs

    cls._extend_forward_kwargs = _extend_forward_kwargs


# (module, patch) in no particular order; P4 (plain-torch CPU ops) is the stand-in sgl_kernel package.
PATCHES = [
    ("sglang.srt.arg_groups.speculative_hook", p1_cpu_platform_declares_dflash),
    ("sglang.srt.arg_groups.choices", p2_torch_native_draft_backend_choice),
    ("sglang.srt.speculative.dflash_worker_v2", p3_record_stream_noop_on_cpu),
    ("sglang.srt.layers.attention.torch_native_backend", p5_torch_native_target_verify),
    ("sglang.srt.model_executor.model_runner", p6_input_embeds_in_model_dtype),
]
