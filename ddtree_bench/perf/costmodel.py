"""Cost model: from measured stage costs and an acceptance curve, predict tok/s per tree budget.

A DDTree round of budget B drafts once, builds and compiles a tree of B nodes, verifies 1 + B
tokens in one target forward, walks the tree and commits. It emits tau(B) tokens on average
(acceptance length, the bonus token counted). AR emits one token per target forward of 1 token.

    T_round(B) = T_draft + T_overhead(B) + T_verify(1 + B)
    T_overhead(B) = T_build(B) + T_compile(B) + T_walk(B) + T_commit     (everything outside the two forwards)
    tok/s(B)   = 1000 * tau(B) / T_round(B)                              (times in ms)
    speedup(B) = tok/s(B) / tok/s(AR) = tau(B) * T_AR / T_round(B)
    T_AR       = measured AR round (verify of 1 token + pick + commit), or T_verify(1) if not measured

DFlash is the same formula with a chain of block_size - 1 nodes (verify of block_size tokens) and
its own tau. The best budget maximises tok/s. Curves given at a few points (`Curve`) are
interpolated linearly in the number of tokens between points and extended by the slope of the last
two points beyond them (verify cost grows about linearly once the forward is compute-bound).
tau(B) comes from a sweep (mean acceptance length per budget) or is given (e.g. the DDTree paper's
Fig. 3).

`calibrate` builds the model from the stage totals of real generate() calls (`RoundSample`: rounds
as they run, first rounds and cache growth included) instead of isolated forwards; per-round means,
since tok/s divides tokens by summed round time. `calibrate_medians` takes per-round stage medians
(`RoundTimes`: FastLoop.rounds of real calls) instead, robust to the few rounds a shared machine
slows, or per-round means (statistic="mean": bench-engine's choice, since a measured tok/s keeps
those rounds), and can leave a budget out; `held_out_predictions` predicts every budget from a model that
never saw its rounds. The batched model (`BatchStageCosts`,
`predict_batched`, `best_per_batch`, `calibrate_batched` from measured (batch, budget) points)
extends the round to C requests: one draft at batch C, one verify over the C concatenated trees,
overhead fixed plus per request, tau per request. Knows nothing of engines or GPUs: it is
arithmetic on measured numbers.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import asdict, dataclass
from typing import Mapping

from ddtree_bench.errors import UsageError


class Curve:
    """y(x) from points {x: y}: piecewise linear inside, linear extension outside (flat if one point). With `beyond`
    (another Curve: a shape measured over a wider range), outside its points it follows that shape's change from the
    nearest end point instead: y(x) = y(end) + beyond(x) - beyond(end)."""

    def __init__(self, points: Mapping[float, float], beyond: Curve | None = None):
        if not points:
            raise ValueError("a curve needs at least one point")
        self.xs = sorted(float(x) for x in points)
        self.ys = [float(points[x]) for x in sorted(points)]
        self.beyond = beyond

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if self.beyond is not None and not xs[0] <= x <= xs[-1]:
            end, y_end = (xs[0], ys[0]) if x < xs[0] else (xs[-1], ys[-1])
            return y_end + self.beyond(x) - self.beyond(end)
        if len(xs) == 1:
            return ys[0]
        i = bisect_left(xs, x)
        if i < len(xs) and xs[i] == x:
            return ys[i]
        i = min(max(i, 1), len(xs) - 1)  # segment [i-1, i]; outside the range, the nearest end segment
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def to_dict(self) -> dict[str, float]:
        return {f"{x:g}": y for x, y in zip(self.xs, self.ys)}


def parse_points(text: str, what: str = "curve") -> dict[int, float]:
    """'16:6.1,32:6.6' -> {16: 6.1, 32: 6.6}."""
    out: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            k, v = part.split(":")
            out[int(k)] = float(v)
        except ValueError:
            raise UsageError(f"{what}: cannot read {part!r}; expected BUDGET:VALUE pairs like 16:6.1,32:6.6") from None
    if not out:
        raise UsageError(f"{what}: no BUDGET:VALUE pairs in {text!r}")
    return out


@dataclass
class Prediction:
    method: str              # "ddtree" | "dflash" | "ar"
    budget: int              # tree nodes (DFlash: block_size - 1; AR: 0)
    tau: float               # acceptance length per round, bonus counted
    round_ms: float
    tok_s: float
    speedup: float           # vs AR

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CostModel:
    verify_ms: Curve         # target forward time vs number of query tokens, at the prefix length of interest
    draft_ms: float          # one drafter forward (+ draft lm_head)
    overhead_ms: Curve       # build + compile + walk + commit vs budget (a one-point curve = constant)
    ar_ms: float | None = None   # measured AR round; None -> verify_ms(1)

    @property
    def t_ar(self) -> float:
        return self.ar_ms if self.ar_ms is not None else self.verify_ms(1)

    def round_ms(self, budget: int) -> float:
        return self.draft_ms + self.overhead_ms(budget) + self.verify_ms(1 + budget)

    def predict(self, budget: int, tau: float, method: str = "ddtree") -> Prediction:
        r = self.round_ms(budget)
        return Prediction(method, budget, tau, r, 1000.0 * tau / r, tau * self.t_ar / r)

    def sweep(self, tau: Mapping[int, float] | Curve, budgets: list[int] | None = None) -> list[Prediction]:
        """Predictions for each budget; tau given per budget (a dict: budgets default to its keys) or as a curve."""
        curve = tau if isinstance(tau, Curve) else Curve(tau)
        if budgets is None:
            if isinstance(tau, Curve):
                raise ValueError("budgets are needed when tau is a curve")
            budgets = sorted(tau)
        return [self.predict(b, curve(b)) for b in budgets]

    def ar(self) -> Prediction:
        return Prediction("ar", 0, 1.0, self.t_ar, 1000.0 / self.t_ar, 1.0)


def best(predictions: list[Prediction]) -> Prediction:
    """The prediction with the highest tok/s (the smaller budget on an exact tie)."""
    if not predictions:
        raise ValueError("no predictions")
    return max(predictions, key=lambda p: (p.tok_s, -p.budget))


def break_even_tau(model: CostModel, budget: int) -> float:
    """The acceptance length at which budget B just matches AR: tau = T_round(B) / T_AR."""
    return model.round_ms(budget) / model.t_ar


# ---------------------------------------------------------------------------- calibrated on rounds as they run


@dataclass
class RoundSample:
    """What real generate() calls at one (method, budget) spent per stage: totals over their rounds.

    stage_ms: Generation.stage_ns summed over the calls, in ms, prefill left out (draft, tree_build,
    verify, commit on the plain loop; the fast loop adds tree_compile and walk). rounds: their
    accept_lengths counted; tokens: the accepted lengths summed (the tau numerator)."""
    method: str              # "ar" | "dflash" | "ddtree"
    budget: int              # DDTree: tree nodes; DFlash: block_size - 1 (its chain); AR: 0
    rounds: int
    tokens: int
    stage_ms: dict[str, float]

    @property
    def verify_tokens(self) -> int:
        """Query tokens of this method's verify forward: the root (bonus) plus the tree or chain."""
        return 1 + self.budget

    def per_round(self, stage: str) -> float:
        return self.stage_ms.get(stage, 0.0) / self.rounds

    @property
    def round_ms(self) -> float:
        return sum(self.stage_ms.values()) / self.rounds

    @property
    def tau(self) -> float:
        return self.tokens / self.rounds


