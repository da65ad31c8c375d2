"""`bench-engine --batch`: per-stage round times and output tok/s of the batched fast loop per (batch, budget).

For each batch size B in `batches` and each method point (AR; DFlash; DDTree at each budget) it
admits B requests (random prompts of `prefix_len` tokens, a different prompt per request) into
one `gpu.batch_loop.BatchFastLoop` with B slots, runs `rounds` measured rounds with every slot
live after `warmup` rounds (round 1 captures the bucket's CUDA graphs: its wall time is reported
as `first_round_ms`, the cold start of a new (bucket, budget) shape, the slotted tree kernel's check included),
and reports per stage the
median ms over the measured rounds (draft, tree_build, tree_compile, verify, walk, commit, as
CUDA events between the stages) and the median round, plus `step_ms`, the median host wall time of one
`loop.step()` over the same rounds (launches, the one host sync, emitting tokens): the round as a client feels it.
`gap_ms` = step_ms - round_ms is what a step costs beyond its device stages - host work the device waits for. DFlash
and DDTree queue the next round's draft before the host reads the walk result (at every bucket), so their host work
overlaps that draft (their gap can be negative: a step's own draft ran during the step before); AR queues nothing.
tok/s below stay on round_ms, the device's figure; step_ms says how far wall time is from it. (step_ms and gap_ms
were added on 2026-12-03 evening.)

Output tok/s of a row = B * tau / round_ms * 1000, with
  tau = the acceptance length per request and round (accepted nodes counting the root), AR 1;
        DDTree: `tau[budget]` when given (random weights accept ~nothing, so on a real shape tau
        is supplied, as bench-engine does at batch 1), DFlash: `tau[0]` when given; else the mean
        a_r measured over the measured rounds (`tau_source` says which);
and per-request tok/s = tau / round_ms * 1000 (what one request's decode rate is at that load).
Beside each row, the single-request fast loop (loop.FastLoop, what `serve --max-batch 1` runs) at the same
point, measured in the same process as bench-engine measures it (bench.round_times): `single_round_ms`
and `x_single` = round_ms / single_round_ms (at batch 1: 1.0 means the batched loop costs what the single
loop costs) and `x_serial` = batch * single_round_ms / round_ms: output tok/s against the single loop serving the
same requests one after another, as `serve --max-batch 1` does (equal tau; > 1: batching them pays). With more
than one batch size, batch 1 is also run in a loop of max(batches) slots (`max_batch`): what `serve
--max-batch N` does at concurrency 1. (File version 2, 2026-12-02: those fields and rows are new; version 1 had neither;
`x_serial` was added on 2026-12-03.)
`best` lists per batch the budget with the highest output tok/s among the DDTree rows (and
whether it beats DFlash and AR at that batch).

`model` checks the batched cost model (perf/costmodel.py: predict_batched) against the measured
grid, leaving one batch out: for each batch C the stage costs are calibrated (calibrate_batched) on
the AR and DDTree rows of the *other* batches only, with each row's overhead = round - draft -
verify (medians), and predict C's round at every budget with the rows' own tau (so the check is of
the round time: predicted tok/s = 1000 * C * tau / predicted round). Per (C, B): predicted and
measured round ms and tok/s, error = predicted / measured - 1; per C: the predicted best budget, the
measured one, and `loss` = 1 - measured tok/s at the predicted best / measured best. A grid of one
batch has nothing to leave out: it is fitted on itself (`fit` says which). Beyond the left-in batches' tokens the
verify cost follows one request's verify forward over the same n (`verify_shape_ms`, timed after the grid, kept in
the result), not the last segment of the fitted points (costmodel.calibrate_batched; docs/gpu-performance.md's
batched cost model says what that changed). Knows nothing of the CLI; returns JSON-able dicts.
"""

from __future__ import annotations

