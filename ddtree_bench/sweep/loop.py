"""The sweep loop: a grid's batches of points run one after another in this process, each point into
its own directory of the sweep directory, failures contained.

Order and sharing:
* in-process points: one engine load per (model, dtype, device) — the drafter is loaded with it
  when any point needs one — reused by every method, budget and client-side point (a fresh
  `InProcessBackend` per point over the same loaded pair);
* server points (standalone / sglang / vllm): one server per server-side combination (backend,
  model, draft, method, budget, spec tokens, dtype, device), started from its profile on a free
  port, warmed up once (`grid.warmup` requests, not recorded), then every client-side point runs
  against it, with the server's counters read before and after each point.
* with repeats, points run in rounds (`sweep/order.py`: interleaved by default, `--order`), and each
  point records the machine's load and clocks before and after (`noise/probe.py`).

Failures: a point whose requests all fail, whose server dies while it runs, or whose server cannot
start, is marked failed (status.json with the reason and the server log tail) and the sweep goes
on; a server that died is restarted for the next point.

`SweepLoop.run_inprocess` / `run_server_group` run one batch; `executors.run_group` runs them in a
worker (a subclass that reports each finished point instead of writing the summary row), and
`SweepLoop.run` hands every batch to `self.executor` when one is set (anything with
`run(loop, batches)`; this module imports no executor). Directories, the lock, resuming and the
aggregate rows are `sweep/run.py`'s; what is checked before any work is `sweep/prepare.py`'s.

Knows the grid, the layout and the runner; the engine, HTTP client and metrics are behind them.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.env import now_iso
from ddtree_bench.errors import RunFailed, UsageError
from ddtree_bench.noise import probe
from ddtree_bench.results import read_json, read_records, write_json_atomic, write_text_atomic
from ddtree_bench.sweep import counters as C
from ddtree_bench.sweep import order as O
from ddtree_bench.sweep.grid import GridSpec, Point, server_id, to_spec
from ddtree_bench.sweep.layout import SweepDir, ar_index
from ddtree_bench.sweep.prepare import Prepared, server_command
from ddtree_bench.sweep.server import ServerError, ServerProcess, free_port, start_ready


def _shim_patches(log: bytes) -> list[str] | None:
    """Patches a server-side shim announced in the server's log (lines `ddtree-bench-shim: applied NAME (...)`,
    e.g. the SGLang CPU shim of scripts/install-sglang-cpu.sh), in order, once each; None when there were none."""
    seen: dict[str, None] = {}
    for line in log.decode("utf-8", errors="replace").splitlines():
        if line.startswith("ddtree-bench-shim: applied "):
            seen.setdefault(line.split()[2], None)
    return list(seen) or None


def _records_if_any(pdir: Path) -> list | None:
    """A finished point's request records, or None when it wrote none that can be read."""
    try:
        return read_records(pdir)
    except UsageError:
        return None