def calibrate(samples: list[RoundSample]) -> CostModel:
    """The cost model from stage times measured inside generation (not from isolated forwards):

        T_draft       = sum of draft ms / sum of rounds, over every DDTree sample (one drafter forward a
                        round, whatever the budget; DFlash's when there is no DDTree sample)
        T_verify(n)   = verify ms / rounds of the sample whose verify takes n = 1 + budget tokens
                        (AR: n = 1, DFlash: n = block_size, DDTree B: n = 1 + B)
        T_overhead(B) = (round - draft - verify) ms / rounds of the DDTree sample at B (build, compile,
                        walk, commit: everything else the round spent)
        T_AR          = the AR sample's round ms / rounds

    Means, not medians: tok/s is tokens over the summed round times, so the mean round is what it
    divides by. Several samples at one point (or one n) are pooled by their rounds."""
    if not samples:
        raise ValueError("no samples to calibrate on")

    def pooled(group: list[RoundSample], stages: tuple[str, ...] | None) -> float:
        rounds = sum(s.rounds for s in group)
        ms = sum(sum(v for k, v in s.stage_ms.items() if stages is None or k in stages) for s in group)
        return ms / rounds

    by_n: dict[int, list[RoundSample]] = {}
    by_budget: dict[int, list[RoundSample]] = {}
    for s in samples:
        if s.rounds <= 0:
            raise ValueError(f"sample {s.method} {s.budget} has no rounds")
        by_n.setdefault(s.verify_tokens, []).append(s)
        if s.method == "ddtree":
            by_budget.setdefault(s.budget, []).append(s)
    verify = Curve({n: pooled(g, ("verify",)) for n, g in by_n.items()})
    drafting = [s for s in samples if s.method == "ddtree"] or [s for s in samples if s.method == "dflash"]
    if not drafting:
        raise ValueError("calibration needs DDTree (or DFlash) samples for the draft cost")
    draft = pooled(drafting, ("draft",))
    overhead = {b: pooled(g, None) - pooled(g, ("draft", "verify")) for b, g in by_budget.items()}
    if not overhead:   # DFlash only: its chain's overhead stands for every budget
        overhead = {0: pooled(drafting, None) - pooled(drafting, ("draft", "verify"))}
    ar = [s for s in samples if s.method == "ar"]
    return CostModel(verify, draft, Curve(overhead), pooled(ar, None) if ar else None)


