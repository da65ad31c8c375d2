"""Is the sweep correct? Every DFlash and DDTree point's greedy outputs against the same sweep's AR
point, and every point against `--baseline FILE` when one is given — by `verdict.compare`, not by
a second diff.

Speculative decoding is lossless: at T = 0 a DFlash or DDTree point must emit exactly the tokens of
AR greedy decoding with the same settings (backend, model, dtype, device, suite, load, temperature,
repeat: `Point.ar_key`). The AR point of the sweep is that reference, for free. Its records become
a `Baseline` (source `sweep-ar`) and `verdict.compare.compare_records` classifies each paired
(prompt, turn): match, near tie, confident divergence, length-only, ... (compare's docstring).

The logit-gap rule needs the AR side's top-1 minus top-2 logit at the first differing token. A
sweep's records carry no gaps, so where some point differs from AR the AR output is re-scored
(`baselines.record.rescore_gaps`: one teacher-forced forward of the reference engine over prompt +
AR output) once, after the sweep's points ran, and only for the AR turns that some point differs
from: a sweep whose outputs all match loads nothing. Where the reference engine cannot load the
model (a hub id, not a directory on this machine; an engine error) the difference stays `unknown`
(shown as unjudged, with the reason). Near-tie threshold: `defaults.NEAR_TIE_GAP` for fp32
in-process points, `defaults.SERVER_NEAR_TIE_GAP` otherwise (bf16 numerics or a server on one side).

Verdict per point and reference (`Judgement.verdict`):
  lossless       every compared turn matches (or differs by truncation / a stripped final EOS);
  near ties      no confident divergence, some near ties: shown, not failed (floating point can
                 flip a near tie: tree-verify vs one-token kernels, batch shape);
  DIVERGES       a confident divergence (gap >= threshold) or a length-only difference that
                 truncation does not explain (e.g. a stop token ignored): the sweep fails (exit 1);
  unjudged       differences whose gap is unknown (the model could not be re-scored), failed
                 requests or prompt mismatches: turns that could not be compared;
  not judged     T > 0: sampled outputs equal AR's only in distribution, so no token diff here;
                 the sampling-distribution test (`verdict/distribution.py`, the reference engine
                 scoring the point's tokens with its own target) is run and its line shown in the
                 note, not failed (its 1% false-alarm rate is per point);
  no reference   the AR point did not finish (or reported no token ids).

Files: `points/<id>/compare_ar.json` and `compare_baseline.json` are the `compare --json`
documents; `points/<id>/correctness.json` holds both judgements. summary.csv's correctness
columns (`CORRECTNESS_COLUMNS`) are the counts. Knows the sweep directory, records and baselines;
loads an engine only to re-score gaps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.baselines.file import Baseline, BaselineEntry
from ddtree_bench.errors import UsageError
from ddtree_bench.sweep.grid import Point, ar_index, config_label

SOURCE = "sweep-ar"
COUNTS = ("compared", "exact_match", "near_ties", "divergences", "other_diffs")
CORRECTNESS_COLUMNS = COUNTS + ("correctness",) + tuple(f"{c}_vs_baseline" for c in COUNTS + ("correctness",))
FAILING = "DIVERGES"
COMPARE_AR = "compare_ar.json"
COMPARE_BASELINE = "compare_baseline.json"
CORRECTNESS_JSON = "correctness.json"


@dataclass
class Judgement:
    """One point against one reference (the sweep's AR point, or the --baseline file)."""

    against: str                      # "ar" | "baseline"
    verdict: str                      # lossless | near ties | DIVERGES | unjudged | not judged | no reference
    compared: int = 0                 # paired (prompt, turn)s
    exact_match: int = 0
    near_ties: int = 0
    divergences: int = 0              # confident divergences + unexplained length-only differences
    other_diffs: int = 0              # everything else that differs: unknown gap, prompt mismatch, errors, ...
    note: str | None = None           # why unjudged / not judged, or compare's warnings
    examples: list[str] | None = None  # "prompt turn at token i (gap g)" of the divergences

    def columns(self, suffix: str = "") -> dict[str, Any]:
        """The summary.csv columns; a point not diffed token by token ("not judged", "no reference") leaves its
        counts empty, not 0 (no divergence was looked for), `compared` kept where prompts were paired (T > 0)."""
        diffed = self.verdict not in ("not judged", "no reference")
        return {**{f"{k}{suffix}": getattr(self, k) if diffed or (k == "compared" and self.compared) else None
                   for k in COUNTS}, f"correctness{suffix}": self.verdict}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Judgement":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


def near_tie_gap_for(p: Point) -> float:
    """The threshold of the logit-gap rule for a point (module docstring)."""
    return D.NEAR_TIE_GAP if p.backend == "inprocess" and p.dtype == "float32" else D.SERVER_NEAR_TIE_GAP


def judge(c: Any, against: str) -> Judgement:
    """A `verdict.compare.Comparison` -> counts and verdict (module docstring)."""
    from ddtree_bench.verdict.compare import BENIGN_LENGTH_REASONS

    n = len(c.prompts)
    if not c.token_comparable:
        dist = getattr(c, "distribution", None)
        note = "T > 0: sampled outputs equal AR only in distribution; tokens are not diffed here"
        if dist is not None and hasattr(dist, "line"):  # verdict/distribution.py's test, surfaced, not failed
            note += "; " + dist.line()
        return Judgement(against, "not judged", compared=n, note=note)
    match = sum(1 for p in c.prompts if p.kind == "match" or (p.kind == "length_only" and p.reason in BENIGN_LENGTH_REASONS))
    near = sum(1 for p in c.prompts if p.kind == "near_tie")
    bad = [p for p in c.prompts if p.kind == "divergence"
           or (p.kind == "length_only" and p.reason not in BENIGN_LENGTH_REASONS)]
    unjudged = sum(1 for p in c.prompts if p.kind in ("unknown", "error", "prompt_mismatch"))  # not after_divergence:
    other = n - match - near - len(bad)                                                   # its earlier turn counts
    verdict = FAILING if bad else ("unjudged" if unjudged else ("near ties" if near else "lossless"))
    examples = [f"{p.prompt_id} turn {p.turn} at token {p.first_divergence}"
                + (f" (gap {p.gap:.3g})" if p.gap is not None else f" ({p.reason})") for p in bad[:3]]
    note = "; ".join(c.warnings) or None
    return Judgement(against, verdict, n, match, near, len(bad), other, note, examples or None)


# ---------------------------------------------------------------------------- the AR point as a baseline


def ar_baseline(ar_dir: Path) -> Baseline | None:
    """The AR point's ok records as a gapless Baseline (None when it has no token ids)."""
    from ddtree_bench.results import read_records, read_run_info
    from ddtree_bench.verdict.compare import run_fact

    info = read_run_info(ar_dir)
    recs = [r for r in read_records(ar_dir) if r.ok]
    if not recs or any(r.output_ids is None for r in recs):
        return None
    spec = info.get("spec") or {}
    header = {"kind": "ddtree-bench-baseline", "version": 1, "source": SOURCE, "method": "ar",
              "temperature": float(spec.get("temperature") or 0.0), "model": spec.get("model"),
              "model_hash": run_fact(info, "model_hash"), "dtype": run_fact(info, "dtype"),
              "suite": (info.get("suite") or {}).get("name"), "max_new_tokens": spec.get("max_new_tokens"),
              "stop_ids": run_fact(info, "stop_ids")}
    entries = [BaselineEntry(r.prompt_id, r.turn, r.prompt_ids, list(r.output_ids), r.output_text, None, None,
                             r.finish_reason) for r in recs]
    return Baseline(header, entries, ar_dir)


class _Rescorer:
    """Reference engines loaded on demand, one (model, dtype, device) at a time, to re-score AR gaps."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.engine: Any = None
        self.stop_ids: list[int] = []
        self.failed: dict[tuple, str] = {}

    def engine_for(self, p: Point) -> tuple[Any, str | None]:
        """(the reference engine of p's model, dtype and device, None) or (None, why it cannot load)."""
        key = (p.model, p.dtype, p.device)
        if key in self.failed:
            return None, self.failed[key]
        if key != self.key:
            self.engine = None
            try:
                from ddtree_bench.pair import load_pair

                pair = load_pair(p.model, None, "ar", key[1], key[2])
                self.engine, self.stop_ids, self.key = pair.engine, list(pair.stop_ids), key
            except (UsageError, OSError, ValueError, RuntimeError, ImportError) as e:
                self.failed[key] = f"the reference engine cannot load {p.model!r} to re-score the AR gaps: {e}"
                return None, self.failed[key]
        return self.engine, None

    def stop_ids_for(self, p: Point) -> list[int]:
        """The stop ids of p's model (after `engine_for`): a stop the run did not emit is judged as one of them."""
        return self.stop_ids if self.key == (p.model, p.dtype, p.device) else []

    def gaps(self, p: Point, entry: BaselineEntry) -> tuple[list[float] | None, str | None]:
        from ddtree_bench.baselines.record import rescore_gaps

        engine, why = self.engine_for(p)
        if engine is None:
            return None, why
        try:
            return [float(g) for g in rescore_gaps(engine, entry.prompt_ids or [], entry.output_ids)], None
        except (RuntimeError, ValueError, IndexError) as e:
            return None, f"re-scoring the AR output failed: {type(e).__name__}: {e}"


def _distribution(sdir, p: Point) -> Any:
    """T > 0: the sampling-distribution test of `verdict/distribution.py` on the point's tokens, scored
    by the reference engine with the point's own target (None where that module or model is missing)."""
    try:
        from ddtree_bench.results import read_records, read_run_info
        from ddtree_bench.verdict.compare import run_fact
        from ddtree_bench.verdict.distribution import judge_sampling

        pdir = sdir.point_dir(p.id)
        info = read_run_info(pdir)
        header = {"source": "record", "model": p.model, "device": p.device if p.backend == "inprocess" else "cpu",
                  "model_hash": run_fact(info, "model_hash"), "stop_ids": run_fact(info, "stop_ids")}
        return judge_sampling(read_records(pdir), info, Baseline(header, []))
    except (ImportError, UsageError, OSError, RuntimeError, ValueError) as e:
        return _Note(f"sampling distribution not judged: {type(e).__name__}: {e}")


@dataclass
class _Note:
    text: str

    def line(self) -> str:
        return self.text

    def to_json(self) -> dict[str, Any]:
        return {"judged": False, "reason": self.text}


# ---------------------------------------------------------------------------- a whole sweep


def _compare(sdir, p: Point, baseline: Baseline, near_tie_gap: float | None):
    from ddtree_bench.results import read_records, read_run_info
    from ddtree_bench.verdict.compare import compare_records

    pdir = sdir.point_dir(p.id)
    return compare_records(read_records(pdir), baseline, near_tie_gap, read_run_info(pdir), str(pdir))


def judge_vs_ar(sdir, p: Point, ar: Point | None, cache: dict[str, Baseline | None], rescorer: _Rescorer | None):
    """(Judgement, compare document or None) of a finished non-AR point against its AR point."""
    if ar is None or not sdir.finished(ar.id):
        return Judgement("ar", "no reference", note="the AR point with these settings did not finish"), None
    if ar.id not in cache:
        cache[ar.id] = ar_baseline(sdir.point_dir(ar.id))
    base = cache[ar.id]
    if base is None:
        return Judgement("ar", "no reference", note="the AR point has no successful request with token ids"), None
    gap = near_tie_gap_for(p)
    c = _compare(sdir, p, base, gap)
    if not c.token_comparable and rescorer is not None:
        c.distribution = _distribution(sdir, p)
    unknown = [r for r in c.prompts if r.kind == "unknown" and r.first_divergence is not None]
    why = None
    if unknown and rescorer is not None:
        by_key = base.by_key()
        for r in unknown:
            e = by_key[(r.prompt_id, r.turn)]
            if e.logit_gap is None:
                e.logit_gap, why = rescorer.gaps(p, e)
        c = _compare(sdir, p, base, gap)
    if rescorer is not None and any(r.kind == "near_tie" for r in c.prompts):
        _recheck_near_ties(sdir, p, c, rescorer)
    j = judge(c, "ar")
    if j.verdict == "unjudged":
        j.note = why or "the AR output's logit gaps were not re-scored"
    return j, c


def _recheck_near_ties(sdir, p: Point, c: Any, rescorer: _Rescorer) -> None:
    """What a near tie may excuse, by the gate's rule (`verdict.near_tie_recheck.recheck_one`: the run's output
    teacher-forced through the reference engine on its own prefix): a `diverged` prompt becomes a divergence
    (reason `after_near_tie`), so a server emitting garbage after a first token that happened to fall on a near tie
    fails the sweep; `confirmed` and `inconclusive` stay near ties and say so. Nothing changes where the engine
    cannot load."""
    from ddtree_bench.results import read_records
    from ddtree_bench.verdict.near_tie_recheck import recheck_one

    engine, _ = rescorer.engine_for(p)
    if engine is None:
        return
    recs = {(r.prompt_id, r.turn): r for r in read_records(sdir.point_dir(p.id))}
    for r in c.prompts:
        rec = recs.get((r.prompt_id, r.turn))
        if r.kind != "near_tie" or rec is None or rec.prompt_ids is None or not rec.output_ids or r.first_divergence is None:
            continue
        try:
            check = recheck_one(engine, rec.prompt_ids, rec.output_ids, r.first_divergence, c.near_tie_gap,
                                rescorer.stop_ids_for(p), rec.finish_reason)
        except (RuntimeError, ValueError, IndexError) as e:
            r.explanation = f"{r.explanation}; not re-checked ({type(e).__name__}: {e})"
            continue
        if check.status == "diverged":
            r.kind, r.reason, r.match = "divergence", "after_near_tie", False
            r.first_divergence, r.gap = check.position, check.gap
            r.explanation = check.note
        else:
            r.explanation = f"{r.explanation}; re-checked ({check.status}): {check.note}"


def check_baseline_model(baseline: Baseline, models: list[str], allow: bool) -> None:
    """Before any work: a --baseline recorded with none of the grid's models is bad input (exit 2),
    unless `allow`; so is an import whose gaps were re-scored on none of them (`logit_gap_source`, what compare
    and gate refuse). Models that are not local (hub ids of a server) cannot be hashed here and pass."""
    gaps = baseline.header.get("logit_gap_source")
    want = baseline.header.get("model_hash") or (gaps.get("model_hash") if isinstance(gaps, dict) else None)
    if allow or not want:
        return
    from ddtree_bench.engine.loading import dir_hash
    from ddtree_bench.pair import model_dirs

    seen = []
    for m in models:
        try:
            target, _ = model_dirs(m, None)
        except UsageError:
            return
        if target is None:
            h = "random-seed-0"
        elif (target / "config.json").is_file():
            h = dir_hash(target)
        else:
            return  # not on this machine: judged per point after the sweep
        if h == want:
            return
        seen.append(f"{m} ({h})")
    what = (f"was recorded with model {baseline.header.get('model')!r} ({want})" if baseline.header.get("model_hash")
            else f"has logit gaps re-scored on {gaps.get('model')!r} ({want})")
    raise UsageError(f"--baseline {baseline.path} {what}; the sweep runs {', '.join(seen)}",
                     hint="record a baseline with the sweep's --model, or pass --allow-model-mismatch to compare anyway")


def judge_sweep(sdir, points: list[Point], baseline: Baseline | None = None, allow_model_mismatch: bool = False,
                rescore: bool = True) -> dict[str, dict[str, Any]]:
    """Judge every finished point; writes compare_*.json and correctness.json per point and returns
    {point id: {"vs_ar": Judgement dict | None, "vs_baseline": ... | None}}."""
    from ddtree_bench.records import json_safe
    from ddtree_bench.results import read_run_info, write_json_atomic
    from ddtree_bench.verdict.compare import model_mismatch

    ars = ar_index(points)
    cache: dict[str, Baseline | None] = {}
    rescorer = _Rescorer() if rescore else None
    out: dict[str, dict[str, Any]] = {}
    for p in points:
        pdir = sdir.point_dir(p.id)
        if not sdir.finished(p.id):
            continue
        entry: dict[str, Any] = {"vs_ar": None, "vs_baseline": None}
        for stale in (COMPARE_AR, COMPARE_BASELINE):
            (pdir / stale).unlink(missing_ok=True)
        if p.method != "ar":
            try:
                j, c = judge_vs_ar(sdir, p, ars.get(p.ar_key()), cache, rescorer)
            except UsageError as e:  # unreadable records, nothing paired: said, not fatal
                j, c = Judgement("ar", "not judged", note=str(e)), None
            entry["vs_ar"] = asdict(j)
            if c is not None:
                write_json_atomic(pdir / COMPARE_AR, json_safe({**c.to_json(), "label": f"{p.id} vs the sweep's AR point"}))
        if baseline is not None:
            c = None
            try:
                mismatch = model_mismatch(read_run_info(pdir), baseline.header)
                if mismatch and not allow_model_mismatch:
                    j = Judgement("baseline", "not judged", note=mismatch)
                else:
                    c = _compare(sdir, p, baseline, None)
                    j = judge(c, "baseline")
            except UsageError as e:  # e.g. no prompt of the point is in the baseline
                j = Judgement("baseline", "not judged", note=str(e))
            entry["vs_baseline"] = asdict(j)
            if c is not None:
                write_json_atomic(pdir / COMPARE_BASELINE, json_safe({**c.to_json(), "label": f"{p.id} vs {baseline.path}"}))
        write_json_atomic(pdir / CORRECTNESS_JSON, entry)
        out[p.id] = entry
    if rescorer is not None:
        rescorer.engine = None
    return out


def columns(doc: dict[str, Any] | None) -> dict[str, Any]:
    """correctness.json -> the summary.csv correctness columns."""
    if not isinstance(doc, dict):
        return {}
    row: dict[str, Any] = {}
    for key, suffix in (("vs_ar", ""), ("vs_baseline", "_vs_baseline")):
        if isinstance(doc.get(key), dict):
            row.update(Judgement.from_dict(doc[key]).columns(suffix))
    return row


def failures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-repeat rows whose outputs confidently diverge from AR or the baseline."""
    return [r for r in rows if str(r.get("repeat")) != "all"
            and FAILING in (r.get("correctness"), r.get("correctness_vs_baseline"))]


_LABEL_KEYS = (("backend", "{}"), ("model", "{}"), ("suite", "{}"), ("concurrency", "c={}"), ("request_rate", "rate={}/s"),
               ("repeat", "repeat {}"))


def _point_label(r: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """'ddtree B=32 T=0.8', then whichever of backend, model, suite, load and repeat vary over `rows` (so the
    per-point lines of a sweep over several loads or repeats tell their points apart)."""
    label = config_label(r) + (f" T={r.get('temperature')}" if float(r.get("temperature") or 0) > 0 else "")
    for key, fmt in _LABEL_KEYS:
        if len({str(x.get(key)) for x in rows}) > 1 and r.get(key) not in (None, ""):
            label += " " + fmt.format(r.get(key))
    return label


def closing_lines(rows: list[dict[str, Any]], baseline: str | None = None,
                  judged: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The sweep's correctness verdict for the console: one line per reference (totals over the
    greedy points), then what was not judged and why (T > 0: the sampling-distribution line)."""

    per = [r for r in rows if str(r.get("repeat")) != "all" and r.get("status") == "ok"]
    lines = []
    for suffix, what, key in (("", "the sweep's AR point", "vs_ar"), ("_vs_baseline", f"the baseline {baseline}", "vs_baseline")):
        if suffix and baseline is None:
            continue
        judged_rows = [r for r in per if r.get(f"correctness{suffix}") not in (None, "")]
        greedy = [r for r in judged_rows if r.get(f"correctness{suffix}") in ("lossless", "near ties", FAILING, "unjudged")]
        tot = {k: sum(int(float(r.get(f"{k}{suffix}") or 0)) for r in greedy) for k in COUNTS}
        verdicts = [r.get(f"correctness{suffix}") for r in greedy]
        head = "correctness vs " + what + ": "
        if FAILING in verdicts:
            bad = [r for r in greedy if r.get(f"correctness{suffix}") == FAILING]
            lines.append(head + f"FAIL - {len(bad)} of {len(greedy)} points diverge confidently "
                         f"({tot['divergences']} prompt turns; {tot['near_ties']} near ties shown, not failed)")
        elif greedy:
            state = "lossless" if all(v == "lossless" for v in verdicts) else "no confident divergence"
            rest = len([r for r in judged_rows if r not in greedy])
            lines.append(head + f"{state} - {tot['exact_match']} of {tot['compared']} prompt turns identical, "
                         f"{tot['near_ties']} near ties (shown, not failed), 0 confident divergences over {len(greedy)} points"
                         + (f"; {rest} more not judged (below)" if rest else ""))
        for r in judged_rows:
            if r in greedy and r.get(f"correctness{suffix}") != "unjudged":
                continue
            note = ((judged or {}).get(str(r.get("point_id"))) or {}).get(key) or {}
            label = _point_label(r, per)
            lines.append(f"  {label} vs {'AR' if not suffix else 'baseline'}: {r.get(f'correctness{suffix}')}"
                         + (f" - {note.get('note')}" if note.get("note") else ""))
    return lines
