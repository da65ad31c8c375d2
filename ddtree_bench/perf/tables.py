"""Terminal tables of a bench-engine result (the JSON file is the machine-readable output)."""

from __future__ import annotations

from typing import Any, Callable

from ddtree_bench.display import table
from ddtree_bench.perf.roofline import AttentionShape, roofline_ms


def _f(x: Any, d: int = 3) -> Any:
    return None if x is None else (round(x, d) if isinstance(x, float) else x)


def profile_tables(prof: dict[str, dict[Any, dict[str, Any]]], top: int | None = None,
                   gemm_limit_ms: Callable[[int], float] | None = None,
                   attention_flops: Callable[[int], float] | None = None) -> str:
    """bench-engine --profile: per column and n, the kernel time by family and the idle time between
    kernels, then the top kernels (ms per forward, launches, share of the kernel time) and, where the profile
    has them (CUDA), the kernel pairs with the most idle time between them. gemm_limit_ms(n):
    the weight GEMMs' own roofline, for a "gemm x" column (gemm ms / that limit); attention_flops(n)
    (perf/roofline.AttentionShape.flops), for an "attn TFLOP/s" column over the attention kernels' time."""
    from ddtree_bench.perf.profile import FAMILIES

    parts = []
    for col, per_n in prof.items():
        rows = []
        for n in sorted(per_n, key=int):
            p = per_n[n]
            gemm, attn = p["families_ms"].get("gemm", 0.0), p["families_ms"].get("attention", 0.0)
            rows.append([n, p["source"], _f(p.get("wall_ms")), _f(p["kernel_ms"])] + [_f(p["families_ms"].get(f, 0.0)) for f in FAMILIES]
                        + [_f(p.get("gap_ms"))] + ([_f(gemm / gemm_limit_ms(int(n)), 2)] if gemm_limit_ms else [])
                        + ([_f(attention_flops(int(n)) / (attn * 1e-3) / 1e12, 1) if attn else None]
                           if attention_flops else []))
        limit = ("; gemm x = gemm ms / the GEMMs' roofline (their weights' bytes at 4.3 TB/s or their FLOPs at 790 TFLOP/s)"
                 if gemm_limit_ms else "") + ("; attn TFLOP/s = the prefix's attention FLOPs (4 layers Hq D n prefix) / the "
                                              "attention kernels' ms" if attention_flops else "")
        parts.append(f"\nverify profile ({col}): ms per forward by kernel family; idle = measured - kernel time{limit}:\n"
                     + table(rows, ["tokens", "source", "measured", "kernels"] + list(FAMILIES) + ["idle"]
                             + (["gemm x"] if gemm_limit_ms else []) + (["attn TFLOP/s"] if attention_flops else [])))
        for n in sorted(per_n, key=int):
            p = per_n[n]
            ks = p["kernels"][:top] if top else p["kernels"]
            more = p.get("kernels_total", len(p["kernels"])) - len(ks)
            parts.append(f"\ntop kernels ({col}, n = {n}){f'; {more} more' if more > 0 else ''}:\n" + table(
                [[k["name"][:70], k["family"], _f(k["ms"]), _f(k["launches"], 1), _f(100 * k["share"], 1)] for k in ks],
                ["kernel", "family", "ms", "launches", "share %"]))
            gaps = p.get("gaps") or []
            if gaps:
                gs = gaps[:top] if top else gaps
                parts.append(f"\nidle between kernels ({col}, n = {n}): {_f(p.get('gaps_ms'))} ms per forward inside it, "
                             f"largest pairs first:\n" + table(
                                 [[g["after"][:40], g["before"][:40], _f(g["ms"]), _f(g["count"], 1),
                                   _f(1e3 * g["ms"] / g["count"], 2) if g["count"] else None] for g in gs],
                                 ["after", "before", "ms", "count", "us each"]))
    return "\n".join(parts)


def _clock_cells(c: dict[str, Any] | None) -> list[Any]:
    """A verify row's clock cells: the forward's and the GEMM-only graph's median SM MHz, the card's maximum, and the
    share of the forward's busy samples at the power cap ("-" where nvidia-smi gave none)."""
    g, f = (c or {}).get("graph") or {}, (c or {}).get("gemm_only") or {}
    cap = g.get("power_capped_share")

    def whole(x):
        return None if x is None else round(x)
    return [whole(g.get("sm_clock_mhz_median")), whole(f.get("sm_clock_mhz_median")), whole(g.get("sm_clock_max_mhz")),
            None if cap is None else round(100 * cap)]


