"""Backend profiles: data (YAML) that turns a sweep point into a server command line.

A profile (`ddtree_bench/profiles/<backend>.yaml`, or `<backend>.yaml` in a `--profiles DIR` that
overrides the bundled file) says how to start one engine's OpenAI-compatible server and how to
watch it:

    name, description, requires     what it is and which engine version / PR branch it needs
    argv                            base command (template items)
    method_args: {ar, dflash, ddtree}  appended per method; a missing method = not supported
    optional_args: {param: [...]}   appended when the parameter is set (spec_tokens, api_key, draft)
    defaults: {param: value}        parameter defaults for this engine (vLLM: spec_tokens 15)
    env: {NAME: value}              extra environment (templates allowed; left out when a placeholder is unset)
    devices: [cuda]                 accepted device kinds (the part of --device before ':')
    device_args: {cpu: [...]}       appended when the point's device kind is the key (vLLM's CPU settings)
    device_env: {cpu: {NAME: v}}    extra environment for that device kind
    python_module: vllm             the module the server's interpreter must import: `{server_python}` in
                                    argv is `--server-python PY`, else the first Python on PATH that can
                                    import it (sweep/server_python.py)
    method_probe: {ddtree: CODE}    Python code run with `{server_python}` before the sweep: exit 0 = this
                                    installation serves the method; otherwise its points are recorded as
                                    `unsupported` with the method's note (not run, not failed). The code
                                    sees DDTREE_BENCH_MODEL (the point's model directory) and
                                    DDTREE_BENCH_DEVICE (e.g. SGLang's CPU path refusing hybrid models)
    health_path                     readiness endpoint (200 = ready)
    startup_timeout_s               how long loading may take
    version: {path, key}            where the server reports its version (JSON)
    counters                        which counter parser applies (sweep/counters.py): sglang|vllm|standalone|llamacpp
    notes: {method: text}           shown in sweep.json / server.json (e.g. "needs PR #29907")

Template items are strings with `{name}` placeholders (model, draft, method, budget, spec_tokens,
block_size = spec_tokens + 1, dtype, device, gpu = N of cuda:N, host, port, api_key, python = this
interpreter, server_python = the serving engine's interpreter, server_bin = the serving engine's binary
(llama-server: `--llama-server`, else found as backends/llamacpp_gguf.py says), max_batch = the largest
concurrency the server's points ask for), or
`{json: OBJ}`, which renders OBJ as compact JSON after substituting placeholders (a leaf that is exactly "{name}" keeps
the value's type; keys whose value is unset are dropped). Unknown keys in a profile are errors.

Knows nothing of processes, HTTP or results.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "profiles"
PROFILE_KEYS = ("name", "description", "requires", "argv", "method_args", "optional_args", "defaults", "env",
                "devices", "device_args", "device_env", "python_module", "method_probe", "health_path",
                "startup_timeout_s", "version", "counters", "notes")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
SECRET_PARAMS = ("api_key",)
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


@dataclass
class Profile:
    name: str
    argv: list[Any]
    method_args: dict[str, list[Any]]
    health_path: str = "/health"
    description: str = ""
    requires: str = ""
    optional_args: dict[str, list[Any]] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=lambda: ["cpu", "cuda"])
    device_args: dict[str, list[Any]] = field(default_factory=dict)
    device_env: dict[str, dict[str, str]] = field(default_factory=dict)
    python_module: str | None = None
    method_probe: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float | None = None
    version: dict[str, str] | None = None
    counters: str | None = None
    notes: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def supports(self, method: str) -> bool:
        return method in self.method_args

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in PROFILE_KEYS if getattr(self, k) not in (None, {}, [], "")} | {"source": self.source}


def parse_profile(data: Any, source: str) -> Profile:
    if not isinstance(data, dict):
        raise UsageError(f"profile {source}: expected a mapping at the top level")
    for k in data:
        if k not in PROFILE_KEYS:
            raise UsageError(f"profile {source}: unknown key {k!r}", hint=f"valid keys: {', '.join(PROFILE_KEYS)}")
    for k in ("name", "argv", "method_args"):
        if k not in data:
            raise UsageError(f"profile {source}: missing key {k!r}")
    if not isinstance(data["argv"], list) or not data["argv"]:
        raise UsageError(f"profile {source}: argv must be a non-empty list")
    ma = data["method_args"]
    if not isinstance(ma, dict) or not all(k in ("ar", "dflash", "ddtree") and isinstance(v, list) for k, v in ma.items()):
        raise UsageError(f"profile {source}: method_args must map ar/dflash/ddtree to lists")
    oa = data.get("optional_args") or {}
    if not isinstance(oa, dict) or not all(isinstance(v, list) for v in oa.values()):
        raise UsageError(f"profile {source}: optional_args must map parameter names to lists")
    if data.get("counters") not in (None, "sglang", "vllm", "standalone", "llamacpp"):
        raise UsageError(f"profile {source}: counters must be sglang, vllm, standalone or llamacpp")
    da = data.get("device_args") or {}
    if not isinstance(da, dict) or not all(isinstance(v, list) for v in da.values()):
        raise UsageError(f"profile {source}: device_args must map device kinds (cpu, cuda) to lists")
    de = data.get("device_env") or {}
    if not isinstance(de, dict) or not all(isinstance(v, dict) for v in de.values()):
        raise UsageError(f"profile {source}: device_env must map device kinds (cpu, cuda) to NAME: value mappings")
    mp = data.get("method_probe") or {}
    if not isinstance(mp, dict) or not all(k in ("ar", "dflash", "ddtree") and isinstance(v, str) for k, v in mp.items()):
        raise UsageError(f"profile {source}: method_probe must map ar/dflash/ddtree to Python code (a string)")
    pm = data.get("python_module")
    if pm is not None and not (isinstance(pm, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", pm)):
        raise UsageError(f"profile {source}: python_module must be a module name, e.g. vllm")
    v = data.get("version")
    if v is not None and not (isinstance(v, dict) and set(v) <= {"path", "key"} and "path" in v):
        raise UsageError(f"profile {source}: version must be {{path: /..., key: name}}")
    for key, what in (("defaults", "map parameter names to values"), ("env", "map NAME to a value"),
                      ("notes", "map ar/dflash/ddtree to text")):
        if not isinstance(data.get(key) or {}, dict):
            raise UsageError(f"profile {source}: {key} must {what}")
    devices = data.get("devices") or ["cpu", "cuda"]
    if not isinstance(devices, list) or not devices or not all(d in ("cpu", "cuda") for d in devices):
        raise UsageError(f"profile {source}: devices must be a list of cpu and/or cuda, got {devices!r}")
    t = data.get("startup_timeout_s")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
        raise UsageError(f"profile {source}: startup_timeout_s must be a positive number of seconds, got {t!r}")
    return Profile(
        name=str(data["name"]), argv=data["argv"], method_args={k: list(v) for k, v in ma.items()},
        health_path=str(data.get("health_path", "/health")), description=str(data.get("description", "")),
        requires=str(data.get("requires", "")), optional_args={k: list(v) for k, v in oa.items()},
        defaults=dict(data.get("defaults") or {}), env={str(k): str(x) for k, x in (data.get("env") or {}).items()},
        devices=[str(d) for d in devices],
        device_args={str(k): list(v) for k, v in da.items()},
        device_env={str(k): {str(n): str(x) for n, x in v.items()} for k, v in de.items()},
        python_module=pm, method_probe={str(k): str(v) for k, v in mp.items()},
        startup_timeout_s=float(data["startup_timeout_s"]) if data.get("startup_timeout_s") is not None else None,
        version=v, counters=data.get("counters"), notes={str(k): str(x) for k, x in (data.get("notes") or {}).items()},
        source=source,
    )


def load_profile(backend: str, override_dir: str | Path | None = None) -> Profile:
    """The profile for `backend`: `<override_dir>/<backend>.yaml` if present, else the bundled one."""
    candidates = []
    if override_dir is not None:
        d = Path(override_dir).expanduser()
        if not d.is_dir():
            raise UsageError(f"--profiles {d} is not a directory")
        candidates.append(d / f"{backend}.yaml")
    candidates.append(BUNDLED_DIR / f"{backend}.yaml")
    for path in candidates:
        if path.is_file():
            from ddtree_bench.yaml_mapping import read_yaml_mapping

            return parse_profile(read_yaml_mapping(path, f"profile {path}", "a mapping of profile keys"), str(path))
    raise UsageError(f"no profile for backend {backend!r}", hint=f"add {backend}.yaml to --profiles DIR")


# --------------------------------------------------------------------------- rendering


def _render_str(template: str, params: dict[str, Any], where: str) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in params:
            raise UsageError(f"{where}: unknown placeholder {{{name}}}")
        if params[name] is None:
            raise UsageError(f"{where}: needs {name}, which this point does not set")
        return str(params[name])

    return _PLACEHOLDER.sub(sub, template)


def _render_json(obj: Any, params: dict[str, Any], where: str) -> Any:
    """Substitute placeholders inside a JSON-able object; exact "{x}" leaves keep their type; unset keys drop."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(v, str) and (m := _PLACEHOLDER.fullmatch(v)) and params.get(m.group(1)) is None:
                if m.group(1) not in params:
                    raise UsageError(f"{where}: unknown placeholder {v}")
                continue
            out[k] = _render_json(v, params, where)
        return out
    if isinstance(obj, list):
        return [_render_json(v, params, where) for v in obj]
    if isinstance(obj, str):
        m = _PLACEHOLDER.fullmatch(obj)
        if m and m.group(1) in params and params[m.group(1)] is not None:
            return params[m.group(1)]
        return _render_str(obj, params, where)
    return obj


