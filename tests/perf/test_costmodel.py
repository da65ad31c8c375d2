"""The cost model on synthetic curves whose best budget can be worked out by hand, and on the
issue's H200 anchor curve (Qwen3-8B shape, bf16, CUDA graphs, 1024-token prefix); its calibration
on stage totals of real rounds and on per-round medians with a budget left out; and the batched model (issue 19), whose best budget per concurrency
is worked out by hand below."""

from __future__ import annotations

import math

import pytest

from ddtree_bench.perf.costmodel import (
    BatchRoundPoint,
    BatchStageCosts,
    CostModel,
    Curve,
    RoundSample,
    RoundTimes,
    best,
    best_per_batch,
    break_even_tau,
    calibrate,
    calibrate_batched,
    calibrate_medians,
    held_out_predictions,
    parse_points,
    predict_batched,
)
from ddtree_bench.errors import UsageError

H200_8B_VERIFY_MS = {1: 4.87, 16: 6.09, 64: 6.36, 128: 6.88, 256: 9.03, 512: 15.3, 1024: 29.9}
PAPER_TAU_8B_MATH500 = {16: 8.6, 32: 9.3, 64: 9.75, 128: 10.2, 256: 10.4, 512: 10.73, 1024: 11.0}  # Fig. 3, read off


def test_curve_interpolates_and_extends_linearly():
    c = Curve({1: 1.0, 11: 2.0, 21: 4.0})
    assert c(1) == 1.0 and c(11) == 2.0
    assert c(6) == pytest.approx(1.5)
    assert c(16) == pytest.approx(3.0)
    assert c(31) == pytest.approx(6.0)       # slope of the last segment
    assert c(0) == pytest.approx(0.9)        # slope of the first segment
    assert Curve({5: 3.0})(1000) == 3.0


def test_flat_verify_makes_the_largest_budget_best():
    # verify cost flat in tokens: more budget only adds acceptance -> the largest budget wins
    m = CostModel(Curve({1: 10.0, 2000: 10.0}), draft_ms=1.0, overhead_ms=Curve({16: 0.0}))
    preds = m.sweep({16: 3.0, 64: 4.0, 256: 5.0})
    assert best(preds).budget == 256
    assert preds[2].speedup == pytest.approx(5.0 * 10.0 / 11.0)


def test_linear_verify_with_concave_tau_has_an_interior_optimum():
    # T_round(B) = 1 + 1 + 0.01 B ms; tau(B) = ln(B). tok/s ~ ln B / (2 + 0.01 B) peaks where
    # d/dB = 0:  (2 + 0.01 B) / B = 0.01 ln B, i.e. 200 / B + 1 = ln B  ->  B* ~ 63; on the grid:
    # 32 -> 3.466 / 2.32 = 1.494, 64 -> 4.159 / 2.64 = 1.575, 128 -> 4.852 / 3.28 = 1.479
    m = CostModel(Curve({1: 1.0, 1025: 1.0 + 0.01 * 1024}), draft_ms=1.0, overhead_ms=Curve({1: 0.0}), ar_ms=1.0)
    budgets = [16, 32, 64, 128, 256, 512, 1024]
    preds = m.sweep(Curve({b: math.log(b) for b in budgets}), budgets)
    by_b = {p.budget: p for p in preds}
    expect = {b: math.log(b) / (1.0 + (1.0 + 0.01 * b)) for b in budgets}
    assert max(expect, key=expect.get) == best(preds).budget == 64
    for b in budgets:
        assert by_b[b].tok_s == pytest.approx(1000 * expect[b], rel=1e-9)


def test_overhead_moves_the_optimum_and_break_even():
    verify = Curve({1: 5.0, 17: 6.0, 65: 6.5, 257: 9.0, 1025: 30.0})
    tau = {16: 6.0, 64: 7.0, 256: 7.5, 1024: 7.8}
    cheap = CostModel(verify, 1.0, Curve({16: 0.1}))
    costly = CostModel(verify, 1.0, Curve({16: 0.1, 64: 1.5, 256: 6.0, 1024: 30.0}))
    # cheap: 16 -> 6 / 7.1 = 0.845, 64 -> 7 / 7.6 = 0.921, 256 -> 7.5 / 10.1; costly: 64 -> 7 / 9 = 0.778
    assert best(cheap.sweep(tau)).budget == 64
    assert best(costly.sweep(tau)).budget == 16
    assert break_even_tau(cheap, 16) == pytest.approx((1.0 + 0.1 + cheap.verify_ms(17)) / 5.0)


