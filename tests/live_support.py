"""What the live-server tests (vLLM, SGLang, llama.cpp) read back from a run: its request records, a reference
baseline keyed by (prompt id, turn), and the checks every server's greedy record passes whatever the engine.

It knows the run folder's and the baseline's file formats as plain JSON; it does not start servers
(process_support does) nor know any engine's own counters (each test module checks those).
"""

from __future__ import annotations

import json
from pathlib import Path


def records(run: Path) -> list[dict]:
    """The run's request records, in file order."""
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]


def baseline_entries(path: Path) -> dict[tuple[str, int], dict]:
    """A baseline file's entries (the header line skipped) by (prompt_id, turn)."""
    lines = path.read_text().splitlines()[1:]
    return {(e["prompt_id"], e.get("turn", 0)): e for e in map(json.loads, lines)}


def assert_greedy_record(r: dict, base: dict[tuple[str, int], dict], max_tokens: int) -> dict:
    """A served greedy record is whole and equals the reference: no error, 1..max_tokens output ids that the
    stream parser credited exactly once (one time per chunk), a length or stop finish, and the output ids equal
    the reference engine's first n, token for token. Returns the record's reference entry."""
    assert r["error"] is None, r["error"]
    n = r["num_output_tokens"]
    assert n == len(r["output_ids"]) and 0 < n <= max_tokens
    assert r["finish_reason"] in ("length", "stop")
    assert sum(r["chunk_tokens"]) == n
    assert len(r["chunk_times_ns"]) == len(r["chunk_tokens"])
    ref = base[(r["prompt_id"], r.get("turn", 0))]
    assert r["output_ids"] == ref["output_ids"][:n]
    return ref
