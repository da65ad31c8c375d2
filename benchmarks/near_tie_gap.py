"""How large a logit gap can floating-point effects flip? Figures for choosing `--near-tie-gap`.

For each prompt of a suite: decode AR-greedy in float32 (the baseline), then teacher-force that
same sequence through the target in a lower precision (and through float32 again as one
full-sequence forward, which is the verify-shaped computation). At every output position, take the
float32 top-1 and top-2 tokens and measure how much the other computation moves the difference
of their logits: delta = (l1 - l2)_other - (l1 - l2)_fp32. A greedy flip at a position needs
|delta| >= the fp32 gap there, so the largest |delta| is the largest gap numerics can flip: the
near-tie threshold should sit above it. It also decodes in the lower precision for real and lists
the fp32 gaps where the outputs first diverge.

    python benchmarks/near_tie_gap.py --model random --suite smoke --max-new-tokens 128 --dtype bfloat16
Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json

import torch


def logits_of(engine, seq: list[int]) -> torch.Tensor:
    t = engine.target
    with torch.inference_mode():
        cache = t.new_cache(len(seq))
        ids = torch.tensor(seq, dtype=torch.long, device=engine.device)
        logits, _ = t(ids, torch.arange(len(seq), device=engine.device), cache, 0)
    return logits.float().cpu()


def quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    s = sorted(xs)
    q = lambda p: s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]  # noqa: E731
    return {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": s[-1]}


def main() -> None:
    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites.prompts import load_suite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random")
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ref-device", default=None, help="Device of the float32 baseline (default: --device).")
    a = ap.parse_args()

    ref = load_pair(a.model, None, "ar", "float32", a.ref_device or a.device)
    low = load_pair(a.model, None, "ar", a.dtype, a.device)
    prompts = load_suite(a.suite, a.limit).prompts
    gaps, d_low, d_full, flips = [], [], [], []
    for p in prompts:
        prompt = ref.tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}])
        g = ref.engine.generate(prompt, method="ar", max_new_tokens=a.max_new_tokens, stop_ids=ref.stop_ids, return_logit_gaps=True)
        out = g.output_ids
        seq = prompt + out[:-1]
        rows = slice(len(prompt) - 1, len(seq))
        lf, ll = logits_of(ref.engine, seq)[rows], logits_of(low.engine, seq)[rows]
        top2 = torch.topk(lf, 2, dim=-1).indices
        for i in range(len(out)):
            t1, t2 = top2[i].tolist()
            gaps.append(g.logit_gaps[i])
            d_low.append(abs(float(ll[i, t1] - ll[i, t2]) - g.logit_gaps[i]))
            d_full.append(abs(float(lf[i, t1] - lf[i, t2]) - g.logit_gaps[i]))
        lo = low.engine.generate(prompt, method="ar", max_new_tokens=a.max_new_tokens, stop_ids=low.stop_ids).output_ids
        k = next((i for i, (x, y) in enumerate(zip(out, lo)) if x != y), None)
        if k is not None:
            flips.append({"prompt_id": p.prompt_id, "index": k, "fp32_gap": g.logit_gaps[k]})
    res = {
        "model": a.model, "device": a.device, "ref_device": a.ref_device or a.device, "dtype": a.dtype, "positions": len(gaps), "prompts": len(prompts),
        "fp32_gap": quantiles(gaps), "fp32_gap_p01": sorted(gaps)[len(gaps) // 100] if gaps else None,
        "abs_delta_low_precision": quantiles(d_low), "abs_delta_fp32_full_vs_incremental": quantiles(d_full),
        "divergences_low_precision": flips, "max_gap_at_divergence": max((f["fp32_gap"] for f in flips), default=None),
        "torch": torch.__version__,
    }
    print(f"{res['positions']} positions over {res['prompts']} prompts, {a.model}: {a.dtype} on {a.device} "
          f"vs float32 on {res['ref_device']}")
    for name in ("fp32_gap", "abs_delta_low_precision", "abs_delta_fp32_full_vs_incremental"):
        print(f"  {name:38s} " + "  ".join(f"{k} {v:.4g}" for k, v in res[name].items()))
    print(f"  {a.dtype} decode diverged on {len(flips)}/{len(prompts)} prompts; largest fp32 gap at the divergence: "
          f"{res['max_gap_at_divergence']}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