def test_h200_anchor_with_paper_tau_prefers_a_middle_budget():
    """On the issue's H200 curve the paper's tau(B) buys most at B = 64 (9.75 / 7.57 ms beats
    10.2 / 8.10 ms at 128): past 128 the verify cost grows faster than tau. The speedups are the
    model's, not a measurement."""
    m = CostModel(Curve(H200_8B_VERIFY_MS), draft_ms=1.0, overhead_ms=Curve({16: 0.2}))
    preds = m.sweep(PAPER_TAU_8B_MATH500)
    assert best(preds).budget == 64
    assert m.ar().tok_s == pytest.approx(1000 / 4.87)
    by_b = {p.budget: p for p in preds}
    assert by_b[1024].speedup < by_b[16].speedup < by_b[128].speedup


def test_parse_points():
    assert parse_points("16:6.1, 32:6.6") == {16: 6.1, 32: 6.6}
    with pytest.raises(UsageError):
        parse_points("16=6")
    with pytest.raises(UsageError):
        parse_points(" , ")


# ---------------------------------------------------------------------------- calibrated on rounds as they run


def test_calibrate_pools_per_round_means_of_real_rounds():
    """Draft pooled over the DDTree samples by their rounds; verify(1 + B) and the overhead (all the
    rest of the round) per budget; the AR round; means, so a generation's tok/s is reproduced."""
    samples = [
        RoundSample("ar", 0, 100, 100, {"verify": 300.0, "commit": 20.0}),
        RoundSample("dflash", 15, 40, 160, {"draft": 48.0, "tree_build": 4.0, "verify": 160.0, "commit": 8.0}),
        RoundSample("ddtree", 16, 10, 45, {"draft": 10.0, "tree_build": 5.0, "verify": 40.0, "commit": 2.0}),
        RoundSample("ddtree", 64, 30, 150, {"draft": 42.0, "tree_build": 30.0, "verify": 150.0, "commit": 6.0}),
    ]
    m = calibrate(samples)
    assert m.draft_ms == pytest.approx((10.0 + 42.0) / 40)                 # not DFlash's 1.2
    assert m.verify_ms(1) == pytest.approx(3.0) and m.verify_ms(16) == pytest.approx(4.0)
    assert m.verify_ms(17) == pytest.approx(4.0) and m.verify_ms(65) == pytest.approx(5.0)
    assert m.overhead_ms(16) == pytest.approx(0.7) and m.overhead_ms(64) == pytest.approx(1.2)
    assert m.t_ar == pytest.approx(3.2)
    # at B = 16 the sample's own rounds: 45 tokens in 57 ms of rounds -> the model says 789.5 tok/s
    # if the draft cost were that sample's; pooled draft 1.3 ms makes the round 1.3 + 0.7 + 4.0 = 6.0 ms
    p = m.predict(16, 4.5)
    assert p.round_ms == pytest.approx(6.0) and p.tok_s == pytest.approx(750.0)
    assert p.speedup == pytest.approx(4.5 * 3.2 / 6.0)


def test_calibrate_uses_means_so_a_slow_first_round_counts():
    """A generation whose first round (the draft over the whole prompt) is 10x the others: tok/s is
    tokens over the summed round time, which the per-round mean reproduces and a median would not."""
    round_ms = [20.0] + [2.0] * 9
    s = RoundSample("ddtree", 32, 10, 40, {"draft": 0.5 * sum(round_ms), "verify": 0.4 * sum(round_ms),
                                             "commit": 0.1 * sum(round_ms)})
    m = calibrate([s])
    measured_tok_s = 40 / (sum(round_ms) / 1000)
    assert m.predict(32, s.tau).tok_s == pytest.approx(measured_tok_s)
    assert 1000 * s.tau / sorted(round_ms)[5] > 1.5 * measured_tok_s     # what a median round would claim


def test_calibrate_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="no samples"):
        calibrate([])
    with pytest.raises(ValueError, match="no rounds"):
        calibrate([RoundSample("ddtree", 16, 0, 0, {})])
    with pytest.raises(ValueError, match="draft cost"):
        calibrate([RoundSample("ar", 0, 5, 5, {"verify": 5.0})])


def _rounds(n: int, **stages: float) -> list[dict[str, float]]:
    return [dict(stages) for _ in range(n)]


