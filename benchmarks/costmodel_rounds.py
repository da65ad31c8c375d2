"""The cost model calibrated on rounds as they run (issue 20 item 5): predicted vs measured tok/s per
budget on the toy pair, on this CPU, made honest and stable on a shared machine.

Every call is a real generate() of the engine bench-engine times (Engine(cuda_graphs=True): the fast
loop, eager on a CPU) on suite prompts; its FastLoop.rounds are the per-round stage times. Each pass
runs every prompt through every config (AR, DFlash, DDTree at each budget), the configs' order
rotating from prompt to prompt, so load drift hits all budgets alike. Prediction at budget B:
`perf.costmodel.held_out_predictions`: the model calibrated on per-round stage medians of every
*other* config's rounds (leave one budget out: B's own rounds never inform B), then
1000 * tau(B) / T_round(B) with tau(B) = B's measured emitted tokens per round (tau is the model's
input; the check is of its time per round). Measured: tokens after the first / (t_done -
t_first_token), summed over the calls. Both pooled over PASSES passes; beside the error stands the
spread of the measurement itself (each pass's measured tok/s against the pooled one, min..max), and
each pass's own error range (a model and a measurement from that pass alone), and the error against
B's median round (1000 tau / median round ms: what the model, made of medians, says without the
slow rounds a shared machine adds, which the mean and so the measured tok/s keep), and the same
held-out prediction from per-round means instead of medians. Best budget: the held-out
predictions' against the measured. Prints a table, then one JSON line. Nothing is asserted.

    python benchmarks/costmodel_rounds.py [--prompts 6] [--max-new-tokens 64] [--passes 3] [--threads 1]
                                          [--budgets 16..1024]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budgets", default="16..1024")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.pair import load_pair
    from ddtree_bench.perf.costmodel import RoundTimes, best, held_out_predictions, rounds_counted
    from ddtree_bench.run_spec import parse_budgets
    from ddtree_bench.suites.prompts import load_suite

    pair = load_pair("toy", None, "ddtree")
    eng = Engine(pair.engine.target, pair.engine.drafter, cuda_graphs=True)
    eng.fast_loop().graphs = False
    bs = pair.engine.drafter.block_size
    prompts = load_suite("gsm8k", args.prompts).prompts
    ids = [pair.tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    budgets = parse_budgets(args.budgets)
    configs = [("ar", 0), ("dflash", bs - 1)] + [("ddtree", b) for b in budgets]
    load0, t_start = os.getloadavg()[0], time.time()

    def call(method: str, budget: int, prompt: list[int]):
        return eng.generate(prompt, method, budget if method == "ddtree" else 0, args.max_new_tokens, stop_ids=pair.stop_ids)

    for method, budget in configs:    # warmup: the longest prompt, so no timed call grows the caches
        call(method, budget, max(ids, key=len))
    # per pass, per config: rounds (stage ms dicts), tokens after the first, decode ns, rounds counted
    passes = []
    for p in range(args.passes):
        got = {c: {"rounds": [], "tokens": 0, "ns": 0, "n": 0} for c in configs}
        for i, prompt in enumerate(ids):
            k = (p * len(ids) + i) % len(configs)
            for cfg in configs[k:] + configs[:k]:
                g = call(*cfg, prompt)
                rec = got[cfg]
                rec["rounds"] += [dict(r) for r in eng.fast_loop().rounds]
                rec["tokens"] += len(g.output_ids) - 1
                rec["ns"] += g.t_done_ns - g.t_first_token_ns
                rec["n"] += len(g.accept_lengths)
        passes.append(got)

    def evaluate(runs: list[dict]) -> dict:
        """Held-out predictions and measurements over the given passes pooled."""
        pooled = {c: {"rounds": [r for run in runs for r in run[c]["rounds"]],
                      **{f: sum(run[c][f] for run in runs) for f in ("tokens", "ns", "n")}} for c in configs}
        samples = [RoundTimes(m, b, pooled[(m, b)]["rounds"]) for m, b in configs]
        tau = {b: pooled[("ddtree", b)]["tokens"] / pooled[("ddtree", b)]["n"] for b in budgets}
        meas = {c: pooled[c]["tokens"] / (pooled[c]["ns"] / 1e9) for c in configs}
        preds = held_out_predictions(samples, tau, budgets)
        means = held_out_predictions(samples, tau, budgets, statistic="mean")
        return {"pooled": pooled, "samples": samples, "tau": tau, "meas": meas, "preds": preds, "means": means}

    everything = evaluate(passes)
    each = [evaluate([run]) for run in passes]
    rows = []
    for j, (b, pred) in enumerate(zip(budgets, everything["preds"])):
        cfg = ("ddtree", b)
        meas = everything["meas"][cfg]
        own = sorted(sum(r.values()) for r in everything["pooled"][cfg]["rounds"])
        per_pass_meas = [e["meas"][cfg] for e in each]
        per_pass_err = [100 * (e["preds"][j].tok_s / e["meas"][cfg] - 1) for e in each]
        rows.append({"budget": b, "tau_emitted": round(everything["tau"][b], 3), "rounds": len(own),
                     "pred_round_ms": round(pred.round_ms, 3), "meas_round_ms_median": round(own[len(own) // 2], 3),
                     "meas_round_ms_mean": round(sum(own) / len(own), 3),
                     "pred_tok_s": round(pred.tok_s, 1), "meas_tok_s": round(meas, 1),
                     "error_pct": round(100 * (pred.tok_s / meas - 1), 1),
                     "error_vs_median_round_pct": round(100 * (own[len(own) // 2] / pred.round_ms - 1), 1),
                     "pred_tok_s_means": round(everything["means"][j].tok_s, 1),
                     "error_means_pct": round(100 * (everything["means"][j].tok_s / meas - 1), 1),
                     "meas_spread_pct": [round(100 * (min(per_pass_meas) / meas - 1), 1), round(100 * (max(per_pass_meas) / meas - 1), 1)],
                     "per_pass_error_pct": [round(min(per_pass_err), 1), round(max(per_pass_err), 1)]})
    pred_best = best(everything["preds"]).budget
    means_best = best(everything["means"]).budget
    meas_best = max(budgets, key=lambda b: (everything["meas"][("ddtree", b)], -b))
    per_pass_best = [(best(e["preds"]).budget, max(budgets, key=lambda b: (e["meas"][("ddtree", b)], -b))) for e in each]
    print(f"toy pair, fp32, CPU, {torch.get_num_threads()} thread(s), nproc {os.cpu_count()}, load {load0:.2f} -> "
          f"{os.getloadavg()[0]:.2f} (1 min), {time.time() - t_start:.0f} s; {args.prompts} gsm8k prompts x {args.passes} "
          f"passes x {args.max_new_tokens} new tokens, greedy, fast engine (eager); "
          f"{rounds_counted(everything['samples'])} rounds; each budget predicted with its own rounds left out")
    print("| B | tau emitted | rounds | pred round ms | meas round ms (median / mean) | pred tok/s | meas tok/s | error "
          "| meas spread over passes | per-pass error | error vs the median round | means: pred tok/s | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['budget']} | {r['tau_emitted']:.2f} | {r['rounds']} | {r['pred_round_ms']:.2f} | {r['meas_round_ms_median']:.2f} / "
              f"{r['meas_round_ms_mean']:.2f} | {r['pred_tok_s']:.1f} | {r['meas_tok_s']:.1f} | {r['error_pct']:+.1f}% "
              f"| {r['meas_spread_pct'][0]:+.1f}..{r['meas_spread_pct'][1]:+.1f}% "
              f"| {r['per_pass_error_pct'][0]:+.1f}..{r['per_pass_error_pct'][1]:+.1f}% | {r['error_vs_median_round_pct']:+.1f}% "
              f"| {r['pred_tok_s_means']:.1f} | {r['error_means_pct']:+.1f}% |")
    print(f"best budget: predicted {pred_best} (from means: {means_best}), measured {meas_best}; per pass (predicted, "
          f"measured): {per_pass_best}")
    print(json.dumps({"threads": torch.get_num_threads(), "load_start": load0, "load_end": os.getloadavg()[0],
                      "prompts": args.prompts, "passes": args.passes, "max_new_tokens": args.max_new_tokens, "rows": rows,
                      "best_budget": {"predicted": pred_best, "from_means": means_best, "measured": meas_best,
                                      "per_pass": per_pass_best},
                      "measured_tok_s": {f"{m}:{b}": v for (m, b), v in everything["meas"].items()}}))


if __name__ == "__main__":
    main()
