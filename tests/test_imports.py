"""ddtree_bench's import graph as a whole: no module imports itself back through any chain, in the
engine or in the harness (the engine's own rules, the two halves, are in tests/engine/test_imports.py).

The graph is read with `ast` by tests/import_graph_support.py (nothing is imported; function-local
and TYPE_CHECKING imports count). Would have caught the harness circles issue 18 found:
sweep.executors -> ray_executor -> run -> plan -> executors, and report.html <-> explain_section.
"""

from __future__ import annotations

from import_graph_support import PACKAGE, cycles, import_graph


def test_the_package_has_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_graph_covers_the_whole_package():
    graph = import_graph()
    assert {"ddtree_bench.cli.app", "ddtree_bench.sweep.run", "ddtree_bench.engine.generate",
            "ddtree_bench.engine.gpu.loop", "ddtree_bench.report"} <= set(graph)
    assert all(m == PACKAGE or m.startswith(PACKAGE + ".") for m in graph)


def test_the_cycle_finder_finds_every_circle_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"a"}}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_lazy_type_only_and_package_level_imports_are_edges(tmp_path):
    root = tmp_path / "pkg"
    _write(root, "__init__.py", "")
    _write(root, "sub/__init__.py", "from pkg.sub.leaf import helper\n")
    _write(root, "sub/leaf.py", "def helper():\n    from pkg import lazy\n")
    _write(root, "lazy.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.typed\n")
    _write(root, "typed.py", "from pkg.sub import helper\nimport os\n")
    _write(root, "alone.py", "from pkg.sub import leaf\n")
    graph = import_graph(root, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": {"pkg.lazy"},
        "pkg.lazy": {"pkg.typed"},
        "pkg.typed": {"pkg.sub"},
        "pkg.alone": {"pkg.sub.leaf"},
    }
    assert cycles(graph) == [["pkg.lazy", "pkg.sub", "pkg.sub.leaf", "pkg.typed"]]
