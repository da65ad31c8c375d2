"""Interleaved repeats (sweep/order.py) and what a sweep with repeats writes: rounds of every point,
reproducible shuffles, resume by point-repeat, aggregate rows with intervals, summary.json, the closing
takeaway line, the noise columns."""

from __future__ import annotations

import csv
import json

import pytest

from ddtree_bench.errors import UsageError
from ddtree_bench.sweep import order as O
from ddtree_bench.sweep.grid import build_grid, expand, server_groups
from process_support import run_cli


def grid(**flags):
    base = {"models": "random", "suites": "smoke", "methods": "dflash,ddtree", "budgets": "8,32", "repeats": 3}
    base.update(flags)
    return build_grid(None, base)


def test_interleaved_runs_every_point_once_per_round_in_a_seeded_shuffle():
    pts = expand(grid())
    batches = O.schedule(pts, "interleaved", seed=7)
    assert len(batches) == 1  # in-process: one engine, every point interleaved
    seq = batches[0].points
    assert sorted(p.id for p in seq) == sorted(p.id for p in pts)
    rounds = [seq[i * 4:(i + 1) * 4] for i in range(3)]
    for k, r in enumerate(rounds):
        assert {p.repeat for p in r} == {k}                        # round k holds exactly the k-th repeats
        assert {(p.method, p.budget) for p in r} == {("ar", None), ("dflash", None), ("ddtree", 8), ("ddtree", 32)}
    assert [p.id for p in O.schedule(pts, "interleaved", seed=7)[0].points] == [p.id for p in seq]
    orders = {tuple(p.method + str(p.budget) for p in r) for r in rounds}
    others = {tuple(p.method + str(p.budget) for p in O.schedule(pts, "interleaved", seed=s)[0].points[:4]) for s in range(8)}
    assert len(orders) > 1 or len(others) > 1  # shuffled, not the listed order every time
    with pytest.raises(ValueError):
        O.schedule(pts, "interleaved", seed=None)


def test_as_listed_keeps_the_expansion_order_and_one_repeat_is_never_shuffled():
    pts = expand(grid())
    assert [[p.id for p in b.points] for b in O.schedule(pts, "as-listed")] == [[p.id for p in g] for _, g in server_groups(pts)]
    one = expand(grid(repeats=1))
    assert [p.id for b in O.schedule(one, "interleaved", seed=3) for p in b.points] == [p.id for p in one]
    with pytest.raises(UsageError):
        O.schedule(pts, "sideways", seed=1)
    with pytest.raises(UsageError):
        grid(order="sideways")


def test_server_points_interleave_within_their_group_and_rounds_cycle_the_groups():
    pts = expand(grid(backends="standalone", concurrency="1,2"))
    inter = O.schedule(pts, "interleaved", seed=1)
    assert len(inter) == 4  # one server start per server group, as before
    for b in inter:
        assert len({p.server_key() for p in b.points}) == 1
        assert [p.repeat for p in b.points] == [0, 0, 1, 1, 2, 2]  # the group's points in rounds
    rounds = O.schedule(pts, "rounds", seed=1)
    assert len(rounds) == 12 and [b.round for b in rounds] == [0] * 4 + [1] * 4 + [2] * 4  # a server start per group per round
    for b in rounds:
        assert len({p.server_key() for p in b.points}) == 1 and {p.repeat for p in b.points} == {b.round}


def test_a_sweep_without_a_recorded_seed_resumes_in_the_listed_order():
    g = grid()
    g.order_seed = None
    assert O.effective_order(g, expand(g)) == "as-listed"
    O.fix_seed(g)
    assert isinstance(g.order_seed, int) and O.effective_order(g, expand(g)) == "interleaved"


