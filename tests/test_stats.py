"""Confidence intervals (ddtree_bench/stats.py, metrics.*_interval) against cases with known answers,
and the takeaway rule that names a winner only when intervals separate (noise/verdict.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddtree_bench import metrics, stats
from ddtree_bench.records import RequestRecord


def rec(pid: str, e2e_ms: float, n: int = 10, t0_ms: float = 0.0, turn: int = 0, ok: bool = True) -> RequestRecord:
    t0 = int(t0_ms * 1e6)
    return RequestRecord(prompt_id=pid, turn=turn, num_output_tokens=n, t_send_ns=t0, t_first_token_ns=t0 + 1,
                         t_done_ns=t0 + int(e2e_ms * 1e6), error=None if ok else "boom")


# ---------------------------------------------------------------------------- the bootstrap


def test_identical_samples_give_a_zero_width_interval():
    iv = stats.mean_interval([3.5] * 20)
    assert iv.estimate == iv.low == iv.high == 3.5
    ratio = stats.paired_ratio_interval([[2.0] * 8], [[1.0] * 8])
    assert ratio.estimate == ratio.low == ratio.high == 2.0
    assert stats.repeat_mean_interval([7.0, 7.0, 7.0]).low == 7.0 == stats.repeat_mean_interval([7.0, 7.0]).high


def test_a_shifted_distribution_excludes_one_and_a_centred_one_does_not():
    rng = np.random.default_rng(1)
    shifted = rng.normal(1.3, 0.1, size=40)
    iv = stats.mean_interval(shifted)
    assert iv.excludes(1.0) and iv.low > 1.0 and iv.low < 1.3 < iv.high
    centred = stats.mean_interval(rng.normal(1.0, 0.1, size=40))
    assert not centred.excludes(1.0)


def test_the_interval_records_its_method_and_reproduces_from_its_seed():
    x = list(np.random.default_rng(2).normal(size=25))
    a, b, c = stats.mean_interval(x), stats.mean_interval(x), stats.mean_interval(x, seed=5)
    assert a == b and a != c
    assert (a.method, a.level, a.resamples, a.seed, a.n) == (stats.BOOTSTRAP, 0.95, 2000, 0, 25)
    assert stats.Interval.from_dict(a.to_dict()) == a
    assert stats.mean_interval([1.0]) is None  # one sample: no spread to resample


def test_bootstrap_coverage_on_a_synthetic_normal_is_near_the_level():
    """200 datasets of 30 draws from N(5, 2): the 95% percentile interval should cover 5 in ~95%."""
    rng = np.random.default_rng(123)
    hits = sum(stats.mean_interval(rng.normal(5.0, 2.0, 30), resamples=500, seed=i).excludes(5.0) is False
               for i in range(200))
    assert 0.88 <= hits / 200 <= 0.99


def test_student_t_over_repeats_covers_where_a_three_value_bootstrap_does_not():
    """Why tok/s over repeats uses t: at n = 3 the bootstrap cannot leave [min, max]."""
    rng = np.random.default_rng(7)
    t_hits = boot_hits = 0
    trials = 400
    for i in range(trials):
        x = rng.normal(100.0, 10.0, 3)
        t_hits += not stats.repeat_mean_interval(x).excludes(100.0)
        boot_hits += not stats.mean_interval(x, resamples=300, seed=i).excludes(100.0)
    assert 0.91 <= t_hits / trials <= 0.99
    assert boot_hits / trials < 0.8


def test_t_quantiles_match_the_tables():
    for df, q in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert stats.t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)
    assert stats.t_cdf(0.0, 5) == pytest.approx(0.5)
    iv = stats.repeat_mean_interval([10.0, 12.0, 14.0])  # mean 12, s = 2, h = 4.303 * 2 / sqrt(3)
    assert (iv.estimate, iv.high - iv.estimate) == (12.0, pytest.approx(4.303 * 2 / math.sqrt(3), abs=1e-3))
    assert stats.repeat_mean_interval([5.0]) is None and stats.repeat_mean_interval([5.0, None]) is None


def test_two_way_bootstrap_widens_with_repeat_to_repeat_drift():
    """Same prompts, one repeat 30% slower: the two-way interval must be wider than one repeat's."""
    rng = np.random.default_rng(3)
    base = rng.uniform(0.8, 1.2, size=16)
    num = [list(base * 1.5), list(base * 1.5), list(base * 1.5 * 0.7)]
    den = [list(base)] * 3
    one = stats.paired_ratio_interval(num[:1], den[:1])
    three = stats.paired_ratio_interval(num, den)
    assert one.high - one.low == pytest.approx(0.0, abs=1e-12)  # every prompt the same ratio in one repeat
    assert three.high - three.low > 0.1 and three.method == stats.BOOTSTRAP_2WAY and three.n == 48
    assert three.estimate == pytest.approx((1.5 * 2 + 1.05) / 3)


def test_missing_cells_count_zero_on_both_sides():
    iv = stats.paired_ratio_interval([[2.0, None, 2.0]], [[1.0, 5.0, 1.0]])
    assert iv.estimate == 2.0 and iv.n == 2
    assert stats.paired_ratio_interval([[2.0, None]], [[1.0, None]]) is None


# ---------------------------------------------------------------------------- from records


