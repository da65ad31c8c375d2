"""compare on hand-built baselines and records: each test fixes the tokens and gaps it judges."""

from __future__ import annotations

import json

import pytest

from baseline_support import STOP, baseline_file, cli, entry, record, run_dir
from ddtree_bench import defaults as D
from ddtree_bench.baselines.file import read_baseline
from ddtree_bench.verdict.compare import compare_records
from ddtree_bench.errors import UsageError

OUT = [10, 11, 12, 13, 14, 15, 16, STOP]
GAPS = [3.0, 0.2, 4.0, 0.05, 2.5, 1.5, 0.7, 6.0]  # near ties (below the default 1.0) at 1, 3 and 6


def _baseline(tmp_path, entries, **header):
    return read_baseline(baseline_file(tmp_path / "b.jsonl", entries, **header))


@pytest.mark.parametrize("index", range(len(OUT) - 1))
def test_an_altered_token_is_found_at_its_index(tmp_path, index):
    b = _baseline(tmp_path, [entry("p", OUT, GAPS)])
    out = list(OUT)
    out[index] = 99
    p = compare_records([record("p", out)], b).prompts[0]
    assert p.match is False and p.first_divergence == index
    assert p.gap == GAPS[index]
    assert p.kind == ("near_tie" if GAPS[index] < D.NEAR_TIE_GAP else "divergence")
    assert p.context_ids["baseline"][0] == OUT[index] and p.context_ids["run"][0] == 99
    assert p.context_ids["before"] == OUT[max(0, index - 8):index]


def test_near_tie_threshold_decides_the_class(tmp_path):
    b = _baseline(tmp_path, [entry("p", OUT, GAPS)])
    out = OUT[:6] + [99, 98]  # diverges at 6 where the gap is 0.7
    assert compare_records([record("p", out)], b, near_tie_gap=0.5).prompts[0].kind == "divergence"
    assert compare_records([record("p", out)], b, near_tie_gap=0.71).prompts[0].kind == "near_tie"
    assert compare_records([record("p", out)], b, near_tie_gap=0.7).prompts[0].kind == "divergence"  # gap < threshold, strictly


def test_totals_and_json_contract(tmp_path):
    b = _baseline(tmp_path, [entry("a", OUT, GAPS), entry("b", OUT, GAPS), entry("c", OUT, GAPS), entry("d", OUT, GAPS)])
    recs = [record("a", OUT), record("b", OUT[:3] + [0] * 5), record("c", OUT[:1] + [0] * 7), record("d", None, error="http: 500")]
    doc = compare_records(recs, b).to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["exact_match_rate"] == 0.25 and doc["num_prompts"] == 4
    assert doc["num_confident_divergences"] == 0 and doc["num_near_ties"] == 2  # b at 3 (gap 0.05), c at 1 (0.2)
    assert doc["num_errors"] == 1
    for p in doc["prompts"]:
        assert set(p) >= {"prompt_id", "turn", "match", "first_divergence", "gap", "kind", "baseline_len", "output_len", "context"}
    kinds = {p["prompt_id"]: p["kind"] for p in doc["prompts"]}
    assert kinds == {"a": "match", "b": "near_tie", "c": "near_tie", "d": "error"}
    assert doc["gap_at_divergence"]["near_tie_max"] == 0.2


@pytest.mark.parametrize("base, out, run_finish, reason", [
    (OUT, OUT[:5], "length", "run_truncated"),          # the run hit a smaller max_new_tokens
    (OUT, OUT[:-1], "stop", "eos_stripped"),            # a server that strips the final stop id
    (OUT, OUT[:4], "stop", "early_stop"),               # ended with neither stop nor length
    (OUT, OUT + [20, 21], "length", "stop_ignored"),    # ran past the stop token
    (OUT[:4], OUT[:6], "length", "baseline_truncated"),
])
def test_length_only_differences_are_labelled(tmp_path, base, out, run_finish, reason):
    b = _baseline(tmp_path, [entry("p", base, [5.0] * len(base), finish="length" if base[-1] != STOP else "stop")])
    p = compare_records([record("p", out, finish=run_finish)], b).prompts[0]
    assert p.kind == "length_only" and p.reason == reason, p.explanation
    assert p.first_divergence == min(len(base), len(out)) and p.gap is None