# verify 2 ms + 0.01 ms a token, draft 3 ms, overhead 0.5 ms + 0.002 ms a node: every budget's rounds
# lie on these lines, so a budget left out is predicted exactly from its neighbours
def _line_samples(budgets: list[int], spike: bool = False) -> list[RoundTimes]:
    out = [RoundTimes("ar", 0, _rounds(20, verify=2.01, commit=0.1)),
           RoundTimes("dflash", 15, _rounds(20, draft=3.0, tree_build=0.2, verify=2.16, commit=0.3))]
    for b in budgets:
        rounds = _rounds(9, draft=3.0, tree_build=0.3 + 0.002 * b, verify=2.0 + 0.01 * (1 + b), commit=0.2)
        if spike:   # one round in nine slowed 10x by another process: the medians ignore it
            rounds[4] = {k: 10 * v for k, v in rounds[4].items()}
        out.append(RoundTimes("ddtree", b, rounds))
    return out


def test_calibrate_medians_reads_each_stage_per_round_and_ignores_a_spike():
    m = calibrate_medians(_line_samples([16, 64, 256], spike=True))
    assert m.draft_ms == pytest.approx(3.0)                               # DDTree's, not DFlash's
    assert m.verify_ms(1) == pytest.approx(2.01) and m.verify_ms(16) == pytest.approx(2.16)
    assert m.verify_ms(65) == pytest.approx(2.65) and m.verify_ms(257) == pytest.approx(4.57)
    assert m.overhead_ms(64) == pytest.approx(0.5 + 0.128)               # tree_build + commit, not draft or verify
    assert m.t_ar == pytest.approx(2.11)
    assert m.predict(64, 5.0).round_ms == pytest.approx(3.0 + 0.628 + 2.65)
    means = calibrate_medians(_line_samples([16, 64, 256], spike=True), statistic="mean")
    assert means.draft_ms == pytest.approx((8 * 3.0 + 30.0) / 9)             # the slow round counted
    assert means.verify_ms(65) == pytest.approx((8 * 2.65 + 26.5) / 9)


def test_leaving_a_budget_out_predicts_it_from_the_others_not_from_its_own_rounds():
    budgets = [16, 32, 64, 128]
    samples = _line_samples(budgets)
    samples[-2] = RoundTimes("ddtree", 64, _rounds(9, draft=3.0, tree_build=5.0, verify=9.0, commit=0.2))  # B=64 off the line
    tau = {16: 4.0, 32: 4.5, 64: 5.0, 128: 5.4}
    held = {p.budget: p for p in held_out_predictions(samples, tau, budgets)}
    on_line = 3.0 + (0.5 + 0.002 * 64) + (2.0 + 0.01 * 65)   # interpolated between 32 and 128
    assert held[64].round_ms == pytest.approx(on_line)
    assert held[64].tok_s == pytest.approx(1000 * 5.0 / on_line)
    assert calibrate_medians(samples).predict(64, 5.0).round_ms == pytest.approx(3.0 + 5.2 + 9.0)   # circular: its own
    # the off-line point does bend its neighbours' held-out predictions (it is in their calibration)
    assert held[32].round_ms != pytest.approx(3.0 + 0.564 + 2.33)
    with pytest.raises(ValueError, match="no rounds"):
        calibrate_medians([RoundTimes("ddtree", 16, [])])
    with pytest.raises(ValueError, match="draft cost"):
        calibrate_medians([RoundTimes("ar", 0, _rounds(3, verify=1.0)), RoundTimes("ddtree", 16, _rounds(3, draft=1.0))],
                          leave_out=16)


# ---------------------------------------------------------------------------- batched (issue 19)

# verify flat at 5 ms up to 200 query tokens, then 0.02 ms a token; draft 1 ms + 0.1 ms per extra request;
# 0.2 ms fixed and 0.1 ms per request of overhead a round; AR 0.05 ms per request
BATCH_COSTS = BatchStageCosts(verify_ms=Curve({1: 5.0, 200: 5.0, 2200: 45.0}), draft_ms=Curve({1: 1.0, 16: 2.5}),
                              overhead_fixed_ms=Curve({0: 0.2}), overhead_per_request_ms=Curve({16: 0.1}),
                              ar_overhead_per_request_ms=0.05)
BATCH_TAU = {16: 4.0, 32: 4.6, 64: 5.1, 128: 5.5}


