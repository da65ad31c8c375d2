"""The live-slot attention over C slots (the batched loop's verify and draft, kernels/attention.py) at fixed split-KV
range counts, against the count `n_split` picks: does a batch of C slots want more ranges than `n_split(C * Hkv)` gives?

`n_split` counts programs over C * Hkv (KV head, slot) pairs, so a second slot halves each pair's ranges, and a
range is 1/count of the live prefix (the kernel splits the live length, rounded up to 64-slot blocks). At batch 1 of
a DFlash verify (T = 16, M = 64 folded rows in 16-row blocks, 1,040 live slots) that is 9 ranges of 2 blocks; at
batch 2, 5 of 4, so each program walks twice the slots. Per (C, T) this times a forward's worth of launches (36 layers, each its
own K/V) as CUDA-graph replays at: `auto` (what live_attend picks), `slot` (n_split over Hkv only: one slot's
ranges per slot) and fixed counts, with the largest output difference from `auto`'s (fp32 sums in another order).
Since 17b85e0 auto takes `slot`'s count for two slots of 64-127 folded rows (attention.split_pairs); before it, the
`auto` column's count was n_split over C * Hkv everywhere (the figures of docs/measurements/2026-12-03/h200-speed-j/b-cold).

    python benchmarks/gpu_slot_attention_ab.py [--batches 1,2,4,16] [--tokens 1,16,17] [--prefix 1024] [--capacity 2048]
    python benchmarks/gpu_slot_attention_ab.py --arms "default;LIVE_STAGES=1;LIVE_BLOCK_N=32,LIVE_STAGES=1"

With --arms, each (C, T) is timed at live_attend's own pick under each arm instead: `;`-separated settings of the
kernels' A/B knobs (kernels/experimental.KNOBS: NAME=value, comma-separated; `default` = none), set in this process
between arms, with each arm's ms, its ratio to the first arm's and its largest difference from the first arm's output.
    python benchmarks/gpu_slot_attention_ab.py --device cpu ...   # refused: needs CUDA
"""

from __future__ import annotations

import argparse
import sys

import torch

LAYERS, HQ, HKV, D = 36, 32, 8, 128
FIXED = (1, 2, 4, 8, 16, 32)


def inputs(C: int, T: int, prefix: int, S: int, dev):
    """Per layer q [C, Hq, T, D], k / v [C, Hkv, S, D]; one bias [C, g*T, S] (prefix visible, a causal tree part)."""
    g = torch.Generator(device=dev).manual_seed(C * 100 + T)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=torch.bfloat16)  # noqa: E731
    qs = [rnd(C, HQ, T, D) for _ in range(LAYERS)]
    ks = [rnd(C, HKV, S, D) for _ in range(LAYERS)]
    vs = [rnd(C, HKV, S, D) for _ in range(LAYERS)]
    G = HQ // HKV
    vis = torch.zeros(T, S, dtype=torch.bool, device=dev)
    vis[:, :prefix] = True
    vis[:, prefix:prefix + T] = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    bias = torch.zeros(T, S, dtype=torch.bfloat16, device=dev).masked_fill(~vis, float("-inf"))
    bias = bias.repeat(G, 1)[None].expand(C, -1, -1).contiguous()
    live = torch.full((C,), prefix + T, dtype=torch.long, device=dev)
    pre = torch.full((C,), prefix, dtype=torch.long, device=dev)
    return qs, ks, vs, bias, live, pre


def _set_arm(arm: str) -> None:
    """Clear every A/B knob, then set the arm's (NAME=value pairs)."""
    import os

    from ddtree_bench.engine.gpu.kernels import experimental

    for name in experimental.KNOBS:
        os.environ.pop(f"DDTREE_{name}", None)
    for pair in filter(None, arm.split(",")):
        if pair != "default":
            name, _, value = pair.partition("=")
            if name not in experimental.KNOBS:
                raise SystemExit(f"gpu_slot_attention_ab: {name} is not one of {sorted(experimental.KNOBS)}")
            os.environ[f"DDTREE_{name}"] = value