import gc
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ddtree_bench import defaults as D
from ddtree_bench.display import table
from ddtree_bench.noise.gpu_clocks import ClockSampler, clock_fields, nvsmi_id, span
from ddtree_bench.engine.interface import ROUND_STAGES
from ddtree_bench.perf.timing import median

COLUMNS = ["batch", "max_batch", "method", "budget", "rounds", *[f"{s}_ms" for s in ROUND_STAGES], "round_ms",
           "step_ms", "gap_ms", "first_round_ms", "single_round_ms", "x_single", "x_serial", "tau", "tau_source", "tok_s",
           "tok_s_per_request", "bucket", "sm_clock_mhz", "power_capped_share"]


@dataclass
class BatchBenchSpec:
    batches: list[int]
    budgets: list[int]
    methods: tuple[str, ...] = ("ar", "dflash", "ddtree")
    prefix_len: int = D.BENCH_PREFIX_LEN
    rounds: int = D.BENCH_ROUNDS
    warmup: int = 2                    # unmeasured rounds first (round 1 captures the graphs)
    graphs: bool = True
    layer_ops: str = "auto"
    tau: dict[int, float] | None = None   # given tau per budget (DDTree), key 0 for DFlash
    seed: int = D.SEED
    single: bool = True                # also time the single-request fast loop per point (x_single)
    verify_shape: bool = True          # also time one request's verify at every n of the grid (model_check's shape)


def parse_batches(text: str) -> list[int]:
    """'1,2,4,8,16' -> [1, 2, 4, 8, 16] (ValueError on anything else)."""
    parts = [x.strip() for x in text.split(",")]
    if not parts or any(not x for x in parts):
        raise ValueError(f"--batch {text!r}: expected a comma list of batch sizes, e.g. 1,2,4,8,16")
    out = sorted({int(x) for x in parts})
    if out[0] < 1:
        raise ValueError("--batch sizes must be >= 1")
    return out


