"""`ddtree-bench serve`'s HTTP surface, in-process (null engine): validation, limits, shapes, /metrics."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time

import pytest
import requests

from ddtree_bench.backends.serve_engine import NullSource
from ddtree_bench.backends.server_metrics import parse_prometheus
from ddtree_bench.backends.standalone import IncrementalText, build_app
from http_support import ThreadedServer

KEY = "sekret"


class GateSource(NullSource):
    """A serial null engine whose jobs wait for `gate`: lets a test fill the queue deterministically."""

    serial = True

    def __init__(self):
        super().__init__("gate")
        self.gate = threading.Event()

    async def stream(self, job):
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        async for ev in super().stream(job):
            yield ev


@pytest.fixture(scope="module")
def server():
    with ThreadedServer(build_app(NullSource("null", chunk_tokens=4), max_body_bytes=64 * 1024)) as s:
        yield s


@pytest.fixture(scope="module")
def keyed():
    with ThreadedServer(build_app(NullSource("null"), api_key=KEY)) as s:
        yield s


def post(server, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return requests.post(server.url + path, data=data, headers=headers, timeout=30, **kw)


def sse_events(resp):
    out = []
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            payload = line[6:]
            out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


# ---------------------------------------------------------------------------- 4xx


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", [1, 2], 400, "must be a JSON object"),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "'messages' is required"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "'messages' must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "'messages[0].content'"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "'messages[0].role'"),
    ("/v1/completions", {"max_tokens": 4}, 400, "'prompt' is required"),
    ("/v1/completions", {"prompt": ""}, 400, "'prompt' is empty"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "batched prompts are not supported"),
    ("/v1/completions", {"prompt": [1, 100000]}, 400, "outside the vocabulary"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "10"}, 400, "'max_tokens' must be an integer"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "'max_tokens' must be an integer >= 1 and <= 2^63 - 1"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2**63}, 400, "'max_tokens' must be an integer >= 1 and <= 2^63 - 1"),
    ("/v1/completions", {"prompt": "x", "temperature": -0.5}, 400, "'temperature' must be in [0, 2]"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "'temperature' must be a number"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "'top_p' must be in (0, 1]"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "'stream' must be a boolean"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "only n = 1"),
    ("/v1/completions", {"prompt": "x", "stop": ["\n"]}, 400, "stop strings are not supported"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "'logprobs' must be in [0, 20]"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2_000_000}, 400, "prompt (at least 1 token) + max_tokens (2000000) exceeds"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "'gpt-4' does not exist"),
    ("/v1/embeddings", {"input": "x"}, 404, "Not Found"),
])
def test_malformed_requests_get_a_4xx_that_says_what_is_wrong(server, path, body, status, needle):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == status


class SeedSource(NullSource):
    """A null engine that records the seed each job reached it with."""

    def __init__(self):
        super().__init__("seeds")
        self.seeds = []

    async def stream(self, job):
        self.seeds.append(job.seed)
        async for ev in super().stream(job):
            yield ev


def test_a_sampled_request_without_a_seed_gets_a_fresh_one_as_openai_does():
    """T > 0 and no seed: each request samples afresh (a new random seed), not seed 0 every time; a given
    seed is kept (reproducible), and greedy requests need none."""
    src = SeedSource()
    with ThreadedServer(build_app(src)) as s:
        for body in ({"temperature": 1.0}, {"temperature": 1.0}, {"temperature": 1.0, "seed": 7}, {"temperature": 0}):
            assert post(s, "/v1/completions", {"prompt": "x", "max_tokens": 2, **body}).status_code == 200
    a, b, kept, greedy = src.seeds
    assert isinstance(a, int) and isinstance(b, int) and a != b
    assert kept == 7 and greedy is None


def test_body_over_the_limit_is_413(server):
    r = post(server, "/v1/completions", {"prompt": "x" * 100_000})
    assert r.status_code == 413 and "larger than 65536 bytes" in r.json()["error"]["message"]


def test_wrong_method_is_405(server):
    r = requests.get(server.url + "/v1/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()


def test_api_key_required_except_for_health(keyed):
    body = {"prompt": "x", "max_tokens": 2}
    assert post(keyed, "/v1/completions", body).status_code == 401
    bad = post(keyed, "/v1/completions", body, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "API key" in bad.json()["error"]["message"]
    assert requests.get(keyed.url + "/v1/models", timeout=10).status_code == 401
    assert requests.get(keyed.url + "/metrics", timeout=10).status_code == 401
    assert requests.get(keyed.url + "/health", timeout=10).status_code == 200
    ok = requests.post(keyed.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_full_queue_is_503_and_queued_requests_still_finish():
    src = GateSource()
    with ThreadedServer(build_app(src, max_queue=1)) as s:
        results = {}

        def call(name):
            results[name] = post(s, "/v1/completions", {"prompt": "x", "max_tokens": 3})

        a = threading.Thread(target=call, args=("a",))
        a.start()
        deadline = time.time() + 20
        while "ddtree:num_requests_running" not in _running(s, 1) and time.time() < deadline:
            time.sleep(0.02)
        b = threading.Thread(target=call, args=("b",))
        b.start()
        while _gauge(s, "num_requests_waiting") < 1 and time.time() < deadline:
            time.sleep(0.02)
        c = post(s, "/v1/completions", {"prompt": "x", "max_tokens": 3})
        assert c.status_code == 503 and "queue is full" in c.json()["error"]["message"]
        src.gate.set()
        a.join(20)
        b.join(20)
        assert results["a"].status_code == 200 and results["b"].status_code == 200


def _gauge(s, name):
    m = parse_prometheus(requests.get(s.url + "/metrics", timeout=10).text)
    return next(v for k, v in m.items() if k.startswith(f"ddtree:{name}{{"))


def _running(s, n):
    return "ddtree:num_requests_running" if _gauge(s, "num_requests_running") >= n else ""


# ---------------------------------------------------------------------------- shapes


def test_health_models_version_server_info(server):
    assert requests.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    models = requests.get(server.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["null"]
    assert requests.get(server.url + "/v1/models/null", timeout=10).json() == models["data"][0]   # retrieve one
    other = requests.get(server.url + "/v1/models/org/gpt-4", timeout=10)
    assert other.status_code == 404 and "'org/gpt-4' does not exist; this server serves 'null'" in other.json()["error"]["message"]
    info = requests.get(server.url + "/server_info", timeout=10).json()
    assert info["engine"] == "null" and info["block_size"] == 4 and "version" in info
    assert "version" in requests.get(server.url + "/version", timeout=10).json()


def test_non_streaming_completion_shape(server):
    r = post(server, "/v1/completions", {"prompt": [104, 105], "max_tokens": 10, "temperature": 0, "return_token_ids": True})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    ch = body["choices"][0]
    assert ch["token_ids"] == [ord("a") + i for i in range(10)] and ch["text"] == "abcdefghij"
    assert ch["prompt_token_ids"] == [104, 105] and ch["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 10, "total_tokens": 12}
    sd = body["metrics"]["speculative_decoding"]
    assert sd["acceptance_lengths"] == [4, 4, 4]  # 1 prefill token + rounds of 4 (the last cut to 1, a_r counted uncut)
    assert sd["num_spec_steps"] == 3 and sd["num_accepted_draft_tokens"] == 9 and sd["mean_acceptance_length"] == 4.0
    assert sd["acceptance_histogram"] == [0, 0, 0, 3] and sd["num_draft_tokens"] == 0


def test_non_streaming_chat_shape(server):
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                              "max_tokens": 3, "return_token_ids": True})
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert body["prompt_token_ids"][:1] == [257]  # <|im_start|>: rendered with the chat template
    assert "token_ids" not in post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                                     "max_tokens": 2}).json()["choices"][0]


def test_streaming_chat_usage_chunk_and_done(server):
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True,
                                              "stream_options": {"include_usage": True}, "return_token_ids": True}, stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant" and "prompt_token_ids" in ev[0]
    content = [e for e in ev[:-1] if e["choices"]]
    assert [len(e["choices"][0]["token_ids"]) for e in content] == [1, 4, 1, 0]  # prefill, a round, a cut round, finish
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in content) == "abcdef"
    final = ev[-2]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 6
    assert final["metrics"]["speculative_decoding"]["acceptance_lengths"] == [4, 4]


def test_streaming_without_usage_and_with_continuous_usage(server):
    ev = sse_events(post(server, "/v1/completions", {"prompt": "x", "max_tokens": 5, "stream": True}, stream=True))
    assert ev[-1] == "[DONE]" and all("usage" not in e and e["choices"] for e in ev[:-1])
    ev = sse_events(post(server, "/v1/completions", {"prompt": "x", "max_tokens": 5, "stream": True,
                                                     "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
                         stream=True))
    assert [e["usage"]["completion_tokens"] for e in ev[:-1]] == [1, 5, 5, 5]  # prefill, a round, finish, the usage chunk
    assert ev[-2]["choices"] == []


def test_metrics_counters_add_up(server):
    before = parse_prometheus(requests.get(server.url + "/metrics", timeout=10).text)
    for n in (9, 13):  # rounds: 2 and 3, each a_r = 4
        assert post(server, "/v1/completions", {"prompt": "x", "max_tokens": n}).status_code == 200
    after = parse_prometheus(requests.get(server.url + "/metrics", timeout=10).text)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    lab = '{model_name="null"}'
    assert delta(f"ddtree:spec_decode_num_drafts_total{lab}") == 5
    assert delta(f"ddtree:spec_decode_num_accepted_tokens_total{lab}") == 15
    assert delta(f"ddtree:spec_decode_num_draft_tokens_total{lab}") == 15  # null: chunk_tokens - 1 per round
    for pos in range(3):
        assert delta(f'ddtree:spec_decode_num_accepted_tokens_per_pos_total{{model_name="null",position="{pos}"}}') == 5
    assert delta('ddtree:spec_decode_rounds_total{model_name="null",accept_length="4"}') == 5
    assert delta(f"ddtree:generation_tokens_total{lab}") == 22
    assert delta(f"ddtree:e2e_request_latency_seconds_count{lab}") == 2
    assert delta(f"ddtree:inter_token_latency_seconds_count{lab}") == 20  # per token after the first
    assert delta('ddtree:http_requests_total{model_name="null",endpoint="/v1/completions",status="200"}') == 2


# ---------------------------------------------------------------------------- text deltas


def test_incremental_text_concatenates_to_the_decoded_ids():
    """Random bytes (broken UTF-8 included) in random chunks: the deltas always add up to decode(ids)."""
    tok = NullSource().tokenizer
    rng = random.Random(0)
    alphabet = list(range(256)) + [0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80] * 20  # lead/continuation-heavy
    for _ in range(300):
        ids = [rng.choice(alphabet) for _ in range(rng.randint(1, 120))]  # past the window: commits happen
        inc, parts, i = IncrementalText(tok), [], 0
        while i < len(ids):
            k = rng.randint(1, 5)
            parts.append(inc.add(ids[i:i + k]))
            i += k
        parts.append(inc.flush())
        assert "".join(parts) == tok.decode(ids)
        assert inc.sent == tok.decode(ids)


def test_held_ids_decode_once_at_the_flush():
    """A non-streaming request holds its ids: no delta on the way, the whole text at the flush and in `sent`."""
    tok = NullSource().tokenizer
    ids = list("Grüße, 世界 🦊".encode()) * 3
    inc = IncrementalText(tok)
    for i in range(0, len(ids), 4):
        assert inc.hold(ids[i:i + 4]) is None
    assert inc.flush() == tok.decode(ids) == inc.sent


def test_incremental_text_decodes_a_bounded_window_on_a_long_stream():
    """Each add decodes only the ids past the last commit: on a long stream of text with multi-byte characters
    the window stays within WINDOW + a few chunks (a cut inside a character waits for the next add; without
    commits every chunk would re-decode the whole output, ~3,000 ids here), and the deltas still add up to
    decode(ids), chunk by chunk."""
    tok = NullSource().tokenizer
    ids = list("Grüße, 世界! The quick brown fox 🦊 jumps. ".encode()) * 60
    inc, parts, widest = IncrementalText(tok), [], 0
    for i in range(0, len(ids), 3):
        parts.append(inc.add(ids[i:i + 3]))
        widest = max(widest, len(inc.ids) - inc.base)
        assert tok.decode(ids[:i + 3]).startswith("".join(parts))
    parts.append(inc.flush())
    assert "".join(parts) == tok.decode(ids)
    assert widest <= IncrementalText.WINDOW + 4 * 3 and inc.base == len(ids)


def test_busy_port_and_unknown_method_exit_2(capsys):
    from ddtree_bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--method", "beam"])
    assert e.value.code == 2 and "unknown --method 'beam'" in capsys.readouterr().err
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    try:
        with pytest.raises(SystemExit) as e:
            main(["serve", "--null", "--host", "0.0.0.0", "--insecure", "--port", str(sock.getsockname()[1])])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "cannot listen on 0.0.0.0" in err
        assert "no --api-key" not in err  # --insecure: the host check let it through to the bind
    finally:
        sock.close()
