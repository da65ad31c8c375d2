"""The cost model calibrated on rounds as they run (issue 20 item 5): predicted vs measured tok/s per
budget on the toy pair, on this CPU.

Calibration: `perf.costmodel.calibrate` on the stage times (Generation.stage_ns) and round counts of
real generate() calls of the engine in-process runs use (Engine(target, drafter): the plain loop,
stages synchronised) on N suite prompts, per method/budget (AR, DFlash, DDTree at each budget).
Measurement: other generate() calls on the same N prompts, the same engine: tok/s = tokens after the
first / (t_done - t_first_token) summed over the prompts, as bench-engine's end to end. The two
passes interleave prompt by prompt (a calibration call, then a measured call) so load drift hits
both. Prediction at budget B: 1000 * tau(B) / T_round(B) from the calibrated model, tau(B) = the
measured runs' emitted tokens per round (tau is the model's input; the check is of its time per
round). "held out": the same with the model calibrated on every other budget only (16, 64, 256,
1024 of 16..1024), the budgets between predicted from its curves. Prints a table, then one JSON
line. Nothing is asserted.

    python benchmarks/costmodel_rounds.py [--prompts 6] [--max-new-tokens 64] [--threads 1] [--budgets 16..1024]
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
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budgets", default="16..1024")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from ddtree_bench.run_spec import parse_budgets
    from ddtree_bench.pair import load_pair
    from ddtree_bench.perf.costmodel import RoundSample, best, calibrate
    from ddtree_bench.suites.prompts import load_suite

    pair = load_pair("toy", None, "ddtree")
    eng = pair.engine
    prompts = load_suite("gsm8k", args.prompts).prompts
    ids = [pair.tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    calib_ids, meas_ids = ids, ids
    budgets = parse_budgets(args.budgets)
    configs = [("ar", 0), ("dflash", eng.block_size - 1)] + [("ddtree", b) for b in budgets]
    load0 = os.getloadavg()[0]
    t_start = time.time()

    samples, measured = [], {}
    for method, budget in configs:
        eng.generate(max(ids, key=len), method, budget, args.max_new_tokens, stop_ids=pair.stop_ids)  # warmup
        stage_ms: dict[str, float] = {}
        rounds = tokens = 0
        m_tok = m_ns = m_rounds = m_acc = 0
        m_stage_ms = m_draft_ms = 0.0
        for cp, mp in zip(calib_ids, meas_ids):
            g = eng.generate(cp, method, budget, args.max_new_tokens, stop_ids=pair.stop_ids)
            for k, v in g.stage_ns.items():
                if k != "prefill":
                    stage_ms[k] = stage_ms.get(k, 0.0) + v / 1e6
            rounds += len(g.accept_lengths)
            tokens += sum(g.accept_lengths)
            g = eng.generate(mp, method, budget, args.max_new_tokens, stop_ids=pair.stop_ids)
            m_tok += len(g.output_ids) - 1
            m_ns += g.t_done_ns - g.t_first_token_ns
            m_rounds += len(g.accept_lengths)
            m_acc += sum(g.accept_lengths)
            m_stage_ms += sum(v for k, v in g.stage_ns.items() if k != "prefill") / 1e6
            m_draft_ms += g.stage_ns.get("draft", 0) / 1e6
        samples.append(RoundSample(method, budget, rounds, tokens, stage_ms))
        measured[(method, budget)] = {"tok_s": m_tok / (m_ns / 1e9), "tau_emitted": m_tok / m_rounds,
                                      "tau": m_acc / m_rounds, "round_ms": m_stage_ms / m_rounds, "rounds": m_rounds,
                                      "draft_ms": m_draft_ms / m_rounds}

    model = calibrate(samples)
    tau = {b: measured[("ddtree", b)]["tau_emitted"] for b in budgets}
    preds = model.sweep(tau, budgets)
    kept = budgets[0::2]
    held = calibrate([s for s in samples if s.method != "ddtree" or s.budget in kept]).sweep(tau, budgets)
    rows = []
    for p, h in zip(preds, held):
        m = measured[("ddtree", p.budget)]
        own = next(x for x in samples if x.method == "ddtree" and x.budget == p.budget)
        rows.append({"budget": p.budget, "calib_round_ms": round(own.round_ms, 3), "calib_draft_ms": round(own.per_round("draft"), 3), "tau": round(m["tau"], 3), "tau_emitted": round(m["tau_emitted"], 3),
                     "pred_round_ms": round(p.round_ms, 3), "meas_round_ms": round(m["round_ms"], 3),
                     "meas_draft_ms": round(m["draft_ms"], 3),
                     "pred_tok_s": round(p.tok_s, 1), "meas_tok_s": round(m["tok_s"], 1),
                     "error_pct": round(100 * (p.tok_s / m["tok_s"] - 1), 1),
                     "held_out": p.budget not in kept, "held_pred_tok_s": round(h.tok_s, 1),
                     "held_error_pct": round(100 * (h.tok_s / m["tok_s"] - 1), 1)})
    ar_pred = 1000.0 / model.t_ar
    pred_best = best(preds).budget
    held_best = best(held).budget
    meas_best = max(budgets, key=lambda b: (measured[("ddtree", b)]["tok_s"], -b))
    print(f"toy pair, fp32, CPU, {torch.get_num_threads()} thread(s), nproc {os.cpu_count()}, load {load0:.2f} -> "
          f"{os.getloadavg()[0]:.2f} (1 min), {time.time() - t_start:.0f} s; {args.prompts} gsm8k prompts, each "
          f"a calibration and a measured call x {args.max_new_tokens} new tokens, greedy, plain engine")
    print("| B | tau | tau emitted | pred round ms | meas round ms | pred tok/s | meas tok/s | error | held out: pred tok/s | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        held = f"{r['held_pred_tok_s']:.1f} | {r['held_error_pct']:+.1f}%" if r["held_out"] else "(calibrated) | "
        print(f"| {r['budget']} | {r['tau']:.2f} | {r['tau_emitted']:.2f} | {r['pred_round_ms']:.2f} | {r['meas_round_ms']:.2f} "
              f"| {r['pred_tok_s']:.1f} | {r['meas_tok_s']:.1f} | {r['error_pct']:+.1f}% | {held} |")
    ar_meas = measured[("ar", 0)]["tok_s"]
    print(f"AR: predicted {ar_pred:.1f} tok/s, measured {ar_meas:.1f} ({100 * (ar_pred / ar_meas - 1):+.1f}%); "
          f"best budget: predicted {pred_best} (held out: {held_best}), measured {meas_best}")
    print(json.dumps({"threads": torch.get_num_threads(), "load_start": load0, "load_end": os.getloadavg()[0],
                      "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "rows": rows,
                      "ar": {"pred_tok_s": ar_pred, "meas_tok_s": ar_meas},
                      "best_budget": {"predicted": pred_best, "held_out": held_best, "measured": meas_best},
                      "model": {"draft_ms": model.draft_ms, "verify_ms": model.verify_ms.to_dict(),
                                "overhead_ms": model.overhead_ms.to_dict(), "ar_ms": model.t_ar}}))


if __name__ == "__main__":
    main()
