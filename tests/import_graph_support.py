"""Reading ddtree_bench's import graph without importing it, and finding the circles in it (not a
test module): tests/test_imports.py checks the whole package, tests/engine/test_imports.py the engine
and its two halves.

`import_graph(root, package)` parses every .py file under `root` with `ast`, so it runs in
milliseconds and needs neither Triton nor CUDA. Every import statement counts wherever it stands: at
module level, inside a function (a lazy import hides a circle, it does not remove it) or under
`if TYPE_CHECKING:`. `from P import n` is an import of the submodule P.n when that file exists, else
of P itself (a package's __init__ when P is a package). What it does not see: the implicit import of
a parent package (importing a.b.c runs a/__init__ and a/b/__init__ first; a package whose __init__
imports its own children would otherwise be a circle with each child), relative imports (the
package has none), and names built at run time (`importlib.import_module(f"...{name}")`, the way
cli/__init__ loads its command modules).

`cycles(graph)` returns every strongly connected component of more than one module (Tarjan).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "ddtree_bench"
PACKAGE = "ddtree_bench"


def _module_name(path: Path, root: Path, package: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([package, *parts])


def import_graph(root: Path = PACKAGE_ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules under `root` it imports anywhere in its body. `root` is the folder of
    the package named `package` (ddtree_bench itself by default, or a subpackage such as
    ddtree_bench/engine with package "ddtree_bench.engine")."""
    files = {_module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    target = sub if sub in files else node.module
                    if target in files and target != mod:
                        graph[mod].add(target)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in files and a.name != mod:
                        graph[mod].add(a.name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