@dataclass
class RoundTimes:
    """Per-round stage times of real generate() calls at one (method, budget): rounds as they run.

    rounds: one {stage: ms} a round (FastLoop.rounds: draft, tree_build, tree_compile, verify, walk,
    commit), first rounds and cache growth included, over every call at this point."""
    method: str              # "ar" | "dflash" | "ddtree"
    budget: int              # DDTree: tree nodes; DFlash: block_size - 1 (its chain); AR: 0
    rounds: list[dict[str, float]]

    @property
    def verify_tokens(self) -> int:
        return 1 + self.budget


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


STATISTICS = {"median": _median, "mean": _mean}   # how calibrate_medians reduces a stage over rounds


def calibrate_medians(samples: list[RoundTimes], leave_out: int | None = None, statistic: str = "median") -> CostModel:
    """The cost model from per-round stage medians of rounds inside generation (robust to the spikes a
    shared machine adds to a few rounds; `calibrate` takes means of totals instead):

        T_draft       = median draft over the rounds of every DDTree sample (DFlash's if there is none)
        T_verify(n)   = median verify over the rounds whose verify takes n = 1 + budget tokens
        T_overhead(B) = median over B's rounds of (round - draft - verify)
        T_AR          = median AR round

    leave_out: a DDTree budget whose rounds are not used, so that its prediction comes from the other
    budgets' curves (calibrating on the budget one then predicts is circular). statistic "mean": per-round
    means instead (every slow round counted, as a measured tok/s counts it)."""
    kept = [s for s in samples if s.rounds and not (s.method == "ddtree" and s.budget == leave_out)]
    if not kept:
        raise ValueError("no rounds to calibrate on")
    reduce = STATISTICS[statistic]
    pool = lambda group, f: reduce([f(r) for s in group for r in s.rounds])  # noqa: E731
    by_n: dict[int, list[RoundTimes]] = {}
    by_budget: dict[int, list[RoundTimes]] = {}
    for s in kept:
        by_n.setdefault(s.verify_tokens, []).append(s)
        if s.method == "ddtree":
            by_budget.setdefault(s.budget, []).append(s)
    drafting = [s for s in kept if s.method == "ddtree"] or [s for s in kept if s.method == "dflash"]
    if not drafting:
        raise ValueError("calibration needs DDTree (or DFlash) rounds for the draft cost")
    rest = lambda r: sum(r.values()) - r.get("draft", 0.0) - r.get("verify", 0.0)  # noqa: E731
    verify = Curve({n: pool(g, lambda r: r.get("verify", 0.0)) for n, g in by_n.items()})
    overhead = {b: pool(g, rest) for b, g in by_budget.items()} or {0: pool(drafting, rest)}
    ar = [s for s in kept if s.method == "ar"]
    return CostModel(verify, pool(drafting, lambda r: r.get("draft", 0.0)), Curve(overhead),
                     pool(ar, lambda r: sum(r.values())) if ar else None)


