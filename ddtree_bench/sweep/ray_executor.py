"""`--executor ray`: one Ray task per batch (server group / in-process engine), anywhere in a cluster.

Each task asks for `num_gpus` = `--gpus-per-point` when its points are on CUDA (0 otherwise; Ray
then sets CUDA_VISIBLE_DEVICES for it), `num_cpus` = `D.SWEEP_RAY_CPUS_PER_POINT`, and the grid's
`ray_resources` (custom resources, e.g. a node label). It runs `executors.run_group` into a
temporary directory on its node and streams back, per finished point, the point directory's files
as bytes (a Ray generator task); the driver writes them into the sweep directory exactly as a local
run would (`executors.Absorber`). No shared file system is assumed: models and drafters given as
paths must exist at those paths on the workers, and ddtree-bench (with the serving engine) must be
installed there; the suites' prompts are loaded once on the driver and travel with each task.

The CPU-or-CUDA default of sglang/vllm points is decided on a cluster node (`external_device_fn`: a
probe task that asks for a GPU when the cluster has any), not on the driver, which may have none.

Faults: tasks are never retried (`max_retries=0`): a worker or node that dies takes its task's
unreported points with it; they are marked failed with Ray's reason, and `--resume` runs them
again (the points the task had reported are kept). Ctrl-C cancels every task (force: the worker
process dies, and its servers with it, `sweep/server.py`).

Ray is an optional extra: without it, `--executor ray` is exit 2 with the install hint.
Knows Ray's task API; the sweep loop and the files are `loop.py`'s and `executors.py`'s.
"""

from __future__ import annotations

import os
import queue as queue_mod
import threading
from typing import Any, Callable

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.sweep import ray_address as RA
from ddtree_bench.sweep.executors import Absorber, GroupDone, GroupJob, needs_gpu, run_group
from ddtree_bench.sweep.grid import GridSpec

_END = "__ddtree_bench_group_end__"


def import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs the ray package, which is not installed", hint=D.RAY_INSTALL_HINT) from None
    return ray


def external_device_fn(grid: GridSpec) -> Callable[[], str] | None:
    """For `expand`: where sglang/vllm points default to (None = decide on this host)."""
    if grid.executor != "ray":
        return None
    ex = RayExecutor(grid)
    return ex.external_device


# --------------------------------------------------------------------------- on the worker


def _probe_device() -> str:
    from ddtree_bench.sweep.grid import external_device

    return external_device()


def _group_task(job: GroupJob):
    """Ray generator task: run the batch on a thread (servers die with it), yield its events."""
    import ray

    events: queue_mod.Queue = queue_mod.Queue()
    ctx = ray.get_runtime_context()
    worker = {"node_id": ctx.get_node_id(), "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def body() -> None:
        try:
            run_group(job, events.put, worker=worker)
        except BaseException as e:  # noqa: BLE001 - reported to the driver as this task's failure
            events.put(RuntimeError(f"{type(e).__name__}: {e}"))
        finally:
            events.put(_END)

    t = threading.Thread(target=body, name="ddtree-sweep-group", daemon=True)
    t.start()
    while True:
        ev = events.get()
        if isinstance(ev, str) and ev == _END:
            break
        if isinstance(ev, BaseException):
            raise ev
        yield ev
    t.join()


# --------------------------------------------------------------------------- on the driver


class RayExecutor:
    name = "ray"

    def __init__(self, grid: GridSpec, echo: Callable[[str], None] = print):
        self.ray = import_ray()
        self.grid, self.echo = grid, echo
        self._device: str | None = None

    def connect(self) -> None:
        """Join the cluster (or start a local Ray); exit 2, quickly, where nothing answers (`ray_address.py`)."""
        ray = self.ray
        if ray.is_initialized():
            return
        where = RA.resolve(self.grid.ray_address)
        RA.check(where)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            ray.init(address=where.address, logging_level="ERROR", log_to_driver=False, configure_logging=False,
                     include_dashboard=False if where.address is None else None)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(f"cannot reach the Ray cluster at {where.describe()}: {e}", hint=RA.HINT) from None

    def external_device(self) -> str:
        if self._device is None:
            self.connect()
            ray = self.ray
            gpus = ray.cluster_resources().get("GPU", 0)
            probe = ray.remote(_probe_device).options(num_gpus=1 if gpus else 0, num_cpus=0, max_retries=0,
                                                      resources=self.grid.ray_resources or None)
            self._device = ray.get(probe.remote())
        return self._device

    def describe(self) -> list[str]:
        where = RA.resolve(self.grid.ray_address).address or "a local Ray instance"
        res = f", resources {self.grid.ray_resources}" if self.grid.ray_resources else ""
        return [f"ray: one task per server group on {where} (num_gpus {self.grid.gpus_per_point} for CUDA points, "
                f"num_cpus {D.SWEEP_RAY_CPUS_PER_POINT}{res}); as many at once as the cluster's resources allow"]

    def run(self, sweep: Any, batches: list) -> None:
        self.connect()
        ray = self.ray
        task = ray.remote(_group_task)
        absorb = Absorber(sweep)
        events: queue_mod.Queue = queue_mod.Queue()
        running: dict[int, dict] = {}
        for tok, batch in enumerate(batches):
            pts = [p for p in batch.points if not sweep.sdir.finished(p.id)]
            if not pts:
                continue
            job = GroupJob(sweep.sdir.id, sweep.grid, sweep.prep, pts, "ray", None)
            gen = task.options(num_returns="streaming", max_retries=0, num_cpus=D.SWEEP_RAY_CPUS_PER_POINT,
                               num_gpus=self.grid.gpus_per_point if needs_gpu(pts) else 0,
                               resources=self.grid.ray_resources or None).remote(job)
            running[tok] = {"gen": gen, "remaining": {p.id: p for p in pts}}
            threading.Thread(target=_pump, args=(ray, tok, gen, events), daemon=True).start()
        try:
            while running:
                try:
                    tok, ev = events.get(timeout=0.5)
                except queue_mod.Empty:
                    continue
                r = running.get(tok)
                if r is None:
                    continue
                if isinstance(ev, _Lost):
                    absorb.lose(r["remaining"], f"ray task lost: {ev.reason}"[:600])
                    del running[tok]
                elif absorb.event(ev, r["remaining"], f"ray-task-{tok}") or isinstance(ev, GroupDone):
                    del running[tok]
        finally:
            for r in running.values():
                try:
                    ray.cancel(r["gen"], force=True)
                except Exception:
                    pass
            try:
                ray.shutdown()
            except Exception:
                pass


class _Lost:
    def __init__(self, reason: str):
        self.reason = reason


def _pump(ray: Any, tok: int, gen: Any, events: queue_mod.Queue) -> None:
    """Move one task's streamed events to the driver's queue; a task that ends without GroupDone
    (worker or node died, cancelled, crashed) becomes _Lost."""
    done = False
    try:
        for ref in gen:
            ev = ray.get(ref)
            events.put((tok, ev))
            done = done or isinstance(ev, GroupDone)
        if not done:
            events.put((tok, _Lost("the task ended without finishing its group")))
    except Exception as e:  # noqa: BLE001 - NodeDiedError, WorkerCrashedError, TaskCancelledError, ...
        events.put((tok, _Lost(f"{type(e).__name__}: {' '.join(str(e).split())}")))
