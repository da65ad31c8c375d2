"""What a near tie may excuse: re-checking a near-tie prompt from the run's own prefix.

`compare` judges a greedy diff at its first divergent token only. When that token is a near tie
(the baseline's top-1 minus top-2 gap is below the threshold), the run's continuation was decoded
from a different prefix than the baseline's, so it cannot be compared with the baseline token by
token — and without a further check a garbage continuation would pass as "a near tie".

Re-check (where the reference engine can load the baseline's model): teacher-force the run's own
output through the reference engine, one forward over prompt_ids + run.output_ids, and read each
token's deficit (the reference's top-1 logit minus the logit of the token the run took, on the row
that predicts it; 0 where the run took the top-1). From the flipped token on:
  * every deficit below the threshold      -> `confirmed`: a greedy decode of its own prefix up to
                                               near ties (the flips were the only differences);
  * the first deficit at or past it         -> `diverged`: a confident divergence after the near tie
                                               (a bug; so is a stop token the run emitted, left out
                                               of its ids, or went past, where the reference was
                                               confident otherwise, and an id outside the vocabulary);
  * more than MAX_FLIPS tokens off the top-1 -> `inconclusive` (counted against the gate's cap: a
                                               low-temperature sampler is not a greedy decode).
The sweep's correctness step applies the same rule (`recheck_one`).
Where the engine cannot load the model (server or imported baselines, a model directory that is
not on this machine, a CUDA baseline on a machine without CUDA, a different model hash) nothing
is re-checked and the gate's `max_near_ties` cap is the only guard; `RecheckReport.guard` says
which applied, and why. Knows baselines, records and the engine's teacher-forced forward; nothing of rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ddtree_bench.pair import BUILTIN

MAX_FLIPS = 8   # tokens off the reference's top-1 a near-tie prompt may have before it is inconclusive
OFF_TOP1 = 1e-3  # a deficit above this is a token off the top-1 (below: float noise of the teacher-forced forward)


@dataclass
class Recheck:
    status: str                      # confirmed | diverged | inconclusive
    note: str
    position: int | None = None      # output index of the divergence after the near tie (diverged)
    gap: float | None = None         # the run token's deficit there (the reference's top-1 minus its logit)
    flips: int = 1                   # tokens off the reference's top-1 from the near tie on (the first included)


@dataclass
class RecheckReport:
    guard: str                       # "recheck" (the reference engine re-decoded) | "cap" (cap only)
    reason: str                      # why the cap is the only guard, or how the re-check ran
    results: dict[tuple[str, int], Recheck] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results.values() if r.status == status)


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
                stop_ids: Sequence[int] = (), finish_reason: str | None = None) -> Recheck:
    """One near-tie prompt judged on the run's own prefix (module docstring), the one rule of the gate and the
    sweep (sweep/correctness.py): the run's output teacher-forced through the reference engine
    (`baselines.record.token_deficits`, one forward); from the flipped token `i` on, the first token whose deficit
    (the reference's top-1 logit minus the run token's) is >= `gap_threshold` is `diverged`; more than MAX_FLIPS
    tokens off the reference's top-1 is `inconclusive`; else `confirmed`. A run that stopped (`finish_reason`
    "stop") without a stop id in its output (servers that leave the EOS out) has the stop judged as one more
    token (position len(out)): stopping where the reference goes on confidently is `diverged` too."""
    from ddtree_bench.baselines.record import token_deficits

    vocab = engine.target.cfg.vocab_size
    oov = next((k for k, t in enumerate(out) if t >= vocab), None)
    if oov is not None or any(t >= vocab for t in prompt_ids):   # no forward can take it: the model cannot emit it
        at = oov if oov is not None else i
        return Recheck("diverged", f"token id {out[at] if oov is not None else '(in the prompt)'} at {at} is outside "
                                   f"the model's vocabulary of {vocab}", at, float("inf"), 1)
    implicit = list(stop_ids) if finish_reason == "stop" and stop_ids and (not out or out[-1] not in stop_ids) else []
    deficits = token_deficits(engine, prompt_ids, out, implicit_stop=implicit)[i:]
    off = [k for k, d in enumerate(deficits) if d > OFF_TOP1]
    bad = next((k for k in off if deficits[k] >= gap_threshold), None)
    if bad is not None:
        at, d = i + bad, deficits[bad]
        where = (f"the near-tie token {i} itself" if at == i else f"after the near tie at token {i} the run's stop"
                 if implicit and at == len(out) else f"after the near tie at token {i} the run's token {at}")
        return Recheck("diverged", f"{where} is {d:.3g} below the reference's top-1 on the run's own prefix "
                                   f"(threshold {gap_threshold:g})", at, d, len(off[:off.index(bad) + 1]))
    if len(off) > MAX_FLIPS:
        return Recheck("inconclusive", f"{len(off)} tokens from {i} on are off the reference's top-1 (each within "
                                       f"{gap_threshold:g}); more than {MAX_FLIPS} near-tie flips are not excused",
                       i + off[MAX_FLIPS], deficits[off[MAX_FLIPS]], len(off))
    worst = max(deficits, default=0.0)
    extra = f" ({len(off)} tokens off its top-1, the worst {worst:.3g} below)" if len(off) > 1 else ""
    return Recheck("confirmed", f"from the near tie at token {i} on, every token of the run is within {gap_threshold:g} "
                                f"of the reference's top-1 on the run's own prefix{extra}", flips=max(1, len(off)))


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
    base_by_key = baseline.by_key()
    stops = list(baseline.stop_ids or pair.stop_ids)
    report = RecheckReport("recheck", f"teacher-forced on the run's own output with the reference engine: {why}")
    for p in near:
        rec, entry = by_key.get((p.prompt_id, p.turn)), base_by_key.get((p.prompt_id, p.turn))
        # a server that returns no prompt ids (llama.cpp / transformers serve chat) was sent the baseline's prompt:
        # compare's prompt check matched it by token count, so the baseline's ids stand in for the run's
        prompt = rec.prompt_ids if rec is not None and rec.prompt_ids is not None else getattr(entry, "prompt_ids", None)
        if rec is None or prompt is None or rec.output_ids is None or p.first_divergence is None:
            report.results[(p.prompt_id, p.turn)] = Recheck("inconclusive", "neither the run's record nor the baseline "
                                                                             "has the token ids to re-check")
            continue
        report.results[(p.prompt_id, p.turn)] = recheck_one(pair.engine, prompt, rec.output_ids,
                                                             p.first_divergence, comparison.near_tie_gap,
                                                             stops, rec.finish_reason)
    return report