def render(result: dict[str, Any]) -> str:
    parts: list[str] = []
    spec = result["spec"]
    what = f"shape {spec['shape']} (random weights)" if spec.get("shape") else f"model {spec['model']}"
    knobs = result.get("environment", {}).get("engine_knobs") or {}
    parts.append(f"bench-engine: {what}, {spec['dtype']} on {result.get('gpu', spec['device'])}, "
                 f"prefix {spec['prefix_len']} tokens, {result['date']}"
                 + "".join(f", {k}={v}" for k, v in sorted(knobs.items())))

    vc = result["verify_curve_ms"]
    cols = [c for c in ("graph", "graph_cublas", "graph_live", "graph_sdpa", "graph_sdpa_whole", "graph_unfused", "eager",
                        "gemm_only")
            if c in vc and vc[c]]
    ns = sorted(set().union(*(vc[c] for c in cols)))
    note = ("; graph: the engine's attention and GEMM choices; graph_cublas: the same with every weight GEMM on cuBLAS; "
            "graph_live: attention over the live slots only; graph_sdpa: SDPA "
            "over a cache narrowed to prefix + n; graph_sdpa_whole: SDPA over the whole cache; graph_unfused: the PyTorch "
            "twin ops") if "graph_unfused" in vc else ""
    depth = {int(k): v for k, v in vc.get("tree_depth", {}).items()}   # JSON keys are strings
    scale = spec.get("curve_logit_scale")
    trees = f"; trees: random draft logits x{scale:g}, depth column" if depth and scale else ""
    gemms = (f"; GEMM table: {result['gemm_table']}" if result.get("gemm_table") else "") + (
        f"; PDL: {result['pdl']}" if result.get("pdl") else "") + (
        f"; tree tiles: {result['tree_tiles']}" if result.get("tree_tiles") else "") + (
        f"; cuBLAS GEMMs: {result['blas']}" if result.get("blas") else "")
    parts.append(f"\nverify forward (ms) vs query tokens (layer ops: {result.get('layer_ops', 'torch')}{gemms}{note}{trees}):\n"
                 + table(
        [[n] + ([depth.get(int(n), "-")] if depth else []) + [_f(vc[c].get(n)) for c in cols] for n in ns],
        ["tokens"] + (["depth"] if depth else []) + cols))
    roof = result.get("verify_roofline")
    if roof:
        ar = roof.get("ar_round")
        ar_line = f"; AR round {_f(ar['ms'])} ms = {_f(ar['ratio'], 2)}x roofline(1)" if ar else ""
        clocks = {int(k): v for k, v in (vc.get("clocks") or {}).items()}   # JSON keys are strings
        clock_note = ("; MHz: median SM clock while the forward / the GEMM-only graph was timed (of the card's max "
                      "MHz), capped %: its samples at the power cap (nvidia-smi)") if clocks else ""
        if vc.get("clocks_error"):
            clock_note += f"; no clocks: {vc['clocks_error']}"
        parts.append(f"\nverify vs roofline(n) = max(W / 4.3 TB/s, 2 P n / 790 TFLOP/s), W = {roof['weight_bytes'] / 1e9:.2f} GB, "
                     f"P = {roof['params'] / 1e9:.2f} B ({roof['timing']} timing; H200 limits"
                     + ("" if str((result.get("spec") or {}).get("device", "cuda")).startswith("cuda") else
                        ": on this CPU the x roofline column says how far it is from an H200, nothing more")
                     + "), and vs the GEMM-only time "
                     f"(every weight GEMM once on cuBLAS, nothing else, same call){ar_line}{clock_note}:\n" + table(
            [[r["tokens"], _f(r["ms"]), _f(r.get("gemm_only_ms")), _f(r.get("vs_gemm"), 2), _f(r["roofline_ms"]),
              _f(r["ratio"], 2), _f(r["achieved_gb_s"], 0), _f(r["achieved_tflop_s"], 1)]
             + (_clock_cells(clocks.get(int(r["tokens"]))) if clocks else [])
             for r in roof["rows"]], ["tokens", "ms", "gemm-only ms", "x gemm-only", "roofline ms", "x roofline", "GB/s",
                                      "TFLOP/s"] + (["MHz", "gemm-only MHz", "max MHz", "capped %"] if clocks else [])))

    proj = result.get("projections")
    if proj:
        parts.append("\nweight GEMMs by projection, every layer's weight of it once (ms per forward); floor = max(its weights "
                     "at 4.3 TB/s, its FLOPs at 790 TFLOP/s); engine = the forward's launch for it:\n" + table(
            [[r["tokens"], r["projection"], r["weights"], round(r["weight_bytes"] / 1e6), _f(r["floor_ms"]), _f(r["cublas_ms"]),
              _f(r["cublas_x"], 2), _f(r["engine_ms"]), _f(r["engine_x"], 2), round(r["engine_gb_s"]), r["launch"]]
             for r in proj],
            ["tokens", "projection", "weights", "MB", "floor ms", "cublas ms", "x floor", "engine ms", "x floor", "GB/s",
             "engine launch"]))

    prof = result.get("verify_profile")
    if prof:
        gb, gp = (roof or {}).get("gemm_weight_bytes"), (roof or {}).get("gemm_params")
        shape = (roof or {}).get("attention_shape")
        parts.append(profile_tables(prof, gemm_limit_ms=(lambda n: roofline_ms(gb, gp, n)) if gb else None,
                                    attention_flops=AttentionShape(**shape).flops if shape else None))

    rows = []
    for r in result["rounds"]:
        name = r["method"] + (f" B={r['budget']}" if r["budget"] else "")
        for eng in ("fast", "plain"):
            m = r.get(eng)
            if not m:
                continue
            rows.append([name, eng] + [_f(m.get(k)) for k in
                        ("draft", "tree_build", "tree_compile", "verify", "walk", "commit", "round")]
                        + [_f(100 * m["overhead_share"], 1), _f(m.get("cold_s"), 1), m.get("tree_builder") or "-"])
    parts.append("\nper-round stage medians (ms); overhead = round - draft - verify; builder = the tree builder the "
                 "fast engine picked; cold s = the first round at this budget (compiles + graph captures):\n" + table(
        rows, ["method", "engine", "draft", "build", "compile", "verify", "walk", "commit", "round", "ovh %", "cold s",
               "builder"]))

    bt = result.get("build_tree_ms") or []
    if bt:
        keys = [k for k in bt[0] if k != "budget"]
        parts.append("\ntree build (ms) vs budget:\n" + table([[r["budget"]] + [_f(r.get(k)) for k in keys] for r in bt],
                                                          ["budget"] + keys))

    e2e = result.get("e2e")
    if e2e:
        rows = []
        for r in e2e:
            name = r["method"] + (f" B={r['budget']}" if r["budget"] else "")
            rows.append([name] + [_f(r.get(e, {}).get(k), 2) for e in ("fast", "plain") for k in ("tok_s", "speedup", "tau")]
                        + [f"{r['fast']['same_as_ar']}/{r['fast']['num_prompts']}",
                           f"{r['fast'].get('redone_rounds', 0)}/{r['fast'].get('rounds', '?')}"])
        parts.append("\nend to end (greedy; redone = fast-engine rounds rebuilt after a failed tree certificate):\n"
                     + table(rows, ["method", "fast tok/s", "x AR", "tau", "plain tok/s", "x AR", "tau", "= AR", "redone"]))

    cm = result.get("cost_model")
    if cm and cm.get("predictions"):
        rows = [[p["budget"], _f(p["tau"], 2), _f(p["round_ms"]), _f(p["tok_s"], 1), _f(p["speedup"], 2),
                 _f(p.get("held_out_tok_s"), 1), _f(p.get("measured_tok_s"), 1)] for p in cm["predictions"]]
        if cm.get("model") == "calibrated":
            which = (f"calibrated on {cm['calibration_rounds']} rounds as they ran ({cm['calibrated_on']}; per-round "
                     f"{cm.get('statistic', 'median')}s); held out: each budget predicted with its own rounds left out")
        else:
            which = "isolated-forward: the verify curve's single forwards, draft and overhead from the rounds"
        iso = cm.get("isolated_forward")
        parts.append(f"\ncost model, {which} (tau {cm['tau_source']}; draft {cm['draft_ms']:.3f} ms, AR round {cm['ar_ms']:.3f} ms):\n"
                     + table(rows, ["budget", "tau", "round ms", "pred tok/s", "pred x AR", "held out tok/s", "measured tok/s"])
                     + f"\npredicted best budget: {cm['best_budget']}"
                     + (f" (isolated-forward model: {iso['best_budget']})" if iso else "")
                     + (f"; measured: {cm['measured_best_budget']}" if cm.get("measured_best_budget") is not None else ""))
    return "\n".join(parts)
