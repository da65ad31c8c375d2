"""gate: exit codes, rules files, noise-aware metric rules, JUnit and markdown, on hand-built runs."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from baseline_support import STOP, baseline_file, cli, entry, record, run_dir
from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.verdict.gate import judge
from ddtree_bench.verdict.rules import MetricRule, load_rules

OUT = [10, 11, 12, 13, 14, 15, 16, STOP]
GAPS = [3.0, 0.2, 4.0, 0.05, 2.5, 1.0, 0.7, 6.0]


@pytest.fixture
def base(tmp_path):
    return baseline_file(tmp_path / "b.jsonl", [entry("a", OUT, GAPS, accept=[3, 3, 2]), entry("b", OUT, GAPS, accept=[3, 3, 2])],
                         accept_method="ddtree", budget=64, block_size=16)


def test_exit_codes(tmp_path, base, capsys):
    good = run_dir(tmp_path / "good", [record("a", OUT, accept=[3, 3, 2]), record("b", OUT, accept=[3, 3, 2])])
    code, out, _ = cli(["gate", good, "--baseline", base], capsys)
    assert code == 0 and "gate: PASSED" in out
    near = run_dir(tmp_path / "near", [record("a", OUT[:3] + [1] * 5, accept=[3, 3, 2]), record("b", OUT, accept=[3, 3, 2])])
    assert cli(["gate", near, "--baseline", base], capsys)[0] == 0  # a near tie (gap 0.05 at 3) passes
    bug = run_dir(tmp_path / "bug", [record("a", OUT[:2] + [1] * 6, accept=[3, 3, 2]), record("b", OUT, accept=[3, 3, 2])])
    code, out, err = cli(["gate", bug, "--baseline", base], capsys)
    assert code == 1 and "confident_divergences" in err and "a turn 0 at token 2 (gap 4)" in out
    err_run = run_dir(tmp_path / "err", [record("a", None, error="http: 500"), record("b", OUT, accept=[3, 3, 2])])
    code, _, err = cli(["gate", err_run, "--baseline", base], capsys)
    assert code == 1 and "request_errors" in err
    slow_tau = run_dir(tmp_path / "tau", [record("a", OUT, accept=[2, 2, 2, 2]), record("b", OUT, accept=[2, 2, 2, 2])])
    code, out, err = cli(["gate", slow_tau, "--baseline", base], capsys)
    assert code == 1 and "acceptance_length_mean" in err  # tau 2.0 < 0.95 x 2.67
    bad_rules = tmp_path / "rules.yaml"
    bad_rules.write_text("correctness:\n  max_confident_divergence: 0\n")  # typo: unknown key
    for argv in (["gate", good, "--baseline", base, "--rules", bad_rules],
                 ["gate", good, "--baseline", tmp_path / "nope.jsonl"],
                 ["gate", tmp_path / "nope", "--baseline", base],
                 ["gate", good, "--baseline", base, "--reference-run", tmp_path / "nope"],
                 ["gate", good, "--baseline", base, "--junit", tmp_path]):
        code, _, err = cli(argv, capsys)
        assert code == 2 and err.startswith("error: "), argv


def test_junit_and_markdown(tmp_path, base, capsys):
    run = run_dir(tmp_path / "run", [record("a", OUT[:2] + [1] * 6, accept=[3, 3, 2]), record("b", OUT[:1] + [1] * 7, accept=[3, 3, 2])])
    junit, md = tmp_path / "out" / "gate.xml", tmp_path / "out" / "gate.md"
    code, _, _ = cli(["gate", run, "--baseline", base, "--junit", junit, "--markdown", md], capsys)
    assert code == 1
    root = ET.parse(junit).getroot()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"ddtree-bench.correctness", "ddtree-bench.performance", "ddtree-bench.prompts"}
    cases = {c.get("name"): c for c in suites["ddtree-bench.prompts"].iter("testcase")}
    assert set(cases) == {"a turn 0", "b turn 0"}
    assert cases["a turn 0"].find("failure") is not None and cases["a turn 0"].find("failure").get("type") == "divergence"
    assert cases["b turn 0"].find("failure") is None and "near_tie" in cases["b turn 0"].find("system-out").text
    rule_cases = {c.get("name"): c for c in suites["ddtree-bench.correctness"].iter("testcase")}
    assert rule_cases["confident_divergences"].find("failure") is not None
    assert root.get("failures") == "2"  # the rule and its prompt
    text = md.read_text()
    assert text.startswith("## ddtree-bench gate: ❌ failed") and "| confident_divergences | ❌ fail |" in text
    assert "### Failing prompts (1)" in text and "Near ties (1)" in text


def test_temperature_above_zero_skips_token_rules_but_not_errors(tmp_path, base, capsys):
    recs = [record("a", [1, 2, 3], accept=[3, 3, 2]), record("b", [4, 5], accept=[3, 3, 2])]
    run = run_dir(tmp_path / "t1", recs, temperature=1.0)
    code, out, _ = cli(["gate", run, "--baseline", base], capsys)
    assert code == 0 and "SKIP  confident_divergences" in out
    assert "decode at different temperatures" in out  # tau at T=1 is not judged against a greedy baseline's
    run = run_dir(tmp_path / "t1e", recs + [record("c", None, error="timeout")], temperature=1.0)
    assert cli(["gate", run, "--baseline", base], capsys)[0] == 1


def test_reference_runs_and_noise(tmp_path, base, capsys):
    recs = [record("a", OUT, accept=[3, 3, 2]), record("b", OUT, accept=[3, 3, 2])]
    run = run_dir(tmp_path / "run", recs, summary={"output_throughput_tok_s": 85.0})
    steady = [run_dir(tmp_path / f"s{i}", recs, summary={"output_throughput_tok_s": 100.0}) for i in range(3)]
    noisy = [run_dir(tmp_path / f"n{i}", recs, summary={"output_throughput_tok_s": v}) for i, v in enumerate((80.0, 100.0, 120.0))]
    args = ["gate", run, "--baseline", base]
    code, out, _ = cli(args + [x for r in steady for x in ("--reference-run", r)], capsys)
    assert code == 1 and "tolerance 10.0%" in out  # -15% of a steady 100 tok/s
    code, out, _ = cli(args + [x for r in noisy for x in ("--reference-run", r)], capsys)
    # t(0.975, 2) = 4.303; 4.303 x s 20 x sqrt(1 + 1/3) / mean 100 = 99.4%: three runs this noisy say little
    assert code == 0 and "widened by noise 99.4%" in out
    code, _, err = cli(args + ["--reference-run", tmp_path / "run"], capsys)   # the gated run itself
    assert code == 2 and "is the run being gated: it cannot be its own reference" in err


def test_reference_spread_is_the_t_prediction_interval():
    from ddtree_bench.verdict.gate import reference_spread

    assert reference_spread([100.0]) is None and reference_spread([100.0, 100.0, 100.0]) == 0.0
    assert reference_spread([80.0, 100.0, 120.0]) == pytest.approx(4.302653 * 20 * (4 / 3) ** 0.5 / 100, rel=1e-4)
    many = [100.0 + (-1) ** i * 5 for i in range(40)]  # t -> 1.96-ish; sqrt(1 + 1/n) -> 1
    assert reference_spread(many) == pytest.approx(2.0227 * 5.064 * (1 + 1 / 40) ** 0.5 / 100, rel=2e-3)


def test_judge_is_direction_aware():
    higher = MetricRule("output_throughput_tok_s", "reference", "higher", 0.1)
    lower = MetricRule("tpot_ms.p50", "reference", "lower", 0.1)
    assert judge(higher, 95.0, 100.0, None, "ref").status == "pass"
    assert judge(higher, 89.0, 100.0, None, "ref").status == "fail"
    assert judge(higher, 150.0, 100.0, None, "ref").status == "pass"  # faster is never a regression
    assert judge(lower, 105.0, 100.0, None, "ref").status == "pass"
    assert judge(lower, 111.0, 100.0, None, "ref").status == "fail"
    assert judge(lower, 50.0, 100.0, None, "ref").status == "pass"
    assert judge(lower, 111.0, 100.0, 0.05, "ref").status == "fail"  # noise_k 0: spread ignored
    warn = MetricRule("tpot_ms.p50", "reference", "lower", 0.1, severity="warn")
    assert judge(warn, 200.0, 100.0, None, "ref").status == "warn"


def test_rules_files_merge_over_defaults_and_reject_unknown_keys(tmp_path):
    d = load_rules()
    assert d.max_confident_divergences == 0 and d.max_errors == 0 and d.near_tie_gap == D.NEAR_TIE_GAP
    assert [(m.metric, m.against) for m in d.metrics] == [("acceptance_length_mean", "baseline"), ("output_throughput_tok_s", "reference")]
    f = tmp_path / "r.yaml"
    f.write_text("correctness:\n  near_tie_gap: 1.5\n  min_exact_match_rate: 0.66\nmetrics:\n  - metric: tpot_ms.p99\n    tolerance: 0.2\n")
    r = load_rules(f)
    assert r.near_tie_gap == 1.5 and r.min_exact_match_rate == 0.66 and r.max_errors == 0
    assert [(m.metric, m.against, m.direction) for m in r.metrics] == [("tpot_ms.p99", "reference", "lower")]
    for bad, msg in (("speed: 1\n", "unknown key 'speed'"),
                     ("metrics:\n  - metric: tpot_ms.p50\n    tolerance: 0.1\n    tolerence: 0.2\n", "unknown key 'tolerence'"),
                     ("metrics:\n  - metric: tok_per_s\n    tolerance: 0.1\n", "unknown metric"),
                     ("metrics:\n  - metric: output_throughput_tok_s\n    against: baseline\n    tolerance: 0.1\n", "only acceptance"),
                     ("correctness:\n  max_errors: -1\n", "max_errors"),
                     ("correctness:\n  near_tie_gap: .nan\n", "correctness.near_tie_gap must be a number >= 0"),
                     ("correctness:\n  near_tie_gap: .inf\n", "correctness.near_tie_gap must be a number >= 0"),
                     ("correctness: [1\n", "malformed YAML")):
        f.write_text(bad)
        with pytest.raises(UsageError, match=msg):
            load_rules(f)


def test_prompt_mismatches_fail_and_total_mismatch_is_bad_input(tmp_path, base, capsys):
    one = run_dir(tmp_path / "one", [record("a", OUT, prompt=[9, 9], accept=[3, 3, 2]), record("b", OUT, accept=[3, 3, 2])])
    code, out, err = cli(["gate", one, "--baseline", base], capsys)
    assert code == 1 and "prompt_mismatches" in err and "a turn 0" in out
    every = run_dir(tmp_path / "every", [record("a", OUT, prompt=[9]), record("b", OUT, prompt=[9])])
    code, _, err = cli(["gate", every, "--baseline", base], capsys)
    assert code == 2 and "every prompt" in err


def _no_ids(rec, count):
    """A record as a server that returns no prompt ids writes it (llama.cpp's chat endpoint): its count, or none."""
    from dataclasses import replace

    return replace(rec, prompt_ids=None, num_prompt_tokens=count)


def test_prompts_without_ids_are_checked_by_count_or_said_unchecked(tmp_path, base, capsys):
    """The baseline's prompts have 4 tokens. A server count of 4 passes by count; 41 is a prompt mismatch (the
    outputs are not diffed); no ids and no counts skip the check and say so - never a silent 'PASS 0'."""
    ok = [record("a", OUT, accept=[3, 3, 2]), record("b", OUT, accept=[3, 3, 2])]
    same = run_dir(tmp_path / "same", [_no_ids(r, 4) for r in ok])
    code, out, _ = cli(["gate", same, "--baseline", base], capsys)
    assert code == 0 and "by the server's prompt-token count only 2" in out, out
    off = run_dir(tmp_path / "off", [_no_ids(ok[0], 41), _no_ids(ok[1], 4)])
    code, out, err = cli(["gate", off, "--baseline", base], capsys)
    assert code == 1 and "prompt_mismatches" in err and "a turn 0" in out
    blind = run_dir(tmp_path / "blind", [_no_ids(r, None) for r in ok])
    code, out, _ = cli(["gate", blind, "--baseline", base], capsys)
    assert code == 0 and "not checked: the run's records carry no prompt token ids" in out and "--endpoint completions" in out