def test_batched_round_is_draft_plus_verify_of_the_concatenated_trees_plus_per_request_overhead():
    preds = {(p.batch, p.budget): p for p in predict_batched(BATCH_COSTS, BATCH_TAU, [1, 4, 8], sorted(BATCH_TAU))}
    p = preds[(8, 64)]      # n = 8 * 65 = 520 tokens: 5 + 0.02 * 320 = 11.4 ms; draft 1.7; overhead 0.2 + 0.8
    assert (p.verify_ms, p.draft_ms, p.overhead_ms) == pytest.approx((11.4, 1.7, 1.0))
    assert p.round_ms == pytest.approx(14.1)
    assert p.tok_s == pytest.approx(1000 * 8 * 5.1 / 14.1) and p.tok_s_per_request == pytest.approx(p.tok_s / 8)
    assert p.ar_tok_s == pytest.approx(1000 * 8 / (5.0 + 0.2 + 8 * 0.05))   # AR at batch 8: 8 tokens a 5.6 ms round
    assert p.speedup == pytest.approx(p.tok_s / p.ar_tok_s)
    assert preds[(1, 16)].round_ms == pytest.approx(1.0 + 5.0 + 0.3)


def test_the_best_budget_shrinks_with_concurrency_once_verify_is_compute_bound():
    """By hand, tau / round ms: C = 1: every tree fits the flat part (6.3 ms) -> the largest tau, B = 128;
    C = 4: 4 / 6.9, 4.6 / 6.9, 5.1 / 8.1, 5.5 / 13.22 -> B = 32; C = 8: 4 / 7.7 = 0.519 beats
    4.6 / 8.98 = 0.512 -> B = 16."""
    best_of = best_per_batch(predict_batched(BATCH_COSTS, BATCH_TAU, [1, 4, 8], sorted(BATCH_TAU)))
    assert {c: p.budget for c, p in best_of.items()} == {1: 128, 4: 32, 8: 16}


def test_calibrate_batched_recovers_the_costs_and_predicts_a_batch_it_did_not_see():
    """Points measured from BATCH_COSTS at batches 1, 2, 8 (AR and three budgets): the fitted costs
    predict batch 4 as the true costs do (verify interpolated in total tokens, draft in C, overhead a
    line in C per budget)."""
    def point(c, b):
        if b == 0:
            return BatchRoundPoint(c, 0, 0.0, BATCH_COSTS.verify_ms(c), 0.2 + 0.05 * c)
        return BatchRoundPoint(c, b, BATCH_COSTS.draft_ms(c), BATCH_COSTS.verify_ms(c * (1 + b)), 0.2 + 0.1 * c)

    budgets = [16, 32, 64]
    fitted = calibrate_batched([point(c, b) for c in (1, 2, 8) for b in [0] + budgets])
    assert fitted.overhead_fixed_ms(32) == pytest.approx(0.2) and fitted.overhead_per_request_ms(32) == pytest.approx(0.1)
    assert fitted.ar_overhead_per_request_ms == pytest.approx(0.05)
    want = predict_batched(BATCH_COSTS, BATCH_TAU, [4], budgets)
    got = predict_batched(fitted, BATCH_TAU, [4], budgets)
    # exact where batch 4's n = 68, 132 lie on one linear piece of the fitted points; at n = 260 the true
    # kink (200 tokens) falls between fitted points 130 and 264: 6.24 ms for 6.2
    for w, g in zip(want, got):
        assert g.round_ms == pytest.approx(w.round_ms, rel=0.01) and g.ar_tok_s == pytest.approx(w.ar_tok_s)
    assert [g.round_ms for g in got[:2]] == pytest.approx([w.round_ms for w in want[:2]], rel=1e-9)
    with pytest.raises(ValueError, match="no points"):
        calibrate_batched([])
    with pytest.raises(ValueError, match="draft cost"):
        calibrate_batched([point(1, 0)])


def test_a_curve_follows_its_shape_outside_its_points_and_its_points_inside():
    shape = Curve({1: 10.0, 100: 20.0, 1000: 200.0})   # bends upward past 100
    c = Curve({10: 3.0, 100: 4.0}, beyond=shape)
    assert c(50) == pytest.approx(3.0 + (50 - 10) / 90)               # inside: its own points
    assert c(1000) == pytest.approx(4.0 + 200.0 - 20.0)               # past the last point: the shape's rise from 100
    assert c(1) == pytest.approx(3.0 + 10.0 - shape(10))              # before the first: the shape's change from 10
    assert Curve({10: 3.0, 100: 4.0})(1000) == pytest.approx(4.0 + 900 / 90)   # without a shape: the last segment's slope
