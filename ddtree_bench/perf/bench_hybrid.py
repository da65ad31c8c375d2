"""`bench-engine --shape qwen3.6-27b`: the hybrid target's verify cost and per-node state memory, next to a
dense shape of similar size (qwen3-32b), one after the other on one device.

For each verify size n (1 + budget tree nodes; the trees are best-first trees of random draft logits, so
they branch and reach depth <= 15), after a prefix of `prefix_len` tokens:
  * verify_ms      - median wall time of one target verify forward (CUDA synchronised) of the hybrid
                     shape with the exact per-node GDN states (one batched step per depth), under the
                     full-state commit ("full") and the replay commit ("replay": only two depth levels
                     of states alive); and of the dense shape (plain ancestor-masked attention);
  * peak_extra_mib - on CUDA, the peak memory the verify allocated above what was allocated before it.
State memory per node (engine/hybrid/replay.py `node_memory`, formulas there) and the largest budget whose
per-node state fits next to the weights: budget_max = floor((device memory - weights - KV of the context
- a 10% workspace margin) / bytes per node) at batch 1. Random bf16 weights; acceptance is not measured.
Knows the engine's modules; prints a table and returns a JSON-able dict.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from ddtree_bench.engine.config import parse_target_config
from ddtree_bench.engine.hybrid.config import parse_hybrid_config
from ddtree_bench.engine.hybrid.model import HybridTarget
from ddtree_bench.engine.hybrid.replay import node_memory
from ddtree_bench.engine.loading import resolve_device, torch_dtype
from ddtree_bench.engine.model import Target
from ddtree_bench.engine.tree import build_tree_fast, compile_tree, verify_mask
from ddtree_bench.perf.shapes import HYBRID_SHAPES, SHAPES, _fill

WORKSPACE_MARGIN = 0.10
MIB = 1 << 20


def _make(module_cls, cfg, dev, dt, seed: int):
    with torch.device("meta"):
        m = module_cls(cfg)
    m = m.to(dt)
    from ddtree_bench.engine.layers import rope_inv_freq

    m.rotary.inv_freq = rope_inv_freq(cfg.rope, getattr(cfg, "rotary_dim", cfg.head_dim))
    m = m.to_empty(device=dev)
    _fill(m, torch.Generator(device=dev).manual_seed(seed))
    if cfg.tie_word_embeddings:
        m.lm_head.weight = m.model.embed_tokens.weight
    return m.eval()


def _weights_bytes(m) -> int:
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in m.parameters()}.values())


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def _time_verify(target, sizes: list[int], prefix_len: int, reps: int, dev, logit_scale: float = 3.0) -> dict[int, dict]:
    """Per verify size n: median verify ms (and CUDA peak extra MiB) after a prefix of prefix_len tokens."""
    V = target.cfg.vocab_size
    cap = prefix_len + max(sizes) + 1
    cache = target.new_cache(cap)
    g = torch.Generator(device="cpu").manual_seed(0)
    prefix = torch.randint(V, (prefix_len,), generator=g).to(dev)
    target(prefix, torch.arange(prefix_len, device=dev), cache, 0, last_logits_only=True)
    out = {}
    for n in sizes:
        logits = (torch.randn(15, V, generator=g) * logit_scale).to(dev)
        tree = build_tree_fast(logits, n - 1) if n > 1 else build_tree_fast(logits, 0)
        vids, vpos, anc = compile_tree(tree, 1, prefix_len)
        mask = verify_mask(anc, prefix_len)
        times = []
        if hasattr(cache, "pending"):   # the previous size's parked tree states would count in the base
            cache.pending = {}
        base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        for r in range(reps + 1):
            _sync(dev)
            t0 = time.perf_counter()
            target(vids, vpos, cache, prefix_len, mask=mask)
            _sync(dev)
            if r:   # the first is a warmup
                times.append((time.perf_counter() - t0) * 1e3)
        peak = (torch.cuda.max_memory_allocated(dev) - base) / MIB if dev.type == "cuda" else None
        out[n] = {"verify_ms": statistics.median(times), "peak_extra_mib": peak, "depth": int(tree.depths.max()) if n > 1 else 0}
    return out


def bench_hybrid(shape: str | dict = "qwen3.6-27b", dense: str | dict | None = None, device: str = "cuda", dtype: str = "bfloat16",
                 sizes=(1, 16, 32, 64, 128, 256), prefix_len: int = 1024, reps: int = 5, context_tokens: int = 8192,
                 device_memory_gib: float | None = None, say: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    dev, dt = resolve_device(device), torch_dtype(dtype)
    spec = HYBRID_SHAPES[shape] if isinstance(shape, str) else shape
    hcfg = parse_hybrid_config(spec["target"], "shape")
    sizes = sorted(set(int(s) for s in sizes))
    mem = node_memory(len(hcfg.gdn_layers), hcfg.linear_num_value_heads, hcfg.linear_key_head_dim, hcfg.linear_value_head_dim,
                      hcfg.conv_dim, torch.finfo(getattr(torch, hcfg.ssm_dtype)).bits // 8, torch.finfo(dt).bits // 8)
    result: dict[str, Any] = {"kind": "bench-hybrid", "version": 1, "shape": shape if isinstance(shape, str) else "custom",
                              "device": str(dev), "dtype": dtype, "prefix_len": prefix_len, "reps": reps,
                              "node_memory": {"full_state_mib": mem.full_state_bytes / MIB, "replay_mib": mem.replay_bytes / MIB}}
    say(f"building the hybrid shape ({hcfg.num_hidden_layers} layers, {len(hcfg.gdn_layers)} GDN) on {dev}")
    target = _make(HybridTarget, hcfg, dev, dt, 0)
    w_bytes = _weights_bytes(target)
    kv_per_token = len(hcfg.attention_layers) * 2 * hcfg.num_key_value_heads * hcfg.head_dim * torch.finfo(dt).bits // 8
    rows = {}
    for mode in ("full", "replay"):
        target.commit_mode = mode
        say(f"hybrid verify, {mode} commit: sizes {sizes}")
        rows[mode] = _time_verify(target, sizes, prefix_len, reps, dev)
    del target
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        total = torch.cuda.mem_get_info(dev)[1]
    else:
        total = None
    if device_memory_gib is not None:
        total = int(device_memory_gib * (1 << 30))
    free = None if total is None else total * (1 - WORKSPACE_MARGIN) - w_bytes - kv_per_token * context_tokens
    result["hybrid"] = {"weights_gib": w_bytes / (1 << 30), "verify": rows,
                        "device_memory_gib": None if total is None else total / (1 << 30),
                        "context_tokens": context_tokens, "kv_gib_at_context": kv_per_token * context_tokens / (1 << 30),
                        "budget_max_full_state": None if free is None else max(0, int(free // mem.full_state_bytes) - 1),
                        "budget_max_replay": None if free is None else max(0, int(free // mem.replay_bytes) - 1)}
    dense = dense if dense is not None else spec.get("dense_twin")
    if dense is not None:
        tcfg = parse_target_config(SHAPES[dense] if isinstance(dense, str) else dense, "shape")
        say(f"building the dense shape ({tcfg.num_hidden_layers} layers, hidden {tcfg.hidden_size})")
        dt_target = _make(Target, tcfg, dev, dt, 1)
        result["dense"] = {"shape": dense if isinstance(dense, str) else "custom", "weights_gib": _weights_bytes(dt_target) / (1 << 30),
                           "verify": _time_verify(dt_target, sizes, prefix_len, reps, dev)}
        del dt_target
    return result


def render_hybrid(res: dict[str, Any]) -> str:
    nm = res["node_memory"]
    h = res["hybrid"]
    lines = [f"hybrid shape {res['shape']} on {res['device']} ({res['dtype']}), prefix {res['prefix_len']}, median of {res['reps']}",
             f"state memory per tree node: full-state {nm['full_state_mib']:.1f} MiB, replay {nm['replay_mib']:.2f} MiB",
             f"{'n':>5} {'depth':>5} {'hybrid full ms':>14} {'hybrid replay ms':>16} {'full peak MiB':>13} {'replay peak MiB':>15}"
             + (f" {res['dense']['shape'] + ' ms':>14}" if "dense" in res else "")]
    for n, full in h["verify"]["full"].items():
        rep = h["verify"]["replay"][n]
        fmt = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
        line = f"{n:>5} {full['depth']:>5} {full['verify_ms']:>14.2f} {rep['verify_ms']:>16.2f} {fmt(full['peak_extra_mib']):>13} {fmt(rep['peak_extra_mib']):>15}"
        if "dense" in res:
            line += f" {res['dense']['verify'][n]['verify_ms']:>14.2f}"
        lines.append(line)
    if h["budget_max_full_state"] is not None:
        lines.append(f"weights {h['weights_gib']:.1f} GiB, KV at {h['context_tokens']} tokens {h['kv_gib_at_context']:.2f} GiB, device "
                     f"{h['device_memory_gib']:.0f} GiB: largest budget at batch 1 - full-state commit {h['budget_max_full_state']}, "
                     f"replay commit {h['budget_max_replay']}")
    return "\n".join(lines)
