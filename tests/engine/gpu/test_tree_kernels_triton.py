"""The Triton tree kernels against their PyTorch twins: the one-block and grid tree builds
(engine/gpu/kernels/tree_block.py, tree_grid.py), their slotted builds of the batched loop (every slot's tree in one
launch per step; their certificate on exact ties), the fused top-K (kernels/topk.py), tree compile,
walk and commit (kernels/tree_verify.py), the walk's argmax (kernels/argmax.py).

They run on CUDA; without a GPU they run on a CPU through Triton's interpreter, at the smaller
shapes below (the interpreter runs every program in Python: a 15-depth tree build takes minutes).
CI does that through tests/engine/gpu/test_triton_interpreter.py (triton is a dev dependency):
    TRITON_INTERPRET=1 python -m pytest -m gpu tests/engine/gpu/test_tree_kernels_triton.py
"""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.forward import visible_bias
from ddtree_bench.engine.tree import build_tree
from ddtree_bench.engine.gpu.tree_ops import ancestors, chain, verify_visible, walk_static
from ddtree_bench.engine.interface import WalkLayout
from ddtree_bench.engine.tree_vector import StaticTreeBuilder, topk_logprobs
from triton_support import DEV, tree_logits, triton_only

pytestmark = [pytest.mark.gpu, triton_only]

INTERPRETED = DEV == "cpu"   # Triton's CPU interpreter: the smaller cases (same code paths, same checks)
SHAPES = ([(4, 3, 50), (6, 5, 7)] if INTERPRETED else
          [(15, 272, 16), (4, 3, 50), (6, 5, 7), (5, 272, 200), (15, 272, 64), (15, 151936, 1024)])
SEEDS = range(1 if INTERPRETED else 2)
TOPK_CASES = [(3, 272, 16, "min"), (2, 9000, 64, "min"), (2, 4097, 64, "min"), (4, 3, 3, "min"),
              (2, 5000, 1, "min"), (3, 272, 16, "threshold"), (2, 4097, 200, "threshold"),
              (2, 300, 272, "threshold"), (1, 9000, 1024, "threshold"),
              (2, 5000, 4096, "threshold"), (1, 13000, 4096, "threshold"),
              (4, 3, 3, "threshold"), (3, 272, 16, "pruned"), (2, 9000, 64, "pruned"), (2, 4097, 64, "pruned"),
              (4, 3, 3, "pruned"), (2, 5000, 1, "pruned"), (15, 151936, 16, "pruned"), (30, 151936, 16, "pruned")]
if INTERPRETED:  # K up to 272, chunks cut mid-vocabulary, both selections
    TOPK_CASES = [(2, 300, 16, "min"), (4, 3, 3, "min"), (2, 4097, 16, "min"), (2, 300, 16, "threshold"),
                  (2, 4097, 40, "threshold"), (4, 3, 3, "threshold"), (2, 300, 16, "pruned"), (4, 3, 3, "pruned"),
                  (2, 4097, 16, "pruned"), (3, 20000, 6, "pruned"), (2, 20000, 3, "pruned")]
VERIFY_CASES = ([(4, 3, 50, 128, 2), (6, 5, 7, 64, 1), (6, 24, 0, 64, 2), (5, 24, 20, 96, 4)] if INTERPRETED else
                [(15, 272, 16, 128, 1), (15, 272, 64, 192, 4), (4, 3, 50, 128, 2), (6, 5, 7, 64, 1), (15, 272, 0, 128, 2)])


def _shape_id(shape) -> str:
    return "L{}xV{}xB{}".format(*shape)


def _kernel_shapes(shapes) -> list:
    """(kernel, shape) parameters, one test per shape so that xdist spreads the kernels' compiles, and each pair in
    an xdist group of its own (`benchmarks/gpu_suite.sh` runs `--dist loadgroup`): the tests that compile one kernel
    at one shape run on one worker, one after another, the first compiling it and the rest reading Triton's cache.
    Spread over workers they compiled it at once, each again (the two B = 1024 one-block tests 95-99 s each on
    the H200, where the third, run later, took under 13 s)."""
    return [pytest.param(k, s, id=f"{k}-{_shape_id(s)}", marks=pytest.mark.xdist_group(f"tree-{k}-{_shape_id(s)}"))
            for k in ("block", "grid", "grid-keys") for s in shapes]


