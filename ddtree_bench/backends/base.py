"""The backend protocol every backend implements.

`generate` never raises for a per-request failure: it returns a record whose `error` says what
went wrong (timeouts, HTTP errors, truncated streams, engine exceptions). It raises `UsageError`
only for problems that make the whole run meaningless before any request succeeded (unreachable
server). `describe()` is what run.json records about the backend (kind, url, server version and
flags, model ids and hashes). A record's `token_source` says whether its output ids are the
server's or the client's re-tokenization of the server's text (`--backend openai`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ddtree_bench.records import GenerationRequest, RequestRecord


class Backend(Protocol):
    kind: str
    block_size: int  # drafter block size (16 for z-lab drafters); 1 when unknown / AR

    async def start(self) -> None: ...

    async def generate(self, req: GenerationRequest) -> RequestRecord: ...

    def describe(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...
