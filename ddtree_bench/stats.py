"""Confidence intervals for the speed figures, and how many repeats would separate two of them.

Pure functions of numbers (no records, no files). `metrics.py` turns records into the inputs.

Methods (defaults written once in `defaults.py`: CI_LEVEL, CI_RESAMPLES, CI_SEED):

* `percentile_bootstrap(samples, statistic)` — Efron's percentile bootstrap: draw `resamples`
  resamples of the rows with replacement (numpy PCG64 seeded with `seed`, so a result file
  reproduces bit for bit), apply the statistic to each, and take the (1 - level)/2 and
  (1 + level)/2 quantiles (linear interpolation) of the resampled statistics. The estimate is the
  statistic of the original rows.
* `paired_ratio_interval(num, den)` — the ratio of sums sum(num) / sum(den) over cells indexed by
  (repeat, prompt): a two-way percentile bootstrap that draws R repeats and P prompts with
  replacement per resample and sums the cells of the drawn cross product (cells missing in a
  repeat count zero in both sums). With one repeat it is the plain bootstrap over prompts. This is
  how `speedup_vs_ar` gets its interval (the pairing lives in num/den: each cell holds one prompt's
  AR time and method time from the same repeat).
* `repeat_mean_interval(values)` — the mean of per-repeat values (output tok/s) with the Student t
  interval mean ± t_{(1+level)/2, n-1} · s / sqrt(n). Not a bootstrap: over 2–5 repeats the
  percentile bootstrap of a mean cannot leave [min, max] and covers far less than its level
  (tests/test_stats.py measures ~65 % for a nominal 95 % at n = 3); t is exact for normal
  repeat means. Needs n >= 2 (None below).
* `repeats_to_separate(a, b, n)` — the repeats at which the intervals of `a` (the higher estimate)
  and `b` would stop overlapping if their half-widths shrink as 1/sqrt(repeats):
  n' = ceil(n · ((h_a + h_b) / (est_a - est_b))^2), with h_a = est_a - low_a (the side facing b) and
  h_b = high_b - est_b. A lower bound for the speedup: the prompt-to-prompt part of its spread does
  not shrink with repeats of the same prompts (more prompts, `--limit`, shrink it).

Undefined values are None, never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ddtree_bench import defaults as D

BOOTSTRAP = "percentile bootstrap"
BOOTSTRAP_2WAY = "two-way percentile bootstrap over repeats and prompts"
STUDENT_T = "student t over repeats"


@dataclass(frozen=True)
class Interval:
    """An estimate with its confidence interval and how it was made (recorded beside the figure)."""

    estimate: float
    low: float
    high: float
    level: float
    method: str
    n: int                      # rows the interval came from (prompts x repeats, or repeats)
    resamples: int | None = None
    seed: int | None = None

    @property
    def half_width_low(self) -> float:
        return self.estimate - self.low

    @property
    def half_width_high(self) -> float:
        return self.high - self.estimate

    def excludes(self, value: float) -> bool:
        return value < self.low or value > self.high

    def clears(self, other: "Interval") -> bool:
        """True when this interval lies wholly above `other` (no overlap, not even touching)."""
        return self.low > other.high

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Interval | None":
        if not isinstance(d, dict):
            return None
        try:
            return cls(float(d["estimate"]), float(d["low"]), float(d["high"]), float(d["level"]), str(d["method"]),
                       int(d["n"]), d.get("resamples"), d.get("seed"))
        except (KeyError, TypeError, ValueError):
            return None


def _rng(seed: int):
    import numpy as np

    return np.random.Generator(np.random.PCG64(seed))


def _quantiles(values, level: float) -> tuple[float, float]:
    import numpy as np

    lo, hi = np.quantile(values, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")


def percentile_bootstrap(samples: Sequence[Any], statistic: Callable[[Any], float], *, level: float = D.CI_LEVEL,
                         resamples: int = D.CI_RESAMPLES, seed: int = D.CI_SEED) -> Interval | None:
    """Percentile bootstrap of `statistic` over the rows of `samples` (see the module docstring).

    `statistic` receives a numpy array of rows (the first axis is resampled). None with fewer than
    2 rows or when the statistic is not finite on the original rows.
    """
    import numpy as np

    _check_level(level)
    rows = np.asarray(samples, dtype=float)
    n = len(rows)
    if n < 2:
        return None
    est = float(statistic(rows))
    if not math.isfinite(est):
        return None
    idx = _rng(seed).integers(0, n, size=(resamples, n))
    stats = np.array([statistic(rows[i]) for i in idx], dtype=float)
    stats = stats[np.isfinite(stats)]
    if len(stats) == 0:
        return None
    lo, hi = _quantiles(stats, level)
    return Interval(est, min(lo, est), max(hi, est), level, BOOTSTRAP, n, resamples, seed)


def mean_interval(values: Sequence[float], **kw: Any) -> Interval | None:
    """Percentile bootstrap of the mean of `values`."""
    return percentile_bootstrap(values, lambda a: float(a.mean()), **kw)


def paired_ratio_interval(num: Sequence[Sequence[float | None]], den: Sequence[Sequence[float | None]], *,
                          level: float = D.CI_LEVEL, resamples: int = D.CI_RESAMPLES,
                          seed: int = D.CI_SEED) -> Interval | None:
    """sum(num) / sum(den) over a repeats x prompts grid of cells, with its two-way bootstrap interval.

    `num[r][p]` / `den[r][p]` belong to prompt p in repeat r; None (a prompt missing or failed in
    that repeat) counts zero in both sums. None when fewer than 2 prompts have a cell, or when the
    denominator is not positive.
    """
    import numpy as np

    _check_level(level)
    if len(num) != len(den) or not num:
        return None
    n_p = max(len(r) for r in num)
    if any(len(a) != len(b) for a, b in zip(num, den)):
        raise ValueError("num and den must have the same shape")
    N = np.zeros((len(num), n_p))
    M = np.zeros((len(num), n_p))
    present = np.zeros(n_p, dtype=bool)
    for r, (nr, dr) in enumerate(zip(num, den)):
        for p, (a, b) in enumerate(zip(nr, dr)):
            if a is None or b is None:
                continue
            N[r, p], M[r, p] = float(a), float(b)
            present[p] = True
    keep = np.flatnonzero(present)
    if len(keep) < 2 or M.sum() <= 0:
        return None
    N, M = N[:, keep], M[:, keep]
    n_r, n_p = N.shape
    est = float(N.sum() / M.sum())
    rng = _rng(seed)
    stats = np.empty(resamples)
    for i in range(resamples):
        rr = rng.integers(0, n_r, size=n_r)
        pp = rng.integers(0, n_p, size=n_p)
        # counts of each drawn repeat and prompt: the cross product's cell weights
        wr = np.bincount(rr, minlength=n_r)
        wp = np.bincount(pp, minlength=n_p)
        d = wr @ M @ wp
        stats[i] = (wr @ N @ wp) / d if d > 0 else np.nan
    stats = stats[np.isfinite(stats)]
    if len(stats) == 0:
        return None
    lo, hi = _quantiles(stats, level)
    method = BOOTSTRAP if n_r == 1 else BOOTSTRAP_2WAY
    return Interval(est, min(lo, est), max(hi, est), level, method, int(n_r * n_p), resamples, seed)


# ---------------------------------------------------------------------------- Student t


def t_cdf(t: float, df: int) -> float:
    """CDF of Student's t with integer `df` >= 1 (Abramowitz & Stegun 26.7.3 / 26.7.4, exact series)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    theta = math.atan2(t, math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        # A(t|df) = 2/pi * (theta + sin(theta) * (cos + 2/3 cos^3 + ... up to cos^(df-2)))
        total, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        a = 2.0 / math.pi * (theta + s * total) if df > 1 else 2.0 / math.pi * theta
    else:
        # A(t|df) = sin(theta) * (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(df-2))
        total, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):
            total += term
            term *= c * c * (2 * k - 1) / (2 * k)
        a = s * total
    return 0.5 + 0.5 * a  # A is P(|T| < t) signed with t


