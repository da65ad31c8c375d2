"""The Triton tree kernels (one-block and grid) against the paper's heap on a CPU, through Triton's
interpreter, with the heap's own (CPU) log-probabilities on both sides: random, one-hot and coarse
(many exact ties) logits, 63 cases per kernel. Prints the cases that differ and a count. Needs
Triton on the path:
    pip install --target /tmp/tsite triton
    PYTHONPATH=/tmp/tsite:. TRITON_INTERPRET=1 python benchmarks/tree_kernel_interpreter_check.py [block|grid]
"""

import sys

from ddtree_bench.engine.tree import build_tree
from ddtree_bench.engine.gpu.kernels.tree_grid import GridTreeBuilder
from ddtree_bench.engine.gpu.kernels.tree_block import TritonTreeBuilder
from tests.test_fastpath import _logits

kinds = sys.argv[1:] or ["block", "grid", "grid-keys"]
cases = [(15, 272, 16), (15, 272, 64), (4, 3, 50), (6, 5, 7), (3, 3, 20), (4, 4, 60), (5, 272, 200)]
for name in kinds:
    make = {"block": TritonTreeBuilder, "grid": GridTreeBuilder,
            "grid-keys": lambda *a: GridTreeBuilder(*a, keys_first=True)}[name]
    bad = n = 0
    for kind in ("coarse", "onehot", "random"):
        for L, V, budget in cases:
            for seed in range(3):
                logits = _logits(kind, L, V, seed)
                heap = build_tree(logits, budget)
                tb = make(L, V, budget, "cpu")
                got = [t.tolist() for t in tb(logits)]
                n += 1
                if got != [heap.token_ids.tolist(), heap.parents.tolist(), heap.depths.tolist()]:
                    bad += 1
                    print(name, "differs:", kind, (L, V, budget), "seed", seed, "flag", tb.flag.item())
    print(f"{name}: {bad} of {n} cases differ")