def _render_items(items: list[Any], params: dict[str, Any], where: str) -> list[str]:
    out = []
    for it in items:
        if isinstance(it, dict):
            if set(it) != {"json"}:
                raise UsageError(f"{where}: a mapping item must be {{json: ...}}")
            out.append(json.dumps(_render_json(it["json"], params, where), separators=(",", ":")))
        elif isinstance(it, (str, int, float)) and not isinstance(it, bool):
            out.append(_render_str(str(it), params, where))
        else:
            raise UsageError(f"{where}: argv items must be strings or {{json: ...}}, got {it!r}")
    return out


@dataclass
class ServerCommand:
    argv: list[str]
    env: dict[str, str]
    params: dict[str, Any]

    def display(self) -> str:
        """The command line with secrets masked (what server.json / run.json record)."""
        return shlex.join(mask_argv(self.argv, self.params))

    def display_env(self) -> dict[str, str]:
        """The extra environment with secrets masked (names with KEY, TOKEN, SECRET, ... in them)."""
        return redact_env(self.env)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_ENV.search(k) else v) for k, v in env.items()}


def mask_argv(argv: list[str], params: dict[str, Any]) -> list[str]:
    secrets = {str(params[k]) for k in SECRET_PARAMS if params.get(k)}
    return ["***" if a in secrets else a for a in argv]


