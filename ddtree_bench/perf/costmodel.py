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
Fig. 3). Knows nothing of engines or GPUs: it is arithmetic on measured numbers.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import asdict, dataclass
from typing import Mapping

from ddtree_bench.errors import UsageError


class Curve:
    """y(x) from points {x: y}: piecewise linear inside, linear extension outside (flat if one point)."""

    def __init__(self, points: Mapping[float, float]):
        if not points:
            raise ValueError("a curve needs at least one point")
        self.xs = sorted(float(x) for x in points)
        self.ys = [float(points[x]) for x in sorted(points)]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
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
