"""bench-engine --batch on the CPU with the random tiny pair: one row per (batch, method point) with
every stage of the batched fast loop, tok/s that follow from tau and the round time, the given tau
used where given, the best budget per batch, JSON (last stdout line and --out) and CSV beside it;
a bad --batch exits 2; the cost-model check (leave one batch out) on rows made from known costs."""

from __future__ import annotations

import csv
import json
import math

import pytest

from ddtree_bench.engine.gpu.loop import ROUND_STAGES
from ddtree_bench.perf.bench_batch import model_check, parse_batches
from engine_support import one_torch_thread  # noqa: F401 (fixture)
from process_support import cli_json, run_cli


def test_batch_table_rows_and_sane_numbers(tmp_path, capsys):
    out = tmp_path / "bb.json"
    text, res, last = cli_json(capsys, "bench-engine", "--model", "random", "--batch", "1,3", "--budgets", "4,16", "--prefix-len",
                               "12", "--rounds", "3", "--tau", "16:2.5", out=out)
    assert last["rows"] == res["rows"]
    assert "batched fast loop" in text and "best DDTree budget per batch" in text
    got = {(r["batch"], r["method"], r["budget"]) for r in res["rows"]}
    assert got == {(b, m, k) for b in (1, 3) for m, k in (("ar", None), ("dflash", None), ("ddtree", 4), ("ddtree", 16))}
    # batch 1 also in a loop of 3 slots (serve --max-batch 3 at concurrency 1): 4 points x (1 of 1, 1 of 3, 3 of 3)
    assert sorted((r["batch"], r["max_batch"]) for r in res["rows"]) == [(1, 1)] * 4 + [(1, 3)] * 4 + [(3, 3)] * 4
    for r in res["rows"]:
        want = ["verify", "walk", "commit"] if r["method"] == "ar" else list(ROUND_STAGES)
        assert all(r[f"{s}_ms"] > 0 for s in want), r
        assert r["rounds"] == 3 and r["bucket"] == r["batch"]   # every measured round ran the whole batch
        # round = the median of per-round sums, each stage its own median: on a loaded CPU a preemption lands in some
        # stage of most rounds, so the two agree in size only
        assert sum(r[f"{s}_ms"] for s in want) / 2 <= r["round_ms"] <= 4 * sum(r[f"{s}_ms"] for s in want)
        assert r["single_round_ms"] > 0 and r["x_single"] == pytest.approx(r["round_ms"] / r["single_round_ms"])
        assert r["x_serial"] == pytest.approx(r["batch"] / r["x_single"])   # tok/s against --max-batch 1 serving them in turn
        assert r["tok_s"] == pytest.approx(r["batch"] * r["tau"] / r["round_ms"] * 1e3)
        assert r["tok_s_per_request"] == pytest.approx(r["tok_s"] / r["batch"])
        assert r["first_round_ms"] > 0 and math.isfinite(r["tok_s"])
        # a step runs ahead of the round it reads (DFlash / DDTree: the NEXT round's draft, AR: the whole next round,
        # on a CPU as host time), so either can be the larger: gap is their difference, whatever its sign
        assert r["step_ms"] > 0 and r["gap_ms"] == pytest.approx(r["step_ms"] - r["round_ms"])
        if r["method"] == "ar":
            assert r["tau"] == 1.0
        elif r["budget"] == 16:
            assert (r["tau"], r["tau_source"]) == (2.5, "given")
        else:
            assert r["tau_source"] == "measured" and 1.0 <= r["tau"] <= 16
    assert [b["batch"] for b in res["best"]] == [1, 3] and all(b["best_budget"] in (4, 16) for b in res["best"])
    assert "cost model vs measured" in text and res["model"]["fit"] == "leave-one-batch-out"
    # one request's verify at every n of the grid (AR: the batch; DDTree: batch x (1 + B)), the model's shape
    assert set(res["verify_shape_ms"]) == {str(n) for n in (1, 3, 5, 17, 15, 51)} or \
        set(res["verify_shape_ms"]) == {1, 3, 5, 17, 15, 51}
    assert all(v > 0 for v in res["verify_shape_ms"].values()) and res["model"]["verify_shape"]
    assert "along one request's verify curve" in text
    assert {(c["batch"], c["budget"]) for c in res["model"]["cells"]} == {(b, k) for b in (1, 3) for k in (4, 16)}
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res["rows"]) and {"tok_s", "verify_ms", "first_round_ms", "x_serial", "step_ms",
                                              "gap_ms"} <= set(rows[0])
    assert "x serial" in text and "gap = step - round" in text
    assert all(r["sm_clock_mhz"] is None and r["power_capped_share"] is None for r in res["rows"])   # no GPU, no clock
    assert "MHz" not in text and {"sm_clock_mhz", "power_capped_share"} <= set(rows[0])