def point_params(profile: Profile, *, model: str, draft: str | None, method: str, budget: int | None,
                 spec_tokens: int | None, dtype: str, device: str, host: str, port: int,
                 api_key: str | None = None, server_python: str | None = None,
                 max_batch: int | None = None, server_bin: str | None = None) -> dict[str, Any]:
    """Template values for one server (profile defaults fill unset knobs). `server_python` is the
    resolved interpreter of the serving engine (`server_python.resolve`), None when the profile needs none."""
    k = spec_tokens if spec_tokens is not None else profile.defaults.get("spec_tokens")
    if method == "ar":
        k = None
    params: dict[str, Any] = {
        "model": model, "draft": draft if method != "ar" else None, "method": method,
        "budget": budget if method == "ddtree" else None, "spec_tokens": k,
        "block_size": (k + 1) if k is not None else None, "dtype": dtype, "device": device,
        "host": host, "port": port, "api_key": api_key, "python": sys.executable, "server_python": server_python,
        "server_bin": server_bin, "max_batch": max_batch,
        "gpu": device.split(":", 1)[1] if device.startswith("cuda:") else None,
    }
    for key, v in profile.defaults.items():
        if key not in params:
            raise UsageError(f"profile {profile.source}: unknown default {key!r}")
    return params


def build_command(profile: Profile, params: dict[str, Any], extra_args: list[str] | None = None,
                  extra_env: dict[str, str] | None = None) -> ServerCommand:
    """Render the profile for one server-side combination. Raises UsageError on an unsupported method
    or device, or a template that needs a parameter the point does not set."""
    method, device = params["method"], params["device"]
    where = f"profile {profile.name}"
    if not profile.supports(method):
        raise UsageError(f"backend {profile.name} has no method {method!r} in its profile ({profile.source})",
                         hint=profile.notes.get(method) or None)
    kind = device.split(":", 1)[0]
    if kind not in profile.devices:
        raise UsageError(f"backend {profile.name} runs on {', '.join(profile.devices)}, not {device!r}")
    argv = _render_items(profile.argv, params, where)
    argv += _render_items(profile.method_args[method], params, f"{where} ({method})")
    argv += _render_items(profile.device_args.get(kind, []), params, f"{where} ({kind})")
    for name, items in profile.optional_args.items():
        if name not in params:
            raise UsageError(f"{where}: optional_args names unknown parameter {name!r}")
        if params[name] is not None:
            argv += _render_items(items, params, f"{where} ({name})")
    argv += list(extra_args or [])
    env = {}
    for k, v in {**profile.env, **profile.device_env.get(kind, {})}.items():  # unset placeholder -> left out
        names = _PLACEHOLDER.findall(v)
        if all(params.get(n) is not None for n in names if n in params):
            env[k] = _render_str(v, params, f"{where} env")
    env.update(extra_env or {})
    return ServerCommand(argv, env, params)