@pytest.mark.parametrize("kind", ["random", "onehot", "coarse"])
@pytest.mark.parametrize("kernel, shape", _kernel_shapes(SHAPES))
def test_tree_kernels_equal_the_pytorch_builder_and_the_heap(kind, kernel, shape):
    """Against the exact PyTorch builder on the same device (same fp32 log-probabilities), and against
    the heap where no exact cross-depth ties can hinge on one ulp: the heap takes its log-probabilities
    from a CPU logsumexp, which can differ from a GPU's in the last bit, and with coarse logits that
    alone reorders exact ties (seen on an H200: (L, V, B) = (4, 3, 50))."""
    from ddtree_bench.engine.gpu.kernels.tree_grid import GridTreeBuilder
    from ddtree_bench.engine.gpu.kernels.tree_block import TritonTreeBuilder

    make = {"block": TritonTreeBuilder, "grid": GridTreeBuilder,
            "grid-keys": lambda *a: GridTreeBuilder(*a, keys_first=True)}[kernel]
    L, V, budget = shape
    for seed in SEEDS:
        logits = tree_logits(kind, L, V, seed).to(DEV)
        tb = make(L, V, budget, DEV)
        got = [t.tolist() for t in tb(logits)]
        assert tb.flag.item() == 0
        assert got == [t.tolist() for t in StaticTreeBuilder(L, V, budget, DEV)(logits)], (L, V, budget, seed)
        if kind != "coarse" or DEV == "cpu":
            heap = build_tree(logits, budget)
            assert got == [heap.token_ids.tolist(), heap.parents.tolist(), heap.depths.tolist()]


WIDTHS = [(16, 16, True), (128, 64, True), (512, 256, False), (1024, 128, True)]   # (bj, lex_bj, once)
PROBE_CASES = ([((4, 3, 50), w) for w in WIDTHS] + [((15, 272, 64), (128, 64, True))] if INTERPRETED else
               [(shape, w) for shape in [(15, 272, 64), (15, 151936, 256), (15, 151936, 512)] for w in WIDTHS])


@pytest.mark.parametrize("shape, widths", PROBE_CASES,
                         ids=[f"{_shape_id(sh)}-bj{w[0]}-lex{w[1]}{'-once' if w[2] else ''}" for sh, w in PROBE_CASES])
@pytest.mark.parametrize("keys_first", [False, True])
def test_grid_builds_at_the_probe_widths_equal_the_pytorch_builder(shape, widths, keys_first):
    """The grid build's counting and lex loops at the column widths and reductions gpu_probe_build.py times
    (_probe.grid_builder: from 16 columns, many steps a loop, to 1,024, one step; ONCE, one reduction after the
    loop): the same tree as the PyTorch builder, so any of them can become the default on its time alone."""
    from ddtree_bench.engine.gpu import _probe

    L, V, budget = shape
    bj, lex_bj, once = widths
    for kind in ("random", "coarse"):
        logits = tree_logits(kind, L, V, 3).to(DEV)
        gb = _probe.grid_builder(L, V, budget, DEV, keys_first=keys_first, bj=bj, lex_bj=lex_bj, once=once)
        got = [t.tolist() for t in gb(logits)]
        assert gb.flag.item() == 0
        assert got == [t.tolist() for t in StaticTreeBuilder(L, V, budget, DEV)(logits)], (shape, kind)


