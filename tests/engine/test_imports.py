"""The engine's import graph: no module of ddtree_bench/engine imports itself back through any chain
(function-local imports count: a lazy import hides a circle, it does not remove it), and the
reference half imports nothing from gpu/ except through the `generate.Engine` dispatcher.

`engine_import_graph()` reads the files with `ast` (nothing is imported), so the test runs in
milliseconds and also without Triton or CUDA. Would have caught the circles the engine had before
the split: generate <-> fastloop, tree <-> tree_static, tree_triton <-> topk_triton <-> tree_grid.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "ddtree_bench" / "engine"
PACKAGE = "ddtree_bench.engine"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ENGINE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def engine_import_graph() -> dict[str, set[str]]:
    """module -> the engine modules it imports anywhere in its body (from-imports of a package's
    names count as imports of those submodules when they exist)."""
    files = {_module_name(p): p for p in ENGINE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                if t in files and t != mod and not (t == PACKAGE or files[t].name == "__init__.py"):
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_engine_has_no_import_circle():
    assert cycles(engine_import_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_dispatcher_reaches_from_the_reference_engine_into_gpu():
    graph = engine_import_graph()
    gpu = f"{PACKAGE}.gpu"
    crossing = {(m, t) for m, ts in graph.items() if not m.startswith(gpu) for t in ts if t.startswith(gpu)}
    assert crossing == {(f"{PACKAGE}.generate", f"{gpu}.loop"), (f"{PACKAGE}.generate", f"{gpu}.batch_loop")}


def test_the_gpu_half_never_imports_the_reference_loop():
    graph = engine_import_graph()
    assert not any(f"{PACKAGE}.generate" in ts for m, ts in graph.items() if m.startswith(f"{PACKAGE}.gpu"))
