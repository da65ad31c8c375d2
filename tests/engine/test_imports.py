"""The engine's import graph: no module of ddtree_bench/engine imports itself back through any chain
(function-local imports count: a lazy import hides a circle, it does not remove it), and the
reference half imports nothing from gpu/ except through the `generate.Engine` dispatcher.

The graph is read with `ast` by tests/import_graph_support.py (nothing is imported), so the test runs
in milliseconds and also without Triton or CUDA; tests/test_imports.py checks the whole package.
Would have caught the circles the engine had before the split: generate <-> fastloop,
tree <-> tree_static, tree_triton <-> topk_triton <-> tree_grid.
"""

from __future__ import annotations

from import_graph_support import PACKAGE_ROOT, cycles, import_graph

PACKAGE = "ddtree_bench.engine"


def engine_import_graph() -> dict[str, set[str]]:
    """module -> the engine modules it imports anywhere in its body (import_graph_support)."""
    return import_graph(PACKAGE_ROOT / "engine", PACKAGE)


def test_the_engine_has_no_import_circle():
    assert cycles(engine_import_graph()) == []


def test_only_the_dispatcher_reaches_from_the_reference_engine_into_gpu():
    graph = engine_import_graph()
    gpu = f"{PACKAGE}.gpu"
    crossing = {(m, t) for m, ts in graph.items() if not m.startswith(gpu) for t in ts if t.startswith(gpu)}
    assert crossing == {(f"{PACKAGE}.generate", f"{gpu}.loop"), (f"{PACKAGE}.generate", f"{gpu}.batch_loop")}


def test_the_gpu_half_never_imports_the_reference_loop():
    graph = engine_import_graph()
    assert not any(f"{PACKAGE}.generate" in ts for m, ts in graph.items() if m.startswith(f"{PACKAGE}.gpu"))