def test_speedup_interval_is_the_paired_speedup_with_a_bootstrap_over_prompts():
    ar = [rec(f"p{i}", 100.0 + 10 * i) for i in range(12)]
    m = [rec(f"p{i}", (100.0 + 10 * i) / 2) for i in range(12)]
    iv = metrics.speedup_vs_ar_interval([m], [ar])
    assert iv.estimate == pytest.approx(metrics.speedup_vs_ar(m, ar)) == pytest.approx(2.0)
    assert iv.low == pytest.approx(2.0) and iv.high == pytest.approx(2.0)  # every prompt exactly 2x
    noisy = [rec(f"p{i}", (100.0 + 10 * i) / (2.0 + (0.6 if i % 2 else -0.6))) for i in range(12)]
    iv2 = metrics.speedup_vs_ar_interval([noisy], [ar])
    assert iv2.low < iv2.estimate < iv2.high and iv2.excludes(1.0)
    self_iv = metrics.speedup_vs_ar_interval([ar], [ar])  # AR against itself: exactly 1, no width
    assert (self_iv.low, self_iv.estimate, self_iv.high) == (1.0, 1.0, 1.0)


def test_speedup_interval_pairs_repeat_r_with_ar_repeat_r():
    ar0 = [rec(f"p{i}", 100.0) for i in range(6)]
    ar1 = [rec(f"p{i}", 200.0) for i in range(6)]   # the machine was 2x slower in repeat 1 ...
    m0 = [rec(f"p{i}", 50.0) for i in range(6)]
    m1 = [rec(f"p{i}", 100.0) for i in range(6)]    # ... for both methods: the speedup is 2x in each
    iv = metrics.speedup_vs_ar_interval([m0, m1], [ar0, ar1])
    assert (iv.low, iv.estimate, iv.high) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0))
    with pytest.raises(ValueError):
        metrics.speedup_vs_ar_interval([m0, m1], [ar0])


def test_throughput_interval_needs_two_repeats():
    r = [[rec("a", 1000.0, n=100)], [rec("a", 500.0, n=100)], [rec("a", 1000.0, n=100)]]  # 100, 200, 100 tok/s
    iv = metrics.output_throughput_interval(r)
    assert iv.estimate == pytest.approx(400.0 / 3) and iv.method == stats.STUDENT_T and iv.low < 100.0
    assert metrics.output_throughput_interval(r[:1]) is None


# ---------------------------------------------------------------------------- repeats to separate


def _iv(est: float, h: float) -> stats.Interval:
    return stats.Interval(est, est - h, est + h, 0.95, "test", 3)


def test_repeats_to_separate_follows_the_stated_formula():
    # gap 0.1, half-widths 0.1 + 0.1 at 3 repeats: n' = 3 * (0.2 / 0.1)^2 = 12
    assert stats.repeats_to_separate(_iv(1.6, 0.1), _iv(1.5, 0.1), 3) == 12
    assert stats.repeats_to_separate(_iv(2.0, 0.1), _iv(1.5, 0.1), 3) == 3     # already apart
    assert stats.repeats_to_separate(_iv(1.5, 0.1), _iv(1.5, 0.1), 3) is None  # equal: nothing separates them
    assert stats.repeats_to_separate(_iv(1.51, 0.3), _iv(1.5, 0.3), 3) is None  # beyond the cap (100)


# ---------------------------------------------------------------------------- the takeaway rule

from ddtree_bench.noise.verdict import Candidate, decide, sentence  # noqa: E402


def test_a_winner_is_named_only_when_its_interval_clears_the_runner_up():
    cands = [Candidate("ddtree B=32", 1.6, _iv(1.6, 0.05)), Candidate("ddtree B=64", 1.4, _iv(1.4, 0.05)),
             Candidate("ar", 1.0, _iv(1.0, 0.0))]
    v = decide(cands, "speedup_vs_ar", 3)
    assert v.winner.label == "ddtree B=32" and v.reason == "separated"
    assert sentence(v).startswith("fastest is ddtree B=32 (1.60× vs AR [1.55, 1.65])")


def test_overlapping_intervals_name_no_winner_and_estimate_the_repeats():
    cands = [Candidate("ar", 1.0, _iv(1.0, 0.0)), Candidate("ddtree B=64", 1.5, _iv(1.5, 0.1)),
             Candidate("ddtree B=32", 1.6, _iv(1.6, 0.1)), Candidate("dflash", 1.2, _iv(1.2, 0.05))]
    v = decide(cands, "speedup_vs_ar", 3)
    assert v.winner is None and v.reason == "overlap"
    assert [c.label for c in v.tied] == ["ddtree B=32", "ddtree B=64"]  # dflash's interval ends below B=32's low
    assert v.repeats_needed == 12
    text = sentence(v)
    assert "no single fastest: ddtree B=32, ddtree B=64 are indistinguishable" in text and "about 12 repeats" in text
    assert "fastest is" not in text


def test_without_intervals_no_winner_is_named():
    v = decide([Candidate("a", 100.0, None), Candidate("b", 90.0, None)], "output_throughput_tok_s", 1)
    assert v.winner is None and v.reason == "no-interval" and "--repeats" in sentence(v)
    v = decide([Candidate("a", 1.5, _iv(1.5, 0.2)), Candidate("b", 1.5, _iv(1.5, 0.2))], "speedup_vs_ar", 2)
    assert v.repeats_needed is None and "treat them as equal" in sentence(v)
