"""`bench-engine` measurements: where a round's time goes, and what the cost model predicts.

Four measurements, each on the pair given (a model directory, `toy`, `random`, or random weights
of a real shape):
1. verify curve - one target forward over n query tokens after a `prefix_len` prefix, for each n in
   `verify_tokens`, timed as a CUDA-graph replay (and eagerly) with CUDA events after warmup;
2. rounds - per-round stage times (draft, tree_build, tree_compile, verify, walk, commit) of AR,
   DFlash and DDTree at each budget, from the fast engine (Engine(cuda_graphs=True)) generating
   after a `prefix_len`-token prompt; round 1 (eager draft over the prompt) and the warmup
   generation are left out; median per stage over rounds; `cold_s`, the warmup generation's first round
   (a new budget's compiles and graph captures: the cold start on a fresh Triton cache, or the captures
   alone on a warm one). Optionally the plain engine's stages too;
3. tree build - `build_tree` (heap, on the CPU), `build_tree_fast` and the static builder (eager and
   graph-captured on a GPU) on random [L, V] draft logits, per budget;
4. end to end (pairs with a tokenizer; `random` accepts ~nothing) - tok/s and acceptance length of AR, DFlash and DDTree per budget
   over suite prompts, fast and plain engines, and whether their tokens agree.
The cost model (perf/bench_costmodel.py) is calibrated on the fast engine's rounds as they run (4's
calls, else 2's) or, failing rounds, built from 1's curve and 2's draft and overhead; with a tau(B)
curve (4's, or given) it predicts tok/s, speedup and the best budget next to what was measured.
Knows nothing of the CLI; returns one JSON-able dict.
"""

from __future__ import annotations

import random
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from ddtree_bench import defaults as D
from ddtree_bench.run_spec import parse_budgets
from ddtree_bench.engine.interface import ROUND_STAGES
from ddtree_bench.noise.gpu_clocks import ClockSampler, nvsmi_id, span, summary_dict
from ddtree_bench.perf.shapes import BLOCK_SIZE
from ddtree_bench.perf.roofline import AttentionShape, linear_bytes_and_params, roofline_ms, roofline_rows, weight_bytes_and_params
from ddtree_bench.perf.timing import graph_time_fn, median, sync, time_fn


@dataclass
class BenchSpec:
    model: str = D.MODEL
    draft: str | None = None
    shape: str | None = None          # random weights of a real shape instead of --model
    budgets: list[int] = field(default_factory=lambda: parse_budgets(D.SWEEP_BUDGETS))
    prefix_len: int = D.BENCH_PREFIX_LEN
    device: str = D.DEVICE
    dtype: str = D.DTYPE
    rounds: int = D.BENCH_ROUNDS      # measured rounds per method/budget
    verify_tokens: list[int] = field(default_factory=lambda: [int(x) for x in D.BENCH_VERIFY_TOKENS.split(",")])
    graphs: bool = True               # fast engine with CUDA graphs (on a CPU it runs eagerly anyway)
    layer_ops: str = "auto"           # fast engine's layer ops: auto | triton (fused kernels) | torch (the twin)
    plain: bool = True                # also time the plain engine (rounds and end to end)
    e2e: bool = True                  # end-to-end tok/s on suite prompts (pairs with a tokenizer)
    build_table: bool = True          # time every tree builder per budget (compiles each Triton kernel at each budget)
    profile: bool = False             # per-kernel profile of the verify forward at each n (torch.profiler)
    projections: bool = False         # each weight projection's GEMMs alone at each n, against its floor (perf/projections.py)
    curve_logit_scale: float = D.BENCH_CURVE_LOGIT_SCALE   # the verify curve's trees (curve_tree)
    suite: str = D.SUITE
    limit: int = D.BENCH_E2E_PROMPTS
    max_new_tokens: int = D.BENCH_E2E_MAX_NEW_TOKENS
    tau: dict[int, float] | None = None   # given tau(B) for the cost model (overrides the measured one)
    build_reps: int = 5
    seed: int = D.SEED


