"""Which executor a grid's batches run on: None (the serial loop, `--workers 1`, the default), a
`LocalExecutor` of `--workers N` pinned worker processes (`sweep/executors.py`), or a `RayExecutor`
(`--executor ray`, `sweep/ray_executor.py`).

Knows the grid's where-to-run settings and this host's GPUs and cores; nothing of what a batch does.
"""

from __future__ import annotations

from typing import Callable

from ddtree_bench.sweep.executors import Executor, LocalExecutor, assign_slots, available_cores, needs_gpu, visible_devices
from ddtree_bench.sweep.grid import GridSpec, Point


def make_executor(grid: GridSpec, points: list[Point], echo: Callable[[str], None] = print) -> Executor | None:
    """None = the serial loop. Raises UsageError (exit 2) for a layout this host cannot give, or
    `--executor ray` without ray installed or with no cluster answering (it connects here, before a sweep
    writes anything)."""
    if grid.executor == "ray":
        from ddtree_bench.sweep.ray_executor import RayExecutor

        ex = RayExecutor(grid, echo)
        ex.connect()
        return ex
    if grid.workers <= 1:
        if needs_gpu(points):   # the serial loop's CUDA points run on this host's GPUs too: as many as a point takes
            assign_slots(1, grid.gpus_per_point, True, visible_devices(), available_cores())
        return None
    slots = assign_slots(grid.workers, grid.gpus_per_point, needs_gpu(points), visible_devices(), available_cores())
    return LocalExecutor(slots)
