"""A sweep answers "is it correct": every DFlash/DDTree point's greedy outputs against the same sweep's
AR point (and a --baseline), through verdict.compare; a confident divergence fails the sweep (exit 1),
a near tie is shown and does not; a baseline of another model is bad input (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from process_support import csv_rows, run_cli

TOY = ["--models", "toy", "--suites", "smoke", "--methods", "dflash,ddtree", "--budgets", "8", "--limit", "2",
       "--max-new-tokens", "12", "--no-report", "-q"]


def _rows(out: Path) -> dict[str, dict]:
    return {r["method"]: r for r in csv_rows(out)}


def _corrupt_ddtree(monkeypatch, where: str) -> dict[str, tuple[int, float]]:
    """Make the in-process DDTree point emit a wrong token in prompt smoke-0's answer, at its most ("max")
    or least ("min") confident position; returns {prompt id: (position, gap)} of the last such request
    (the warmup request runs on the same prompt first)."""
    from ddtree_bench.backends.inprocess import InProcessBackend
    from ddtree_bench.baselines.record import rescore_gaps

    real = InProcessBackend._fill
    chosen: dict[str, tuple[int, float]] = {}

    def fill(self, rec, g, batch_sizes):
        rec = real(self, rec, g, batch_sizes)
        if self.method == "ddtree" and rec.prompt_id == "smoke-0" and rec.output_ids and len(rec.output_ids) > 2:
            gaps = rescore_gaps(self.pair.engine, rec.prompt_ids, rec.output_ids)[:-1]
            i = (max if where == "max" else min)(range(len(gaps)), key=lambda k: gaps[k])
            ids = list(rec.output_ids)
            ids[i] = (ids[i] + 7) % 200 + 3  # another ordinary byte token, never the stop token
            rec.output_ids, rec.output_text = ids, self.pair.tokenizer.decode(ids)
            chosen[rec.prompt_id] = (i, gaps[i])
        return rec

    monkeypatch.setattr(InProcessBackend, "_fill", fill)
    return chosen


def test_a_correct_sweep_says_so_per_point_and_in_its_closing_verdict(tmp_path, capsys):
    out = tmp_path / "sw"
    assert run_cli(["sweep", *TOY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = _rows(out)
    for m in ("dflash", "ddtree"):
        assert rows[m]["correctness"] == "lossless" and rows[m]["exact_match"] == rows[m]["compared"] == "2", rows[m]
        assert rows[m]["divergences"] == "0" and rows[m]["near_ties"] == "0"
        assert json.loads((out / "points" / rows[m]["point_id"] / "compare_ar.json").read_text())["num_matches"] == 2
    assert rows["ar"]["correctness"] == ""  # the reference itself
    assert "greedy vs AR" in printed and "2/2 same" in printed
    assert "correctness vs the sweep's AR point: lossless - 4 of 4 prompt turns identical" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["version"] == 2 and summary["correctness"]["diverged"] == []


def test_a_confident_divergence_fails_the_sweep_with_exit_1(tmp_path, monkeypatch, capsys):
    chosen = _corrupt_ddtree(monkeypatch, "max")
    out = tmp_path / "sw"
    assert run_cli(["sweep", *TOY, "--out", str(out)]) == 1
    cap = capsys.readouterr()
    pos, gap = chosen["smoke-0"]
    assert gap >= 1.0, "the toy target is confident somewhere in its first answer"
    rows = _rows(out)
    assert rows["ddtree"]["correctness"] == "DIVERGES" and rows["ddtree"]["divergences"] == "1"
    assert rows["dflash"]["correctness"] == "lossless"
    doc = json.loads((out / "points" / rows["ddtree"]["point_id"] / "compare_ar.json").read_text())
    bad = [p for p in doc["prompts"] if p["kind"] == "divergence"]
    assert len(bad) == 1 and bad[0]["first_divergence"] == pos and bad[0]["gap"] == pytest.approx(gap, abs=1e-3)
    assert "DIVERGES 1/2" in cap.out and "correctness vs the sweep's AR point: FAIL - 1 of 2 points" in cap.out
    assert "confidently diverge from greedy AR" in cap.err
    assert json.loads((out / "summary.json").read_text())["correctness"]["diverged"] == [rows["ddtree"]["point_id"]]


def test_a_near_tie_is_shown_and_does_not_fail_the_sweep(tmp_path, monkeypatch, capsys):
    import ddtree_bench.sweep.correctness as K

    chosen = _corrupt_ddtree(monkeypatch, "min")
    monkeypatch.setattr(K, "near_tie_gap_for", lambda p: 1e9)  # every AR gap is below it: the flip is a near tie
    out = tmp_path / "sw"
    assert run_cli(["sweep", *TOY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert chosen
    rows = _rows(out)
    assert rows["ddtree"]["correctness"] == "near ties" and rows["ddtree"]["near_ties"] == "1"
    assert rows["ddtree"]["divergences"] == "0" and rows["ddtree"]["exact_match"] == "1"
    assert "1/2 same, 1 tie" in printed and "1 near ties (shown, not failed)" in printed


def test_a_wrong_token_on_a_near_tie_is_not_excused_when_it_is_no_near_runner_up(tmp_path, monkeypatch, capsys):
    """The AR gap at the corrupted position is below the threshold (a near tie by the baseline alone), but the
    token put there is far below the reference's top-1 on the run's own prefix: the sweep re-checks it and
    fails (a server emitting garbage from a near-tie position on passed as 'near ties', exit 0)."""
    import ddtree_bench.sweep.correctness as K

    chosen = _corrupt_ddtree(monkeypatch, "min")
    monkeypatch.setattr(K, "near_tie_gap_for", lambda p: chosen["smoke-0"][1] + 1e-3)
    out = tmp_path / "sw"
    assert run_cli(["sweep", *TOY, "--out", str(out)]) == 1
    rows = _rows(out)
    assert rows["ddtree"]["correctness"] == "DIVERGES" and rows["ddtree"]["near_ties"] == "0", rows["ddtree"]
    doc = json.loads((out / "points" / rows["ddtree"]["point_id"] / "compare_ar.json").read_text())
    bad = [p for p in doc["prompts"] if p["kind"] == "divergence"]
    assert len(bad) == 1 and bad[0]["reason"] == "after_near_tie" and "below the reference's top-1" in bad[0]["explanation"]
    assert bad[0]["first_divergence"] >= chosen["smoke-0"][0]


def test_sweep_baseline_is_compared_and_one_of_another_model_is_exit_2(tmp_path, capsys):
    base = tmp_path / "random.jsonl"
    assert run_cli(["baseline", "record", "--model", "random", "--suite", "smoke", "--limit", "2",
                    "--max-new-tokens", "8", "--out", str(base)]) == 0
    grid = ["--models", "random", "--suites", "smoke", "--methods", "ddtree", "--budgets", "4", "--limit", "2",
            "--max-new-tokens", "8", "--no-report", "-q"]
    out = tmp_path / "sw"
    assert run_cli(["sweep", *grid, "--baseline", str(base), "--out", str(out)]) == 0
    rows = _rows(out)
    for m in ("ar", "ddtree"):
        assert rows[m]["correctness_vs_baseline"] == "lossless" and rows[m]["exact_match_vs_baseline"] == "2"
    assert (out / "points" / rows["ar"]["point_id"] / "compare_baseline.json").exists()
    assert "vs baseline" in capsys.readouterr().out

    toy = tmp_path / "toy.jsonl"
    assert run_cli(["baseline", "record", "--model", "toy", "--suite", "smoke", "--limit", "2",
                    "--max-new-tokens", "4", "--out", str(toy)]) == 0
    capsys.readouterr()
    other = tmp_path / "other"
    assert run_cli(["sweep", *grid, "--baseline", str(toy), "--out", str(other)]) == 2
    err = capsys.readouterr().err
    assert "was recorded with model 'toy'" in err and "--allow-model-mismatch" in err and not other.exists()
    assert run_cli(["sweep", *grid, "--baseline", str(toy), "--dry-run"]) == 2   # the dry run refuses it too
    assert "was recorded with model 'toy'" in capsys.readouterr().err
    import json

    lines = base.read_text().splitlines()   # an import whose gaps were re-scored on the toy: the same refusal
    h = json.loads(lines[0])
    h["model_hash"], h["logit_gap_source"] = None, {"model": "toy", "model_hash": json.loads(toy.read_text().splitlines()[0])["model_hash"]}
    gapped = tmp_path / "gapped.jsonl"
    gapped.write_text("\n".join([json.dumps(h), *lines[1:]]) + "\n")
    assert run_cli(["sweep", *grid, "--baseline", str(gapped), "--out", str(tmp_path / "g")]) == 2
    assert "has logit gaps re-scored on 'toy'" in capsys.readouterr().err and not (tmp_path / "g").exists()
    assert run_cli(["sweep", *grid, "--baseline", str(toy), "--allow-model-mismatch", "--out", str(other)]) == 0
    assert _rows(other)["ddtree"]["correctness_vs_baseline"] in ("DIVERGES", "near ties", "lossless", "unjudged")
    assert _rows(other)["ddtree"]["correctness"] == "lossless"  # vs its own AR: still lossless


def test_repeats_sum_the_counts_and_keep_the_worst_verdict():
    from ddtree_bench.sweep.aggregate import _correctness

    reps = [{"correctness": "lossless", "compared": "2", "exact_match": "2", "near_ties": "0", "divergences": "0", "other_diffs": "0"},
            {"correctness": "DIVERGES", "compared": "2", "exact_match": "1", "near_ties": "0", "divergences": "1", "other_diffs": "0"}]
    got = _correctness(reps)
    assert got["correctness"] == "DIVERGES" and got["compared"] == 4 and got["exact_match"] == 3 and got["divergences"] == 1
    assert "correctness_vs_baseline" not in got


def test_closing_lines_tell_points_apart_by_what_varies():
    """T > 0 points of several loads and repeats each get a line that names its load and repeat (they read alike)."""
    from ddtree_bench.sweep.correctness import closing_lines

    rows = [{"point_id": f"p{c}{r}", "status": "ok", "repeat": r, "method": "ddtree", "budget": 16, "temperature": 0.8,
             "concurrency": c, "backend": "inprocess", "model": "toy", "suite": "smoke", "correctness": "not judged"}
            for c in (1, 4) for r in (0, 1)]
    rows.append({**rows[0], "repeat": "all"})  # the aggregate row is no point
    lines = closing_lines(rows)
    assert sorted(lines) == sorted(f"  ddtree B=16 T=0.8 c={c} repeat {r} vs AR: not judged" for c in (1, 4) for r in (0, 1))


def test_points_not_diffed_leave_their_counts_empty_and_the_verdict_line_says_so():
    """A toy-hybrid point against a toy baseline is 'not judged': its counts are empty, not 0 divergences, and the
    baseline line that calls the judged points lossless says how many were not judged."""
    from ddtree_bench.sweep.correctness import Judgement, closing_lines

    cols = Judgement("baseline", "not judged", note="another model").columns("_vs_baseline")
    assert cols["divergences_vs_baseline"] is None and cols["compared_vs_baseline"] is None
    assert Judgement("ar", "not judged", compared=4).columns()["compared"] == 4   # T > 0: paired, not diffed
    ok = {"status": "ok", "repeat": 0, "method": "ddtree", "budget": 16, "temperature": 0.0, "correctness": "lossless",
          "correctness_vs_baseline": "lossless", "compared_vs_baseline": 2, "exact_match_vs_baseline": 2, "model": "toy"}
    other = {**ok, "model": "toy-hybrid", "correctness_vs_baseline": "not judged", "compared_vs_baseline": None}
    lines = closing_lines([ok, other], baseline="b.jsonl")
    assert any(ln.startswith("correctness vs the baseline b.jsonl: lossless") and ln.endswith("; 1 more not judged (below)")
               for ln in lines), lines
    assert "  ddtree B=16 toy-hybrid vs baseline: not judged" in lines
