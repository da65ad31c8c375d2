"""Issue 17's classes of bad input: each is exit 2 with one `error:` line, before any model loads.

Classes (one parametrized test each): undecodable (binary) input files; output paths that cannot be
written; empty list items and unbounded budgets; result files of another kind or a newer version
(older versions still read); `run --out` over a finished run. Then the verdict classes: gate
markdown escaping, run prompts the baseline lacks, near ties bounded (re-checked with the reference
engine where it loads the model, capped where it cannot), and help/doc drift (sweep --help
defaults, machine paths in committed baselines).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from baseline_support import STOP, baseline_file, cli, entry, record, run_dir
from ddtree_bench import defaults as D

ROOT = Path(__file__).resolve().parents[2]
BINARY = bytes([0xFF, 0xFE, 0x00, 0x81, 0xC3, 0x28, 0xA0, 0xA1, 0x0A, 0xE2, 0x82]) * 40
OUT = [10, 11, 12, 13, 14, 15, 16, STOP]


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: these errors must come before the work."""
    import ddtree_bench.pair as pair

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the bad input was reported")

    monkeypatch.setattr(pair, "load_pair", boom)


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bin.bin").write_bytes(BINARY)
    (tmp_path / "bin.jsonl").write_bytes(BINARY)
    (tmp_path / "bin.yaml").write_bytes(BINARY)
    base = baseline_file(tmp_path / "base.jsonl", [entry("a", OUT), entry("b", OUT)])
    run = run_dir(tmp_path / "run", [record("a", OUT), record("b", OUT)])
    binrec = shutil.copytree(run, tmp_path / "run_binrec")
    (binrec / "records.jsonl").write_bytes(BINARY)
    binjson = shutil.copytree(run, tmp_path / "run_binjson")
    (binjson / "run.json").write_bytes(BINARY)
    sw = tmp_path / "sw_bin"
    (sw / "points").mkdir(parents=True)
    (sw / "sweep.json").write_bytes(BINARY)
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "standalone.yaml").write_bytes(BINARY)
    return {"base": base, "run": run}