# ---------------------------------------------------------------------------- pairs


def load_bench_pair(spec: BenchSpec):
    """(target, drafter, tokenizer or None, info) for the spec."""
    if spec.shape:
        from ddtree_bench.perf.shapes import random_shaped_pair

        t, d = random_shaped_pair(spec.shape, spec.dtype, spec.device, seed=spec.seed)
        return t, d, None, {"shape": spec.shape, "weights": "random"}
    from ddtree_bench.engine.hybrid.config import is_hybrid_config
    from ddtree_bench.engine.loading import read_config
    from ddtree_bench.errors import UsageError
    from ddtree_bench.pair import load_pair, model_dirs

    target_dir, _ = model_dirs(spec.model, spec.draft)
    if target_dir is not None and is_hybrid_config(read_config(target_dir, "model")):
        raise UsageError(f"bench-engine --model times dense targets (the fast loop's stages); {spec.model} is a hybrid "
                         "(Gated DeltaNet) target", hint="--shape qwen3.6-27b --device cuda --dtype bfloat16 times a hybrid verify; `ddtree-bench run "
                         f"--model {spec.model}` measures its tok/s and acceptance")
    lp = load_pair(spec.model, spec.draft, "ddtree", spec.dtype, spec.device)
    return lp.engine.target, lp.engine.drafter, lp.tokenizer, dict(lp.info)


def random_prompt(vocab: int, n: int, seed: int) -> list[int]:
    """n token ids drawn uniformly from [0, vocab) by random.Random(seed): the benchmarks' prompts on random weights."""
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


# ---------------------------------------------------------------------------- 1. verify curve


class _Narrow:
    """The first `capacity` slots of a KVCache (StaticKV needs only k, v, capacity)."""

    def __init__(self, cache, capacity: int):
        self.k, self.v = cache.k[:, :, :capacity], cache.v[:, :, :capacity]
        self.capacity = capacity


CURVE_DEPTH = BLOCK_SIZE - 1   # the verify curve's trees are as deep as the 8B shape's DFlash drafter drafts


