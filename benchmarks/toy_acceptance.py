"""Acceptance of a toy pair: tau per suite for DFlash and DDTree budgets, and tok/s vs AR.

    python benchmarks/toy_acceptance.py --pair ddtree_bench/models/toy --suites gsm8k,humaneval,mt-bench \\
        --limit 16 --max-new-tokens 256 --budgets 16,32,64,128,256,512,1024 --device cpu

Prints one table row per (suite, method, budget) and, last, one JSON line with everything. Checks
that every speculative output equals AR greedy (fp32), and says so. Knows the engine and suites.
"""

from __future__ import annotations

import argparse
import json
import time

from ddtree_bench.pair import load_pair
from ddtree_bench.suites.prompts import load_suite


def conversation_requests(pair, prompts, max_new):
    """Prompt ids per (prompt, turn), with turn 2 on the AR answer to turn 1 (same for every method)."""
    out = []
    for p in prompts:
        messages = []
        for turn, text in enumerate(p.turns):
            messages = messages + [{"role": "user", "content": text}]
            ids = pair.tokenizer.apply_chat_template(messages)
            out.append((p.prompt_id, turn, ids))
            g = pair.engine.generate(ids, "ar", max_new_tokens=max_new, stop_ids=pair.stop_ids)
            messages = messages + [{"role": "assistant", "content": pair.tokenizer.decode(g.output_ids)}]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="ddtree_bench/models/toy")
    ap.add_argument("--suites", default="gsm8k,humaneval,mt-bench")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--budgets", default="16,32,64,128,256,512,1024")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    pair = load_pair(f"{args.pair}/target", f"{args.pair}/draft", "ddtree", args.dtype, args.device)
    methods = [("ar", 0), ("dflash", 0)] + [("ddtree", int(b)) for b in args.budgets.split(",")]
    rows = []
    print(f"{'suite':10s} {'method':7s} {'B':>5s} {'tau':>6s} {'tok/s':>8s} {'xAR':>5s} {'=AR':>4s}", flush=True)
    for suite in args.suites.split(","):
        prompts = load_suite(suite, args.limit).prompts
        reqs = conversation_requests(pair, prompts, args.max_new_tokens)
        ar_out, ar_tps = {}, None
        for method, budget in methods:
            taus, toks, secs, same = [], 0, 0.0, True
            for pid, turn, ids in reqs:
                t0 = time.perf_counter()
                g = pair.engine.generate(ids, method, budget=budget, max_new_tokens=args.max_new_tokens, stop_ids=pair.stop_ids)
                secs += time.perf_counter() - t0
                toks += len(g.output_ids)
                taus.append(sum(g.accept_lengths) / len(g.accept_lengths))
                if method == "ar":
                    ar_out[(pid, turn)] = g.output_ids
                else:
                    same &= g.output_ids == ar_out[(pid, turn)]
            tps = toks / secs
            if method == "ar":
                ar_tps = tps
            row = {"suite": suite, "method": method, "budget": budget if method == "ddtree" else None,
                   "tau": sum(taus) / len(taus), "tok_s": tps, "speedup": tps / ar_tps, "equals_ar": same,
                   "requests": len(reqs), "tokens": toks}
            rows.append(row)
            print(f"{suite:10s} {method:7s} {budget if method == 'ddtree' else '':>5} {row['tau']:6.2f} {tps:8.1f} "
                  f"{row['speedup']:5.2f} {'yes' if same else 'NO':>4s}", flush=True)
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