def test_the_grid_width_knobs_reach_the_single_and_slotted_builds(monkeypatch):
    """DDTREE_GRID_KEYS_BJ / DDTREE_GRID_LEX_BJ and the grid-once feature (an A/B's arms in benchmarks/gpu_batch_ab.py,
    whole rounds at the probe's widths) set what the builds launch, single and slotted, and their trees stay the
    PyTorch builder's; unset, the constants; a width the loops cannot step by is bad input."""
    from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
    from ddtree_bench.engine.gpu.kernels import tree_grid
    from ddtree_bench.engine.gpu.kernels.warm import record
    from ddtree_bench.errors import UsageError

    L, V, budget = 4, 3, 50
    logits = torch.stack([tree_logits("random", L, V, s) for s in (1, 2)]).to(DEV)

    def counting_launches(b, x):
        return {(la.kernel.fn.__name__, la.kwargs.get("BJ"), la.kwargs.get("ONCE")) for la in record(lambda: b(x))
                if la.kernel.fn.__name__ in ("_rank_kernel", "_pop_rank_kernel", "_lex_kernel")}

    for env in ({}, {"DDTREE_GRID_KEYS_BJ": "1024", "DDTREE_GRID_LEX_BJ": "256", "DDTREE_GPU_EXPERIMENTAL": "grid-once"}):
        for name in ("DDTREE_GRID_KEYS_BJ", "DDTREE_GRID_LEX_BJ", "DDTREE_GPU_EXPERIMENTAL"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        bj, lex, once = (1024, 256, True) if env else (tree_grid.BJ_KEYS, tree_grid.BJ, False)
        single = tree_grid.GridTreeBuilder(L, V, budget, DEV, keys_first=True)
        slotted = tree_grid.SlottedGridBuilder(L, V, budget, DEV, slots=2, keys_first=True)
        want = {("_rank_kernel", bj, once), ("_pop_rank_kernel", bj, once), ("_lex_kernel", lex, None)}
        assert counting_launches(single, logits[0]) == want
        assert counting_launches(slotted, logits) == want
        exact = BatchTreeBuilder(L, V, budget, DEV)(logits)
        got = slotted(logits)
        assert slotted.flag.item() == 0
        assert [t.tolist() for t in (got.token_ids, got.parents, got.depths)] == \
            [t.tolist() for t in (exact.token_ids, exact.parents, exact.depths)], env
        assert [t.tolist() for t in single(logits[0])] == \
            [t.tolist() for t in StaticTreeBuilder(L, V, budget, DEV)(logits[0])], env
    monkeypatch.setenv("DDTREE_GRID_KEYS_BJ", "96")
    with pytest.raises(UsageError, match="DDTREE_GRID_KEYS_BJ"):
        tree_grid.GridTreeBuilder(L, V, budget, DEV, keys_first=True)


SLOT_SHAPES = ([(4, 3, 50), (6, 5, 7)] if INTERPRETED else
               [(4, 3, 50), (6, 5, 7), (15, 272, 16), (15, 272, 64), (15, 151936, 16), (15, 151936, 256)])


def tie_logits() -> torch.Tensor:
    """[3, 3] logits whose one-block build at budgets 15-23 raises the certificate: depths 1-2 nearly uniform, depth 3
    one token at 0 and two at -1e6, so every depth-3 extension by those two rounds to the same fp32 score (the ulp
    at 1e6 is 0.0625) and exact ties are broken by lexicographic position, not by the parents' key order the
    pruning assumes (kernels/tree_pruned.py). The tree can still come out right; the certificate cannot tell."""
    return torch.tensor([[0.001, 0.0004, -0.0086], [-0.0001, 0.0073, -0.013], [0.0, -1e6, -1e6]])


def _slotted(kernel: str):
    """(slotted builder, single builder) classes of a Triton tree kernel: block | grid | grid-keys."""
    from ddtree_bench.engine.gpu.kernels.tree_block import SlottedTreeBuilder, TritonTreeBuilder
    from ddtree_bench.engine.gpu.kernels.tree_grid import GridTreeBuilder, SlottedGridBuilder

    return {"block": (SlottedTreeBuilder, TritonTreeBuilder),
            "grid": (SlottedGridBuilder, GridTreeBuilder),
            "grid-keys": (lambda *a, **kw: SlottedGridBuilder(*a, **kw, keys_first=True),
                          lambda *a: GridTreeBuilder(*a, keys_first=True))}[kernel]


@pytest.mark.parametrize("kernel, shape", _kernel_shapes(SLOT_SHAPES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("C", [1, 2, 3])
def test_slotted_kernels_equal_the_exact_builder_per_slot(C, dtype, kernel, shape):
    """The slotted builds (the one-block kernel over one program per slot; every grid launch over a slot axis),
    scratch for 4 slots, against the exact batched builder and StaticTreeBuilder slot by slot: different logits
    families per slot, and (C = 3) two equal slots; C = 1 is also the single build's launch (its tree)."""
    from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder

    SlottedTreeBuilder, TritonTreeBuilder = _slotted(kernel)
    kinds = ("random", "onehot", "coarse")
    dt = getattr(torch, dtype)
    L, V, budget = shape
    x = torch.stack([tree_logits(kinds[c % 3], L, V, 10 + c) for c in range(C)])
    if C == 3:
        x[2] = x[0]
    x = x.to(DEV, dt)
    sb = SlottedTreeBuilder(L, V, budget, DEV, slots=4)
    got = sb(x)
    assert got.token_ids.shape == (C, sb.N)
    if sb.flag.item() != 0:   # bf16's ties at the Qwen3 vocabulary may hit a pruning boundary: the loop redoes it
        assert dtype == "bfloat16" and V > 272, (L, V, budget)
        return
    exact = BatchTreeBuilder(L, V, budget, DEV)(x)
    one = StaticTreeBuilder(L, V, budget, DEV)
    for c in range(C):
        want = [t.tolist() for t in one(x[c])]
        assert [t.tolist() for t in got.slot(c)] == want == [t.tolist() for t in exact.slot(c)], (L, V, budget, c)
    if C == 1:
        assert [t.tolist() for t in TritonTreeBuilder(L, V, budget, DEV)(x[0])] == [t.tolist() for t in got.slot(0)]
    with pytest.raises(ValueError, match="C <= 4"):
        sb(x[:1].expand(5, -1, -1))


@pytest.mark.parametrize("kernel", ["block", "grid", "grid-keys"])
def test_slotted_kernels_raise_their_flag_when_any_slot_cannot_certify(kernel):
    """Exact-tie logits (tie_logits) in one slot raise the one flag of the launch; the other slots' trees are still
    the exact builder's, and slots without ties leave the flag at 0. The single build flags on the same logits."""
    from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder

    SlottedTreeBuilder, TritonTreeBuilder = _slotted(kernel)

    L, V, budget = 3, 3, 15
    clean = [tree_logits("random", L, V, s) for s in range(3)]
    sb = SlottedTreeBuilder(L, V, budget, DEV, slots=3)
    exact = BatchTreeBuilder(L, V, budget, DEV)
    for where in (0, 1, 2, None):
        x = torch.stack([tie_logits() if c == where else clean[c] for c in range(3)]).to(DEV)
        got = sb(x)
        assert (sb.flag.item() > 0) == (where is not None), where
        sb.flag.zero_()
        want = exact(x)
        for c in range(3):
            if c != where:
                assert [t.tolist() for t in got.slot(c)] == [t.tolist() for t in want.slot(c)], (where, c)
    single = TritonTreeBuilder(L, V, budget, DEV)
    single(tie_logits().to(DEV))
    assert single.flag.item() > 0


class _TieProposer:
    """A host-side drafter (3 depths, vocabulary 3) whose drafts are tie_logits() at every third frontier position,
    seeded random logits elsewhere: a function of the request's state only, so batch 1 and the batch see the same."""

    block_size, target_layer_ids = 4, (1, 2)

    def new_cache(self, capacity: int):
        return None

    def propose(self, ctx, bonus: int, cache, draft_len: int, start: int) -> torch.Tensor:
        x = tie_logits() if start % 3 == 0 else torch.randn(3, 3, generator=torch.Generator().manual_seed(start)) * 3
        return x.to(DEV)


@pytest.mark.parametrize("kernel", ["auto", "grid", "grid-keys"])
@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_batched_loop_redoes_rounds_whose_slotted_build_flags_on_exact_ties(monkeypatch, T, kernel):
    """The batched fast loop with a real slotted kernel (auto at B = 15: the one-block kernel; the grid ones forced,
    as tree_kernel forces them in the single loop; on this CPU under the interpreter: the builder check made to run
    here) on a 3-token vocabulary, drafts with exact ties on some rounds: those rounds raise the certificate, are
    redone with the exact builder, and every request equals its batch-1 run (the reference loop)."""
    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
    from ddtree_bench.engine.gpu.kernels import tree_block
    from ddtree_bench.engine.loading import random_pair

    monkeypatch.setattr(tree_block, "available", lambda device: True)
    target, _ = random_pair(seed=0, vocab_size=3, block_size=4, device=DEV)
    plain = Engine(target, proposer=_TieProposer())
    reqs = [BatchRequest([i % 3, 1, 2, 0, 1][: 2 + i], 10 + 3 * i, temperature=T if i != 1 else 0.0, seed=40 + i, key=i)
            for i in range(4)]
    loop = BatchFastLoop(target, plain.proposer, "ddtree", 15, 3, tree_kernel=kernel)
    got = loop.run(reqs)
    for r, g in zip(reqs, got):
        want = plain.generate(r.prompt_ids, "ddtree", 15, r.max_new_tokens, r.temperature, r.top_p, r.seed)
        assert (g.output_ids, g.accept_lengths) == (want.output_ids, want.accept_lengths), r.key
    name = {"auto": "triton-block-slotted", "grid": "triton-grid-slotted", "grid-keys": "triton-grid-keys-slotted"}
    assert loop.tree_builder == name[kernel] and loop.redone_rounds > 0


@pytest.mark.parametrize("kind", ["random", "onehot", "coarse"])
@pytest.mark.parametrize("L,V,k,select", TOPK_CASES)
def test_fused_topk_equals_pytorch_bit_for_bit(kind, L, V, k, select):
    """Every selection, at K from 1 to a whole chunk, chunks cut mid-vocabulary, coarse logits (ties
    at the threshold: the lowest token ids must win; one-hot: every chunk's best ties with the others', so "pruned"
    keeps them all) and NaN; "pruned" also at the Qwen3 vocabulary over one and two slots' depths."""
    from ddtree_bench.engine.gpu import _probe

    for seed in range(2):
        x = tree_logits(kind, L, V, seed)
        if seed:
            x[0, V // 2] = float("nan")   # NaN counts as -inf
        for dt in (torch.float32, torch.bfloat16):
            xd = x.to(DEV, dt)
            lp, ids = _probe.topk(xd, k, select=select)
            lp_ref, ids_ref = topk_logprobs(xd, k)
            assert torch.equal(ids, ids_ref) and torch.equal(lp, lp_ref)
            none, alone = _probe._topk_module._topk(xd, k, select=select, with_logprobs=False)   # the batched builder's
            assert none is None and torch.equal(alone, ids_ref)


def test_the_default_selection_prunes_where_the_vocabulary_spans_k_chunks_and_is_exact_there(monkeypatch):
    """selection(): "pruned" from K = 2 to PRUNED_UP_TO over at least K chunks (the Qwen3 vocabulary: 38 chunks of
    4,096), "min" at K = 1 and where fewer chunks than K leave nothing to prune (the toy's 272 tokens: one chunk),
    "threshold" above. topk_logprobs_fused with the default gives PyTorch's bits on such a vocabulary (CHUNK shrunk so
    the interpreter's 3,000 tokens make 47 chunks)."""
    from ddtree_bench.engine.gpu.kernels import topk

    assert [topk.selection(k, 38) for k in (1, 2, 16, 32, 33, 64)] == ["min", "pruned", "pruned", "pruned", "threshold",
                                                                        "threshold"]
    assert [topk.selection(k, 1) for k in (1, 16, 17, 32)] == ["min", "min", "threshold", "threshold"]
    monkeypatch.setattr(topk, "CHUNK", 64)
    for kind in ("random", "onehot", "coarse"):
        x = tree_logits(kind, 3, 3000, 1).to(DEV)
        for k in (5, 32):
            assert all(torch.equal(a, b) for a, b in zip(topk.topk_logprobs_fused(x, k), topk_logprobs(x, k)))


def test_fused_topk_widens_its_chunks_until_the_survivors_fit_the_triton_merge(monkeypatch):
    """chunk_for doubles the chunk while C*K survivors exceed MERGE_MAX (shrunk here, with CHUNK, so a small
    vocabulary crosses it twice), and the top-K at the widened chunk is still the PyTorch one bit for bit,
    merged by the Triton merge (torch.topk never called)."""
    from ddtree_bench.engine.gpu.kernels import topk

    monkeypatch.setattr(topk, "CHUNK", 64)
    monkeypatch.setattr(topk, "MAX_CHUNK", 256)
    monkeypatch.setattr(topk, "MERGE_MAX", 128)
    assert [topk.chunk_for(k, 600) for k in (8, 14, 40, 60)] == [64, 128, 256, 256]  # C*k: 80; 140->70; 400->120; ..->180
    calls = []
    real = torch.topk
    monkeypatch.setattr(torch, "topk", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for kind in ("random", "coarse"):
        x = tree_logits(kind, 2, 600, 0).to(DEV)
        calls.clear()
        lp, ids = topk.topk_logprobs_fused(x, 40)
        merged_by_triton = not calls
        lp_ref, ids_ref = topk_logprobs(x, 40)
        assert merged_by_triton and torch.equal(ids, ids_ref) and torch.equal(lp, lp_ref)


def _forced_post(ids: torch.Tensor, par: torch.Tensor, V: int, node: int, g: torch.Generator) -> torch.Tensor:
    """Random target picks, except that every node on `node`'s path matches (so it is accepted)."""
    post = torch.randint(0, V, ids.shape, generator=g)
    while node > 0:
        p = int(par[node - 1])
        post[p] = ids[node]
        node = p
    return post


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compile_and_walk_kernels_equal_their_twins(dtype):
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree, walk_tree

    dt = getattr(torch, dtype)
    accepted = set()
    for L, V, budget, cap, group in VERIFY_CASES:
        for seed in range(2):
            g = torch.Generator().manual_seed(seed)
            logits = tree_logits("random", L, V, seed)
            tok, par, dep = StaticTreeBuilder(L, V, budget, "cpu")(logits) if budget else chain(logits)
            T = 1 + tok.numel()
            bonus, start = torch.tensor([7]), torch.tensor(int(torch.randint(0, cap - T, (1,), generator=g)))
            ids_ref = torch.cat([bonus, tok])
            anc_ref = ancestors(par, L)
            bias_ref = visible_bias(verify_visible(anc_ref, start, cap), dt, group)
            dev = [t.to(DEV) for t in (bonus, tok, par, dep, start)]
            ids, pos, anc, bias, path = compile_tree(*dev, cap, dt, group, L)
            assert torch.equal(ids.cpu(), ids_ref)
            assert torch.equal(pos.cpu(), start + torch.cat([torch.zeros(1, dtype=torch.long), dep]))
            assert torch.equal(anc.cpu(), anc_ref) and torch.equal(bias.cpu(), bias_ref)
            for node in [0] + torch.randint(1, T, (4,), generator=g).tolist():
                post = _forced_post(ids_ref, par, V, node, g)
                want = walk_static(ids_ref, par, dep, anc_ref, post, L)
                got = walk_tree(ids, dev[2], dev[3], path, post.to(DEV), WalkLayout(L))
                assert torch.equal(got.cpu(), want), (L, V, budget, seed, node)
                accepted.add(int(want[0]))
    assert len(accepted) >= 4 and max(accepted) >= 5   # the cases cover short and deep accepted paths


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("guard", [False, True])
def test_commit_kernel_equals_its_twin(dtype, guard):
    """commit_tree (two launches) against tree_ops.commit_static: the K/V rows of every layer and
    head (overlapping moves included), the gathered context rows, the frontier, ctx_start and the
    bonus - for chains, sibling paths and the root alone, and (guard) a raised certificate flag,
    which must leave everything as it was."""
    from ddtree_bench.engine.gpu.tree_ops import commit_static
    from ddtree_bench.engine.gpu.kernels.tree_verify import commit_tree

    L, layers, hkv, S, D, T, C = 6, 3, 2, 48, 24, 20, 37
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(5)
    cases = [[0, 1, 2, 3, 4, 5, 6], [0, 2, 5, 9], [0, 3, 4, 11, 17, 18, 19], [0]]
    for path in cases:
        for flag in ([0, 1] if guard else [None]):
            a = len(path)
            walked = [a] + path + [0] * (L + 1 - a) + torch.randint(0, 50, (L + 2,), generator=g).tolist()
            walked = torch.tensor(walked + ([flag] if guard else []), device=DEV)
            state = dict(start=torch.tensor(9, device=DEV), ctx_start=torch.tensor(2, device=DEV),
                         bonus=torch.tensor([7], device=DEV),
                         k=torch.randn(layers, hkv, S, D, generator=g).to(DEV, dt),
                         v=torch.randn(layers, hkv, S, D, generator=g).to(DEV, dt),
                         hidden=torch.randn(T, C, generator=g).to(DEV, dt),
                         ctx=torch.randn(L + 1, C, generator=g).to(DEV, dt))
            ref = {n: t.clone() for n, t in state.items()}
            before = {n: t.clone() for n, t in state.items()}
            commit_static(walked, WalkLayout(L, guard), ref["start"], ref["ctx_start"], ref["bonus"], ref["k"], ref["v"], ref["hidden"], ref["ctx"])
            commit_tree(walked, WalkLayout(L, guard), state["start"], state["ctx_start"], state["bonus"], state["k"], state["v"],
                        state["hidden"], state["ctx"])
            for n in state:
                assert torch.equal(state[n], ref[n]), (path, flag, n)
            changed = not torch.equal(ref["k"], before["k"]) or int(ref["start"]) != 9
            assert changed == (flag != 1)


@pytest.mark.parametrize("budget", [0, 20])
def test_batched_compile_walk_commit_equal_the_twins_slot_by_slot(budget):
    """compile_trees / walk_trees / commit_trees (one launch for C slots) against the PyTorch twins run slot by
    slot, as the batched loop ran them before: ids, positions, ancestors, bias, path-based walk; the commit
    into each slot's region of a slotted cache [layers, B, Hkv, S, D] with B > C (the slots past C untouched),
    its ctx rows, frontier, ctx_start, bonus - and a padding slot (live 0) that commits a = 0. DFlash chains
    (budget 0) and trees."""
    from ddtree_bench.engine.gpu.tree_ops import commit_static
    from ddtree_bench.engine.gpu.kernels.tree_verify import commit_trees, compile_trees, walk_trees

    L, V, cap, group, C, B, layers, hkv, D, CW = 5, 24, 96, 2, 3, 4, 2, 2, 8, 12
    dt = torch.float32
    g = torch.Generator().manual_seed(budget)
    trees = [StaticTreeBuilder(L, V, budget, "cpu")(tree_logits("random", L, V, s)) if budget else
             chain(tree_logits("random", L, V, s)) for s in range(C)]
    tok, par, dep = (torch.stack(t) for t in zip(*trees))
    T = 1 + tok.shape[1]
    bonus = torch.tensor([7, 3, 11])
    start = torch.tensor([5, 40, 17])
    ids, pos, anc, bias, path = compile_trees(*(t.to(DEV) for t in (bonus, tok, par, dep, start)), cap, dt, group, L)
    posts, walks = [], []
    for c in range(C):
        ids_ref = torch.cat([bonus[c : c + 1], tok[c]])
        anc_ref = ancestors(par[c], L)
        assert torch.equal(ids.cpu()[c * T : (c + 1) * T], ids_ref)
        assert torch.equal(pos.cpu()[c * T : (c + 1) * T], start[c] + torch.cat([torch.zeros(1, dtype=torch.long), dep[c]]))
        assert torch.equal(anc.cpu()[c], anc_ref)
        assert torch.equal(bias.cpu()[c], visible_bias(verify_visible(anc_ref, start[c], cap), dt, group))
        post = _forced_post(ids_ref, par[c], V, [T - 1, 0, 1][c], g)
        posts.append(post)
        walks.append(walk_static(ids_ref, par[c], dep[c], anc_ref, post, L))
    walked = walk_trees(ids, par.to(DEV), dep.to(DEV), path, torch.stack(posts).to(DEV), WalkLayout(L))
    assert torch.equal(walked.cpu(), torch.stack(walks))
    live = torch.tensor([1, 0, 1])
    state = dict(start=start.clone(), ctx_start=torch.tensor([1, 2, 3]), bonus=bonus.clone(),
                 k=torch.randn(layers, B, hkv, cap, D, generator=g), v=torch.randn(layers, B, hkv, cap, D, generator=g),
                 hidden=torch.randn(C * T, CW, generator=g), ctx=torch.randn(B, L + 1, CW, generator=g))
    ref = {n: t.clone() for n, t in state.items()}
    masked = torch.cat([walked.cpu()[:, :1] * live[:, None], walked.cpu()[:, 1:]], dim=1)
    for c in range(C):
        commit_static(masked[c], WalkLayout(L), ref["start"][c], ref["ctx_start"][c], ref["bonus"][c : c + 1],
                      ref["k"][:, c], ref["v"][:, c], ref["hidden"][c * T : (c + 1) * T], ref["ctx"][c])
    dev = {n: t.to(DEV) for n, t in state.items()}
    commit_trees(walked, WalkLayout(L), dev["start"], dev["ctx_start"], dev["bonus"], dev["k"], dev["v"], dev["hidden"],
                 dev["ctx"], live.to(DEV))
    for n in state:
        assert torch.equal(dev[n].cpu(), ref[n]), n
    assert torch.equal(dev["k"].cpu()[:, C:], state["k"][:, C:]) and int(ref["start"][1]) == 40   # slot 3; padding stays
    assert int(walks[0][0]) > 1   # slot 0 accepted a path: rows moved


def test_argmax_kernel_equals_torch_argmax():
    """Every rule of torch.argmax: first of equal maxima (also -0.0 vs +0.0), NaN beats all (first NaN),
    a row of -inf, +inf; rows shorter and longer than one block, and a vocabulary cut mid-block."""
    from ddtree_bench.engine.gpu.kernels.argmax import argmax_rows

    g = torch.Generator().manual_seed(0)
    for V in (3, 272, 2048, 2049, 5000):
        for dt in (torch.float32, torch.bfloat16):
            x = (torch.randn(8, V, generator=g) * 3).to(dt)
            x[1] = float("-inf")
            x[2] = x[2].round()
            x[3, V // 2] = x[3, V - 1] = float("nan")
            x[4] = 0.0
            x[4, V // 3] = -0.0
            x[5] = 1.0
            x[6, 0] = x[6, V - 1] = float("inf")
            x[7] = (torch.arange(V) % 7 == 3).to(dt)
            xd = x.to(DEV)
            assert torch.equal(argmax_rows(xd).cpu(), x.argmax(dim=-1)), (V, dt)
            assert torch.equal(argmax_rows(xd).cpu(), xd.argmax(dim=-1).cpu()), (V, dt)


def test_the_loop_gate_passes_on_every_tree_kernel_and_fails_a_broken_one(monkeypatch):
    """gpu/tree_kernels.self_test (the fast loop's gate for these kernels) passes here, and names the kernel
    that differs from its twin when one is broken."""
    from ddtree_bench.engine.gpu import tree_kernels
    from ddtree_bench.engine.gpu.kernels import tree_verify

    dev = torch.device(DEV)
    assert tree_kernels.self_test(dev) is None
    real = tree_verify.walk_tree
    monkeypatch.setattr(tree_verify, "walk_tree", lambda *a: real(*a).roll(1))
    assert tree_kernels.self_test(dev) == "walk_tree differs from walk_static"


def test_both_self_tests_record_every_kernel_they_run_so_warm_can_compile_them_at_once():
    """The gates run at a process's first round, so ops_for and tree_kernels.available compile their kernels at
    once first (kernels/warm.py records the test, its launches not run). A recorded test sees garbage where a
    kernel's output would be; it must still reach every launch (no early return on the first mismatch), or the
    rest would compile one after another in the real run."""
    from ddtree_bench.engine.gpu import fused, tree_kernels
    from ddtree_bench.engine.gpu.kernels.warm import record

    names = lambda fn: sorted({la.kernel.fn.__name__ for la in record(fn)})  # noqa: E731
    assert names(lambda: tree_kernels.self_test(torch.device("cpu"))) == [
        "_commit_rows_kernel", "_commit_state_kernel", "_compile_kernel", "_pick_kernel", "_span_kernel", "_walk_kernel"]
    assert len(record(lambda: tree_kernels.self_test(torch.device("cpu")))) == 10   # the batched launches too
    assert names(lambda: fused.self_test(fused.TritonOps(), "cpu", torch.float32)) == [
        "_qkv_rope_kernel", "_rmsnorm_kernel", "_silu_mul_kernel"]