class SweepLoop:
    executor = None  # None: batches run here, one after another (else sweep/executors.py's)

    def __init__(self, grid: GridSpec, prep: Prepared, sdir: SweepDir, progress: bool, echo: Callable[[str], None]):
        self.grid, self.prep, self.sdir = grid, prep, sdir
        self.points = prep.points
        self.ars = ar_index(self.points)
        self.progress, self.echo = progress, echo
        self.failed: list[str] = []
        self.done = 0
        self.bar = None

    # ------------------------------------------------------------------ bookkeeping

    def _label(self, p: Point) -> str:
        s = f"{p.backend} {p.method}"
        if p.budget is not None:
            s += f" B={p.budget}"
        if p.spec_tokens is not None:
            s += f" k={p.spec_tokens}"
        varying = []
        g = self.grid
        if len(g.models) > 1:
            varying.append(Path(p.model).name)
        if len(g.suites) > 1:
            varying.append(p.suite)
        if len(g.concurrency) > 1 or len(g.request_rates) > 1:
            varying.append(f"c={p.concurrency}" if p.request_rate is None else f"rate={p.request_rate:g}/s")
        if len(g.temperatures) > 1:
            varying.append(f"T={p.temperature:g}")
        if g.repeats > 1:
            varying.append(f"rep={p.repeat}")
        return s + (f" [{' '.join(varying)}]" if varying else "")

    def _finish(self, p: Point) -> None:
        row = self.sdir.row(p, self.ars.get(p.ar_key()))
        if row is not None:
            self.sdir.append_row(row)
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        n = len(self.points)
        if row is None:
            return
        if row["status"] == "ok":
            tau = row.get("acceptance_length_mean")
            sp = row.get("speedup_vs_ar")
            tps = row.get("output_throughput_tok_s")
            msg = (f"ok  tau={tau:.2f}" if tau is not None else "ok  tau=-") + \
                  (f"  {tps:.1f} tok/s" if tps is not None else "") + (f"  x{sp:.2f} vs AR" if sp is not None else "")
            if row.get("num_errors"):
                msg += f"  ({row['num_errors']} request errors)"
            if row.get("concurrency_honoured") is False:
                msg += f"  [concurrency NOT honoured: {row.get('concurrency_why')}]"
            if row.get("acceptance_crosscheck_agree") is False:
                msg += f"  [server acceptance {row['server_acceptance_length']:.2f} disagrees]"
        elif row["status"] == "unsupported":
            msg = f"unsupported: {str(row.get('error') or '')[:200]}"
        else:
            self.failed.append(p.id)
            msg = f"FAILED: {str(row.get('error') or '')[:160]}"
        self._write(f"[{self.done}/{n}] {self._label(p)}: {msg}")

    def _write(self, text: str) -> None:
        if self.bar is not None:
            from tqdm.auto import tqdm

            tqdm.write(text)
        else:
            self.echo(text)

    def _status(self, p: Point, **fields: Any) -> None:
        self.sdir.write_point_json(p.id, "status.json", {"status": "ok", "finished_at": now_iso(), **fields})

    def _annotate_run(self, p: Point, extra: dict[str, Any]) -> None:
        path = self.sdir.point_dir(p.id) / "run.json"
        if path.exists():
            info = read_json(path)
            info["sweep"] = {"sweep_id": self.sdir.id, "point_id": p.id, "point": p.to_dict(), **extra}
            write_json_atomic(path, info)

    def _execute(self, p: Point, spec, backend=None) -> str | None:
        """Run one point via the runner; returns the failure reason, or None when it finished."""
        from ddtree_bench.runner import execute

        try:
            execute(spec, self.sdir.point_dir(p.id), progress=self.progress, backend=backend, overwrite=True,
                    suite=self.prep.suites[p.suite])
            return None
        except (RunFailed, UsageError) as e:
            return str(e)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # a bug or an engine crash must not end the sweep; keep the traceback
            self.sdir.point_dir(p.id).mkdir(parents=True, exist_ok=True)
            (self.sdir.point_dir(p.id) / "traceback.txt").write_text(traceback.format_exc(), encoding="utf-8")
            return f"internal error: {type(e).__name__}: {e}"

    # ------------------------------------------------------------------ in-process

    def run_inprocess(self, group: list[Point], engines: dict) -> None:
        from ddtree_bench.backends.inprocess import InProcessBackend
        from ddtree_bench.pair import load_pair

        todo = [p for p in group if not self.sdir.finished(p.id)]
        if not todo:
            return
        p0 = todo[0]
        needs_draft = [q for q in self.points if q.backend == "inprocess" and q.engine_key() == p0.engine_key() and q.method != "ar"]
        draft = p0.draft if p0.method != "ar" else (needs_draft[0].draft if needs_draft else None)
        key = (p0.model, draft, p0.dtype, p0.device, bool(needs_draft) or p0.method != "ar")
        if key not in engines:
            engines.clear()  # one loaded pair at a time (large models on one GPU)
            try:
                engines[key] = load_pair(p0.model, draft, "dflash" if key[-1] else "ar", p0.dtype, p0.device,
                                         cuda_graphs=self.grid.cuda_graphs)
            except UsageError as e:
                for p in todo:
                    self.sdir.mark_failed(p.id, f"cannot load the model pair: {e}")
                    self._finish(p)
                return
        pair = engines[key]
        for p in todo:
            spec = to_spec(p, self.grid)
            backend = InProcessBackend(pair, p.method, spec.budget, spec)
            window = probe.start()  # machine load, CPU/GPU clocks before and after (noise.probe)
            err = self._execute(p, spec, backend)
            noise = window.finish()
            k = pair.engine.block_size - 1 if p.method != "ar" and pair.engine.block_size > 1 else None
            if err is None:
                self._annotate_run(p, {"engine_shared": True})
                self._status(p, spec_tokens=k, noise=noise)
            else:
                self.sdir.mark_failed(p.id, err, spec_tokens=k, noise=noise)
            self._finish(p)

    # ------------------------------------------------------------------ servers

    def _start_server(self, p: Point, restarts: int) -> tuple[ServerProcess, dict[str, Any], int]:
        """The point's server, started, ready and warmed up, with its info (server.json); started again on fresh ports
        when a port was taken while it started (server.start_ready), each try with its own log
        (<server>-<restarts>.log). Returns the server, its info and the restart count it reached."""
        profile = self.prep.profiles[p.backend]
        timeout = self.grid.startup_timeout_s or profile.startup_timeout_s or D.SERVER_STARTUP_TIMEOUT_S
        cmds = []   # each try's command

        def make() -> ServerProcess:
            if cmds:
                self._write(f"{p.backend} server: a port was taken while it started; starting it again on fresh ports")
            port = free_port(D.HOST)
            cmds.append(server_command(profile, p, self.grid, port=port, api_key=self.prep.api_key,
                                       server_python=self.prep.server_pythons.get(p.backend)))
            log = self.sdir.servers_dir / f"{server_id(p)}-{restarts + len(cmds) - 1}.log"
            srv = ServerProcess(cmds[-1].argv, port=port, log_path=log, health_path=profile.health_path,
                                env=cmds[-1].env, startup_timeout_s=timeout, api_key=self.prep.api_key)
            srv.record_dir = self.sdir.servers_dir  # pid + start time, so a later --resume can reap it if we die
            self._write(f"starting {p.backend} server for {self._label(p).split(' [')[0]} on port {port} (log: {log})")
            return srv

        srv = start_ready(make)
        cmd, restarts = cmds[-1], restarts + len(cmds) - 1
        try:
            version = None
            if profile.version:
                obj = C.fetch_json(srv.url, profile.version["path"], D.SERVER_HEALTH_TIMEOUT_S, self.prep.api_key)
                if obj is not None:
                    version = obj.get(profile.version.get("key", "version"))
            info = {"backend": p.backend, "profile": profile.source, "requires": profile.requires,
                    "note": profile.notes.get(p.method), "command": cmd.display(), "env": cmd.display_env(),
                    "server_python": self.prep.server_pythons.get(p.backend),
                    "version": version, "restarts": restarts, "started_at": now_iso(),
                    "cpu_shim": _shim_patches(srv.log_slice(0)), **srv.describe()}
            try:
                self._warmup(p, srv)
            except (UsageError, RunFailed, OSError) as e:
                raise ServerError(f"warmup failed: {e}", srv.log_tail()) from None
            return srv, info, restarts
        except BaseException:
            srv.stop()
            raise

    def _warmup(self, p: Point, srv: ServerProcess) -> None:
        """`grid.warmup` short requests on the first prompt, not recorded (outside every counter window)."""
        if self.grid.warmup <= 0:
            return
        from ddtree_bench import driver
        from ddtree_bench.backends import make_backend
        from ddtree_bench.records import Prompt

        spec = to_spec(p, self.grid, url=srv.url, api_key=self.prep.api_key)
        first = self.prep.suites[p.suite].prompts[0]
        warm = [Prompt(f"warmup-{i}", first.turns[:1]) for i in range(self.grid.warmup)]

        async def go() -> None:
            backend = make_backend(spec)
            try:
                await driver.drive(backend, warm, max_new_tokens=min(16, self.grid.max_new_tokens),
                                 temperature=p.temperature, top_p=self.grid.top_p, seed=self.grid.seed, progress=False)
            finally:
                await backend.aclose()

        asyncio.run(go())

    def run_server_group(self, group: list[Point]) -> None:
        todo = [p for p in group if not self.sdir.finished(p.id)]
        if todo and todo[0].id in self.prep.unsupported:  # one server-side config: all or none unsupported
            for p in todo:
                self.sdir.mark_unsupported(p.id, self.prep.unsupported[p.id])
                self._finish(p)
            return
        srv: ServerProcess | None = None
        info: dict[str, Any] = {}
        restarts = 0
        log_pos = 0  # where the next point's slice of the server log starts
        kind = self.prep.profiles[group[0].backend].counters
        try:
            for i, p in enumerate(todo):
                if srv is None or not srv.alive():
                    if srv is not None:
                        srv.stop()
                        restarts += 1
                    log_pos = 0
                    try:
                        srv, info, restarts = self._start_server(p, restarts)
                    except ServerError as e:
                        srv = None
                        for q in todo[i:]:  # a server that cannot start fails its whole group, once
                            self.sdir.mark_failed(q.id, f"server did not start: {e}", e.log_tail)
                            self._finish(q)
                        return
                log_pos = self._run_server_point(p, srv, info, kind, log_pos)
        finally:
            if srv is not None:
                srv.stop()

    def _run_server_point(self, p: Point, srv: ServerProcess, info: dict[str, Any], kind: str | None, log_start: int) -> int:
        """Run one client-side point against a live server; returns where the server log ended."""
        api_key = self.prep.api_key
        spec = to_spec(p, self.grid, url=srv.url, api_key=api_key)
        spec.warmup = 0  # the server was warmed up once when it started
        before, before_text = C.scrape_with_text(kind, srv.url, api_key=api_key)
        window = probe.start([srv.pid] if srv.pid else None)  # the server's CPU is not "other load"
        err = self._execute(p, spec)
        noise = window.finish()
        records = _records_if_any(self.sdir.point_dir(p.id))
        # any failed request (one may have finished before a kill): give a dying server time to exit
        failed = err is not None or records is None or any(not r.ok for r in records)
        died = not srv.alive(settle_s=D.SERVER_DEATH_SETTLE_S if failed else 0.0)
        after, after_text = C.scrape_with_text(kind, srv.url, api_key=api_key) if not died else ({}, None)
        log_end = srv.log_size()
        pdir = self.sdir.point_dir(p.id)
        pdir.mkdir(parents=True, exist_ok=True)
        for name, text in (("metrics_before.prom", before_text), ("metrics_after.prom", after_text)):
            if text is not None:  # the server's own /metrics around the point, verbatim
                write_text_atomic(pdir / name, text)
        (pdir / "server.log").write_bytes(srv.log_slice(log_start, log_end))
        write_json_atomic(pdir / "server.json", info)
        tail = srv.log_tail() if (died or err) else None
        if died:
            err = f"server exited with code {srv.returncode} while the point ran" + (f" ({err})" if err else "")
        if err is None:
            records = records if records is not None else read_records(pdir)
            ok = sum(1 for r in records if r.ok)
            server_side = C.server_acceptance(kind, before, after, ok) if kind else None
            per_req = C.per_request_acceptance(records)
            cross = C.crosscheck(C.client_acceptance_length(kind, records), server_side, per_req)  # kind's definition
            write_json_atomic(pdir / "counters.json", {"kind": kind, "before": before, "after": after,
                                                       "server_counters": server_side, "per_request": per_req,
                                                       "crosscheck": cross})
            self._annotate_run(p, {"server": info, "server_warmup_requests": self.grid.warmup})
            self._status(p, server_version=info.get("version"), spec_tokens=p.spec_tokens, noise=noise)
        else:
            self.sdir.mark_failed(p.id, err, tail, server_version=info.get("version"), noise=noise)
        self._finish(p)
        return log_end

    # ------------------------------------------------------------------ all

    def run(self) -> None:
        from tqdm.auto import tqdm

        finished = sum(1 for p in self.points if self.sdir.finished(p.id))
        self.done = finished
        self.bar = tqdm(total=len(self.points), initial=finished, desc="sweep", unit="point", disable=not self.progress)
        if not self.progress:
            self.bar.close()
            self.bar = None
        engines: dict = {}
        try:
            batches = O.schedule_for(self.grid, self.points)  # rounds of repeats (sweep/order.py)
            if self.executor is not None:  # --workers N / --executor ray: batches elsewhere (sweep/executors.py)
                self.executor.run(self, batches)
                batches = []
            for batch in batches:
                group = batch.points
                if group[0].backend == "inprocess":
                    self.run_inprocess(group, engines)
                else:
                    engines.clear()
                    self.run_server_group(group)
        finally:
            engines.clear()
            if self.bar is not None:
                self.bar.close()
