"""Prompts longer than the target's context: the in-process backend makes such a request its own error (the
message a server's 400 gives), batch-1 and batched alike, and `baseline record` refuses the suite (exit 2,
nothing written) - a reference decoded at positions the model was not built for could never be met."""

from __future__ import annotations

import json

import pytest

from baseline_support import cli
from ddtree_bench.results import read_records

TOO_LONG = "prompt (25019 tokens) + max_new_tokens (4) exceeds the model's context of 4096 tokens"


@pytest.fixture
def suite(tmp_path):
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps({"id": "long", "turns": ["word " * 5000]}) + "\n" + json.dumps({"id": "short", "turns": ["hi"]}) + "\n")
    return f


@pytest.mark.parametrize("method,concurrency", [("ar", 1), ("ddtree", 2)])
def test_a_prompt_over_the_context_is_that_requests_error(suite, tmp_path, capsys, method, concurrency):
    out = tmp_path / "r"
    code, _, err = cli(["run", "--suite", suite, "--max-new-tokens", "4", "--method", method, "--budget", "16",
                        "--concurrency", concurrency, "--out", out, "-q"], capsys)
    assert code == 0, err
    assert f"warning: 1 of 2 requests failed; the metrics cover the 1 that succeeded (first error: long turn 0: {TOO_LONG})" in err
    recs = {r.prompt_id: r for r in read_records(out)}
    assert recs["long"].error == TOO_LONG and recs["long"].num_prompt_tokens == 25019 and recs["long"].output_ids is None
    assert recs["short"].ok and len(recs["short"].output_ids) == 4


def test_baseline_record_refuses_a_prompt_over_the_context(suite, tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    code, _, err = cli(["baseline", "record", "--suite", suite, "--max-new-tokens", "4", "--out", out, "-q"], capsys)
    assert code == 2 and f"error: long turn 0: {TOO_LONG}" in err and "Traceback" not in err
    assert not out.exists()


def test_the_engine_itself_refuses_a_request_over_the_context():
    """`Engine.generate` and the batched loop's admission check the context too (the GPU loops share these entry
    points), so no caller can decode at positions the target lacks."""
    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.interface import ContextTooLong
    from ddtree_bench.pair import load_pair

    engine = load_pair("toy", None, "ddtree").engine
    limit = engine.target.cfg.max_position_embeddings
    with pytest.raises(ContextTooLong, match=f"exceeds the model's context of {limit} tokens"):
        engine.generate([1] * (limit - 3), method="ddtree", budget=16, max_new_tokens=4)
    with pytest.raises(ContextTooLong):
        engine.batch_loop("ddtree", 16, 2).check(BatchRequest([1] * (limit - 3), 4))
    assert len(engine.generate([1] * (limit - 5), method="ar", budget=0, max_new_tokens=4).output_ids) == 4


def test_max_new_tokens_that_leave_no_room_for_any_prompt_are_bad_input(tmp_path, capsys):
    """Every request would fail: exit 2 before anything is written (was exit 1 and a directory that blocked the next
    run's --out)."""
    out = tmp_path / "r"
    code, _, err = cli(["run", "--model", "toy-hybrid", "--limit", "1", "--max-new-tokens", "5000", "--out", out, "-q"], capsys)
    assert code == 2 and "--max-new-tokens 5000 leaves no room for a prompt in the model's context of 4096 tokens" in err
    assert not out.exists() and not list(tmp_path.glob(".r.*"))
