"""The llama.cpp pieces that need no llama-server: rounds rebuilt from llama-server's per-chunk `timings`,
the client against a server that closes the connection after every streamed response (as llama-server
does), the request body it sends, and the GGUF cache key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ddtree_bench.backends.parsers import StreamState, accept_lengths_from_stats

TOY_TARGET = Path(__file__).resolve().parents[2] / "ddtree_bench" / "models" / "toy" / "target"


def chunk(tok, draft_n=None, accepted=None, finish=None):
    timings = {"predicted_n": 1}
    if draft_n is not None:
        timings.update(draft_n=draft_n, draft_n_accepted=accepted)
    return {"choices": [{"text": "x", "index": 0, "finish_reason": finish}],
            "__verbose": {"tokens": [] if tok is None else [tok]}, "timings": timings}


def test_rounds_are_rebuilt_from_the_cumulative_timings_of_a_stream():
    # prefill token; round 1 drafts 15, accepts 3 (4 tokens); round 2 drafts 15, accepts 0; round 3 drafts
    # 14 (shortened), accepts 7; then one token without a draft (budget's last: not a round); final chunk
    seq = ([chunk(1)] + [chunk(2, 15, 3)] * 4 + [chunk(3, 30, 3)] + [chunk(4, 44, 10)] * 8 + [chunk(5, 44, 10)]
           + [chunk(None, 44, 10, "length")])
    st = StreamState()
    for obj in seq:
        st.feed(obj)
    assert st.output_ids == [1, 2, 2, 2, 2, 3] + [4] * 8 + [5]
    assert st.stats["per_step_accepted"] == [3, 0, 7] and st.stats["num_spec_steps"] == 3
    assert st.stats["num_accepted_draft_tokens"] == 10 and st.stats["num_draft_tokens"] == 44
    assert accept_lengths_from_stats(st.stats) == ([4, 1, 8], "rounds")


def test_one_body_gives_totals_and_no_rounds():
    st = StreamState()
    st.feed({"choices": [{"text": "abc", "finish_reason": "length"}], "__verbose": {"tokens": [1, 2, 3]},
             "timings": {"draft_n": 44, "draft_n_accepted": 10, "predicted_n": 3}})
    assert st.output_ids == [1, 2, 3]
    assert st.stats["source"] == "llamacpp" and st.stats["num_accepted_draft_tokens"] == 10
    assert "per_step_accepted" not in st.stats and accept_lengths_from_stats(st.stats) == (None, None)


def test_ar_timings_carry_no_spec_stats():
    st = StreamState()
    st.feed(chunk(7))
    assert st.stats is None and st.output_ids == [7]


def test_llamacpp_request_body_asks_for_ids_timings_and_neutral_sampling():
    from ddtree_bench.backends.client import HTTPBackend
    from ddtree_bench.records import GenerationRequest

    b = HTTPBackend("llamacpp", "http://127.0.0.1:1", model=str(TOY_TARGET), endpoint="completions")
    from ddtree_bench.backends.client import local_tokenizer

    b.tokenizer = local_tokenizer(str(TOY_TARGET))
    req = GenerationRequest(prompt_id="p", turn=0, messages=[{"role": "user", "content": "hi"}], max_new_tokens=8,
                            temperature=0.7, top_p=0.9, seed=1)
    body, ids = b.payload(req)
    assert body["prompt"] == ids and all(isinstance(t, int) for t in ids)
    assert body["return_tokens"] and body["verbose"] and body["timings_per_token"]
    assert body["top_k"] == 0 and body["min_p"] == 0.0 and body["cache_prompt"] is False
    assert "stop_token_ids" not in body and "return_token_ids" not in body


class ClosingServer:
    """An HTTP/1.1 server that answers keep-alive and then closes the connection after every streamed
    response, as llama-server does; it counts the requests it actually read."""

    def __init__(self):
        self.posts = 0
        self.server = None

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:")), 0)
                await reader.readexactly(length)
                if lines[0].startswith("GET"):
                    payload = json.dumps({"data": [{"id": "m"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
                    await writer.drain()
                    continue
                self.posts += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for event in ({"choices": [{"text": "a", "index": 0, "finish_reason": None}]},
                              {"choices": [{"text": "b", "index": 0, "finish_reason": "length"}]}):
                    data = b"data: " + json.dumps(event).encode() + b"\n\n"
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                break                                   # ... and close, despite "keep-alive"
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("kind", ["openai", "llamacpp"])
def test_streams_survive_a_server_that_closes_after_each_response(kind):
    from ddtree_bench import driver
    from ddtree_bench.backends.client import HTTPBackend
    from ddtree_bench.records import Prompt

    fake = ClosingServer()

    async def go():
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        backend = HTTPBackend(kind, f"http://127.0.0.1:{port}", model=str(TOY_TARGET), endpoint="completions")
        try:
            recs = await driver.drive(backend, [Prompt(f"p{i}", ["hi"]) for i in range(16)], max_new_tokens=2,
                                      progress=False)
        finally:
            await backend.aclose()
            server.close()
            await server.wait_closed()
        return backend, recs

    backend, recs = asyncio.run(go())
    assert len(recs) == 16 and [r.error for r in recs] == [None] * 16
    assert fake.posts == 16                             # every request was read once: none twice, none lost
    if kind == "openai":                                # a keep-alive pool: the dead connections were met and re-sent
        assert backend.stale_connection_retries >= 8
    else:                                               # llama-server: one connection per request, nothing to re-send
        assert backend.stale_connection_retries == 0 and backend.connections_opened >= 16
    assert backend.describe()["stale_connection_retries"] == backend.stale_connection_retries


def test_a_dead_fresh_connection_is_not_retried():
    """Only a kept-alive connection that broke before any response is re-sent: a server that drops a new
    connection is a connection error, reported, not hidden."""
    from ddtree_bench import driver
    from ddtree_bench.backends.client import HTTPBackend
    from ddtree_bench.records import Prompt

    reads = 0

    async def handle(reader, writer):
        nonlocal reads
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET"):
            payload = json.dumps({"data": [{"id": "m"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
            await writer.drain()
        else:
            reads += 1
        writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        backend = HTTPBackend("llamacpp", f"http://127.0.0.1:{port}", model=str(TOY_TARGET), endpoint="completions")
        try:
            recs = await driver.drive(backend, [Prompt("p", ["hi"])], max_new_tokens=2, progress=False)
        finally:
            await backend.aclose()
            server.close()
        return backend, recs

    backend, recs = asyncio.run(go())
    assert recs[0].error and recs[0].error.startswith("connection:")
    assert backend.stale_connection_retries == 0 and reads == 1


def test_gguf_cache_key_follows_content(tmp_path):
    from ddtree_bench.backends.llamacpp_gguf import content_hash, has_mtp_layers, merge_less_byte_bpe

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"a": 1}')
    h1 = content_hash(d)
    (d / "config.json").write_text('{"a": 2}')
    assert content_hash(d) != h1
    (d / "config.json").write_text('{"a": 1}')
    assert content_hash(d) == h1
    assert merge_less_byte_bpe(TOY_TARGET) and not has_mtp_layers(TOY_TARGET)
