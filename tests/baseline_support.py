"""Helpers for the baseline / compare / gate tests: run the CLI in-process, and build baselines and
run directories by hand (no model), so each test states exactly the tokens and gaps it judges."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddtree_bench import metrics
from ddtree_bench.baselines.file import BaselineEntry, write_baseline
from ddtree_bench.records import RequestRecord

STOP = 258  # the byte tokenizer's <|im_end|>


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run `ddtree-bench ARGV` in this process; returns (exit code, stdout, stderr)."""
    from ddtree_bench.cli import main

    capsys.readouterr()
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def entry(pid: str, out: list[int], gaps: list[float] | None = None, turn: int = 0, prompt: list[int] | None = None,
          accept: list[int] | None = None, finish: str | None = None, text: str | None = None) -> BaselineEntry:
    return BaselineEntry(pid, turn, prompt if prompt is not None else [1, 2, 3, turn], list(out),
                         text if text is not None else " ".join(map(str, out)),
                         gaps if gaps is not None else [5.0] * len(out), accept,
                         finish or ("stop" if out and out[-1] == STOP else "length"))


def record(pid: str, out: list[int] | None, turn: int = 0, prompt: list[int] | None = None, accept: list[int] | None = None,
           error: str | None = None, finish: str | None = None, t0: int = 0, ns_per_token: int = 1_000_000) -> RequestRecord:
    n = len(out or [])
    return RequestRecord(
        prompt_id=pid, turn=turn, prompt_ids=prompt if prompt is not None else [1, 2, 3, turn], output_ids=out,
        output_text=" ".join(map(str, out or [])), accept_lengths=accept, num_output_tokens=n if out is not None else None,
        finish_reason=finish or (None if error else ("stop" if out and out[-1] == STOP else "length")),
        t_send_ns=t0, t_first_token_ns=t0 + ns_per_token, t_done_ns=t0 + ns_per_token * max(n, 1), error=error,
    )


def baseline_file(path: Path, entries: list[BaselineEntry], **header: Any) -> Path:
    h = {"source": "record", "method": "ar", "temperature": 0.0, "model": "test", "dtype": "float32",
         "suite": "unit", "max_new_tokens": 16, "stop_ids": [STOP]}
    h.update(header)
    return write_baseline(path, h, entries)


def run_dir(path: Path, records: list[RequestRecord], summary: dict[str, Any] | None = None, **spec: Any) -> Path:
    """A results directory as `ddtree-bench run` writes it (summary.json from metrics.summarize unless given)."""
    path.mkdir(parents=True, exist_ok=True)
    s = {"backend": "inprocess", "model": "test", "method": "ddtree", "budget": 64, "suite": "unit", "limit": None,
         "max_new_tokens": 16, "temperature": 0.0, "dtype": "float32", "device": "cpu", "concurrency": 1, "request_rate": None}
    s.update(spec)
    (path / "run.json").write_text(json.dumps({"kind": "ddtree-bench-run", "version": 1, "spec": s,
                                                "suite": {"name": s["suite"]}, "backend": {"stop_ids": [STOP]}}))
    (path / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    summ = metrics.summarize(records)
    summ.update(summary or {})
    (path / "summary.json").write_text(json.dumps(summ))
    return path
