"""Plain-torch versions of the compiled CPU `sgl_kernel` ops that SGLang 0.5.23's DFlash path calls on a CPU
(the shim's patch P4): the three a DFlash server's log shows called (request-to-token pool, extend cache
locations, and the all-layer KV row copy MHATokenToKVPool runs once at start-up).

PyPI has no CPU build of sgl-kernel. Each function below has the signature of the CPU op SGLang calls
(see the call site named in its docstring) and the semantics of the Triton kernel of the same name that
SGLang runs on CUDA (`sglang/kernels/ops/...`). They move indices and KV rows only: nothing here drafts,
verifies or accepts. Slow and obvious on purpose: batch sizes on a CPU are small.
"""

from __future__ import annotations

import ctypes

import torch


def _out_offsets(start: torch.Tensor, end: torch.Tensor) -> list[int]:
    """Exclusive prefix sums of (end - start): where request i's slice starts in a packed output."""
    lens = (end.long() - start.long()).tolist()
    out, acc = [], 0
    for n in lens:
        out.append(acc)
        acc += n
    return out


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """`mem_cache/allocation.py::assign_req_to_token_pool_func` (Triton `assign_req_to_token_pool`):
    req_to_token[req_pool_indices[i], start[i]:end[i]] = the i-th packed slice of out_cache_loc."""
    offs = _out_offsets(start_offset, end_offset)
    for i, (row, s, e) in enumerate(zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist())):
        req_to_token[row, s:e] = out_cache_loc[offs[i]:offs[i] + (e - s)].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """`kernels/ops/speculative/cache_locs.py::assign_extend_cache_locs_func` and `fill_front_out_cache_loc_func`
    (Triton `assign_extend_cache_locs`): the i-th packed slice of out_cache_loc = req_to_token[req_pool_indices[i],
    start[i]:end[i]] (the inverse direction of `assign_req_to_token_pool_cpu`)."""
    offs = _out_offsets(start_offset, end_offset)
    for i, (row, s, e) in enumerate(zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist())):
        out_cache_loc[offs[i]:offs[i] + (e - s)] = req_to_token[row, s:e].to(out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """`kernels/ops/kvcache/cache_move.py::copy_all_layer_kv_cache_func` (Triton `copy_all_layer_kv_cache_tiled`):
    for every KV buffer b (its base address data_ptrs[b], its row width strides[b] bytes), row tgt_loc[j] =
    row src_loc[j]. Rows are read first and written after, so overlapping moves behave like a gather.
    (MHATokenToKVPool calls it once at start-up to warm the kernel: row 0 onto itself.)"""
    tgt, src = tgt_loc.reshape(-1).tolist(), src_loc.reshape(-1).tolist()
    for base, width in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + s * width, width) for s in src]
        for t, row in zip(tgt, rows):
            ctypes.memmove(base + t * width, row, width)


def _announced(fn):
    """fn, printing `ddtree-bench-shim: called sgl_kernel.NAME` on stderr the first time it runs (evidence in the
    server log of which stand-in ops a run reached)."""
    import functools
    import sys

    seen = []

    @functools.wraps(fn)
    def op(*args, **kwargs):
        if not seen:
            seen.append(True)
            print(f"ddtree-bench-shim: called sgl_kernel.{fn.__name__}", file=sys.stderr, flush=True)
        return fn(*args, **kwargs)

    return op


IMPLEMENTED = {f.__name__: _announced(f) for f in (assign_req_to_token_pool_cpu, assign_extend_cache_locs_cpu,
                                                   copy_all_layer_kv_cache_cpu)}
