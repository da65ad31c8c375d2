"""What a sweep checks before it does any work: the grid's points, their suites' prompts (loaded
once, for every point), the server profiles and interpreters they need, and which points this
installation cannot serve. Bad input is exit 2 here, before a directory, a server or a model exists
(`sweep --dry-run` stops after this). Also the command line a server-side point's server starts with
(`server_command`), since checking that its executable exists needs it.

Knows the grid, the suites and the profiles; nothing of the loop, servers' processes or executors.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.suites.prompts import SuitePrompts, load_suite
from ddtree_bench.sweep import server_python
from ddtree_bench.sweep.grid import GridSpec, Point, expand
from ddtree_bench.sweep.profiles import Profile, build_command, load_profile, point_params
from ddtree_bench.pair import BUNDLED

SERVER_BACKENDS = ("standalone", "sglang", "vllm", "openai", "llamacpp")  # openai: transformers serve; llamacpp: llama-server


@dataclass
class Prepared:
    points: list[Point]
    suites: dict[str, SuitePrompts]              # suite -> its prompts, loaded once for every point (first: server warmup)
    profiles: dict[str, Profile]
    api_key: str | None
    server_pythons: dict[str, str] = field(default_factory=dict)  # backend -> interpreter ({server_python})
    unsupported: dict[str, str] = field(default_factory=dict)     # point id -> why this installation cannot serve it


def prepare(grid: GridSpec, api_key: str | None = None, external_device_fn: Callable[[], str] | None = None) -> Prepared:
    """Expand and check everything that can be checked before any work: exit 2 on bad input."""
    points = expand(grid, external_device_fn)  # (ray: a cluster node picks sglang/vllm's default device)
    suites = {s: load_suite(s, grid.limit) for s in dict.fromkeys(p.suite for p in points)}
    for s, loaded in suites.items():
        if not loaded.prompts:
            raise UsageError(f"suite {s!r} has no prompts")
    prep = Prepared(points, suites, {}, api_key)
    checked: set[tuple] = set()
    for p in points:
        if p.backend in ("inprocess", "standalone") or p.model in BUNDLED:
            from ddtree_bench.pair import model_dirs

            target_dir, draft_dir = model_dirs(p.model, p.draft)  # the bundled toy pair must be installed
            key = (p.model, p.draft if p.method != "ar" else None)
            if p.backend in ("inprocess", "standalone") and target_dir is not None and key not in checked:
                from ddtree_bench.engine.loading import check_configs

                # our engine loads them: a missing or broken directory, or a drafter that does not fit, is bad input
                check_configs(target_dir, draft_dir if p.method != "ar" else None)
                checked.add(key)
        if p.backend not in SERVER_BACKENDS:
            continue
        if p.backend not in prep.profiles:
            prof = prep.profiles[p.backend] = load_profile(p.backend, grid.profiles)
            if prof.python_module and _uses_server_python(prof):
                prep.server_pythons[p.backend] = server_python.resolve(prof.python_module, grid.server_python)
        prof = prep.profiles[p.backend]
        if p.backend == "llamacpp":  # the GGUF files the server loads: a model llama.cpp cannot convert is unsupported
            from ddtree_bench.backends.llamacpp_gguf import ConversionRefused

            try:
                _model_for(prof, p)
            except ConversionRefused as e:
                prep.unsupported[p.id] = f"unsupported by llama.cpp: {e}"
                continue
        cmd = server_command(prof, p, grid, port=0, api_key=api_key, server_python=prep.server_pythons.get(p.backend))
        exe = cmd.argv[0]
        if not (os.path.isabs(exe) and os.access(exe, os.X_OK)) and shutil.which(exe) is None:
            raise UsageError(f"backend {p.backend}: {exe!r} is not installed (not on PATH)",
                             hint=prof.requires or None)
        code = prof.method_probe.get(p.method)
        if code:  # the probe sees the point's model directory and device (profiles.py: method_probe)
            code = f"DDTREE_BENCH_MODEL = {cmd.params['model']!r}\nDDTREE_BENCH_DEVICE = {p.device!r}\n" + code
            ok, said = server_python.probe(prep.server_pythons.get(p.backend) or sys.executable, code)
            if not ok:
                prep.unsupported[p.id] = "; ".join(x for x in (f"unsupported by this {p.backend}: {said}",
                                                                prof.notes.get(p.method)) if x)
    return prep


def _uses_server_python(profile: Profile) -> bool:
    return "{server_python}" in repr(profile.argv)


def _model_for(profile: Profile, p: Point) -> tuple[str, str | None]:
    """Engines outside ddtree-bench get directories: the bundled toy pair resolves to its files;
    llama-server gets GGUF files converted from them (backends/llamacpp_gguf.py, cached by content)."""
    model, draft = p.model, p.draft
    if p.backend in ("sglang", "vllm", "openai", "llamacpp") and p.model in BUNDLED:
        from ddtree_bench.pair import model_dirs

        target_dir, draft_dir = model_dirs(p.model, p.draft)
        model, draft = str(target_dir), p.draft or (str(draft_dir) if p.method != "ar" else None)
    if p.backend == "llamacpp":
        from ddtree_bench.backends.llamacpp_gguf import gguf_pair

        pair = gguf_pair(model, draft if p.method != "ar" else None, p.dtype)
        return str(pair.target), str(pair.draft) if pair.draft is not None else None
    return model, draft


def server_command(profile: Profile, p: Point, grid: GridSpec, port: int, api_key: str | None,
             server_python: str | None = None):
    model, draft = _model_for(profile, p)
    server_bin = None
    if "{server_bin}" in repr(profile.argv):
        from ddtree_bench.backends.llamacpp_gguf import find_server

        server_bin = find_server(grid.llama_server)
    params = point_params(profile, model=model, draft=draft, method=p.method, budget=p.budget,
                          spec_tokens=p.spec_tokens, dtype=p.dtype, device=p.device, host=D.HOST, port=port,
                          api_key=api_key, server_python=server_python, server_bin=server_bin,
                          max_batch=max(grid.concurrency or [1]))  # every client-side point shares the server
    return build_command(profile, params, grid.server_args.get(p.backend), grid.server_env)
