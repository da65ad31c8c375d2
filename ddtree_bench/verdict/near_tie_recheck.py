"""What a near tie may excuse: re-checking a near-tie prompt from the run's own prefix.

`compare` judges a greedy diff at its first divergent token only. When that token is a near tie
(the baseline's top-1 minus top-2 gap is below the threshold), the run's continuation was decoded
from a different prefix than the baseline's, so it cannot be compared with the baseline token by
token — and without a further check a garbage continuation would pass as "a near tie".

Re-check (where the reference engine can load the baseline's model): take the run's own prefix,
prompt_ids + run.output_ids[:i+1] (the flipped token included), decode it greedily with the
reference engine for as many tokens as the run's continuation has, and compare:
  * equal                                   -> `confirmed`: the run is an exact greedy decode of
                                               its own prefix; the flip was the only difference;
  * first differs at k with reference gap g -> g < threshold: another near tie, re-check again
    from the run's prefix up to k (at most MAX_FLIPS flips a prompt, then `inconclusive`);
    g >= threshold: `diverged` — a confident divergence after the near tie (a bug);
  * the reference stops where the run goes on, or the other way round -> `diverged`.
Where the engine cannot load the model (server or imported baselines, a model directory that is
not on this machine, a CUDA baseline on a machine without CUDA, a different model hash) nothing
is re-checked and the gate's `max_near_ties` cap is the only guard; `RecheckReport.guard` says
which applied, and why. Knows baselines, records and the engine's `generate`; nothing of rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench.pair import BUILTIN

MAX_FLIPS = 8   # near-tie flips re-checked per prompt before the prompt is called inconclusive


@dataclass
class Recheck:
    status: str                      # confirmed | diverged | inconclusive
    note: str
    position: int | None = None      # output index of the divergence after the near tie (diverged)
    gap: float | None = None         # the reference's gap there
    flips: int = 1                   # near-tie flips seen on this prompt (the first included)


@dataclass
class RecheckReport:
    guard: str                       # "recheck" (the reference engine re-decoded) | "cap" (cap only)
    reason: str                      # why the cap is the only guard, or how the re-check ran
    results: dict[tuple[str, int], Recheck] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results.values() if r.status == status)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def loadable(header: dict[str, Any]) -> tuple[bool, str]:
    """Can the reference engine on this machine decode as this baseline did? (yes/no, why)."""
    source = header.get("source")
    if source != "record":
        return False, (f"the baseline's gaps come from {source or 'an unknown source'}, not from the reference engine "
                       "(`baseline record`)")
    model = header.get("model")
    if not isinstance(model, str) or not model:
        return False, "the baseline names no model"
    if model not in BUILTIN and not Path(model).expanduser().is_dir():
        return False, f"the baseline's model {model!r} is not a directory on this machine"
    device = str(header.get("device") or "cpu")
    if device.startswith("cuda"):
        try:
            import torch

            if not torch.cuda.is_available():
                return False, f"the baseline was recorded on {device} and this machine has no CUDA device"
        except ImportError:  # pragma: no cover - torch is a dependency
            return False, "torch is not installed"
    return True, f"{model} ({header.get('dtype') or 'float32'}, {device})"


def recheck_one(engine: Any, prompt_ids: list[int], out: list[int], i: int, gap_threshold: float,
                stops: list[int]) -> Recheck:
    """One near-tie prompt re-decoded from the run's own prefix (module docstring): the gate's re-check and
    the sweep's (sweep/correctness.py) both call it."""
    flips, pos = 1, i
    while True:
        prefix = list(prompt_ids) + list(out[:pos + 1])
        cont = list(out[pos + 1:])
        if not cont:  # the flipped token was the run's last: nothing after it to judge
            return Recheck("confirmed", f"the near-tie token {pos} was the run's last token", flips=flips)
        ref = engine.generate(prefix, method="ar", max_new_tokens=len(cont), stop_ids=stops, return_logit_gaps=True)
        r_out, gaps = list(ref.output_ids), list(ref.logit_gaps or [])
        k = _first_difference(cont, r_out)
        if k is None:
            extra = f" (and {flips - 1} more near-tie flips)" if flips > 1 else ""
            return Recheck("confirmed", f"after the near tie at token {i}{extra} the run equals the reference engine's "
                                        "greedy continuation of the run's own prefix", flips=flips)
        at = pos + 1 + k
        if k == min(len(cont), len(r_out)):
            if len(r_out) < len(cont):
                return Recheck("diverged", f"after the near tie at token {i} the reference stops at token {at} "
                                           f"(stop id {r_out[-1] if r_out else '?'}) and the run goes on", at, None, flips)
            return Recheck("diverged", f"after the near tie at token {i} the run stops at token {at} and the reference "
                                       "goes on", at, None, flips)
        g = gaps[k] if k < len(gaps) else None
        if g is not None and g < gap_threshold:
            flips += 1
            if flips > MAX_FLIPS:
                return Recheck("inconclusive", f"more than {MAX_FLIPS} near-tie flips after token {i}; not re-checked further",
                               at, g, flips)
            pos = at
            continue
        gtxt = f"{g:.3g}" if g is not None else "unknown"
        return Recheck("diverged", f"after the near tie at token {i} the run diverges at token {at} from the reference "
                                   f"engine's continuation of the run's own prefix, where the reference was confident "
                                   f"(gap {gtxt})", at, g, flips)


def recheck_near_ties(comparison: Any, records: list[Any], baseline: Any, enabled: bool = True) -> RecheckReport | None:
    """Re-check every near-tie prompt of `comparison` (None when it has none)."""
    near = [p for p in comparison.prompts if p.kind == "near_tie"]
    if not near:
        return None
    if not enabled:
        return RecheckReport("cap", "re-checking is off (correctness.recheck_near_ties: false)")
    ok, why = loadable(baseline.header)
    if not ok:
        return RecheckReport("cap", why)
    from ddtree_bench.errors import UsageError
    from ddtree_bench.pair import load_pair

    h = baseline.header
    try:
        pair = load_pair(h["model"], None, "ar", str(h.get("dtype") or "float32"), str(h.get("device") or "cpu"))
    except UsageError as e:
        return RecheckReport("cap", f"the reference engine cannot load {h['model']!r}: {e}")
    want, got = h.get("model_hash"), pair.info.get("model_hash")
    if want and got and want != got:
        return RecheckReport("cap", f"the model loaded here ({got}) is not the baseline's ({want})")
    by_key = {(r.prompt_id, r.turn): r for r in records}
    report = RecheckReport("recheck", f"re-decoded from the run's own prefix with the reference engine: {why}")
    stops = list(baseline.stop_ids or pair.stop_ids)
    for p in near:
        rec = by_key.get((p.prompt_id, p.turn))
        if rec is None or rec.prompt_ids is None or rec.output_ids is None or p.first_divergence is None:
            report.results[(p.prompt_id, p.turn)] = Recheck("inconclusive", "the run's record has no token ids to re-check")
            continue
        report.results[(p.prompt_id, p.turn)] = recheck_one(pair.engine, rec.prompt_ids, rec.output_ids,
                                                             p.first_divergence, comparison.near_tie_gap, stops)
    return report
