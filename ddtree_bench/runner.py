"""Executing one `RunSpec`: suite -> prompts -> backend -> records -> summary, into a results directory.

This is what `ddtree-bench run` does and what every sweep point does. All input is validated before
the first request (exit 2 on bad input, nothing written); a run whose every request failed is
finalised without summary.json and raises `RunFailed` (exit 1).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtree_bench.env import environment, now_iso
from ddtree_bench.errors import RunFailed
from ddtree_bench.records import RequestRecord
from ddtree_bench.results import RUN_KIND, RUN_VERSION, RunWriter, check_run_out
from ddtree_bench.run_spec import RunSpec

if TYPE_CHECKING:
    from ddtree_bench.suites.prompts import SuitePrompts


@dataclass
class RunResult:
    out: Path
    summary: dict[str, Any] | None
    records: list[RequestRecord]


def default_out(spec: RunSpec, root: Path = Path("results")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    budget = f"-b{spec.budget}" if spec.method == "ddtree" else ""
    suite = Path(spec.suite).stem if spec.suite.endswith(".jsonl") else spec.suite
    base = root / f"{stamp}-{spec.backend}-{spec.method}{budget}-{suite}"
    out, n = base, 2
    while out.exists():  # two runs started in the same second get two directories
        out, n = Path(f"{base}-{n}"), n + 1
    return out


def execute(spec: RunSpec, out: Path | None = None, progress: bool = True, backend=None, overwrite: bool = False,
            suite: SuitePrompts | None = None) -> RunResult:
    """Run `spec` and write its results directory. `backend` may be passed in (sweeps reuse one), and
    so may `suite`, the spec's suite already loaded (`suites.prompts.load_suite`: a sweep loads each
    suite once for all its points); either way the suite is loaded once and only that record is used.
    An `out` that already holds a run is refused (UsageError) unless `overwrite` (`results.check_run_out`)."""
    from ddtree_bench import driver, metrics
    from ddtree_bench.backends import make_backend
    from ddtree_bench.engine.facts import run_facts
    from ddtree_bench.suites.prompts import load_suite

    spec.validate()
    out = check_run_out(out or default_out(spec), overwrite)
    if suite is None:
        suite = load_suite(spec.suite, spec.limit, subset=spec.subset)
        if spec.limit and len(suite.prompts) < spec.limit and progress:
            print(f"note: --limit {spec.limit}, but {spec.suite} has {len(suite.prompts)} prompts: running "
                  f"{len(suite.prompts)}", file=sys.stderr)
    elif not suite.answers(spec.suite, spec.limit, spec.subset):
        raise ValueError(f"execute: suite {suite.suite!r} (limit {suite.limit}, subset {suite.subset}) is not the spec's "
                         f"{spec.suite!r} (limit {spec.limit}, subset {spec.subset})")
    own_backend = backend is None   # a sweep passes its own (its points do not announce their warmups)
    if backend is None:
        backend = make_backend(spec)
    with RunWriter(out, overwrite) as writer:
        info = {
            "kind": RUN_KIND,
            "version": RUN_VERSION,  # results.RUN_VERSION says what each version added
            "spec": spec.public_dict(),
            "suite": suite.info.to_dict(),
            "backend": backend.describe(),
            **run_facts(spec, backend),  # the drafter's attention mode and the stop-id rule (engine/facts.py)
            "started_at": now_iso(),
            **environment(spec.device if spec.backend == "inprocess" else None),
        }
        writer.write_run(info)
        records = asyncio.run(driver.drive(
            backend, suite.prompts, max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
            seed=spec.seed, concurrency=spec.concurrency, request_rate=spec.request_rate, warmup=spec.warmup,
            on_record=writer.append, progress=progress, desc=f"{spec.method}" + (f" B={spec.budget}" if spec.method == "ddtree" else ""),
            announce_warmup=progress and own_backend,
        ))
        writer.update_run(finished_at=now_iso(), backend=backend.describe())
        ok = [r for r in records if r.ok]
        if records and not ok:
            writer.commit(None)
            first = records[0].error
            raise RunFailed(f"all {len(records)} requests failed (first: {first}); records in {out}")
        summary = metrics.summarize(records, block_size=max(16, getattr(backend, "block_size", 16)))
        batching = backend.batching() if hasattr(backend, "batching") else None  # did the concurrency overlap for real
        summary.update(metrics.concurrency_summary(records, spec.concurrency, spec.request_rate, batching))
        writer.commit(summary)
    return RunResult(out, summary, records)