def test_prompt_mismatch_is_flagged_not_diffed(tmp_path):
    b = _baseline(tmp_path, [entry("a", OUT, GAPS), entry("b", OUT, GAPS)])
    recs = [record("a", [99] * 8, prompt=[1, 2, 9, 0]), record("b", OUT)]
    a = compare_records(recs, b).prompts[0]
    assert a.kind == "prompt_mismatch" and a.match is None and a.first_divergence is None
    assert "from token 2" in a.explanation
    with pytest.raises(UsageError, match="every prompt"):
        compare_records([record("a", OUT, prompt=[7]), record("b", OUT, prompt=[7])], b)
    with pytest.raises(UsageError, match="no \\(prompt, turn\\)"):
        compare_records([record("zzz", OUT)], b)


def test_a_later_turn_after_a_divergence_is_not_compared(tmp_path):
    b = _baseline(tmp_path, [entry("m", OUT, GAPS, turn=0), entry("m", OUT, GAPS, turn=1, prompt=[1, 2, 3, 10, 11])])
    diverged = OUT[:1] + [99] * 7  # near tie at 1
    recs = [record("m", diverged, turn=0), record("m", OUT, turn=1, prompt=[1, 2, 3, 10, 99])]
    c = compare_records(recs, b)
    assert [p.kind for p in c.prompts] == ["near_tie", "after_divergence"]
    assert c.count("prompt_mismatch") == 0


def test_unknown_gap_for_imported_baselines(tmp_path):
    e = entry("p", OUT)
    e.logit_gap = None  # as `baseline import` writes it without --gaps-from-model
    b = _baseline(tmp_path, [e])
    p = compare_records([record("p", OUT[:2] + [1] * 6)], b).prompts[0]
    assert p.kind == "unknown" and p.gap is None and p.first_divergence == 2


def test_temperature_above_zero_compares_acceptance_not_tokens(tmp_path):
    accept_b, accept_r = [3, 3, 2], [4, 2, 2]
    b = _baseline(tmp_path, [entry("a", OUT, GAPS, accept=accept_b), entry("b", OUT, GAPS, accept=accept_b)],
                  accept_method="ddtree", budget=64, block_size=4)
    recs = [record("a", [1, 2, 3], accept=accept_r), record("b", [4, 5, 6, 7], accept=accept_r)]  # different samples
    c = compare_records(recs, b, run_info={"spec": {"temperature": 1.0, "method": "ddtree", "budget": 64}})
    doc = c.to_json()
    assert doc["token_comparable"] is False and "distribution" in doc["not_comparable_reason"]
    assert doc["exact_match_rate"] is None and doc["num_confident_divergences"] is None and doc["num_near_ties"] is None
    assert {p["kind"] for p in doc["prompts"]} == {"sampled"}
    acc = doc["acceptance"]
    assert acc["tau_run"] == pytest.approx(8 / 3) and acc["tau_baseline"] == pytest.approx(8 / 3)
    assert acc["histogram_run"] == {"1": 0.0, "2": pytest.approx(2 / 3), "3": 0.0, "4": pytest.approx(1 / 3)}
    # baseline {2: 1/3, 3: 2/3} vs run {2: 2/3, 4: 1/3}: TV = (1/3 + 2/3 + 1/3) / 2
    assert acc["histogram_tv_distance"] == pytest.approx(2 / 3)
    # rate at depth d = share of rounds with a - 1 >= d: run [1, 1/3, 1/3], baseline [1, 2/3, 0]
    assert acc["rate_by_depth_delta"] == pytest.approx([0.0, -1 / 3, 1 / 3])


