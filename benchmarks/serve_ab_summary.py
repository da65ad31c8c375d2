"""The summary of benchmarks/gpu_serve_http_ab.sh: per run its TPOT / TTFT / end-to-end medians and output tok/s
(summary.json), per side the median and range of the runs' TPOTs, B / A over the medians, whether every request's
output ids matched between the sides, and a paired sign-flip test over the rounds.

Round i ran A-i then B-i back to back, so the test pairs them: the statistic is |sum of log(B_i / A_i)|, and p is the
share of all 2^rounds sign flips of those logs whose statistic is at least as large (exact; with 6 rounds the smallest
p is 2 / 64 = 0.031, when every round leans the same way, and 5 rounds cannot go below 0.0625). p < 0.05 reads "beyond
what one code's rounds spread": through HTTP on host-bound AR rounds identical code spread 5-12% between medians of
5-6 servers a side (docs/gpu-performance.md, "Night (2026-12-04)").

    python benchmarks/serve_ab_summary.py OUT ROUNDS
"""

from __future__ import annotations

import json
import math
import statistics
import sys


def sign_flip_p(logs: list[float]) -> float:
    """Two-sided exact p of a paired sign-flip test: the share of the 2^n sign patterns of `logs` whose |sum| is at
    least the observed |sum| (1.0 for no rounds)."""
    obs = abs(sum(logs))
    n = len(logs)
    hits = sum(abs(sum(x if (m >> j) & 1 else -x for j, x in enumerate(logs))) >= obs - 1e-12 for m in range(2 ** n))
    return hits / 2 ** n


def load(out: str, side: str, i: int) -> tuple[dict, dict]:
    d = f"{out}/{side}-{i}/run"
    with open(f"{d}/summary.json") as f:
        s = json.load(f)
    with open(f"{d}/records.jsonl") as f:
        ids = {(x["prompt_id"], x["turn"]): x["output_ids"] for x in map(json.loads, f)}
    return s, ids


def main(out: str, rounds: int) -> None:
    print("run    tpot ms  ttft ms   e2e ms    tok/s")
    tpot: dict[str, list[float]] = {"A": [], "B": []}
    same, ref = True, None
    for i in range(1, rounds + 1):
        for side in "AB":
            s, ids = load(out, side, i)
            tpot[side].append(s["tpot_ms"]["p50"])
            print(f"{side}-{i:<3} {s['tpot_ms']['p50']:7.4f}  {s['ttft_ms']['p50']:7.2f}  {s['e2e_ms']['p50']:7.1f}  "
                  f"{s['output_throughput_tok_s']:7.1f}")
            ref = ids if ref is None else ref
            same &= ids == ref
    med = {k: statistics.median(v) for k, v in tpot.items()}
    for k in "AB":
        print(f"{k}: TPOT median {med[k]:.4f} ms over {rounds} servers, range {min(tpot[k]):.4f}-{max(tpot[k]):.4f}")
    print(f"B / A: TPOT {med['B'] / med['A']:.3f}x; output ids {'identical' if same else 'DIFFER'} request by request")
    logs = [math.log(b / a) for a, b in zip(tpot["A"], tpot["B"])]
    p = sign_flip_p(logs)
    print(f"paired sign-flip test over {len(logs)} rounds: p = {p:.3f} ({'beyond' if p < 0.05 else 'within'} what one "
          f"code's rounds spread; mean B / A {math.exp(sum(logs) / len(logs)):.3f}x)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