def t_quantile(p: float, df: int) -> float:
    """Inverse of `t_cdf` by bisection (to 1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)


def repeat_mean_interval(values: Sequence[float | None], *, level: float = D.CI_LEVEL,
                         floor: float | None = None) -> Interval | None:
    """Mean of per-repeat values with the Student t interval (module docstring); None below 2 values.

    `floor` clips the lower bound (0 for a throughput, which cannot be negative; with 2 repeats
    t = 12.7 makes a symmetric interval reach below zero easily)."""
    _check_level(level)
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n < 2:
        return None
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1))
    h = t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)
    low = mean - h if floor is None else max(floor, mean - h)
    return Interval(mean, low, mean + h, level, STUDENT_T, n)


# ---------------------------------------------------------------------------- separation


def repeats_to_separate(higher: Interval, lower: Interval, repeats: int, cap: int = D.CI_MAX_REPEATS_ESTIMATE) -> int | None:
    """Repeats at which the two intervals would stop overlapping (formula in the module docstring).

    Returns `repeats` itself when they already separate, None when the estimates are equal (no
    number of repeats separates them) or the answer exceeds `cap`.
    """
    if higher.clears(lower):
        return repeats
    gap = higher.estimate - lower.estimate
    if gap <= 0:
        return None
    ratio = (higher.half_width_low + lower.half_width_high) / gap
    need = math.ceil(max(1, repeats) * ratio * ratio - 1e-9)
    need = max(need, repeats + 1)
    return need if need <= cap else None