@pytest.mark.slow
def test_a_sweep_with_repeats_writes_intervals_aggregates_noise_and_resumes_by_point_repeat(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", "--models", "random", "--suites", "smoke", "--methods", "ddtree", "--budgets", "8",
            "--limit", "3", "--max-new-tokens", "5", "--repeats", "2", "--order-seed", "11", "--out", str(out),
            "--no-report", "-q"]
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "speedup [95% CI]" in printed and "over 2 repeats" in printed
    last = [ln for ln in printed.splitlines() if ln.startswith("takeaway")]
    assert len(last) == 1 and ("fastest is" in last[0] or "indistinguishable" in last[0])

    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["version"] == 2 and sweep["grid"]["order_seed"] == 11 and sweep["schedule"]["order"] == "interleaved"
    ran = [pid for b in sweep["schedule"]["batches"] for pid in b]
    assert sorted(ran) == sorted(p["id"] for p in sweep["points"])
    with open(out / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    per, agg = [r for r in rows if r["repeat"] != "all"], [r for r in rows if r["repeat"] == "all"]
    assert len(per) == 4 and len(agg) == 2 and {r["method"] for r in agg} == {"ar", "ddtree"}
    for r in agg:
        lo, est, hi = (float(r[k]) for k in ("output_throughput_tok_s_ci_low", "output_throughput_tok_s", "output_throughput_tok_s_ci_high"))
        assert 0.0 <= lo <= est <= hi and r["repeats_ok"] == "2" and r["status"] == "ok"
        slo, sp, shi = (float(r[k]) for k in ("speedup_vs_ar_ci_low", "speedup_vs_ar", "speedup_vs_ar_ci_high"))
        assert slo <= sp <= shi
    ar_agg = next(r for r in agg if r["method"] == "ar")
    assert float(ar_agg["speedup_vs_ar_ci_low"]) == pytest.approx(1.0) == float(ar_agg["speedup_vs_ar_ci_high"])
    for r in per:
        assert r["speedup_vs_ar_ci_low"] != "" and r["output_throughput_tok_s_ci_low"] == ""  # one repeat: no tok/s interval
        assert r["heavy_load"] in ("True", "False") and float(r["load_avg_1m_before"]) >= 0 and float(r["cpu_mhz_before"] or 1) > 0
    status = json.loads((out / "points" / per[0]["point_id"] / "status.json").read_text())
    assert {"before", "after", "other_cpu_cores", "heavy_load"} <= set(status["noise"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "ddtree-bench-sweep-summary" and summary["intervals"]["resamples"] == 2000
    assert len(summary["rows"]) == 6 and summary["takeaways"][0]["sentence"] in last[0]

    # resume: remove one finished point-repeat; only that one runs again
    victim = next(r["point_id"] for r in per if r["method"] == "ddtree" and r["repeat"] == "1")
    (out / "points" / victim / "summary.json").unlink()
    before = {r["point_id"]: (out / "points" / r["point_id"] / "records.jsonl").stat().st_mtime_ns for r in per}
    assert run_cli(["sweep", "--resume", str(out), "--no-report", "-q"]) == 0
    after = {pid: (out / "points" / pid / "records.jsonl").stat().st_mtime_ns for pid in before}
    assert [pid for pid in before if before[pid] != after[pid]] == [victim]
    with open(out / "summary.csv", newline="") as f:
        assert sum(1 for r in csv.DictReader(f) if r["repeat"] == "all") == 2


@pytest.mark.parametrize("order", ["interleaved", "rounds"])
def test_no_configuration_runs_its_repeats_back_to_back_where_rounds_meet(order):
    """Issue 33: two shuffled rounds could meet on the same point (its repeats then share one slow minute).
    Interleaved server points stay within their server group, so a group of one configuration (a
    standalone AR server) can only run its repeats back to back: there only `rounds` separates them."""
    for flags in ({"repeats": 2}, {"repeats": 3, "methods": "ddtree", "budgets": "8"},
                  {"repeats": 2, "backends": "standalone", "budgets": "8"}):
        pts = expand(grid(**flags))
        for seed in range(60):
            batches = O.schedule(pts, order, seed=seed)
            assert sorted(p.id for b in batches for p in b.points) == sorted(p.id for p in pts)
            seqs = [[p for b in batches for p in b.points]] if order == "rounds" else \
                [b.points for b in batches if len({(p.method, p.budget) for p in b.points}) > 1]
            for a, b in ((a, b) for seq in seqs for a, b in zip(seq, seq[1:])):
                same = (a.method, a.budget, a.backend) == (b.method, b.budget, b.backend)
                assert not same, (order, flags, seed, a.id, b.id)
