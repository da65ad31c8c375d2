"""`baseline record` end to end on the random pair, and the baseline file's validation."""

from __future__ import annotations

import json

import pytest

from baseline_support import cli
from ddtree_bench.baselines.file import read_baseline
from ddtree_bench.errors import UsageError

MAX_NEW = 24


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One AR baseline (with DDTree acceptance lengths) of the smoke suite on the random pair, and a DDTree run."""
    from ddtree_bench.cli import main

    d = tmp_path_factory.mktemp("rec")
    base, run = d / "smoke.jsonl", d / "run"
    for argv in (["baseline", "record", "--model", "random", "--suite", "smoke", "--max-new-tokens", MAX_NEW,
                  "--accept-method", "ddtree", "--budget", 8, "--out", base, "-q"],
                 ["run", "--model", "random", "--method", "ddtree", "--budget", 8, "--suite", "smoke",
                  "--max-new-tokens", MAX_NEW, "--warmup", 0, "--out", run, "-q"]):
        try:
            main([str(a) for a in argv])
        except SystemExit as e:
            assert not e.code, f"{argv} exited {e.code}"
    return base, run


def test_header_and_entries_follow_the_contract(recorded):
    b = read_baseline(recorded[0])
    h = b.header
    assert h["kind"] == "ddtree-bench-baseline" and h["version"] == 1
    for key in ("model", "draft", "model_hash", "draft_hash", "suite", "subset_rule", "template", "dtype", "device",
                "versions", "max_new_tokens", "stop_ids", "created_at", "chat_template_sha256"):
        assert key in h, key
    assert h["max_new_tokens"] == MAX_NEW and h["stop_ids"] == [258] and h["versions"]["torch"]
    # one line per (prompt, turn): smoke has 3 prompts, the last with 2 turns
    assert [(e.prompt_id, e.turn) for e in b.entries] == [("smoke-0", 0), ("smoke-1", 0), ("smoke-2", 0), ("smoke-2", 1)]
    for e in b.entries:
        assert 0 < len(e.output_ids) <= MAX_NEW
        assert len(e.logit_gap) == len(e.output_ids) and all(g >= 0 for g in e.logit_gap)
        assert e.accept_lengths and sum(e.accept_lengths) >= len(e.output_ids) - 1
        assert e.extra["accept_output_matches"] is True  # fp32: DDTree == AR
    assert h["accept_method"] == "ddtree" and h["budget"] == 8 and h["num_accept_output_mismatches"] == 0


def test_turn_two_carries_the_models_own_first_answer(recorded):
    b = read_baseline(recorded[0]).by_key()
    t0, t1 = b[("smoke-2", 0)], b[("smoke-2", 1)]
    # the turn-1 prompt starts with turn 0's prompt and contains turn 0's answer text re-encoded
    assert t1.prompt_ids[: len(t0.prompt_ids)] == t0.prompt_ids
    assert len(t1.prompt_ids) > len(t0.prompt_ids) + 3


def test_faithful_ddtree_run_matches_exactly(recorded, capsys):
    base, run = recorded
    code, out, _ = cli(["compare", run, "--baseline", base, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["exact_match_rate"] == 1.0 and doc["num_prompts"] == 4
    assert doc["num_confident_divergences"] == 0 and doc["num_near_ties"] == 0
    assert {p["kind"] for p in doc["prompts"]} == {"match"}
    assert all(p["first_divergence"] is None for p in doc["prompts"])
    # the baseline carries DDTree's acceptance lengths at the same budget: tau is identical
    acc = doc["acceptance"]
    assert acc["tau_baseline"] == pytest.approx(acc["tau_run"]) and acc["histogram_tv_distance"] == pytest.approx(0.0)
    code, out, _ = cli(["gate", run, "--baseline", base], capsys)
    assert code == 0 and "gate: PASSED" in out


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    for extra in (["--suite", "no-such-suite"], ["--dtype", "float8"], ["--max-new-tokens", "0"],
                  ["--accept-method", "medusa"], ["--suite", str(tmp_path / "missing.jsonl")]):
        code, _, err = cli(["baseline", "record", "--model", "random", "--out", out, "-q", *extra], capsys)
        assert code == 2, extra
        assert err.startswith("error: ") and "Traceback" not in err
        assert not out.exists() and not list(tmp_path.glob(".b.jsonl*"))
    code, _, err = cli(["baseline", "record", "--model", "random", "--suite", "smoke", "--out", tmp_path], capsys)
    assert code == 2 and "directory" in err


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


HEADER = {"kind": "ddtree-bench-baseline", "version": 1}
GOOD = {"prompt_id": "a", "turn": 0, "prompt_ids": [1], "output_ids": [5, 6], "output_text": "", "logit_gap": [1.0, 2.0]}


@pytest.mark.parametrize("lines, message", [
    ([{"kind": "something-else"}, GOOD], "not a ddtree-bench baseline"),
    ([{**HEADER, "version": 99}, GOOD], "newer"),
    ([HEADER], "no entries"),
    ([HEADER, {**GOOD, "logit_gap": [1.0]}], "1 values for 2 output tokens"),
    ([HEADER, {**GOOD, "output_ids": "5 6"}], "output_ids"),
    ([HEADER, GOOD, GOOD], "duplicate entry"),
    ([HEADER, {**GOOD, "accept_lengths": [0]}], "accept_lengths"),
])
def test_malformed_baselines_name_the_problem(tmp_path, lines, message):
    with pytest.raises(UsageError, match=message):
        read_baseline(_write(tmp_path / "b.jsonl", lines))


def test_unknown_entry_keys_round_trip(tmp_path):
    from ddtree_bench.baselines.file import write_baseline

    b = read_baseline(_write(tmp_path / "b.jsonl", [HEADER, {**GOOD, "note": "kept", "logit_gap": None}]))
    assert b.entries[0].extra == {"note": "kept"} and b.entries[0].logit_gap is None and not b.has_gaps
    write_baseline(tmp_path / "c.jsonl", b.header, b.entries)
    again = read_baseline(tmp_path / "c.jsonl")
    assert again.entries[0].to_dict() == b.entries[0].to_dict() and again.header["num_entries"] == 1