def one_error_line(code: int, err: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error: ") and all(line.startswith(("error: ", "hint: ")) for line in lines), err
    assert "internal error" not in err and "Traceback" not in err


SW = ["--models", "random", "--suites", "smoke", "--methods", "ar", "--limit", "1", "--max-new-tokens", "2", "--no-report", "-q"]
RUN = ["--suite", "smoke", "--max-new-tokens", "2", "-q"]

BINARY_INPUTS = {
    "suite JSONL": (["run", "--suite", "bin.jsonl", "--out", "o", *RUN[2:]], "bin.jsonl:1: not UTF-8"),
    "baseline (compare)": (["compare", "run", "--baseline", "bin.bin"], "bin.bin:1: not UTF-8"),
    "baseline (gate)": (["gate", "run", "--baseline", "bin.bin"], "bin.bin:1: not UTF-8"),
    "records.jsonl": (["compare", "run_binrec", "--baseline", "base.jsonl"], "records.jsonl:1: not UTF-8"),
    "run.json": (["compare", "run_binjson", "--baseline", "base.jsonl"], "run.json: not UTF-8"),
    "reference run.json": (["gate", "run", "--baseline", "base.jsonl", "--reference-run", "run_binjson"], "not UTF-8"),
    "rules YAML": (["gate", "run", "--baseline", "base.jsonl", "--rules", "bin.yaml"], "not UTF-8"),
    "grid YAML": (["sweep", "--config", "bin.yaml", "--out", "o", "--no-report"], "not UTF-8"),
    "sweep.json (resume)": (["sweep", "--resume", "sw_bin", "--no-report"], "sweep.json: not UTF-8"),
    "profile YAML": (["sweep", "--backends", "standalone", "--profiles", "prof", "--out", "o", *SW], "not UTF-8"),
    "compare JSON (report)": (["report", "run", "--out", "r.html", "--compare", "bin.bin"], "not UTF-8"),
}


@pytest.mark.parametrize("case", list(BINARY_INPUTS))
def test_binary_input_files_are_exit_2_with_one_line(case, files, no_model, capsys):
    argv, says = BINARY_INPUTS[case]
    code, _, err = cli(argv, capsys)
    one_error_line(code, err)
    assert says in err


OUTPUT_PATHS = {
    "run --out afile/sub": ["run", "--out", "afile/sub", *RUN],
    "run --out /proc/x": ["run", "--out", "/proc/x", *RUN],
    "run --out afile": ["run", "--out", "afile", *RUN],
    "sweep --out afile": ["sweep", "--out", "afile", *SW],
    "sweep --out afile/sub": ["sweep", "--out", "afile/sub", *SW],
    "sweep --out /proc/x": ["sweep", "--out", "/proc/x", *SW],
    "gate --junit afile/x.xml": ["gate", "run", "--baseline", "base.jsonl", "--junit", "afile/x.xml"],
    "gate --markdown /proc/x.md": ["gate", "run", "--baseline", "base.jsonl", "--markdown", "/proc/x.md"],
    "gate --junit DIR": ["gate", "run", "--baseline", "base.jsonl", "--junit", "run"],
    "report --out afile/x.html": ["report", "run", "--out", "afile/x.html"],
    "report --out /proc/x.html": ["report", "run", "--out", "/proc/x.html"],
    "baseline record --out afile/x": ["baseline", "record", "--out", "afile/x.jsonl", *RUN],
    "baseline record --out /proc/x": ["baseline", "record", "--out", "/proc/x.jsonl", *RUN],
    "baseline import --out afile/x": ["baseline", "import", "bin.bin", "--out", "afile/x.jsonl", "--tokenizer", "toy"],
    "bench-engine --out afile/x.json": ["bench-engine", "--out", "afile/x.json", "--model", "random", "-q"],
    "toy train --out afile/sub": ["toy", "train", "--out", "afile/sub"],
}


@pytest.mark.parametrize("case", list(OUTPUT_PATHS))
def test_output_paths_are_checked_before_any_work(case, files, no_model, capsys, tmp_path):
    code, _, err = cli(OUTPUT_PATHS[case], capsys)
    one_error_line(code, err)
    assert "--out" in err or "--junit" in err or "--markdown" in err
    assert not (tmp_path / "afile").is_dir() and (tmp_path / "afile").read_text() == "x"


LISTS = {
    "--budgets 16,,32": ["sweep", "--budgets", "16,,32", "--out", "o", *SW],
    "--budgets 32,": ["sweep", "--budgets", "32,", "--out", "o", *SW],
    "--budgets 16..2^40": ["sweep", "--budgets", "16..1099511627776", "--out", "o", *SW],
    "--budgets 99999999999": ["sweep", "--budgets", "99999999999", "--out", "o", *SW],
    "run --budget 2^40": ["run", "--budget", "1099511627776", "--out", "o", *RUN],
    "--concurrency 1,,4": ["sweep", "--concurrency", "1,,4", "--out", "o", *SW],
    "--temperatures 0,,1": ["sweep", "--temperatures", "0,,1", "--out", "o", *SW],
    "--methods ar,": ["sweep", *SW[:4], "--methods", "ar,", "--out", "o", "--no-report", "-q"],
    "--suites smoke,,smoke": ["sweep", "--suites", "smoke,,smoke", "--out", "o", "--models", "random", "--no-report", "-q"],
    "bench-engine --verify-tokens 1,,16": ["bench-engine", "--verify-tokens", "1,,16", "--model", "random", "-q"],
    "bench-engine --budgets 16..2^40": ["bench-engine", "--budgets", "16..1099511627776", "--model", "random", "-q"],
    "--profiles /nonexistent (in-process)": ["sweep", "--profiles", "/nonexistent/profiles", "--out", "o", *SW],
    "--profiles afile": ["sweep", "--profiles", "afile", "--backends", "standalone", "--out", "o", *SW[2:]],
}


@pytest.mark.parametrize("case", list(LISTS))
def test_empty_items_unbounded_ranges_and_missing_paths_are_exit_2(case, files, no_model, capsys, tmp_path):
    code, _, err = cli(LISTS[case], capsys)
    one_error_line(code, err)
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_budget_ceiling_is_written_once_and_enforced_everywhere():
    from ddtree_bench.run_spec import RunSpec, parse_budgets
    from ddtree_bench.errors import UsageError
    from ddtree_bench.sweep.grid import parse_budget_list

    assert parse_budgets(f"16..{D.MAX_BUDGET}")[-1] == D.MAX_BUDGET
    for bad in (f"16..{2 * D.MAX_BUDGET}", str(D.MAX_BUDGET + 1)):
        with pytest.raises(UsageError, match=str(D.MAX_BUDGET)):
            parse_budgets(bad)
    with pytest.raises(UsageError):
        parse_budget_list([16, D.MAX_BUDGET * 4])
    with pytest.raises(UsageError):
        RunSpec(budget=D.MAX_BUDGET + 1).validate()
    RunSpec(budget=D.MAX_BUDGET).validate()


def _rewrite_run_json(d: Path, **fields) -> Path:
    info = json.loads((d / "run.json").read_text())
    info.update(fields)
    (d / "run.json").write_text(json.dumps(info))
    return d


@pytest.mark.parametrize("fields,ok", [({"version": 1}, True), ({"version": 2}, True), ({"version": 99}, False),
                                        ({"kind": "something-else"}, False), ({"version": "2"}, False)])
def test_run_json_of_unknown_version_or_kind_is_refused_and_older_versions_read(fields, ok, files, capsys, tmp_path):
    d = _rewrite_run_json(shutil.copytree(files["run"], tmp_path / "r"), **fields)
    for argv in (["compare", d, "--baseline", files["base"]], ["gate", d, "--baseline", files["base"]],
                 ["report", d, "--out", tmp_path / "r.html"]):
        code, _, err = cli(argv, capsys)
        if ok:
            assert code == 0, err
        else:
            one_error_line(code, err)
            assert "run.json" in err
    if not ok:
        from ddtree_bench.errors import UsageError
        from ddtree_bench.results import load

        with pytest.raises(UsageError):
            load(d)


BAD_FIELDS = {   # a hand-edited or foreign records.jsonl: each field's wrong type or range, named in the error
    "accept_lengths": ([1, 2, "x"], '"accept_lengths" must be a list of integers >= 1'),
    "accept_lengths ": ([0, 0], '"accept_lengths" must be a list of integers >= 1'),
    "num_output_tokens": ("x", '"num_output_tokens" must be an integer >= 0'),
    "t_send_ns": ("x", '"t_send_ns" must be a number'),
    "error": (5, '"error" must be a string or null'),
    "prompt_ids": ([-1], '"prompt_ids" must be a list of token ids'),
    "chunk_tokens": ([1, 2], '"chunk_times_ns" has 1 entries for 2'),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_records_with_a_field_of_the_wrong_type_are_exit_2_naming_it(case, files, no_model, capsys, tmp_path):
    value, says = BAD_FIELDS[case]
    d = shutil.copytree(files["run"], tmp_path / "r")
    lines = (d / "records.jsonl").read_text().splitlines()
    rec = json.loads(lines[1])
    rec[case.strip()] = value
    if case == "chunk_tokens":
        rec["chunk_times_ns"] = [5]
    lines[1] = json.dumps(rec)
    (d / "records.jsonl").write_text("\n".join(lines) + "\n")
    for argv in (["compare", d, "--baseline", files["base"]], ["gate", d, "--baseline", files["base"]],
                 ["report", d, "--out", tmp_path / "r.html"], ["explain", d]):
        code, _, err = cli(argv, capsys)
        one_error_line(code, err)
        assert "records.jsonl:2: not a valid request record" in err and says in err, (argv[0], err)
    assert not (tmp_path / "r.html").exists()


def test_compare_json_of_a_newer_version_is_refused_by_report(files, capsys, tmp_path):
    code, out, _ = cli(["compare", files["run"], "--baseline", files["base"], "--json"], capsys)
    doc = json.loads(out)
    (tmp_path / "c1.json").write_text(json.dumps(doc))
    doc["version"] = 7
    (tmp_path / "c7.json").write_text(json.dumps(doc))
    assert cli(["report", files["run"], "--out", tmp_path / "a.html", "--compare", tmp_path / "c1.json"], capsys)[0] == 0
    code, _, err = cli(["report", files["run"], "--out", tmp_path / "b.html", "--compare", tmp_path / "c7.json"], capsys)
    one_error_line(code, err)
    assert "version 7" in err


def test_run_out_over_a_finished_run_needs_overwrite_and_never_replaces_foreign_dirs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--model", "random", "--method", "ar", *RUN]
    assert cli(argv + ["--out", "r"], capsys)[0] == 0
    first = (tmp_path / "r" / "records.jsonl").read_text()
    code, _, err = cli(argv + ["--out", "r"], capsys)
    one_error_line(code, err)
    assert "--overwrite" in err and (tmp_path / "r" / "records.jsonl").read_text() == first
    assert cli(argv + ["--out", "r", "--overwrite"], capsys)[0] == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, _, err = cli(argv + ["--out", "mine", "--overwrite"], capsys)
    one_error_line(code, err)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name or ".old" in p.name]


# ---------------------------------------------------------------------------- verdicts


def test_gate_markdown_escapes_prompt_ids_suite_and_model_names(tmp_path, capsys):
    evil = "<img src=x onerror=alert(1)>|[x](javascript:alert(1))@team"
    base = baseline_file(tmp_path / "b.jsonl", [entry(evil, OUT), entry("ok", OUT)], model="<b>m|x</b>", suite="<script>s</script>")
    run = run_dir(tmp_path / "run", [record(evil, OUT[:2] + [1] * 6), record("ok", OUT)], suite="a|b")
    md, xml = tmp_path / "g.md", tmp_path / "g.xml"
    code, _, _ = cli(["gate", run, "--baseline", base, "--markdown", md, "--junit", xml], capsys)
    assert code == 1
    text = md.read_text()
    for raw in ("<img", "<b>", "<script", "](javascript", "@team"):
        assert raw not in text, raw
    for line in text.splitlines():
        if line.startswith("| ") and "---" not in line:
            cells = re.split(r"(?<!\\)\|", line)  # unescaped pipes only: every row keeps its column count
            assert len(cells) - 2 in (3, 6), line
    import xml.etree.ElementTree as ET

    assert any(evil in (c.get("name") or "") for c in ET.parse(xml).getroot().iter("testcase"))  # XML escapes itself


def test_gate_fails_on_run_prompts_the_baseline_never_judged(tmp_path, capsys):
    base = baseline_file(tmp_path / "b.jsonl", [entry("a", OUT), entry("b", OUT)])
    run = run_dir(tmp_path / "run", [record(p, OUT) for p in ("a", "b", "c", "d")])
    code, out, err = cli(["gate", run, "--baseline", base], capsys)
    assert code == 1 and "unjudged_prompts" in err and "2 of the run's prompts/turns are not in the baseline" in out
    rules = tmp_path / "rules.yaml"
    rules.write_text("correctness:\n  max_unjudged_prompts: null\n")
    code, out, _ = cli(["gate", run, "--baseline", base, "--rules", rules], capsys)
    assert code == 0 and re.search(r"WARN\s+unjudged_prompts", out)


def test_near_ties_are_capped_where_no_reference_engine_can_recheck(tmp_path, capsys):
    gaps = [3.0, 0.2, 4.0, 0.05, 2.5, 1.0, 0.7, 6.0]
    pids = ["a", "b", "c", "d", "e"]
    base = baseline_file(tmp_path / "b.jsonl", [entry(p, OUT, gaps) for p in pids], model="/nowhere/model")
    run = run_dir(tmp_path / "run", [record(p, OUT[:1] + [99] * 7) for p in pids])  # garbage after a near tie at 1
    code, out, err = cli(["gate", run, "--baseline", base], capsys)
    assert code == 1 and "near_ties" in err
    assert "5 near ties that excuse the rest of their output (allowed 3)" in out and "the cap is the only guard" in out
    few = run_dir(tmp_path / "few", [record(p, OUT[:1] + [99] * 7) if p in "ab" else record(p, OUT) for p in pids])
    assert cli(["gate", few, "--baseline", base], capsys)[0] == 0


@pytest.fixture(scope="module")
def toy_near_tie(tmp_path_factory):
    """A toy baseline and two runs that flip at its nearest tie to the reference's runner-up there: one continues
    as the reference engine would from the flipped prefix, the other with garbage where the reference is confident."""
    import torch

    from ddtree_bench.baselines.file import read_baseline
    from ddtree_bench.baselines.record import _teacher_forced_rows
    from ddtree_bench.cli import main
    from ddtree_bench.pair import load_pair

    d = tmp_path_factory.mktemp("toy")
    try:
        main(["baseline", "record", "--suite", "smoke", "--limit", "1", "--max-new-tokens", "24", "--out", str(d / "b.jsonl"), "-q"])
    except SystemExit as e:
        assert not e.code
    e0 = json.loads((d / "b.jsonl").read_text().splitlines()[1])
    baseline = read_baseline(d / "b.jsonl")
    base_out, engine = e0["output_ids"], load_pair("toy", None, "ar").engine
    i = min(range(1, len(base_out) - 8), key=lambda j: e0["logit_gap"][j])  # the toy's own nearest tie
    assert e0["logit_gap"][i] < D.NEAR_TIE_GAP
    flip = int(torch.topk(_teacher_forced_rows(engine, e0["prompt_ids"], base_out)[i], 2).indices[1])  # runner-up
    ref = engine.generate(e0["prompt_ids"] + base_out[:i] + [flip], method="ar", max_new_tokens=len(base_out) - i - 1,
                          stop_ids=baseline.stop_ids, return_logit_gaps=True)
    good = base_out[:i] + [flip] + list(ref.output_ids)
    k = next(j for j, g in enumerate(ref.logit_gaps) if g >= D.NEAR_TIE_GAP)  # the reference is confident here
    bad_tok = next(t for t in (120, 121, 122) if t != ref.output_ids[k])
    bad = base_out[:i] + [flip] + list(ref.output_ids[:k]) + [bad_tok] * (len(ref.output_ids) - k)
    runs = {}
    for name, out in (("good", good), ("bad", bad)):
        runs[name] = run_dir(d / name, [record(e0["prompt_id"], out, prompt=e0["prompt_ids"],
                                               finish="stop" if out[-1] in baseline.stop_ids else "length")],
                             model="toy", suite="smoke", max_new_tokens=24)
    # a chat server that returns no prompt ids (llama.cpp, transformers serve): the baseline's stand in
    noids = record(e0["prompt_id"], bad, prompt=e0["prompt_ids"], finish="stop" if bad[-1] in baseline.stop_ids else "length")
    noids.prompt_ids, noids.num_prompt_tokens = None, len(e0["prompt_ids"])
    runs["bad_noids"] = run_dir(d / "bad_noids", [noids], model="toy", suite="smoke", max_new_tokens=24)
    # a server that stops right after the flip where the reference goes on confidently, leaving the EOS out
    early = record(e0["prompt_id"], base_out[:i] + [flip] + list(ref.output_ids[:k]), prompt=e0["prompt_ids"], finish="stop")
    runs["stop_early"] = run_dir(d / "stop_early", [early], model="toy", suite="smoke", max_new_tokens=24)
    # a run whose token at the near tie is neither the top-1 nor near it: a divergence there, not a near tie
    worst = int(torch.argmin(_teacher_forced_rows(engine, e0["prompt_ids"], base_out)[i]))
    runs["far"] = run_dir(d / "far", [record(e0["prompt_id"], base_out[:i] + [worst] + list(ref.output_ids),
                                             prompt=e0["prompt_ids"])], model="toy", suite="smoke", max_new_tokens=24)
    return d / "b.jsonl", runs, i, i + 1 + k


def test_a_near_tie_is_rechecked_from_the_runs_own_prefix_with_the_reference_engine(toy_near_tie, capsys):
    base, runs, tie_at, bad_at = toy_near_tie
    code, out, _ = cli(["gate", runs["good"], "--baseline", base], capsys)
    assert code == 0, out
    assert "re-checked from the run's own prefix with the reference engine: 1 confirmed, 0 diverged" in out
    code, out, err = cli(["gate", runs["bad"], "--baseline", base], capsys)
    assert code == 1 and "confident_divergences" in err
    assert f"at token {bad_at} after a near tie at {tie_at}" in out and "1 confirmed" not in out
    code, out, err = cli(["gate", runs["bad_noids"], "--baseline", base], capsys)   # passed as a near tie before
    assert code == 1 and "confident_divergences" in err and f"at token {bad_at} after a near tie at {tie_at}" in out
    code, out, err = cli(["gate", runs["stop_early"], "--baseline", base], capsys)   # was 'confirmed'
    assert code == 1 and f"at token {bad_at} after a near tie at {tie_at}" in out, out
    code, out, err = cli(["gate", runs["far"], "--baseline", base], capsys)
    assert code == 1 and f"at token {tie_at} after a near tie at {tie_at}" in out  # the flipped token itself judged
    rules = Path(base).with_name("cap-only.yaml")
    rules.write_text("correctness:\n  recheck_near_ties: false\n")
    code, out, _ = cli(["gate", runs["bad"], "--baseline", base, "--rules", rules], capsys)
    assert code == 0 and "the cap is the only guard" in out  # what the cap alone lets through, and says so


def test_the_recheck_calls_a_near_greedy_sampler_inconclusive(monkeypatch):
    """More than MAX_FLIPS tokens off the reference's top-1, each within the threshold, is not a greedy decode;
    float noise of the teacher-forced forward (deficits ~1e-6) is no flip."""
    from types import SimpleNamespace

    import ddtree_bench.baselines.record as R
    from ddtree_bench.verdict import near_tie_recheck as N

    cases = {"confirmed": [0.0, 0.3] + [1e-6] * 30, "inconclusive": [0.0, 0.3] + [0.0, 0.2] * (N.MAX_FLIPS + 1)}
    for want, deficits in cases.items():
        monkeypatch.setattr(R, "token_deficits", lambda e, p, o, d=deficits, **k: d)
        engine = SimpleNamespace(target=SimpleNamespace(cfg=SimpleNamespace(vocab_size=64)))
        assert N.recheck_one(engine, [1], [0] * len(deficits), 1, 1.0).status == want


def test_sweep_help_defaults_come_from_defaults(capsys):
    code, out, _ = cli(["sweep", "--help"], capsys)
    flat = " ".join(out.split())
    assert code == 0 and f"Prompts per point. [default: {D.SWEEP_LIMIT}]" in flat
    assert f"[default: {D.SWEEP_MAX_NEW_TOKENS}]" in flat and f"[default: {D.SWEEP_BUDGETS}]" in flat


def test_committed_baselines_carry_no_machine_paths_and_old_headers_still_read(tmp_path):
    from ddtree_bench.baselines.file import portable_header, read_baseline

    for f in sorted((ROOT / "baselines").glob("*.jsonl")):
        header = f.read_text(encoding="utf-8").splitlines()[0]
        assert not re.search(r'"/(work|root|home|tmp|Users)/', header), f.name
        assert json.loads(header)["model_path"].startswith("bundled:")
    old = tmp_path / "old.jsonl"
    lines = (ROOT / "baselines" / "toy-smoke.jsonl").read_text().splitlines()
    h = json.loads(lines[0])
    h["model_path"] = "/work/main/ddtree_bench/models/toy/target"  # as the recorder used to write it
    old.write_text("\n".join([json.dumps(h), *lines[1:]]) + "\n")
    assert len(read_baseline(old).entries) == len(lines) - 1
    from ddtree_bench.baselines.file import PACKAGE_DIR

    p = portable_header({"model_path": str(PACKAGE_DIR / "models" / "toy" / "target"), "command": ["/usr/bin/ddtree-bench", "x"],
                         "suite_info": {"spec_file": "/elsewhere/s.yaml"}}, cwd=tmp_path)
    assert p == {"model_path": "bundled:models/toy/target", "command": ["ddtree-bench", "x"],
                 "suite_info": {"spec_file": "/elsewhere/s.yaml"}}
    # a bundled suite spec recorded from another working directory (suite_specs links out of the package in a checkout)
    for spec in (PACKAGE_DIR / "suite_specs" / "gsm8k.yaml", (PACKAGE_DIR / "suite_specs" / "gsm8k.yaml").resolve()):
        got = portable_header({"suite_info": {"spec_file": str(spec)}}, cwd=tmp_path)["suite_info"]["spec_file"]
        assert got == "bundled:suite_specs/gsm8k.yaml", spec


def test_gate_and_compare_use_the_same_near_tie_default_for_a_server_baseline(tmp_path, capsys):
    gap = (D.NEAR_TIE_GAP + D.SERVER_NEAR_TIE_GAP) / 2  # a near tie for server logprob gaps, confident for fp32 ones
    gaps = [5.0, gap] + [5.0] * 6
    run = run_dir(tmp_path / "run", [record("a", OUT[:1] + [99] * 7)])
    for source, code in (("server", 0), ("record", 1)):
        base = baseline_file(tmp_path / f"{source}.jsonl", [entry("a", OUT, gaps)], source=source, model="/nowhere/model")
        c, out, _ = cli(["compare", run, "--baseline", base, "--json"], capsys)
        kind = json.loads(out)["prompts"][0]["kind"]
        assert kind == ("near_tie" if source == "server" else "divergence")
        got, out, _ = cli(["gate", run, "--baseline", base], capsys)
        assert got == code, out


@pytest.mark.parametrize("env,said", [("DDTREE_GPU_EXPERIMENTAL", "unknown feature(s) turbo"),
                                      ("DDTREE_GEMM_TABLE", "cannot read it as JSON"),
                                      ("DDTREE_TREE_RANGES", "must be a positive integer, got 'turbo'")])
def test_a_bad_gpu_knob_is_exit_2_before_any_work(env, said, capsys, monkeypatch, tmp_path):
    """The GPU path reads these deep inside a forward; the CLI checks them first, so a typo is one line and
    exit 2 on every command, not a run whose requests all failed."""
    from process_support import cli_in_process

    bad = tmp_path / "table.json"
    bad.write_bytes(b"\x89PNG\x00")
    monkeypatch.setenv(env, str(bad) if env == "DDTREE_GEMM_TABLE" else "turbo")
    res = cli_in_process(capsys, "suites", check=False)
    assert res.returncode == 2 and said in res.stderr and len(res.stderr.strip().splitlines()) <= 2
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a host without CUDA")
@pytest.mark.parametrize("argv,says", [
    (["--device", "cuda"], "needs 1 GPUs; 0 visible"),
    (["--device", "cuda", "--gpus-per-point", "2", "--dry-run"], "needs 2 GPUs; 0 visible"),
    (["--models", "/nonexistent/model"], "model directory /nonexistent/model does not exist"),
])
def test_a_sweep_refuses_what_run_refuses_before_writing_anything(argv, says, tmp_path, capsys):
    """Input `run` refuses with exit 2 (no CUDA here, no model directory) was exit 1 in a sweep after it had
    written points/, summary.csv and a report; the serial loop checked no GPU count at all."""
    out = tmp_path / "sw"
    code, _, err = cli(["sweep", "--methods", "ar", "--limit", "1", "--max-new-tokens", "2", "--out", out, "-q", *argv], capsys)
    one_error_line(code, err)
    assert says in err and not out.exists()


@pytest.mark.parametrize("dry", [False, True])
def test_a_sweep_checks_every_pairs_configs_before_writing_anything(dry, tmp_path, capsys):
    """A drafter that does not fit its target, a missing drafter, a hybrid config whose layer_types are short: exit 2
    with run's own line before anything is written (was exit 1 after writing points and a report, and a --resume
    hint that failed again; --dry-run passed them)."""
    from ddtree_bench.pair import BUNDLED

    bad_draft = shutil.copytree(BUNDLED["toy-hybrid"] / "draft", tmp_path / "bad-draft")
    cfg = json.loads((bad_draft / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 3, 99]
    (bad_draft / "config.json").write_text(json.dumps(cfg))
    short = shutil.copytree(BUNDLED["toy-hybrid"], tmp_path / "short")
    tcfg = json.loads((short / "target" / "config.json").read_text())
    text = tcfg.get("text_config", tcfg)
    text["layer_types"] = text["layer_types"][:-1]
    (short / "target" / "config.json").write_text(json.dumps(tcfg))
    cases = [(["--models", "toy-hybrid", "--drafts", str(bad_draft)], "[99] outside the target's"),
             (["--models", "toy-hybrid", "--drafts", str(tmp_path / "nowhere")], "does not exist"),
             (["--models", str(short / "target"), "--drafts", str(short / "draft")], "layer_types")]
    for argv, says in cases:
        out = tmp_path / "sw"
        code, _, err = cli(["sweep", "--methods", "ddtree", "--budgets", "16", "--limit", "1", "--max-new-tokens", "2",
                            "--out", out, "-q", *argv, *(["--dry-run"] if dry else [])], capsys)
        one_error_line(code, err)
        assert says in err and not out.exists(), (argv, err)


def test_gate_on_a_sweep_directory_points_to_its_points(tmp_path, capsys):
    base = baseline_file(tmp_path / "b.jsonl", [entry("a", OUT)])
    sweep = tmp_path / "sw"
    (sweep / "points").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    code, _, err = cli(["gate", sweep, "--baseline", base], capsys)
    assert code == 2 and "is not a run directory" in err and "hint: gate one point: SWEEP/points/<point-id>" in err


def test_a_token_id_outside_the_vocabulary_fails_the_gate_instead_of_crashing_it(toy_near_tie, capsys, tmp_path):
    """A server that returned id 99999 (the toy's vocabulary is far smaller) at a near tie: 'internal error:
    IndexError' from the teacher-forced forward before; now a confident divergence that names the id."""
    from ddtree_bench.baselines.file import read_baseline

    base, _, tie_at, _ = toy_near_tie
    e0 = read_baseline(base).entries[0]
    out = list(e0.output_ids[:tie_at]) + [99999] + list(e0.output_ids[tie_at + 1:])
    run = run_dir(tmp_path / "oov", [record(e0.prompt_id, out, prompt=e0.prompt_ids)], model="toy", suite="smoke",
                  max_new_tokens=24)
    code, text, err = cli(["gate", run, "--baseline", base], capsys)
    assert code == 1 and "confident_divergences" in err and "Traceback" not in err and "internal error" not in err