def test_a_batch_row_gets_the_clock_of_its_measured_rounds(tmp_path):
    """With a sampler (CUDA's nvidia-smi; here the stand-in), the row's clock is from samples inside its measured
    rounds only, and the table gains its MHz and capped % columns."""
    from nvsmi_support import fake_nvidia_smi

    from ddtree_bench.engine.loading import random_pair
    from ddtree_bench.noise.gpu_clocks import ClockSampler
    from ddtree_bench.perf.bench_batch import BatchBenchSpec, batch_row, render_batch

    target, drafter = random_pair(seed=1)
    spec = BatchBenchSpec(batches=[2], budgets=[4], prefix_len=12, rounds=30, single=False, verify_shape=False)
    import time

    with ClockSampler(None, 20, exe=fake_nvidia_smi(tmp_path)) as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.samples) < 3 and time.monotonic() < deadline:   # samples before the row starts
            time.sleep(0.01)
        row = batch_row(target, drafter, "ddtree", 4, 2, spec, None, sampler)
    (lo, hi), = sampler.spans["ddtree:4:2:2"]
    inside = [x.sm_clock_mhz for x in sampler.samples if lo <= x.t_s <= hi]
    assert inside and min(inside) <= row["sm_clock_mhz"] <= max(inside) and 0 < row["power_capped_share"] < 1
    assert min(x.t_s for x in sampler.samples) < lo   # samples before the measured rounds (captures) left out
    text = render_batch({"rows": [row], "best": [], "model": None})
    assert "MHz = median SM clock of the measured rounds" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("2 "))
    assert line.split()[-2:] == [str(round(row["sm_clock_mhz"])), str(round(100 * row["power_capped_share"]))]


def test_parse_batches_and_bad_batch_exits_2(capsys):
    assert parse_batches("16,1, 4,2,8") == [1, 2, 4, 8, 16]
    assert run_cli(["bench-engine", "--model", "random", "--batch", "1,,2"]) == 2
    assert run_cli(["bench-engine", "--model", "random", "--batch", "0,2"]) == 2
    assert run_cli(["bench-engine", "--model", "random", "--batch", "two"]) == 2
    err = capsys.readouterr().err
    assert "--batch" in err and "Traceback" not in err


def known_rows(bump: dict | None = None) -> list[dict]:
    """Rows from costs the batched model can represent: verify 5 + 0.01 n (n = C(1 + B)), draft 1 + 0.2 C,
    overhead 0.5 + 0.01 B + 0.1 C (AR 0.3 + 0.02 C); `bump` multiplies one (C, B) round."""
    tau = {16: 3.0, 32: 3.5}
    rows = []
    for c in (1, 2, 4, 8):
        v = 5 + 0.01 * c
        rows.append({"batch": c, "method": "ar", "budget": None, "verify_ms": v, "round_ms": v + 0.3 + 0.02 * c,
                     "tau": 1.0, "tok_s": 1000 * c / (v + 0.3 + 0.02 * c)})
        for b, t in tau.items():
            d, v = 1 + 0.2 * c, 5 + 0.01 * c * (1 + b)
            r = (d + v + 0.5 + 0.01 * b + 0.1 * c) * (bump or {}).get((c, b), 1.0)
            rows.append({"batch": c, "method": "ddtree", "budget": b, "draft_ms": d, "verify_ms": v, "round_ms": r,
                         "tau": t, "tok_s": 1000 * c * t / r})
    rows.append({"batch": 2, "method": "ddtree", "budget": 64, "error": "OOM"})   # failed rows are left out
    return rows