def test_cli_compare_reports_and_exits_0(tmp_path, capsys):
    base = baseline_file(tmp_path / "b.jsonl", [entry("a", OUT, GAPS), entry("b", OUT, GAPS)])
    run = run_dir(tmp_path / "run", [record("a", OUT), record("b", OUT[:2] + [0] * 6)])
    code, out, _ = cli(["compare", run, "--baseline", base], capsys)
    assert code == 0
    assert "divergence" in out and "exact match 1/2 (50.0%)" in out and "confident divergences 1" in out
    code, out, _ = cli(["compare", run, "--baseline", base, "--json", "--near-tie-gap", "5"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["num_near_ties"] == 1 and doc["near_tie_gap"] == 5
    for argv in (["compare", run, "--baseline", tmp_path / "missing.jsonl"], ["compare", tmp_path, "--baseline", base],
                 ["compare", run, "--baseline", base, "--near-tie-gap", "-1"], ["compare", run]):
        code, _, err = cli(argv, capsys)
        assert code == 2 and err.startswith("error: "), argv


def test_server_runs_are_described_by_the_servers_own_report(tmp_path):
    """For server backends the client's --dtype means nothing: facts come from server_info."""
    b = _baseline(tmp_path, [entry("p", OUT, GAPS)], model_hash="sha256:aaa", dtype="float32")
    info = {"spec": {"backend": "standalone", "dtype": "float32", "max_new_tokens": 16},
            "backend": {"kind": "standalone", "stop_ids": None,
                        "server_info": {"model_hash": "sha256:bbb", "dtype": "bfloat16", "stop_ids": [STOP, 7]}}}
    c = compare_records([record("p", OUT)], b, run_info=info)
    text = " | ".join(c.warnings)
    assert "sha256:bbb" in text and "bfloat16" in text and "stop ids" in text
    assert c.run_info["dtype"] == "bfloat16"
    sglang = {"spec": {"backend": "sglang", "dtype": "float16"}, "backend": {"kind": "sglang"}}
    assert compare_records([record("p", OUT)], b, run_info=sglang).warnings == []  # unknown dtype: no claim


def test_a_run_whose_concurrency_was_not_honoured_says_so(tmp_path, capsys):
    """Outputs compare as they are, but a serialised run did not test batched correctness: compare says so."""
    base = baseline_file(tmp_path / "b.jsonl", [entry("a", OUT, GAPS)])
    why = "the server runs one request at a time (its /server_info max_batch = 1)"
    serial = run_dir(tmp_path / "serial", [record("a", OUT)], concurrency=4,
                     summary={"concurrency_requested": 4, "concurrency_honoured": False, "concurrency_why": why})
    batched = run_dir(tmp_path / "batched", [record("a", OUT)], concurrency=4,
                      summary={"concurrency_requested": 4, "concurrency_honoured": True, "concurrency_why": None})
    code, out, _ = cli(["compare", serial, "--baseline", base], capsys)
    assert code == 0 and "c=4 (NOT honoured)" in out
    assert f"warning: the run asked for concurrency 4, which was not honoured ({why})" in out
    code, out, _ = cli(["compare", batched, "--baseline", base], capsys)
    assert code == 0 and "c=4," in out and "honoured" not in out
    code, out, _ = cli(["compare", serial, "--baseline", base, "--json"], capsys)
    doc = json.loads(out)
    assert doc["run_info"]["concurrency"] == 4 and doc["run_info"]["concurrency_honoured"] is False


def test_gaps_rescored_on_another_model_are_a_model_mismatch(tmp_path, capsys):
    """An import whose gaps came from --gaps-from-model of another target: its near ties are that model's, so compare
    and gate refuse the pair (exit 2) unless --allow-model-mismatch, as for the baseline's own model."""
    from ddtree_bench.verdict.compare import model_mismatch

    header = {"model": "toy-hybrid", "model_hash": None,
              "logit_gap_source": {"model": "toy", "model_hash": "sha256:dense"}}
    run = {"spec": {"backend": "inprocess", "model": "toy-hybrid", "model_hash": "sha256:hybrid"}}
    assert "the baseline's logit gaps come from toy (sha256:dense), not the run's target toy-hybrid" in model_mismatch(run, header)
    run["spec"]["model_hash"] = "sha256:dense"
    assert model_mismatch(run, header) is None
    b = baseline_file(tmp_path / "b.jsonl", [entry("p", OUT, GAPS)], logit_gap_source={"model": "toy", "model_hash": "sha256:dense"})
    r = run_dir(tmp_path / "r", [record("p", OUT)], model_hash="sha256:hybrid")
    for cmd in ("compare", "gate"):
        code, _, err = cli([cmd, r, "--baseline", b], capsys)
        assert code == 2 and "logit gaps come from toy" in err and "--allow-model-mismatch" in err, (cmd, err)


def test_tau_against_a_baseline_of_another_method_budget_or_temperature_is_marked_not_comparable():
    from ddtree_bench.verdict.compare import acceptance_mismatch

    header = {"accept_method": "ddtree", "budget": 64, "temperature": 0.0}
    run = {"spec": {"backend": "inprocess", "method": "ddtree", "budget": 64, "temperature": 0.0}}
    assert acceptance_mismatch(run, header) is None
    run["spec"]["temperature"] = 1.0
    assert "different temperatures" in acceptance_mismatch(run, header)
    run["spec"].update(temperature=0.0, budget=16)
    assert acceptance_mismatch(run, header) == "the baseline's acceptance lengths are from ddtree B=64, the run is ddtree B=16"
    run["spec"]["method"] = "dflash"
    assert acceptance_mismatch(run, header).endswith("the run is dflash")
    assert acceptance_mismatch(run, {"accept_method": None}) is None