def held_out_predictions(samples: list[RoundTimes], tau: Mapping[int, float], budgets: list[int],
                         statistic: str = "median") -> list[Prediction]:
    """Each DDTree budget B predicted by `calibrate_medians(samples, leave_out=B, statistic)` with tau(B)
    given: an honest check of the model at every budget (B's own rounds never inform B's prediction)."""
    return [calibrate_medians(samples, leave_out=b, statistic=statistic).predict(b, tau[b]) for b in budgets]


def rounds_counted(samples: list[RoundTimes]) -> int:
    return sum(len(s.rounds) for s in samples)


# ---------------------------------------------------------------------------- batched (issue 19)


@dataclass
class BatchStageCosts:
    """Per-round stage costs of the batched engine, C requests in flight, each with a tree of B nodes.

        verify_ms(n)         one target forward over the C trees concatenated, n = C * (1 + B) query
                             tokens (each request attends to its own prefix and ancestors); a Curve in n
        draft_ms(C)          one drafter forward over C requests (C * block_size tokens); a Curve in C
        overhead_fixed_ms(B) per round, whatever C (launches, the host sync); a Curve in B
        overhead_per_request_ms(B)  per request and round (its tree build, compile, walk, commit); a Curve in B
        ar_overhead_per_request_ms  AR's per request and round (pick + commit); AR's fixed part is
                             overhead_fixed_ms(0)

    Attention over C prefixes is inside verify_ms's points but not modelled apart: a curve measured at
    one prefix length predicts that length. Beyond its points verify_ms extends along a given shape (calibrate_batched's
    verify_shape: one request's verify over n tokens), not along its last segment."""
    verify_ms: Curve
    draft_ms: Curve
    overhead_fixed_ms: Curve
    overhead_per_request_ms: Curve
    ar_overhead_per_request_ms: float = 0.0


@dataclass
class BatchPrediction:
    batch: int               # C, requests per round
    budget: int              # B, tree nodes per request
    tau: float               # acceptance length per request and round, bonus counted
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    round_ms: float
    tok_s: float             # output tokens per second over all C requests
    tok_s_per_request: float
    ar_tok_s: float          # AR at the same batch
    speedup: float           # tok_s / ar_tok_s

    def to_dict(self) -> dict:
        return asdict(self)


def predict_batched(costs: BatchStageCosts, tau: Mapping[int, float] | Curve, batches: list[int],
                    budgets: list[int]) -> list[BatchPrediction]:
    """Output tok/s per (batch C, budget B), batch-major:

        T_round(C, B)  = T_draft(C) + T_verify(C * (1 + B)) + T_fixed(B) + C * T_request(B)
        tok/s(C, B)    = 1000 * C * tau(B) / T_round(C, B)          (per request: 1000 * tau(B) / T_round)
        T_AR(C)        = T_verify(C) + T_fixed(0) + C * T_request_AR;   AR tok/s(C) = 1000 * C / T_AR(C)
        speedup(C, B)  = tok/s(C, B) / AR tok/s(C)

    tau(B) is per request and does not depend on C: batching is lossless (each request accepts what it
    accepts alone), so tau comes from batch-1 runs or is given."""
    tau_curve = tau if isinstance(tau, Curve) else Curve(tau)
    out = []
    for c in batches:
        if c < 1:
            raise ValueError(f"batch {c} < 1")
        ar_round = costs.verify_ms(c) + costs.overhead_fixed_ms(0) + c * costs.ar_overhead_per_request_ms
        ar_tok_s = 1000.0 * c / ar_round
        for b in budgets:
            t = tau_curve(b)
            draft, verify = costs.draft_ms(c), costs.verify_ms(c * (1 + b))
            overhead = costs.overhead_fixed_ms(b) + c * costs.overhead_per_request_ms(b)
            r = draft + verify + overhead
            tok_s = 1000.0 * c * t / r
            out.append(BatchPrediction(c, b, t, draft, verify, overhead, r, tok_s, tok_s / c, ar_tok_s, tok_s / ar_tok_s))
    return out