@torch.inference_mode()
def batch_row(target, drafter, method: str, budget: int, batch: int, spec: BatchBenchSpec,
              max_batch: int | None = None, sampler: ClockSampler | None = None) -> dict[str, Any]:
    """One (batch, method, budget) measurement in a loop of max_batch slots (default: batch) (module docstring);
    with a sampler (CUDA), also the median SM clock and power-capped share of the measured rounds' samples."""
    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
    from ddtree_bench.engine.proposer import DFlashProposer
    from ddtree_bench.perf.bench import random_prompt

    proposer = DFlashProposer(drafter, target) if method != "ar" else None
    loop = BatchFastLoop(target, proposer, method, budget, max_batch or batch, graphs=spec.graphs, layer_ops=spec.layer_ops)
    per_round = 1 + (proposer.block_size - 1 if proposer is not None else 0)   # most tokens a round can emit
    n_new = (spec.warmup + spec.rounds) * per_round + 1                          # every slot stays live throughout
    V = target.cfg.vocab_size
    for i in range(batch):
        loop.admit(BatchRequest(random_prompt(V, spec.prefix_len, spec.seed + i), max_new_tokens=n_new))
    cuda = loop.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    loop.step()
    first_ms = (time.perf_counter_ns() - t0) / 1e6
    for _ in range(spec.warmup - 1):
        loop.step()
    n0 = {id(st): len(st.accept_lengths) for st in loop.active}
    start = len(loop.rounds)
    steps_ms = []
    label = f"{method}:{budget}:{batch}:{max_batch or batch}"
    with span(sampler, label):
        for _ in range(spec.rounds):
            t = time.perf_counter_ns()
            loop.step()
            steps_ms.append((time.perf_counter_ns() - t) / 1e6)
        if cuda:
            torch.cuda.synchronize()
    measured = [r for r in loop.rounds[start:] if r["batch"] == batch]
    acc = [a for st in loop.active for a in st.accept_lengths[n0.get(id(st), 0):]]
    med = {f"{s}_ms": median([r.get(s, 0.0) for r in measured]) for s in ROUND_STAGES if any(s in r for r in measured)}
    round_ms = median([sum(r.get(s, 0.0) for s in ROUND_STAGES) for r in measured])
    step_ms = median(steps_ms)
    given = (spec.tau or {}).get(budget if method == "ddtree" else 0) if method != "ar" else None
    if method == "ar":
        tau, source = 1.0, "ar"
    elif given is not None:
        tau, source = float(given), "given"
    else:
        tau, source = (sum(acc) / len(acc) if acc else float("nan")), "measured"
    row = {"batch": batch, "max_batch": max_batch or batch, "method": method, "budget": budget if method == "ddtree" else None,
           "rounds": len(measured),
           **med, "round_ms": round_ms, "step_ms": step_ms, "gap_ms": step_ms - round_ms,
           "first_round_ms": first_ms, "tau": tau, "tau_source": source,
           "tok_s": batch * tau / round_ms * 1e3 if round_ms else float("nan"),
           "tok_s_per_request": tau / round_ms * 1e3 if round_ms else float("nan"),
           "bucket": measured[0]["bucket"] if measured else None,
           # DDTree's tree builder at this batch (batch 1: the single loop's) and rounds redone after a failed certificate
           "builder": (loop.solo.tree_builder(budget) if batch == 1 and loop.solo is not None else loop.tree_builder)
           if method == "ddtree" else None, "redone_rounds": loop.redone_rounds,
           **clock_fields(sampler, label)}
    loop.release()
    del loop
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def best_per_batch(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch: the DDTree budget with the highest output tok/s, and the DFlash and AR tok/s beside it
    (rows that failed are left out)."""
    rows = [r for r in rows if "error" not in r]
    out = []
    for b in sorted({r["batch"] for r in rows}):
        at = [r for r in rows if r["batch"] == b and r.get("max_batch", b) == b]
        dd = [r for r in at if r["method"] == "ddtree"]
        top = max(dd, key=lambda r: r["tok_s"]) if dd else None
        other = {m: next((r["tok_s"] for r in at if r["method"] == m), None) for m in ("dflash", "ar")}
        out.append({"batch": b, "best_budget": top["budget"] if top else None, "ddtree_tok_s": top["tok_s"] if top else None,
                    "dflash_tok_s": other["dflash"], "ar_tok_s": other["ar"]})
    return out


def run_batch_bench(target, drafter, spec: BatchBenchSpec, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every (batch, method point) row, the best budget per batch, and the spec."""
    points = [(m, 0) for m in spec.methods if m != "ddtree"]
    if "ddtree" in spec.methods:
        points += [("ddtree", b) for b in spec.budgets]
    single: dict[tuple[str, int], float] = {}
    if spec.single:
        from ddtree_bench.perf.bench import round_times

        for method, budget in points:
            progress(f"single loop: {method}{f' B={budget}' if method == 'ddtree' else ''}")
            try:
                single[(method, budget)] = round_times(target, drafter if method != "ar" else None, method, budget,
                                                       spec.prefix_len, spec.rounds, spec.graphs, False, spec.seed,
                                                       spec.layer_ops)["fast"]["round"]
            except Exception as e:  # noqa: BLE001 - the batched rows still run
                progress(f"single loop {method} {budget}: {type(e).__name__}: {e}")
    runs = [(b, None) for b in spec.batches]
    if len(spec.batches) > 1 and 1 in spec.batches:   # serve --max-batch N at concurrency 1
        runs.insert(1, (1, max(spec.batches)))
    with ExitStack() as stack:
        cuda = target.lm_head.weight.device.type == "cuda"
        sampler = stack.enter_context(ClockSampler(nvsmi_id(target.lm_head.weight.device))) if cuda else None
        rows = _batch_rows(target, drafter, spec, runs, points, single, sampler, progress)
    shape = None
    if spec.verify_shape:
        ns = sorted({r["batch"] * (1 + (r["budget"] or 0)) for r in rows if "error" not in r and r["method"] != "dflash"})
        progress(f"one request's verify at n = {', '.join(map(str, ns))} (the cost model's shape)")
        try:
            shape = verify_shape_ms(target, drafter, spec, ns)
        except Exception as e:  # noqa: BLE001 - the model then extends its verify linearly, as before
            progress(f"verify shape: {type(e).__name__}: {e}")
    return {"kind": "bench-engine-batch", "version": 2, "rows": rows, "best": best_per_batch(rows),
            "verify_shape_ms": shape, "model": model_check(rows, shape), "spec": {k: v for k, v in spec.__dict__.items()}}


def _batch_rows(target, drafter, spec: BatchBenchSpec, runs, points, single, sampler, progress) -> list[dict[str, Any]]:
    """run_batch_bench's rows, one (batch, method point) each, with their single-loop ratios."""
    rows = []
    for batch, slots in runs:
        for method, budget in points:
            what = f"batch {batch}{f' of {slots}' if slots else ''}: {method}{f' B={budget}' if method == 'ddtree' else ''}"
            progress(what)
            try:
                row = batch_row(target, drafter, method, budget, batch, spec, slots, sampler)
            except Exception as e:  # one shape that cannot run (memory, a kernel) must not lose the others
                row = {"batch": batch, "max_batch": slots or batch, "method": method,
                       "budget": budget if method == "ddtree" else None, "error": f"{type(e).__name__}: {e}"}
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            one = single.get((method, budget))
            if one and "error" not in row:
                row.update(single_round_ms=one, x_single=row["round_ms"] / one, x_serial=batch * one / row["round_ms"])
            progress(f"{what}: " + (f"error {row['error']}" if "error" in row else
                                    f"round {row['round_ms']:.3f} ms (single loop {one or float('nan'):.3f}), "
                                    f"first {row['first_round_ms']:.0f} ms, {row['tok_s']:.1f} tok/s"))
            rows.append(row)
    return rows


@torch.inference_mode()
def verify_shape_ms(target, drafter, spec: BatchBenchSpec, ns: list[int]) -> dict[int, float]:
    """ms of one request's verify forward over n tokens after spec.prefix_len (bench.CurveSetup's tree; replayed from
    a CUDA graph with the fast loop's ops on CUDA, else eager): the shape model_check extends the batched verify along
    beyond the batches a prediction was fitted on."""
    from ddtree_bench.engine.gpu.fused import TORCH_OPS
    from ddtree_bench.perf.bench import CurveSetup
    from ddtree_bench.perf.timing import graph_time_fn, time_fn

    device = target.lm_head.weight.device
    layers = drafter.target_layer_ids if drafter is not None else ()
    setup = CurveSetup(target, layers, spec.prefix_len, ns, device, spec.layer_ops)
    on_graphs = spec.graphs and device.type == "cuda"
    out = {}
    for n in ns:
        fn = setup.point(n, with_path=setup.ops is not TORCH_OPS and on_graphs).forward()
        out[n] = graph_time_fn(fn) if on_graphs else time_fn(fn, device, reps=3, warmup=1)
    return out


def model_check(rows: list[dict[str, Any]], verify_shape: dict[int, float] | None = None) -> dict[str, Any]:
    """The batched cost model against the measured rows, one batch left out at a time (module docstring); with
    verify_shape ({n: ms}, verify_shape_ms) the verify curve extends along it beyond the fitted batches' n."""
    from ddtree_bench.perf.costmodel import BatchRoundPoint, best_per_batch as model_best, calibrate_batched, predict_batched

    ok = [r for r in rows if "error" not in r and r["method"] in ("ar", "ddtree") and r.get("round_ms")
          and r.get("max_batch", r["batch"]) == r["batch"]]
    points = {id(r): BatchRoundPoint(r["batch"], r["budget"] or 0, r.get("draft_ms", 0.0), r["verify_ms"],
                                     r["round_ms"] - r.get("draft_ms", 0.0) - r["verify_ms"]) for r in ok}
    batches = sorted({r["batch"] for r in ok})
    fit = "leave-one-batch-out" if len(batches) > 1 else "in-sample"
    cells, best = [], []
    for c in batches:
        at = {r["budget"]: r for r in ok if r["batch"] == c and r["method"] == "ddtree"}
        train = [points[id(r)] for r in ok if r["batch"] != c or fit == "in-sample"]
        if not at or not any(p.budget > 0 for p in train):
            continue
        try:
            costs = calibrate_batched(train, verify_shape)
        except ValueError:
            continue
        preds = predict_batched(costs, {b: r["tau"] for b, r in at.items()}, [c], sorted(at))
        for p in preds:
            m = at[p.budget]
            cells.append({"batch": c, "budget": p.budget, "tau": p.tau, "pred_round_ms": p.round_ms,
                          "meas_round_ms": m["round_ms"], "pred_tok_s": p.tok_s, "meas_tok_s": m["tok_s"],
                          "error": p.tok_s / m["tok_s"] - 1 if m["tok_s"] else float("nan")})
        pb = model_best(preds)[c].budget
        mb = max(at.values(), key=lambda r: (r["tok_s"], -r["budget"]))
        best.append({"batch": c, "pred_best_budget": pb, "meas_best_budget": mb["budget"],
                     "loss": 1 - at[pb]["tok_s"] / mb["tok_s"] if mb["tok_s"] else float("nan")})
    return {"fit": fit, "verify_shape": bool(verify_shape), "cells": cells, "best": best}


def render_batch(result: dict[str, Any]) -> str:
    """The terminal tables: per (batch, method, budget) stage medians and tok/s, then the best budget per batch."""
    def f(x, d=2):
        return None if x is None else (round(x, d) if isinstance(x, float) else x)

    ok = [r for r in result["rows"] if "error" not in r]
    clocked = any(r.get("sm_clock_mhz") is not None for r in ok)
    failed = [f"  batch {r['batch']} {r['method']} {r['budget'] or ''}: {r['error']}" for r in result["rows"] if "error" in r]
    rows = [[r["batch"], r.get("max_batch", r["batch"]), r["method"], r["budget"] if r["budget"] is not None else "-", r["rounds"]]
            + [f(r.get(f"{s}_ms"), 3) for s in ROUND_STAGES] + [f(r["round_ms"], 3), f(r.get("step_ms"), 3),
                                                                f(r.get("gap_ms"), 3), f(r.get("single_round_ms"), 3),
                                                                f(r.get("x_single"), 2), f(r.get("x_serial"), 2),
                                                                f(r["first_round_ms"], 1),
                                                                f(r["tau"]), r["tau_source"], f(r["tok_s"], 1),
                                                                f(r["tok_s_per_request"], 1)]
            + ([None if r.get("sm_clock_mhz") is None else round(r["sm_clock_mhz"]),
                None if r.get("power_capped_share") is None else round(100 * r["power_capped_share"])] if clocked else [])
            for r in ok]
    head = ["batch", "slots", "method", "budget", "rounds", *ROUND_STAGES, "round", "step", "gap", "single", "x single",
            "x serial",
            "first round",
            "tau", "tau from", "tok/s", "tok/s/req"] + (["MHz", "capped %"] if clocked else [])
    best = [[b["batch"], b["best_budget"], f(b["ddtree_tok_s"], 1), f(b["dflash_tok_s"], 1), f(b["ar_tok_s"], 1)]
            for b in result["best"]]
    model = result.get("model") or {"cells": [], "best": []}
    cells = [[m["batch"], m["budget"], f(m["tau"]), f(m["pred_round_ms"], 3), f(m["meas_round_ms"], 3), f(m["pred_tok_s"], 1),
              f(m["meas_tok_s"], 1), f"{100 * m['error']:+.1f}%"] for m in model["cells"]]
    picks = [[m["batch"], m["pred_best_budget"], m["meas_best_budget"], f"{100 * m['loss']:.1f}%"] for m in model["best"]]
    checked = ("" if not cells else
               f"\n\ncost model vs measured (DDTree; fit {model['fit']}; same tau, so the check is of the round"
               + ("; verify beyond the fitted batches along one request's verify curve" if model.get("verify_shape") else "")
               + "):\n"
               + table(cells, ["batch", "budget", "tau", "pred round", "meas round", "pred tok/s", "meas tok/s", "error"])
               + "\n\nbest budget per batch, predicted vs measured (loss = tok/s given up by the predicted pick):\n"
               + table(picks, ["batch", "predicted", "measured", "loss"]))
    return ("batched fast loop, ms per round (medians; single = the single-request fast loop's round at the same point, "
            "step = host wall time of one loop step, gap = step - round (host work the device waited for); "
            "x single = round / single; x serial = batch x single / round, tok/s against serving the batch's requests one "
            "after another (--max-batch 1); slots = the loop's max_batch; first round = cold start of the shape, graphs "
            "captured" + ("; MHz = median SM clock of the measured rounds, capped % = their samples at the power cap"
                          if clocked else "") + "):\n"
            + table(rows, head) + "\n\nbest DDTree budget per batch (output tok/s):\n"
            + table(best, ["batch", "best budget", "ddtree tok/s", "dflash tok/s", "ar tok/s"]) + checked
            + ("\n\nfailed:\n" + "\n".join(failed) if failed else ""))


def csv_text(result: dict[str, Any]) -> str:
    """The rows as CSV (COLUMNS order)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in result["rows"]:
        w.writerow(r)
    return buf.getvalue()


def batch_cli(bench_spec, batch_text: str, out, say: Callable[[str], None]) -> None:
    """bench-engine --batch: validate, load the pair (bench.load_bench_pair: --model or --shape), run,
    print the tables, write --out FILE.json and FILE.csv, and end stdout with the JSON document."""
    import json

    import typer

    from ddtree_bench.errors import UsageError
    from ddtree_bench.perf.bench import load_bench_pair
    from ddtree_bench.records import json_safe
    from ddtree_bench.results import write_json_atomic, write_text_atomic

    try:
        batches = parse_batches(batch_text)
    except ValueError as e:
        msg = str(e) if str(e).startswith("--batch") else f"--batch {batch_text!r}: expected a comma list of batch sizes, e.g. 1,2,4,8,16"
        raise UsageError(msg) from None
    target, drafter, _, info = load_bench_pair(bench_spec)
    spec = BatchBenchSpec(batches=batches, budgets=list(bench_spec.budgets), prefix_len=bench_spec.prefix_len,
                          rounds=bench_spec.rounds, graphs=bench_spec.graphs, layer_ops=bench_spec.layer_ops,
                          tau=bench_spec.tau, seed=bench_spec.seed,
                          methods=("ar", "dflash", "ddtree") if drafter is not None else ("ar",))
    result = run_batch_bench(target, drafter, spec, say)
    result["pair"] = info
    result["device"] = str(target.lm_head.weight.device)
    result["dtype"] = str(target.lm_head.weight.dtype).replace("torch.", "")
    if target.lm_head.weight.device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(target.lm_head.weight.device)
    typer.echo(render_batch(result))
    if out is not None:
        from ddtree_bench.outpaths import make_dirs

        make_dirs(out.parent)
        write_json_atomic(out, result)
        write_text_atomic(out.with_suffix(".csv"), csv_text(result))
        typer.echo(f"wrote {out} and {out.with_suffix('.csv')}")
    typer.echo(json.dumps(json_safe(result), separators=(",", ":")))
    if any("error" in r for r in result["rows"]):
        raise typer.Exit(1)