def curve_tree(n: int, device: torch.device, with_path: bool, logit_scale: float = D.BENCH_CURVE_LOGIT_SCALE
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A DDTree-shaped tree of n tokens (root included) for the verify curve: parents [n-1] (1-based),
    depths [n-1] of the PyTorch builder's tree of the n - 1 best prefixes of random logits [CURVE_DEPTH, 4096]
    (x logit_scale, seeded by n: 3 gives wide trees of depth <= ~4, 12 deep ones to CURVE_DEPTH), and
    (with_path) its path table [n, CURVE_DEPTH+1] (tree_verify.compile_tree's)."""
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    empty = torch.empty(0, dtype=torch.long, device=device)
    if n == 1:
        tok = par = dep = empty
    else:
        logits = torch.randn(CURVE_DEPTH, 4096, generator=torch.Generator().manual_seed(n)).to(device) * logit_scale
        tok, par, dep = StaticTreeBuilder(CURVE_DEPTH, 4096, n - 1, device)(logits)
    if not with_path:
        return par, dep, None
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree

    start = torch.zeros((), dtype=torch.long, device=device)
    path = compile_tree(torch.zeros(1, dtype=torch.long, device=device), tok, par, dep, start, n, torch.float32, 1,
                        CURVE_DEPTH)[4]
    return par, dep, path


@dataclass
class CurvePoint:
    """One n of the verify curve: its tree's depth and `forward(capacity, ops, attention)`, a zero-argument
    static-shape target forward over the n tree tokens after the prefix (what a graph captures)."""
    n: int
    depth: int
    forward: Callable[..., Callable[[], Any]]


class CurveSetup:
    """A target with `prefix_len` tokens of prefix in a cache of capacity prefix_len + max(tokens) (aligned),
    and `point(n)`: the n-token DDTree-shaped tree after it (`curve_tree`), compiled as the fast loop
    compiles it (bias, and the path table with the fused ops). Shared by verify_curve and the in-process
    A/B benchmark (benchmarks/gpu_verify_ab.py)."""

    @torch.inference_mode()
    def __init__(self, target, layers, prefix_len: int, tokens: list[int], device: torch.device,
                 layer_ops: str = "auto", logit_scale: float = D.BENCH_CURVE_LOGIT_SCALE):
        from ddtree_bench.engine.gpu.fused import merge_projections, ops_for

        self.target, self.layers, self.device, self.logit_scale = target, layers, device, logit_scale
        self.ops = ops_for(device, target.lm_head.weight.dtype, layer_ops)
        merge_projections(target)   # before any capture: the merge allocates
        self.whole = self.align(prefix_len + max(tokens))
        self.cache = target.new_cache(self.whole)
        prefix = torch.tensor(random_prompt(target.cfg.vocab_size, prefix_len, 1), device=device)
        target(prefix, torch.arange(prefix_len, device=device), self.cache, 0)
        self.start = torch.tensor(prefix_len, device=device)

    @staticmethod
    def align(n: int) -> int:
        from ddtree_bench.engine.gpu.loop import CAPACITY_ALIGN

        return -(-n // CAPACITY_ALIGN) * CAPACITY_ALIGN

    def point(self, n: int, with_path: bool) -> CurvePoint:
        from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward, visible_bias
        from ddtree_bench.engine.gpu.tree_ops import ancestors, verify_visible

        target, device, start = self.target, self.device, self.start
        ids = torch.randint(target.cfg.vocab_size, (n,), device=device, generator=torch.Generator(device=device).manual_seed(n))
        par, dep, path = curve_tree(n, device, with_path, self.logit_scale)
        pos = start + torch.cat([torch.zeros(1, dtype=torch.long, device=device), dep])
        anc = ancestors(par, CURVE_DEPTH)
        dt = target.lm_head.weight.dtype

        def forward(cap: int | None = None, o=None, attention: str = "auto"):
            o = o or self.ops
            kv = StaticKV(_Narrow(self.cache, cap or self.whole))
            bias = visible_bias(verify_visible(anc, start, cap or self.whole), dt, group_size(target))
            return lambda: target_forward(target, ids, pos, kv, start, bias, self.layers, o, attention=attention,
                                          tree_path=path if o.name == "triton" else None)

        return CurvePoint(n, int(dep.max()) if dep.numel() else 0, forward)


def gemm_only(target, n: int, device: torch.device):
    """A zero-argument function that runs every weight GEMM of a verify forward over n tokens once, through
    cuBLAS (F.linear) and nothing else: per layer the merged q/k/v, o_proj, the merged gate/up and down_proj,
    then lm_head, on fixed random inputs of the right widths - the floor the verify's non-GEMM work sits on
    (issue 35: everything else should cost <= 15% of it). Call after fused.merge_projections."""
    import torch.nn.functional as F

    from ddtree_bench.perf.projections import weights_in_order

    weights = [w for _, w in weights_in_order(target)]
    g = torch.Generator(device=device).manual_seed(n)
    dt = target.lm_head.weight.dtype
    xs = {k: torch.randn(n, k, device=device, generator=g).to(dt) for k in {w.shape[1] for w in weights}}
    return lambda: [F.linear(xs[w.shape[1]], w) for w in weights]


@torch.inference_mode()
def verify_curve(target, layers, prefix_len: int, tokens: list[int], device: torch.device, graphs: bool,
                 reps: int = 20, eager: bool = True, layer_ops: str = "auto", profile: bool = False,
                 profile_reps: int = 5, profile_top: int = D.BENCH_PROFILE_TOP,
                 logit_scale: float = D.BENCH_CURVE_LOGIT_SCALE) -> dict[str, Any]:
    """ms of one static-shape target forward over n tokens after prefix_len tokens (CurveSetup). Columns:
    "graph" (replayed, with `layer_ops` and the forward's default attention: on CUDA with the fused ops,
    the tree kernel, kernels/tree_attention.py, from TREE_MIN_ROWS folded rows and the live-slot kernel
    below; and their weight GEMMs: kernels/gemm.py where its table has the shape, else cuBLAS), "eager"
    (the same, not captured) and, when those ops are the fused kernels, "graph_cublas" (every weight GEMM
    on cuBLAS: the default before the few-row GEMM), "graph_live" (the live-slot kernel over the bias at every n: the default before the
    tree kernel), "graph_sdpa" (SDPA over a cache narrowed to prefix_len + n: how
    the curve was taken before the live-slot kernel), "graph_sdpa_whole" (SDPA over the whole cache:
    what the engine's rounds ran before it) and "graph_unfused" (the PyTorch twin ops: what fusion saves);
    "gemm_only" (`gemm_only`: every weight GEMM once on cuBLAS, nothing else; replayed on CUDA, eager elsewhere);
    "tree_depth": {n: the curve tree's depth}; on CUDA "clocks": {n: {"graph" | "gemm_only": noise.gpu_clocks.ClockSummary
    as a dict, or None}}: the SM clock and power cap of the samples taken while that column was timed, and
    "clocks_error" where nvidia-smi gave none.
    profile: also "profile" = {column: {n: perf.profile.KernelProfile as a dict, top kernels}} for
    graph, graph_cublas and gemm_only (CUDA; the ATen ops on a CPU): the floor's own kernels beside the
    forward's, so a GEMM-only time above the forward's GEMM kernels (n = 256 on the H200, 2026-12-02) shows
    whether cuBLAS picked other kernels there or the same ones ran slower."""
    from ddtree_bench.engine.gpu.fused import TORCH_OPS, TritonOps
    from ddtree_bench.engine.gpu.kernels.gemm import cublas_only
    from ddtree_bench.perf.profile import profile_kernels

    setup = CurveSetup(target, layers, prefix_len, tokens, device, layer_ops, logit_scale)
    ops, whole, align = setup.ops, setup.whole, setup.align
    on_graphs = graphs and device.type == "cuda"
    fused = ops is not TORCH_OPS and on_graphs
    out: dict[str, Any] = {"graph": {}, "eager": {}, "gemm_only": {}}
    if fused:
        out.update({"graph_cublas": {}, "graph_live": {}, "graph_sdpa": {}, "graph_sdpa_whole": {}, "graph_unfused": {}})
    profiles: dict[str, dict[int, Any]] = {"graph": {}, **({"graph_cublas": {}} if fused else {}), "gemm_only": {}}
    with ExitStack() as stack:
        sampler = stack.enter_context(ClockSampler(nvsmi_id(device))) if device.type == "cuda" else None
        for n in tokens:
            pt = setup.point(n, with_path=fused)
            out.setdefault("tree_depth", {})[n] = pt.depth
            forward = pt.forward
            fns = {"graph": forward(whole)}
            if fused:
                fns.update({"graph_cublas": forward(whole, TritonOps(gemm_config=cublas_only)), "graph_live": forward(whole, attention="live"),
                            "graph_sdpa": forward(align(prefix_len + n), attention="sdpa"),
                            "graph_sdpa_whole": forward(whole, attention="sdpa"), "graph_unfused": forward(whole, TORCH_OPS)})
            if on_graphs:
                for col, fn in fns.items():
                    with span(sampler, f"{col}@{n}"):
                        out[col][n] = graph_time_fn(fn, reps=reps)
            if eager or not on_graphs:
                out["eager"][n] = time_fn(fns["graph"], device, reps=max(3, reps // 4), warmup=1)
            gemms = fns["gemm_only"] = gemm_only(target, n, device)
            with span(sampler, f"gemm_only@{n}"):
                out["gemm_only"][n] = (graph_time_fn(gemms, reps=reps) if on_graphs
                                       else time_fn(gemms, device, reps=max(3, reps // 4), warmup=1))
            if sampler is not None:
                out.setdefault("clocks", {})[n] = {col: summary_dict(sampler, f"{col}@{n}") for col in ("graph", "gemm_only")}
            if profile:
                for col in profiles:
                    wall = out[col].get(n) if on_graphs or col == "gemm_only" else out["eager"].get(n)
                    p = profile_kernels(fns[col], device, reps=profile_reps, graph=on_graphs, wall_ms=wall)
                    profiles[col][n] = p.to_dict(top=profile_top)
    if sampler is not None and sampler.error:
        out["clocks_error"] = sampler.error   # why the clock columns are empty
    if profile:
        out["profile"] = profiles
    return out



# ---------------------------------------------------------------------------- 2. rounds


def _stage_medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in ROUND_STAGES if any(k in r for r in rounds)]
    med = {k: median([r.get(k, 0.0) for r in rounds]) for k in keys}
    med["round"] = median([sum(r.values()) for r in rounds])
    return med


def _overhead(med: dict[str, float]) -> dict[str, float]:
    o = med["round"] - med.get("draft", 0.0) - med.get("verify", 0.0)
    return {"overhead_ms": o, "overhead_share": o / med["round"] if med["round"] > 0 else float("nan")}


@torch.inference_mode()
def round_times(target, drafter, method: str, budget: int, prefix_len: int, rounds: int, graphs: bool,
                plain: bool, seed: int, layer_ops: str = "auto") -> dict[str, Any]:
    """Stage medians (ms) of the fast engine (and the plain one) over `rounds` rounds after a prefix_len prompt."""
    from ddtree_bench.engine.generate import Engine

    prompt = random_prompt(target.cfg.vocab_size, prefix_len, seed)
    d = drafter if method != "ar" else None
    fast = Engine(target, d, cuda_graphs=True)
    fast.fast_loop().graphs = graphs and fast.device.type == "cuda"
    fast.fast_loop().layer_ops = layer_ops
    n_new = rounds + 1
    fast.generate(prompt, method, budget, n_new)            # warmup: captures the graphs
    gen = fast.generate(prompt, method, budget, n_new)
    rs = fast.fast_loop().rounds
    measured = rs[1:] if method != "ar" and len(rs) > 1 else rs  # round 1 drafts eagerly over the whole prompt
    out: dict[str, Any] = {"method": method, "budget": budget if method == "ddtree" else None, "rounds": len(measured),
                           "tau": sum(gen.accept_lengths) / max(1, len(gen.accept_lengths))}
    med = _stage_medians(measured)
    out["fast"] = {**med, **_overhead(med), "cold_s": fast.fast_loop().cold_s.get((method, budget if method == "ddtree" else 0))}
    if method == "ddtree":
        loop = fast.fast_loop()
        out["fast"]["tree_builder"] = loop.tree_builder(budget)
        out["fast"]["builder_ms"] = loop.builder_ms.get(budget)   # auto's timing of each exact builder
        out["fast"]["redone_rounds"] = loop.redone_rounds          # failed certificates (warmup included)
    if plain:
        p = Engine(target, d, sync_stages=True)
        p.generate(prompt, method, budget, n_new)
        g = p.generate(prompt, method, budget, n_new)
        n = len(g.accept_lengths)
        per = {k: v / 1e6 / n for k, v in g.stage_ns.items() if k != "prefill"}
        per["round"] = sum(per.values())
        out["plain"] = {**per, **_overhead(per), "same_tokens": g.output_ids == gen.output_ids}
    del fast
    if target.lm_head.weight.device.type == "cuda":
        import gc

        gc.collect()  # stages reference their loop: free the graphs' pools before the next budget
        torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------- 3. tree build


@torch.inference_mode()
def build_times(V: int, L: int, budgets: list[int], device: torch.device, reps: int) -> list[dict[str, Any]]:
    """ms per tree build for each budget: heap (CPU), vectorised (CPU and device), the paper's Algorithm 1
    written plainly (CPU, `perf.plain_tree`: the speed reference) and its ratio to the vectorised CPU
    build, static (device, eager/graph)."""
    from ddtree_bench.engine.tree import build_tree, build_tree_fast
    from ddtree_bench.engine.gpu import _probe
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder
    from ddtree_bench.perf.plain_tree import plain_algorithm1

    cpu = torch.device("cpu")
    logits_cpu = torch.randn(L, V, generator=torch.Generator().manual_seed(0)) * 3
    logits_dev = logits_cpu.to(device)
    rows = []
    for B in budgets:
        row: dict[str, Any] = {"budget": B}
        row["heap_cpu"] = time_fn(lambda: build_tree(logits_cpu, B), cpu, reps=reps, warmup=1)
        row["vectorised_cpu"] = time_fn(lambda: build_tree_fast(logits_cpu, B), cpu, reps=reps, warmup=1)
        row["plain_alg1_cpu"] = time_fn(lambda: plain_algorithm1(logits_cpu, B), cpu, reps=reps, warmup=1)
        row["plain/vectorised_cpu"] = row["plain_alg1_cpu"] / row["vectorised_cpu"]   # > 1: the engine's build is faster
        if device.type == "cuda":
            row["vectorised_gpu"] = time_fn(lambda: build_tree_fast(logits_dev, B), device, reps=reps, warmup=2)
            sb = StaticTreeBuilder(L, V, B, device)
            row["static_gpu_eager"] = time_fn(lambda: sb(logits_dev), device, reps=reps, warmup=2)
            row["static_gpu_graph"] = graph_time_fn(lambda: sb(logits_dev), reps=max(reps, 10))
            full = _probe.sorted_builder(L, V, B, device)
            row["static_gpu_graph_fullsort"] = graph_time_fn(lambda: full(logits_dev), reps=max(reps, 10))
            from ddtree_bench.engine.gpu import builders
            from ddtree_bench.engine.gpu.kernels import tree_block

            heap_tok = build_tree(logits_cpu, B).token_ids.tolist()
            for kernel in builders.KERNELS:
                tb = builders.checked_builder(L, V, B, device, kernel)
                if tb is None:
                    row[f"{kernel}_error"] = tree_block._SELF_TEST.get("error") or "unusable at this budget"
                    continue
                row[f"{kernel}_gpu_eager"] = time_fn(lambda: tb(logits_dev), device, reps=reps, warmup=2)
                row[f"{kernel}_gpu_graph"] = graph_time_fn(lambda: tb(logits_dev), reps=max(reps, 10))
                tok, _, _ = tb(logits_dev)
                row[f"{kernel}_equals_heap"] = tok.tolist() == heap_tok and tb.flag.item() == 0
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- 4. end to end


@torch.inference_mode()
def end_to_end(target, drafter, tokenizer, spec: BenchSpec, progress: Callable[[str], None],
               round_log: dict[tuple[str, int], list[dict[str, float]]] | None = None) -> list[dict[str, Any]]:
    """tok/s (decode: first token to last) and mean acceptance length per method/budget, fast engine and
    (spec.plain) plain engine. round_log: gets the fast engine's per-round stage ms of the timed calls,
    keyed (method, budget), for the cost model calibrated on rounds as they run."""
    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.suites.prompts import load_suite

    prompts = load_suite(spec.suite, spec.limit).prompts
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    configs = [("ar", 0), ("dflash", 0)] + [("ddtree", b) for b in spec.budgets]
    engines = {"fast": Engine(target, drafter, cuda_graphs=True)}
    if spec.plain:
        engines["plain"] = Engine(target, drafter, sync_stages=False)
    engines["fast"].fast_loop().graphs = spec.graphs and engines["fast"].device.type == "cuda"
    engines["fast"].fast_loop().layer_ops = spec.layer_ops
    rows = []
    ref: dict[str, list[list[int]]] = {}
    for method, budget in configs:
        row: dict[str, Any] = {"method": method, "budget": budget if method == "ddtree" else None}
        for name, eng in engines.items():
            progress(f"e2e {name} {method} {budget or ''}")
            # warmup: the longest prompt at full length, so the timed runs never grow the cache (a growth
            # drops and recaptures every graph inside the timing)
            eng.generate(max(ids, key=len), method, budget, spec.max_new_tokens)
            redone = eng.fast_loop().redone_rounds if name == "fast" else 0
            toks, ns, acc, outs = 0, 0, [], []
            for p in ids:
                g = eng.generate(p, method, budget, spec.max_new_tokens)
                if round_log is not None and name == "fast":
                    round_log.setdefault((method, budget), []).extend(dict(r) for r in eng.fast_loop().rounds)
                toks += len(g.output_ids) - 1          # the first token comes from prefill
                ns += g.t_done_ns - g.t_first_token_ns
                acc += g.accept_lengths
                outs.append(g.output_ids)
            row[name] = {"tok_s": toks / (ns / 1e9) if ns else float("nan"), "tau": sum(acc) / max(1, len(acc)),
                         "tokens": toks, "rounds": len(acc)}
            if name == "fast":   # rounds rebuilt by the exact builder after a failed certificate
                row[name]["redone_rounds"] = eng.fast_loop().redone_rounds - redone
            if method == "ar":
                ref[name] = outs
            # greedy: every method must emit AR's tokens (a mismatch is a near-tie or a bug: see compare)
            row[name]["same_as_ar"] = sum(o == r for o, r in zip(outs, ref[name]))
            row[name]["num_prompts"] = len(outs)
        rows.append(row)
    for row in rows:
        for name in engines:
            ar = next(r for r in rows if r["method"] == "ar")[name]["tok_s"]
            row[name]["speedup"] = row[name]["tok_s"] / ar
    return rows


# ---------------------------------------------------------------------------- everything


def run_bench(spec: BenchSpec, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    from ddtree_bench.env import environment, now_iso

    dev = torch.device(spec.device)
    progress("loading the pair")
    target, drafter, tokenizer, info = load_bench_pair(spec)
    layers = drafter.target_layer_ids if drafter is not None else ()
    result: dict[str, Any] = {"spec": asdict(spec), "pair": info, "date": now_iso(), "environment": environment(spec.device)}
    if dev.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(dev)

    progress("verify curve")
    from ddtree_bench.engine.gpu.fused import ops_for

    result["layer_ops"] = ops_for(dev, target.lm_head.weight.dtype, spec.layer_ops).name
    from ddtree_bench.engine.gpu.kernels.gemm import table_name

    result["gemm_table"] = table_name(dev) if result["layer_ops"] == "triton" else "none"   # the PyTorch ops run no table
    from ddtree_bench.engine.gpu.kernels import pdl

    result["pdl"] = pdl.describe(dev) if result["layer_ops"] == "triton" else "off"   # programmatic dependent launch
    from ddtree_bench.engine.gpu.kernels.tree_attention import narrow_tiles

    result["tree_tiles"] = "narrow" if dev.type == "cuda" and narrow_tiles(dev) else "table"   # the tree kernel's shapes
    from ddtree_bench.engine.gpu.ops import lt_gemms

    result["blas"] = ("cublaslt" if lt_gemms(dev) else "cublas") if dev.type == "cuda" else "none"   # cuBLAS's entry
    weight_bytes, params = weight_bytes_and_params(target)   # before verify_curve merges projections
    gemm_bytes, gemm_params = linear_bytes_and_params(target)
    curves = verify_curve(target, layers, spec.prefix_len, spec.verify_tokens, dev, spec.graphs, layer_ops=spec.layer_ops,
                          logit_scale=spec.curve_logit_scale)
    result["verify_curve_ms"] = curves
    timed = curves["graph"] or curves["eager"]
    progress("verify curve: " + ", ".join(f"n={n} {ms:.2f} ms" for n, ms in timed.items())
             + (f" ({'graph' if curves['graph'] else 'eager'})" if timed else ""))
    curve = curves["graph"] or curves["eager"]
    result["verify_roofline"] = {"weight_bytes": weight_bytes, "params": params, "timing": "graph" if curves["graph"] else "eager",
                                 "rows": roofline_rows(curve, weight_bytes, params, curves.get("gemm_only")),
                                 "gemm_weight_bytes": gemm_bytes, "gemm_params": gemm_params,
                                 "attention_shape": asdict(AttentionShape(target.cfg.num_hidden_layers,
                                                                          target.cfg.num_attention_heads,
                                                                          target.cfg.head_dim, spec.prefix_len))}

    if spec.projections:   # after verify_curve: it merged q/k/v and gate/up as the forward runs them
        from ddtree_bench.perf.projections import projection_rows

        progress("projections")
        result["projections"] = projection_rows(target, spec.verify_tokens, dev, spec.graphs)

    result["rounds"] = []
    configs = [("ar", 0)] + ([("dflash", 0)] + [("ddtree", b) for b in spec.budgets] if drafter is not None else [])
    for method, budget in configs:
        progress(f"rounds {method} {budget or ''}")
        result["rounds"].append(round_times(target, drafter, method, budget, spec.prefix_len, spec.rounds, spec.graphs,
                                            spec.plain, spec.seed, spec.layer_ops))
        r = result["rounds"][-1]
        progress(f"  round {r['fast']['round']:.2f} ms (fast)" + (f", {r['plain']['round']:.2f} ms (plain)" if r.get("plain") else "")
                 + f", overhead {100 * r['fast']['overhead_share']:.1f}%")
    sync(dev)

    if spec.build_table:
        progress("tree build")
        L = (drafter.block_size - 1) if drafter is not None else 15
        result["build_tree_ms"] = build_times(target.cfg.vocab_size, L, spec.budgets, dev, spec.build_reps)
        progress(f"tree build: {len(result['build_tree_ms'])} budgets timed")

    has_text = spec.shape is None and drafter is not None and tokenizer is not None  # `random` has the byte tokenizer
    e2e_rounds: dict[tuple[str, int], list[dict[str, float]]] = {}
    if spec.e2e and has_text:
        result["e2e"] = end_to_end(target, drafter, tokenizer, spec, progress, e2e_rounds)

    if spec.profile:   # last: torch.profiler's hooks outlive the profile and slowed later rounds ~0.4 ms on an H200
        progress("verify profile")
        prof = verify_curve(target, layers, spec.prefix_len, spec.verify_tokens, dev, spec.graphs,
                            layer_ops=spec.layer_ops, profile=True, eager=False, logit_scale=spec.curve_logit_scale)
        result["verify_profile"] = prof["profile"]
        for col, per_n in result["verify_profile"].items():
            progress(f"verify profile {col}: " + "; ".join(
                f"n={n} kernels {p['kernel_ms']:.3f} ms " + " ".join(f"{f} {ms:.3f}" for f, ms in p["families_ms"].items())
                + f" idle {p['gap_ms'] if p['gap_ms'] is not None else float('nan'):.3f}" for n, p in per_n.items()))

    ar_round = next((r["fast"]["round"] for r in result["rounds"] if r["method"] == "ar"), None)
    if ar_round:
        roof1 = roofline_ms(weight_bytes, params, 1)
        result["verify_roofline"]["ar_round"] = {"ms": ar_round, "roofline_ms": roof1, "ratio": ar_round / roof1}
    tau = spec.tau
    tau_source = "given"
    if tau is None and result.get("e2e"):
        # emitted tokens per round (the last round's cut counted), as the measured tok/s counts them
        tau = {r["budget"]: r["fast"]["tokens"] / r["fast"]["rounds"] for r in result["e2e"]
               if r["method"] == "ddtree" and r["fast"]["rounds"]}
        tau_source = "measured (e2e, fast engine: emitted tokens per round)"
    if tau:
        from ddtree_bench.perf.bench_costmodel import cost_model

        result["cost_model"] = cost_model(curve, result["rounds"], tau, tau_source, spec.budgets, ar_round,
                                          drafter.block_size if drafter is not None else None, e2e_rounds, result.get("e2e"))
    return result
