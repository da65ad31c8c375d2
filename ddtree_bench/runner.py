"""Executing one `RunSpec`: suite -> prompts -> backend -> records -> summary, into a results directory.

This is what `ddtree-bench run` does and what every sweep point does. All input is validated before
the first request (exit 2 on bad input, nothing written); a run whose every request failed is
finalised without summary.json and raises `RunFailed` (exit 1).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_bench.config import RunSpec
from ddtree_bench.env import environment, now_iso
from ddtree_bench.errors import RunFailed
from ddtree_bench.records import RequestRecord
from ddtree_bench.results import RunWriter, check_out_dir


@dataclass
class RunResult:
    out: Path
    summary: dict[str, Any] | None
    records: list[RequestRecord]


def default_out(spec: RunSpec, root: Path = Path("results")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    budget = f"-b{spec.budget}" if spec.method == "ddtree" else ""
    suite = Path(spec.suite).stem if spec.suite.endswith(".jsonl") else spec.suite
    return root / f"{stamp}-{spec.backend}-{spec.method}{budget}-{suite}"


def execute(spec: RunSpec, out: Path | None = None, progress: bool = True, backend=None) -> RunResult:
    """Run `spec` and write its results directory. `backend` may be passed in (sweeps reuse one)."""
    from ddtree_bench import load, metrics, suites
    from ddtree_bench.backends import make_backend

    spec.validate()
    out = check_out_dir(out or default_out(spec))
    prompts, suite_info = suites.load_prompts(spec.suite, spec.limit, subset=spec.subset)
    if backend is None:
        backend = make_backend(spec)
    with RunWriter(out) as writer:
        info = {
            "kind": "ddtree-bench-run",
            "version": 2,  # 2: records carry token_source, the spec `stream` (1 is read the same, without them)
            "spec": spec.public_dict(),
            "suite": suite_info.to_dict(),
            "backend": backend.describe(),
            "started_at": now_iso(),
            **environment(spec.device if spec.backend == "inprocess" else None),
        }
        writer.write_run(info)
        records = asyncio.run(load.drive(
            backend, prompts, max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
            seed=spec.seed, concurrency=spec.concurrency, request_rate=spec.request_rate, warmup=spec.warmup,
            on_record=writer.append, progress=progress, desc=f"{spec.method}" + (f" B={spec.budget}" if spec.method == "ddtree" else ""),
        ))
        writer.update_run(finished_at=now_iso(), backend=backend.describe())
        ok = [r for r in records if r.ok]
        if records and not ok:
            writer.commit(None)
            first = records[0].error
            raise RunFailed(f"all {len(records)} requests failed (first: {first}); records in {out}")
        summary = metrics.summarize(records, block_size=max(16, getattr(backend, "block_size", 16)))
        writer.commit(summary)
    return RunResult(out, summary, records)
