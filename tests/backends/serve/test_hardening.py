"""`ddtree-bench serve` under adversarial input, one test (or table) per class of issue 17:

* bad bodies: invalid unicode, pathological nesting, non-finite numbers, integers beyond int64,
  wrong types (generated from `openai_protocol.FIELDS`, so a new field is covered by itself),
  unsupported features and the vLLM `stream_options` rules -> 4xx, OpenAI error body, no traceback;
* the Authorization header: any bytes -> 401, never 500;
* disconnects: a vanished client's request (non-streaming, queued, streaming before its first
  chunk, a stream nobody reads) frees the engine and its queue place, counted as abort / 499;
* CPU work off the event loop: /health answers while a prompt is being tokenized, and a hopeless
  prompt is refused by its byte length without tokenizing;
* slow connections: a request head or body that trickles in is cut after the read timeout;
* `--host`: loopback detection and the refusal of an open non-loopback server.

In-process servers on 127.0.0.1 (null engine); every wait is a bounded poll on server state.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import requests

from ddtree_bench.backends.openai_protocol import FIELDS, INT64_MAX, INT64_MIN, spec_decoding_metrics
from ddtree_bench.backends.serve_engine import NullSource
from ddtree_bench.backends.server_metrics import parse_prometheus
from ddtree_bench.backends.standalone import build_app
from http_support import ThreadedServer

KEY = "sekret"
DEADLINE_S = 30  # a hang guard for polls, not a speed claim


@pytest.fixture(scope="module")
def server():
    with ThreadedServer(build_app(NullSource("null"))) as s:
        yield s


@pytest.fixture(scope="module")
def keyed():
    with ThreadedServer(build_app(NullSource("null"), api_key=KEY)) as s:
        yield s


def host_port(s) -> tuple[str, int]:
    host, port = s.url.split("//")[1].split(":")
    return host, int(port)


def raw_request(s, body: bytes, path: str = "/v1/completions", headers: dict[str, bytes] | None = None) -> tuple[int, bytes]:
    """One HTTP/1.1 request over a plain socket (bytes exactly as given); (status, body)."""
    head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n"
    for k, v in (headers or {}).items():
        head += k.encode() + b": " + v + b"\r\n"
    head += b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    with socket.create_connection(host_port(s), timeout=DEADLINE_S) as sock:
        sock.sendall(head + body)
        buf = b""
        while chunk := sock.recv(65536):
            buf += chunk
    status_line, _, rest = buf.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def assert_client_error(status: int, body: bytes, want: int | range = range(400, 500)) -> dict:
    assert (status in want) if isinstance(want, range) else status == want, (status, body[:300])
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    return err


def metrics(s) -> dict[str, float]:
    return parse_prometheus(requests.get(s.url + "/metrics", timeout=DEADLINE_S).text)


def metric(s, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    heads = (f"ddtree:{name}{{", f"ddtree:{name}_total{{")  # gauges, counters
    return sum(v for k, v in metrics(s).items() if k.startswith(heads) and all(w in k for w in want))


def wait_until(cond, what: str) -> None:
    deadline = time.time() + DEADLINE_S
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ---------------------------------------------------------------------------- bad bodies

SURROGATE = "\\ud800"  # JSON text for a lone surrogate
BAD_BODIES = {
    "unicode": [
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a%sb"}]}' % SURROGATE, "messages"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "%s"}]}]}' % SURROGATE, "messages"),
        ("/v1/chat/completions", '{"messages": [{"role": "%s", "content": "x"}]}' % SURROGATE, "messages"),
        ("/v1/completions", '{"prompt": "\\udfff"}', "prompt"),
        ("/v1/completions", '{"prompt": "x", "model": "%s"}' % SURROGATE, "model"),
        ("/v1/completions", '{"prompt": "x", "%s": 1}' % SURROGATE, None),  # in a key
        ("/v1/completions", b'{"prompt": "\xff\xfe"}', None),  # not UTF-8
        ("/v1/completions", b'{"prompt": "\xed\xa0\x80"}', None),  # a surrogate encoded as UTF-8 bytes
    ],
    "nesting": [
        ("/v1/chat/completions", "[" * 100_000 + "]" * 100_000, None),  # RecursionError in json
        ("/v1/chat/completions", '{"messages": ' + "[" * 5000 + "]" * 5000 + "}", None),
        ("/v1/completions", '{"prompt": "x", "temperature": ' + "[" * 900 + "]" * 900 + "}", None),  # below the recursion limit
        ("/v1/completions", '{"prompt": "x", "stop_token_ids": ' + "[" * 990 + "]" * 990 + "}", None),
        ("/v1/completions", '{"prompt": "x", "extra": ' + '{"a": ' * 70 + "1" + "}" * 70 + "}", None),
    ],
    "stream_options (as vLLM)": [
        ("/v1/completions", '{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options"),
        ("/v1/completions", '{"prompt": "x", "stream": false, "stream_options": {"include_usage": true}}', "stream_options"),
        ("/v1/completions", '{"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": true}}', "stream_options"),
        ("/v1/completions", '{"prompt": "x", "stream": true, "stream_options": {"include_usage": false, '
                            '"continuous_usage_stats": true}}', "stream_options"),
        ("/v1/completions", '{"prompt": "x", "stream": true, "stream_options": {"include_usage": "yes"}}', "stream_options.include_usage"),
    ],
    "other shapes": [
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x", "name": 5}]}', "messages"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "no"}}',
         "chat_template_kwargs.enable_thinking"),
        ("/v1/completions", '{"prompt": "x", "stop_token_ids": [1.5]}', "stop_token_ids"),
        ("/v1/completions", '{"prompt": "x", "stop_token_ids": "1"}', "stop_token_ids"),
        ("/v1/completions", '{"prompt": "x", "response_format": {"type": "json_object"}}', "response_format"),
        ("/v1/completions", '{"prompt": "x", "logit_bias": {"1": 5}}', "logit_bias"),
    ],
}


@pytest.mark.parametrize("path,body,param", [c for cases in BAD_BODIES.values() for c in cases],
                         ids=[f"{k}-{i}" for k, cases in BAD_BODIES.items() for i in range(len(cases))])
def test_malformed_bodies_get_400_with_an_openai_error_and_no_traceback(server, capfd, path, body, param):
    status, resp = raw_request(server, body if isinstance(body, bytes) else body.encode(), path)
    err = assert_client_error(status, resp, 400)
    if param is not None:
        assert err["param"] == param, err
    assert "Traceback" not in capfd.readouterr().err


def _numeric_fields():
    return [k for k, f in FIELDS.items() if {"int", "number"} & set(f.kinds)]


@pytest.mark.parametrize("key", _numeric_fields())
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e308", "-1e308", "1e309"])
def test_every_numeric_field_refuses_non_finite_and_huge_numbers(server, capfd, key, literal):
    body = '{"prompt": "x", "max_tokens": 2, "%s": %s}' % (key, literal)
    if key in ("max_tokens", "max_completion_tokens"):
        body = '{"prompt": "x", "%s": %s}' % (key, literal)
    status, resp = raw_request(server, body.encode())
    err = assert_client_error(status, resp, 400)
    assert literal.lstrip("-") in ("NaN", "Infinity") or err["param"] == key, err
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("key", [k for k, f in FIELDS.items() if "int" in f.kinds and "number" not in f.kinds])
@pytest.mark.parametrize("value", [2 ** 63, -(2 ** 63) - 1, 2 ** 64, 10 ** 30, -(10 ** 30)])
def test_every_integer_field_refuses_values_beyond_its_range(server, capfd, key, value):
    body = {"prompt": "x", "max_tokens": 2, key: value}
    status, resp = raw_request(server, json.dumps(body).encode())
    err = assert_client_error(status, resp, 400)
    assert err["param"] == key, err
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("seed", [INT64_MIN, INT64_MAX, 0, -1])
def test_seed_accepts_the_whole_int64_range(server, seed):
    r = requests.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "seed": seed}, timeout=10)
    assert r.status_code == 200, r.text


WRONG = {"int": [True, 1.5, "1", [1]], "number": [True, "0.5", [0.5], {"a": 1}], "bool": [1, "true", [True]],
         "str": [5, ["x"], {"a": "b"}], "object": ["x", [1], 5]}


@pytest.mark.parametrize("key", list(FIELDS))
def test_every_field_refuses_every_wrong_type(server, capfd, key):
    """Generated from the one field table: a new field is checked without a new test."""
    kinds = FIELDS[key].kinds
    wrong = [v for k in kinds for v in WRONG[k]
             if not any(_matches(v, other) for other in kinds)]
    assert wrong
    for v in wrong:
        status, resp = raw_request(server, json.dumps({"prompt": "x", "max_tokens": 2, key: v}).encode())
        err = assert_client_error(status, resp, 400)
        assert err["param"] == key and key in err["message"], (v, err)
    assert "Traceback" not in capfd.readouterr().err


def _matches(v, kind: str) -> bool:
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return {"bool": bool, "str": str, "object": dict}[kind] is type(v)


@pytest.mark.parametrize("key", [k for k, f in FIELDS.items() if f.off])
def test_unsupported_features_accept_their_off_values_and_refuse_the_rest(server, key):
    f = FIELDS[key]
    for off in f.off:
        r = requests.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, key: off}, timeout=10)
        assert r.status_code == 200, (key, off, r.text)
    on = {"int": 2, "number": 0.5, "bool": True, "str": "x"}
    for kind in f.kinds:
        value = on[kind]
        if value in f.off or (kind == "number" and f.lo is not None and not f.lo <= value <= f.hi):
            continue
        r = requests.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, key: value}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == f.why, (key, value, r.text)


def test_a_well_formed_request_still_passes_every_check(server):
    body = {"prompt": "x", "max_tokens": 3, "temperature": 2, "top_p": 1, "seed": 7, "n": 1, "best_of": 1,
            "top_logprobs": 0, "echo": False, "suffix": "", "frequency_penalty": 0.0, "presence_penalty": 0, "top_k": -1,
            "min_p": 0, "repetition_penalty": 1.0, "stop": [], "tools": [], "user": "u", "response_format": {"type": "text"},
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "unknown_field": [1]}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")


# ---------------------------------------------------------------------------- protocol fields


@pytest.mark.parametrize("method,rounds", [("ar", [1, 1, 1]), ("dflash", [3, 1]), ("ddtree", [4]), ("dflash", []), ("ddtree", [])])
def test_spec_metrics_hold_floats_or_leave_the_key_out_never_null(method, rounds):
    spec = spec_decoding_metrics(method, rounds, block_size=16, budget=32)
    assert all(v is not None for v in spec.values()), spec
    for key in ("mean_acceptance_length", "draft_acceptance_rate"):
        assert key not in spec or isinstance(spec[key], float)
    assert ("mean_acceptance_length" in spec) == bool(rounds)
    assert ("draft_acceptance_rate" in spec) == (bool(rounds) and method != "ar")
    if rounds:
        assert spec["mean_acceptance_length"] == sum(rounds) / len(rounds)


# ---------------------------------------------------------------------------- auth


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"Bearer \xe9", "Bearer é".encode(), b"\x80", b"Bearer " + b"\xf0" * 100,
                                   b"Bearer sekret\xc2\xa0", b"", b"Bearer"])
def test_any_authorization_bytes_get_401_never_500(keyed, capfd, value):
    status, resp = raw_request(keyed, b'{"prompt": "x", "max_tokens": 2}', headers={"Authorization": value})
    err = assert_client_error(status, resp, 401)
    assert err["type"] == "authentication_error"
    assert "Traceback" not in capfd.readouterr().err
    assert raw_request(keyed, b'{"prompt": "x", "max_tokens": 2}', headers={"Authorization": b"Bearer " + KEY.encode()})[0] == 200


def test_a_non_ascii_api_key_works():
    key = "clé-ü"
    with ThreadedServer(build_app(NullSource("null"), api_key=key)) as s:
        ok = raw_request(s, b'{"prompt": "x", "max_tokens": 2}', headers={"Authorization": f"Bearer {key}".encode()})
        assert ok[0] == 200
        assert raw_request(s, b'{"prompt": "x", "max_tokens": 2}', headers={"Authorization": b"Bearer cl\xe9-\xfc"})[0] == 401


# ---------------------------------------------------------------------------- disconnects


class GatedSerial(NullSource):
    """A serial null engine: a job waits for `gate` before its first token, then streams `chunk_tokens`
    per round after `chunk_delay_s`. Records the rounds each job ran and whether it saw `cancelled`."""

    serial = True

    def __init__(self, chunk_delay_s: float = 0.0, chunk_tokens: int = 4):
        super().__init__("gated", chunk_tokens=chunk_tokens, chunk_delay_s=chunk_delay_s)
        self.gate = threading.Event()
        self.finished: list[tuple[int, bool]] = []  # (rounds emitted, ran to its end)

    async def stream(self, job):
        rounds, completed = 0, False
        try:
            while not self.gate.is_set():
                await asyncio.sleep(0.01)
            async for ev in super().stream(job):
                rounds += ev.kind == "tokens"
                yield ev
            completed = True
        finally:
            self.finished.append((rounds, completed))


def open_request(s, body: dict, path: str = "/v1/completions", rcvbuf: int | None = None) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(DEADLINE_S)
    sock.connect(host_port(s))
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def test_an_abandoned_non_streaming_request_frees_the_engine():
    src = GatedSerial(chunk_delay_s=0.005)
    src.gate.set()
    with ThreadedServer(build_app(src)) as s:
        sock = open_request(s, {"prompt": "x", "max_tokens": 1_000_000})  # ~1.25 h of rounds at 5 ms each
        wait_until(lambda: metric(s, "num_requests_running") == 1 and metric(s, "time_to_first_token_seconds_count"), "it to run")
        sock.close()
        wait_until(lambda: src.finished, "the engine to stop")
        rounds, completed = src.finished[0]
        assert not completed and rounds < 1_000_000 // 4
        r = requests.post(s.url + "/v1/completions", json={"prompt": "y", "max_tokens": 8}, timeout=DEADLINE_S)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        wait_until(lambda: metric(s, "request_success", finished_reason="abort") == 1, "the abort to be counted")
        assert metric(s, "http_requests", status="499") == 1 and metric(s, "http_requests", status="500") == 0
        assert metric(s, "request_success", finished_reason="length") == 1  # the second request only


def test_abandoned_queued_requests_leave_the_queue():
    src = GatedSerial()
    with ThreadedServer(build_app(src, max_queue=2)) as s:
        running = open_request(s, {"prompt": "x", "max_tokens": 3})
        wait_until(lambda: metric(s, "num_requests_running") == 1, "the first to run")
        queued = [open_request(s, {"prompt": "q", "max_tokens": 3, "stream": stream}) for stream in (False, True)]
        wait_until(lambda: metric(s, "num_requests_waiting") == 2, "two to queue")
        for q in queued:
            q.close()
        wait_until(lambda: metric(s, "num_requests_waiting") == 0, "the abandoned to leave the queue")
        results = {}
        later = [threading.Thread(target=lambda i=i: results.__setitem__(i, requests.post(
            s.url + "/v1/completions", json={"prompt": "z", "max_tokens": 3}, timeout=DEADLINE_S))) for i in range(2)]
        for t in later:
            t.start()
        wait_until(lambda: metric(s, "num_requests_waiting") == 2, "two new ones to queue (not 503)")
        src.gate.set()
        for t in later:
            t.join(DEADLINE_S)
        assert [results[i].status_code for i in range(2)] == [200, 200]
        assert running.recv(12).startswith(b"HTTP/1.1 200")
        running.close()
        assert metric(s, "request_success", finished_reason="abort") == 2
        assert metric(s, "http_requests", status="503") == 0


def test_a_stream_closed_before_its_first_chunk_is_an_abort_not_a_500(capfd):
    src = GatedSerial()
    with ThreadedServer(build_app(src)) as s:
        sock = open_request(s, {"prompt": "x", "max_tokens": 50, "stream": True})
        wait_until(lambda: metric(s, "num_requests_running") == 1, "it to start")
        sock.close()
        wait_until(lambda: metric(s, "num_requests_running") == 0, "it to be cancelled")
        src.gate.set()
        r = requests.post(s.url + "/v1/completions", json={"prompt": "y", "max_tokens": 4, "stream": True}, timeout=DEADLINE_S)
        assert r.status_code == 200 and r.text.rstrip().endswith("[DONE]")
        assert metric(s, "http_requests", status="500") == 0 and metric(s, "http_requests", status="499") == 1
        assert metric(s, "request_success", finished_reason="abort") == 1
    assert "Traceback" not in capfd.readouterr().err


def test_a_stream_nobody_reads_is_cut_after_the_read_timeout():
    """The client's receive buffer fills, the server's write stalls past the read timeout: abort."""
    src = NullSource("null", chunk_tokens=4096)
    src.max_model_len = 1 << 24  # room for ~40 MB of stream, far more than the socket buffers hold
    with ThreadedServer(build_app(src, read_timeout_s=0.5)) as s:
        sock = open_request(s, {"prompt": "x", "max_tokens": 8_000_000, "stream": True, "return_token_ids": True}, rcvbuf=4096)
        try:
            wait_until(lambda: metric(s, "request_success", finished_reason="abort") == 1, "the stalled stream to be cut")
        finally:
            sock.close()
        assert metric(s, "request_success", finished_reason="length") == 0


# ---------------------------------------------------------------------------- CPU work off the loop


class _Tok:
    """The null tokenizer behind a hook: `encode_batch` calls `on_encode` first and counts calls."""

    def __init__(self, inner, on_encode=lambda: None):
        self.inner, self.on_encode, self.calls = inner, on_encode, 0
        self.tok = self

    def encode_batch(self, texts, add_special_tokens=False):
        self.calls += 1
        self.on_encode()
        return self.inner.tok.encode_batch(texts, add_special_tokens=add_special_tokens)

    def get_vocab(self, with_added_tokens=True):
        return self.inner.tok.get_vocab(with_added_tokens=with_added_tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_tokenization_runs_off_the_event_loop():
    """The tokenizer blocks until /health has answered: on the loop, /health could not answer."""
    release, entered = threading.Event(), threading.Event()
    src = NullSource("null")
    src.tokenizer = _Tok(src.tokenizer, on_encode=lambda: (entered.set(), release.wait(DEADLINE_S)))
    with ThreadedServer(build_app(src)) as s:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("r", requests.post(
            s.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=DEADLINE_S)))
        t.start()
        assert entered.wait(DEADLINE_S)
        try:
            assert requests.get(s.url + "/health", timeout=5).status_code == 200  # while the tokenizer is busy
        finally:
            release.set()
        t.join(DEADLINE_S)
        assert result["r"].status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "x" * 300_000, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "é" * 150_000}], "max_tokens": 4}),
])
def test_a_hopeless_prompt_is_refused_by_its_length_without_tokenizing(path, body):
    src = NullSource("null")
    src.max_model_len = 4096
    src.tokenizer = tok = _Tok(src.tokenizer)
    with ThreadedServer(build_app(src)) as s:
        r = requests.post(s.url + path, json=body, timeout=DEADLINE_S)
        assert r.status_code == 400 and "exceeds the model's context" in r.json()["error"]["message"]
        assert "at least" in r.json()["error"]["message"] and tok.calls == 0
        ok = requests.post(s.url + path, json=dict(body, **({"prompt": "x" * 1000} if "prompt" in body else {})) if "prompt" in body
                           else {"messages": [{"role": "user", "content": "é" * 100}], "max_tokens": 4}, timeout=DEADLINE_S)
        assert ok.status_code == 200 and tok.calls == 1


def test_the_exact_context_check_counts_tokens_of_a_prompt_that_passes_the_byte_bound():
    src = NullSource("null")
    src.max_model_len = 4096
    with ThreadedServer(build_app(src)) as s:
        r = requests.post(s.url + "/v1/completions", json={"prompt": "x" * 5000, "max_tokens": 4}, timeout=DEADLINE_S)
        assert r.status_code == 400 and "prompt (5000 tokens)" in r.json()["error"]["message"]
        r = requests.post(s.url + "/v1/completions", json={"prompt": "x" * 4092, "max_tokens": 4}, timeout=DEADLINE_S)
        assert r.status_code == 200


# ---------------------------------------------------------------------------- slow connections


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        sock.settimeout(0.05)
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def test_slowloris_connections_are_dropped_after_the_read_timeout():
    with ThreadedServer(build_app(NullSource("null"), read_timeout_s=0.5)) as s:
        socks = [socket.create_connection(host_port(s), timeout=5) for _ in range(5)]
        idle = socket.create_connection(host_port(s), timeout=5)  # sends nothing at all
        try:
            for sock in socks:
                sock.sendall(b"GET /health HTTP/1.1\r\n")
            deadline = time.time() + DEADLINE_S
            open_ = list(socks) + [idle]
            while open_:
                assert time.time() < deadline, f"{len(open_)} slow connections still open"
                for sock in socks:
                    if sock in open_:
                        try:
                            sock.sendall(b"X")  # one header byte at a time, never a full line
                        except OSError:
                            pass
                open_ = [x for x in open_ if not _closed_by_server(x)]
            assert requests.get(s.url + "/health", timeout=5).status_code == 200  # the server itself is fine
        finally:
            for sock in socks + [idle]:
                sock.close()


def test_a_trickled_body_gets_408():
    with ThreadedServer(build_app(NullSource("null"), read_timeout_s=0.5)) as s:
        with socket.create_connection(host_port(s), timeout=DEADLINE_S) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            buf = b""
            while b"\r\n\r\n" not in buf or not buf.rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                buf += chunk
        assert buf.startswith(b"HTTP/1.1 408")
        assert json.loads(buf.partition(b"\r\n\r\n")[2])["error"]["type"] == "timeout_error"


def test_keep_alive_connections_survive_between_quick_requests():
    """The read timeout does not cut a client that reuses its connection promptly."""
    with ThreadedServer(build_app(NullSource("null"), read_timeout_s=2)) as s:
        with requests.Session() as session:
            for _ in range(5):
                assert session.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10).status_code == 200


# ---------------------------------------------------------------------------- --host


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("127.255.255.254", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("192.168.1.20", False), ("::ffff:10.0.0.1", False),
    ("128.0.0.1", False), ("no-such-host.invalid", False),
])
def test_loopback_detection(host, loopback):
    from ddtree_bench.cli.serve import is_loopback

    assert is_loopback(host) is loopback


def test_non_loopback_host_without_a_key_exits_2_before_binding(capsys):
    from ddtree_bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--null", "--host", "0.0.0.0", "--port", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: --host 0.0.0.0 is not a loopback address" in err and "--insecure" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args,warned", [(["--host", "127.0.0.2"], False), (["--host", "0.0.0.0", "--api-key", "k"], False),
                                         (["--host", "0.0.0.0", "--insecure"], True)])
def test_allowed_hosts_get_past_the_check(capsys, args, warned):
    """A busy port makes the server stop at its bind (exit 2, 'cannot listen'): the host check passed."""
    from ddtree_bench.cli import main

    bind = "127.0.0.2" if "127.0.0.2" in args else "0.0.0.0"
    sock = socket.socket()
    sock.bind((bind, 0))
    sock.listen()
    try:
        with pytest.raises(SystemExit) as e:
            main(["serve", "--null", *args, "--port", str(sock.getsockname()[1])])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "cannot listen on" in err
        assert ("warning:" in err) is warned
    finally:
        sock.close()


def test_cli_refuses_non_finite_timeouts(capsys):
    from ddtree_bench.cli import main

    for flag, value in (("--read-timeout", "nan"), ("--read-timeout", "0"), ("--shutdown-grace", "inf"), ("--null-delay-ms", "nan")):
        with pytest.raises(SystemExit) as e:
            main(["serve", "--null", flag, value])
        assert e.value.code == 2 and f"error: {flag} must be a finite number" in capsys.readouterr().err