def test_model_check_predicts_rows_it_did_not_see():
    got = model_check(known_rows())
    assert got["fit"] == "leave-one-batch-out" and len(got["cells"]) == 8
    for c in got["cells"]:
        assert c["pred_round_ms"] == pytest.approx(c["meas_round_ms"], rel=1e-9) and abs(c["error"]) < 1e-9
    assert all(b["pred_best_budget"] == b["meas_best_budget"] and b["loss"] == pytest.approx(0) for b in got["best"])


def test_model_check_reports_a_wrong_pick_and_its_loss():
    rows = known_rows(bump={(8, 32): 1.5})   # batch 8's budget 32 measured slower than the other batches predict
    got = model_check(rows)
    at8 = {c["budget"]: c for c in got["cells"] if c["batch"] == 8}
    assert at8[32]["error"] == pytest.approx(0.5) and at8[16]["error"] == pytest.approx(0, abs=1e-9)
    meas = {r["budget"]: r["tok_s"] for r in rows if r["batch"] == 8 and r["method"] == "ddtree"}
    best8 = next(b for b in got["best"] if b["batch"] == 8)
    assert (best8["pred_best_budget"], best8["meas_best_budget"]) == (32, 16)
    assert best8["loss"] == pytest.approx(1 - meas[32] / meas[16]) and best8["loss"] > 0.2
    one = model_check([r for r in rows if r["batch"] == 4])
    assert one["fit"] == "in-sample" and {c["batch"] for c in one["cells"]} == {4}


def test_the_verify_shape_carries_the_model_past_the_batches_it_was_fitted_on():
    """Verify bends upward with tokens (0.01 n + 2e-5 n^2, as a forward turns compute-bound): fitted on batches 1-4, a
    straight extension of their points predicts batch 8 at B = 32 (n = 264) 4% short; along one request's verify curve
    (the same function) it predicts batch 8 exactly, and batches inside the fitted range do not move."""
    def verify(n):
        return 5 + 0.01 * n + 2e-5 * n * n

    rows = known_rows()
    for r in rows:
        if "error" not in r:
            n = r["batch"] * (1 + (r["budget"] or 0))
            r["round_ms"] += verify(n) - r["verify_ms"]
            r["verify_ms"] = verify(n)
            r["tok_s"] = 1000 * r["batch"] * r["tau"] / r["round_ms"]
    shape = {n: verify(n) for n in {c * (1 + b) for c in (1, 2, 4, 8) for b in (0, 16, 32)}}
    straight, shaped = model_check(rows), model_check(rows, shape)
    at = lambda got, c: {x["budget"]: x for x in got["cells"] if x["batch"] == c}  # noqa: E731
    assert at(straight, 8)[32]["error"] > 0.03   # n = 264, twice the fitted 132: tok/s over-predicted, the round short
    assert all(abs(x["error"]) < 1e-9 for x in at(shaped, 8).values())
    assert shaped["verify_shape"] and not straight["verify_shape"]
    for c in (2, 4):   # inside the range the fitted points decide, shape or not
        assert [x["pred_round_ms"] for x in at(shaped, c).values()] == pytest.approx(
            [x["pred_round_ms"] for x in at(straight, c).values()])


def test_a_verify_shape_that_cannot_be_timed_leaves_the_straight_model_and_says_so(tmp_path, capsys, monkeypatch):
    """The shape is timed after the grid (one more forward per n, the largest at max batch x (1 + B) tokens): if that
    fails (memory, a kernel), the rows and the model still come out, extended along the fitted points as before."""
    from ddtree_bench.perf import bench_batch

    def boom(*a, **k):
        raise RuntimeError("CUDA out of memory (stand-in)")

    monkeypatch.setattr(bench_batch, "verify_shape_ms", boom)
    out = tmp_path / "bb.json"
    assert run_cli(["bench-engine", "--model", "random", "--batch", "1,2", "--budgets", "4", "--prefix-len", "12",
                    "--rounds", "2", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    res = json.loads(out.read_text())
    assert res["verify_shape_ms"] is None and res["model"]["verify_shape"] is False and res["model"]["cells"]
    assert "along one request's verify curve" not in cap.out
    assert "verify shape: RuntimeError: CUDA out of memory (stand-in)" in cap.err