def arms(a, dev) -> int:
    """--arms: live_attend's own pick per (C, T), timed under each arm's knobs."""
    from ddtree_bench.engine.gpu.graphs import replay_ms
    from ddtree_bench.engine.gpu.kernels import attention as at

    names = a.arms.split(";")
    print(f"# live-slot attention, 36 layers (ms per forward), prefix {a.prefix}, capacity {a.capacity}; arms: {names}")
    print(f"{'C':>3} {'T':>3} | " + " | ".join(f"{n:>24}" for n in names))
    with torch.inference_mode():
        for C in map(int, a.batches.split(",")):
            for T in map(int, a.tokens.split(",")):
                qs, ks, vs, bias, live, pre = inputs(C, T, a.prefix, a.capacity, dev)
                fn = lambda: [at.live_attend(qs[i], ks[i], vs[i], bias, live, pre) for i in range(LAYERS)]  # noqa: E731
                cells, first, ref = [], None, None
                for arm in names:
                    _set_arm(arm)
                    out = fn()[:2]
                    ref = out if ref is None else ref
                    err = max(float((o - r).abs().max()) for o, r in zip(out, ref))
                    ms = replay_ms(fn, reps=10)
                    first = first or ms
                    cells.append(f"{ms:7.3f} ({ms / first:.3f}x, {err:.0e})")
                print(f"{C:3d} {T:3d} | " + " | ".join(f"{c:>24}" for c in cells), flush=True)
                qs = ks = vs = None   # free this point's caches before the next
                torch.cuda.empty_cache()
    _set_arm("default")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,2,4,16")
    ap.add_argument("--tokens", default="1,16,17")
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--arms", default="", help="';'-separated knob settings, e.g. 'default;LIVE_STAGES=1'")
    a = ap.parse_args(argv)
    if a.device != "cuda" or not torch.cuda.is_available():
        print("gpu_slot_attention_ab: needs a CUDA device", file=sys.stderr)
        return 2
    from ddtree_bench.engine.gpu.graphs import replay_ms
    from ddtree_bench.engine.gpu.kernels import attention as at

    dev = torch.device("cuda")
    S = a.capacity
    if a.arms:
        return arms(a, dev)
    print(f"# live-slot attention, 36 layers (ms per forward), Hq {HQ} Hkv {HKV} D {D}, prefix {a.prefix}, capacity {S}")
    print(f"{'C':>3} {'T':>3} {'M':>4} {'rows':>4} {'auto':>5} {'slot':>5} | " + " ".join(f"{'ms@' + str(s):>8}" for s in ("auto", "slot", *FIXED))
          + " | best  max|d|")
    with torch.inference_mode():
        for C in map(int, a.batches.split(",")):
            for T in map(int, a.tokens.split(",")):
                qs, ks, vs, bias, live, pre = inputs(C, T, a.prefix, S, dev)
                M = (HQ // HKV) * T
                BM = at.slot_rows(M, C)
                auto = at.n_split(at.split_pairs(C, HKV, M), M, S, BM)
                slot = at.n_split(HKV, M, S, BM)
                counts = {"auto": None, "slot": slot, **{str(s): s for s in FIXED if s <= -(-S // at.BLOCK_N)}}
                ref = [at.live_attend(qs[i], ks[i], vs[i], bias, live, pre) for i in range(2)]
                ms, err = {}, {}
                for name, ns in counts.items():
                    fn = lambda ns=ns: [at.live_attend(qs[i], ks[i], vs[i], bias, live, pre, splits=ns) for i in range(LAYERS)]  # noqa: E731
                    got = fn()
                    err[name] = max(float((got[i] - ref[i]).abs().max()) for i in range(2))
                    ms[name] = replay_ms(fn, reps=10)
                best = min(ms, key=ms.get)
                print(f"{C:3d} {T:3d} {M:4d} {BM:4d} {auto:5d} {slot:5d} | " + " ".join(f"{ms[k]:8.3f}" for k in ms)
                      + f" | {best} ({ms[best] / ms['auto']:.3f}x)  {max(err.values()):.2e}", flush=True)
                qs = ks = vs = None   # free this point's caches before the next
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
