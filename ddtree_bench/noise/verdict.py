"""Which configuration is fastest — said only when the intervals support it.

`decide(candidates, metric, repeats)` ranks configurations by their estimate and names the best
one a winner only when its interval lies wholly above the runner-up's (`Interval.clears`: no
overlap). Otherwise it lists the configurations indistinguishable from the best (their intervals
reach the best's lower bound) and estimates how many repeats would separate the best from the
runner-up with `stats.repeats_to_separate`: n' = ceil(n · ((h_best + h_next) / (est_best −
est_next))^2), the half-widths shrinking as 1/sqrt(repeats). Without an interval on both (tok/s
from a single repeat) it names no winner and says why.

`sentence(verdict)` is the one line the report and the sweep's closing console line print.
Knows intervals and labels; nothing of files, records or HTML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.stats import Interval, repeats_to_separate

METRICS = {"speedup_vs_ar": ("\u00d7 vs AR", 2), "output_throughput_tok_s": (" tok/s", 1)}
FORMULA = "n' = n\u00b7((h\u2081 + h\u2082)/\u0394)\u00b2"


@dataclass
class Candidate:
    label: str
    estimate: float | None
    interval: Interval | None = None
    ref: Any = None              # what the caller wants back (a report point, a CSV row)


@dataclass
class Verdict:
    metric: str                          # a METRICS key
    ranked: list[Candidate]              # by estimate, best first (no estimate: left out)
    repeats: int
    winner: Candidate | None = None
    tied: list[Candidate] = field(default_factory=list)   # indistinguishable from the best (best first)
    repeats_needed: int | None = None    # to separate the best from the runner-up; None: more than the cap
    reason: str = ""                     # single | separated | overlap | no-interval

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runner_up(self) -> Candidate | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "reason": self.reason, "repeats": self.repeats,
                "winner": self.winner.label if self.winner else None,
                "indistinguishable": [c.label for c in self.tied], "repeats_needed": self.repeats_needed,
                "repeats_cap": D.CI_MAX_REPEATS_ESTIMATE, "sentence": sentence(self),
                "ranked": [{"label": c.label, "estimate": c.estimate,
                            "interval": c.interval.to_dict() if c.interval else None} for c in self.ranked]}


def decide(candidates: list[Candidate], metric: str, repeats: int) -> Verdict:
    ranked = sorted((c for c in candidates if c.estimate is not None), key=lambda c: -float(c.estimate))
    v = Verdict(metric, ranked, max(1, repeats))
    if not ranked:
        v.reason = "none"
        return v
    if len(ranked) == 1:
        v.winner, v.reason = ranked[0], "single"
        return v
    best, nxt = ranked[0], ranked[1]
    if best.interval is None or nxt.interval is None:
        v.reason, v.tied = "no-interval", [c for c in ranked]
        return v
    if best.interval.clears(nxt.interval):
        v.winner, v.reason = best, "separated"
        return v
    v.reason = "overlap"
    v.tied = [c for c in ranked if c.interval is not None and c.interval.high >= best.interval.low]
    v.repeats_needed = repeats_to_separate(best.interval, nxt.interval, v.repeats)
    return v


def value_text(c: Candidate, metric: str) -> str:
    """'1.52× vs AR [1.41, 1.63]' (interval at its level) or '1.52× vs AR' without one."""
    unit, digits = METRICS.get(metric, ("", 2))
    if c.estimate is None:
        return "\u2014"
    s = f"{c.estimate:.{digits}f}{unit}"
    if c.interval is not None:
        s += f" [{c.interval.low:.{digits}f}, {c.interval.high:.{digits}f}]"
    return s


def sentence(v: Verdict) -> str:
    """The takeaway in words (what the report and the sweep's closing line print)."""
    if not v.ranked:
        return "no configuration finished"
    m = v.metric
    level = next((c.interval.level for c in v.ranked if c.interval is not None), D.CI_LEVEL)
    pct = f"{100 * level:g}%"
    best = v.ranked[0]
    if v.reason == "single":
        return f"only {best.label} finished ({value_text(best, m)})"
    if v.reason == "separated":
        nxt = v.ranked[1]
        return (f"fastest is {best.label} ({value_text(best, m)}); its {pct} interval clears the runner-up "
                f"{nxt.label} ({value_text(nxt, m)})")
    if v.reason == "no-interval":
        return (f"highest estimate {best.label} ({value_text(best, m)}), but with one repeat there is no interval on "
                f"{'tok/s' if m == 'output_throughput_tok_s' else 'this figure'}: no fastest configuration can be named "
                f"(run with --repeats 3 or more)")
    names = ", ".join(c.label for c in v.tied)
    nxt = v.ranked[1]
    if v.repeats_needed is None:
        more = (f"no number of repeats up to {D.CI_MAX_REPEATS_ESTIMATE} would separate {best.label} from {nxt.label} "
                f"({FORMULA}): treat them as equal")
    else:
        more = (f"about {v.repeats_needed} repeats would separate {best.label} from {nxt.label} "
                f"({FORMULA} with n = {v.repeats} now)")
    return (f"no single fastest: {names} are indistinguishable ({pct} intervals overlap; best estimate "
            f"{best.label} {value_text(best, m)}, next {nxt.label} {value_text(nxt, m)}); {more}")
