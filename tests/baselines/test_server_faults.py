"""`baseline record --backend ... --url` against a server that stalls, dies or fails: exit 2 with one line that names
the server and the prompt, never an internal error, and no baseline file."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from baseline_support import cli
from http_support import ThreadedServer


def app_with(gen):
    app = web.Application()

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "toy", "object": "model"}]})

    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", gen)
    return app


async def stall(request):
    await asyncio.sleep(30)
    return web.json_response({})


async def fail_500(request):
    return web.Response(status=500, text="<html>\n<body>Internal\nServer Error</body>\n</html>", content_type="text/html")


async def hang_up(request):
    request.transport.close()
    return web.Response()


@pytest.mark.parametrize("gen,want,hint", [
    (stall, "gave no complete answer within 1 s (smoke-0 turn 0)", "raise --timeout"),
    (fail_500, "answered 500 to a greedy request with logprobs (smoke-0 turn 0): <html> <body>Internal Server Error", "see its log"),
    (hang_up, "broke the connection (smoke-0 turn 0)", "still up"),
])
def test_a_faulty_server_is_one_line_and_exit_2(tmp_path, capsys, gen, want, hint):
    out = tmp_path / "b.jsonl"
    with ThreadedServer(app_with(gen)) as s:
        code, _, err = cli(["baseline", "record", "--backend", "vllm", "--url", s.url, "--model", "toy", "--suite", "smoke",
                            "--limit", "1", "--max-new-tokens", "4", "--timeout", "1", "--out", out, "-q"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith("error: the server at ") and want in lines[0], err
    assert len(lines) == 2 and lines[1].startswith("hint: ") and hint in lines[1] and not out.exists()
