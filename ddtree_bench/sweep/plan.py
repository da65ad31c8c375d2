"""The plan printed before a sweep runs (and all `--dry-run` prints): what will run, where, how long.

    points   N (F finished, T to run)   server groups G   workers W (how they are pinned)
    estimate ~X (from M points measured in this directory | stated defaults)

Estimate of one point still to run: the mean `duration_s` of the finished points in the directory
with the same (backend, method), else the same backend, else any finished point, else the stated
`D.PLAN_POINT_S[backend]` (for D.SWEEP_LIMIT prompts of D.SWEEP_MAX_NEW_TOKENS tokens) scaled by the grid's
limit x max_new_tokens against those defaults (a suite run whole, `limit: all`, is not scaled: its size is
not known before it loads). A batch costs the sum of its points plus one server start (the mean
`ready_after_s` measured for that backend, else `D.PLAN_SERVER_START_S`). Wall time with W workers
is the longest-processing-time-first schedule of the batches on W workers: each batch, longest
first, goes to the worker free soonest (a bound within 4/3 of the best). Ray: W = the number of
batches (as many at once as the cluster allows), so the estimate is a lower bound there.

Knows the directory's measured points; nothing of servers or engines.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from statistics import mean

from ddtree_bench import defaults as D
from ddtree_bench.sweep.grid import Point
from ddtree_bench.sweep.layout import SweepDir


@dataclass
class Plan:
    points: int
    finished: int
    groups: int              # batches with something left to run
    workers: int
    executor: str
    estimate_s: float        # wall time of what is left
    serial_s: float          # the same, one batch after another
    source: str              # where the per-point figure came from
    where: list[str] = field(default_factory=list)   # one line per worker / the Ray layout

    def lines(self) -> list[str]:
        out = [f"plan: {self.points} points ({self.finished} finished, {self.points - self.finished} to run), "
               f"{self.groups} server group{'s' if self.groups != 1 else ''}, {self.workers} worker{'s' if self.workers != 1 else ''} ({self.executor})",
               f"plan: estimated {_duration(self.estimate_s)}" +
               (f" (serial {_duration(self.serial_s)})" if self.workers > 1 and self.groups > 1 else "") + f", {self.source}"]
        out += [f"plan:   {w}" for w in self.where]
        return out


def _duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def _measured(sdir: SweepDir | None, points: list[Point]) -> tuple[dict[tuple, list[float]], dict[str, list[float]]]:
    per: dict[tuple, list[float]] = {}
    starts: dict[str, list[float]] = {}
    if sdir is None or not sdir.points_dir.is_dir():
        return per, starts
    for p in points:
        s = sdir.read_point_json(p.id, "summary.json")
        if s and isinstance(s.get("duration_s"), (int, float)):
            per.setdefault((p.backend, p.method), []).append(float(s["duration_s"]))
        srv = sdir.read_point_json(p.id, "server.json")
        if srv and isinstance(srv.get("ready_after_s"), (int, float)):
            starts.setdefault(p.backend, []).append(float(srv["ready_after_s"]))
    return per, starts


def makespan(costs: list[float], workers: int) -> float:
    """Longest-processing-time-first on `workers` identical workers."""
    loads = [0.0] * max(1, min(workers, len(costs) or 1))
    heapq.heapify(loads)
    for c in sorted(costs, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + c)
    return max(loads) if costs else 0.0


def work_scale(limit: int | None, max_new_tokens: int) -> float:
    """The grid's prompts x tokens per point against the defaults the stated per-point times are for."""
    if limit is None:
        return 1.0
    return (limit * max_new_tokens) / (D.SWEEP_LIMIT * D.SWEEP_MAX_NEW_TOKENS)


def build_plan(points: list[Point], batches: list, sdir: SweepDir | None, workers: int, executor: str,
               where: list[str] | None = None, scale: float = 1.0) -> Plan:
    per, starts = _measured(sdir, points)
    every = [x for xs in per.values() for x in xs]

    def point_s(p: Point) -> float:
        for xs in (per.get((p.backend, p.method)), [x for (b, _), v in per.items() if b == p.backend for x in v], every):
            if xs:
                return mean(xs)
        return D.PLAN_POINT_S.get(p.backend, D.PLAN_POINT_S["inprocess"]) * scale

    def start_s(backend: str) -> float:
        xs = starts.get(backend)
        return mean(xs) if xs else D.PLAN_SERVER_START_S.get(backend, 0.0)

    finished = {p.id for p in points if sdir is not None and sdir.finished(p.id)}
    costs = []
    for b in batches:
        left = [p for p in b.points if p.id not in finished]
        if left:
            costs.append(start_s(left[0].backend) + sum(point_s(p) for p in left))
    n_measured = len(every)
    source = (f"from {n_measured} point{'s' if n_measured != 1 else ''} measured in this directory" if n_measured
              else "from stated defaults (defaults.PLAN_POINT_S / PLAN_SERVER_START_S" +
              (f", x{scale:.2g} for this grid's prompts x tokens)" if scale != 1.0 else ")"))
    w = len(costs) if executor == "ray" else workers
    return Plan(len(points), len(finished), len(costs), w if executor != "ray" else max(1, w), executor,
                makespan(costs, w), sum(costs), source, list(where or []))


def plan_for(grid, points: list[Point], sdir: SweepDir | None, executor=None) -> Plan:
    """The plan of `grid`'s points with `executor` (None = serial), from `sdir`'s measured points."""
    from ddtree_bench.sweep import order as O

    name = getattr(executor, "name", "serial")
    workers = len(getattr(executor, "slots", [])) or 1
    return build_plan(points, O.schedule_for(grid, points), sdir, workers, name,
                      executor.describe() if executor is not None else [],
                      work_scale(getattr(grid, "limit", D.SWEEP_LIMIT), getattr(grid, "max_new_tokens", D.SWEEP_MAX_NEW_TOKENS)))


def dry_run(grid, sweep_dir=None, api_key: str | None = None) -> list[str]:
    """`sweep --dry-run`: validate the grid as a sweep would (exit 2 on bad input), writing nothing,
    and return the plan's lines. Ray: checks that ray is installed, connects to nothing."""
    import copy

    from ddtree_bench.sweep import order as O
    from ddtree_bench.sweep.executor_choice import make_executor
    from ddtree_bench.sweep.prepare import prepare

    grid = copy.deepcopy(grid)
    sdir = SweepDir(sweep_dir) if sweep_dir is not None else None
    if sdir is not None:
        sdir.read()  # a sweep directory (exit 2 otherwise)
    executor = None
    if grid.executor == "ray":
        from ddtree_bench.sweep.ray_address import host_port, resolve
        from ddtree_bench.sweep.ray_executor import import_ray

        import_ray()
        where = resolve(grid.ray_address)
        if where.address:
            host_port(where.address)  # its form only (exit 2 for a dashboard URL, a missing port)
    prep = prepare(grid, api_key)
    if grid.executor != "ray":
        executor = make_executor(grid, prep.points)
    O.fix_seed(grid)
    plan = plan_for(grid, prep.points, sdir, executor)
    if grid.executor == "ray":
        plan = build_plan(prep.points, O.schedule_for(grid, prep.points), sdir, 1, "ray",
                          [f"ray: one task per server group on {grid.ray_address or 'RAY_ADDRESS / a local Ray'}; "
                           f"as many at once as the cluster's resources allow"])
    return plan.lines() + ["dry run: nothing was started or written"]
