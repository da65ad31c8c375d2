"""The Triton tree kernel against the paper's heap on a CPU, through Triton's interpreter, with the
heap's own (CPU) log-probabilities on both sides: random, one-hot and coarse (many exact ties)
logits, 54 cases. Prints the cases that differ and a count. Needs Triton on the path:
    pip install --target /tmp/tsite triton
    PYTHONPATH=/tmp/tsite:. TRITON_INTERPRET=1 python benchmarks/tree_kernel_interpreter_check.py
"""

from ddtree_bench.engine.tree import build_tree
from ddtree_bench.engine.tree_triton import TritonTreeBuilder
from tests.test_fastpath import _logits

bad = 0
for kind in ("coarse", "onehot", "random"):
    for L, V, budget in [(15, 272, 16), (15, 272, 64), (4, 3, 50), (6, 5, 7), (3, 3, 20), (4, 4, 60)]:
        for seed in range(3):
            logits = _logits(kind, L, V, seed)
            heap = build_tree(logits, budget)
            tb = TritonTreeBuilder(L, V, budget, "cpu")
            got = [t.tolist() for t in tb(logits)]
            if got != [heap.token_ids.tolist(), heap.parents.tolist(), heap.depths.tolist()]:
                bad += 1
                print("differs:", kind, (L, V, budget), "seed", seed, "flag", tb.flag.item())
print(f"{bad} of 54 cases differ")