def best_per_batch(predictions: list[BatchPrediction]) -> dict[int, BatchPrediction]:
    """Per batch C, the budget with the highest output tok/s (the smaller budget on an exact tie)."""
    best_of: dict[int, BatchPrediction] = {}
    for p in predictions:
        cur = best_of.get(p.batch)
        if cur is None or (p.tok_s, -p.budget) > (cur.tok_s, -cur.budget):
            best_of[p.batch] = p
    return best_of


@dataclass
class BatchRoundPoint:
    """Measured per-round stage times (ms, medians or means over rounds) at one (batch C, budget B);
    budget 0 = AR. overhead_ms is the round less draft and verify."""
    batch: int
    budget: int
    draft_ms: float
    verify_ms: float
    overhead_ms: float


def calibrate_batched(points: list[BatchRoundPoint], verify_shape: Mapping[float, float] | None = None) -> BatchStageCosts:
    """BatchStageCosts from measured (C, B) points (leave a batch out of `points` to predict it honestly):

        verify_ms    Curve over n = C * (1 + B) of the points' verify (points at one n averaged); outside them, along
                     verify_shape ({n: ms}, one request's verify forward over n tokens at the same prefix) where given:
                     a batch beyond the measured ones adds what one forward's n more tokens add (mostly weight GEMMs),
                     where the last segment's slope, from batches of few rows, understates it once the forward turns
                     compute-bound (docs/gpu-performance.md, the batched cost model)
        draft_ms     Curve over C of the DDTree points' draft (averaged over budgets)
        overhead     per budget, a least-squares line overhead(C) = fixed(B) + C * per_request(B) over
                     its batches (one batch: all of it per request, fixed 0); AR's (budget 0) per-request
                     slope is ar_overhead_per_request_ms and its intercept fixed(0)"""
    if not points:
        raise ValueError("no points to calibrate on")
    by_n: dict[int, list[float]] = {}
    by_c: dict[int, list[float]] = {}
    by_b: dict[int, list[BatchRoundPoint]] = {}
    for p in points:
        by_n.setdefault(p.batch * (1 + p.budget), []).append(p.verify_ms)
        if p.budget > 0:
            by_c.setdefault(p.batch, []).append(p.draft_ms)
        by_b.setdefault(p.budget, []).append(p)
    if not by_c:
        raise ValueError("calibration needs DDTree points (budget > 0) for the draft cost")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    fixed, per_req = {}, {}
    for b, group in by_b.items():
        fixed[b], per_req[b] = _line([p.batch for p in group], [p.overhead_ms for p in group])
    ar_slope = per_req.pop(0, None)
    tree_fixed = {b: v for b, v in fixed.items() if b > 0}
    return BatchStageCosts(
        verify_ms=Curve({n: mean(v) for n, v in by_n.items()}, beyond=Curve(verify_shape) if verify_shape else None),
        draft_ms=Curve({c: mean(v) for c, v in by_c.items()}),
        overhead_fixed_ms=Curve(fixed if 0 in fixed else {0: 0.0, **tree_fixed}),
        overhead_per_request_ms=Curve(per_req),
        ar_overhead_per_request_ms=ar_slope or 0.0,
    )


def _line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys on xs; with one distinct x: (0, mean y / x)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my / mx
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope
