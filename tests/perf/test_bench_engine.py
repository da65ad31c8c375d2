"""bench-engine on the CPU with the random tiny pair: the JSON has every stage of every method and
budget, the verify curve, tree-build times and the cost model; bad flags exit 2. Also the real-shape
random-weight helper (parameter counts of the published configs, built on the meta device)."""

from __future__ import annotations

import json

import pytest
import torch

from ddtree_bench.cli import main
from ddtree_bench.engine.generate import Engine
from ddtree_bench.perf.shapes import SHAPES, param_count, random_shaped_pair
from engine_support import one_torch_thread  # noqa: F401 (fixture)
from process_support import cli_json


def test_bench_engine_cpu_json_and_table(tmp_path, capsys):
    out = tmp_path / "b.json"
    text, res, last = cli_json(capsys, "bench-engine", "--model", "random", "--budgets", "4,16", "--prefix-len", "40",
                               "--rounds", "3", "--verify-tokens", "1,5,17", "--tau", "4:1.5,16:2.5", "--limit", "1",
                               "--max-new-tokens", "8", out=out)
    assert last["spec"] == res["spec"]   # last stdout line: the same document
    assert "per-round stage medians" in text and "predicted best budget" in text
    assert set(res["verify_curve_ms"]["eager"]) == {"1", "5", "17"} == set(res["verify_curve_ms"]["gemm_only"])
    assert all(r["vs_gemm"] > 0 and r["gemm_only_ms"] > 0 for r in res["verify_roofline"]["rows"])
    from ddtree_bench.engine.loading import random_pair

    cfg = random_pair()[0].cfg   # the attention work's shape, for the profile's attention FLOP rate
    assert res["verify_roofline"]["attention_shape"] == {"layers": cfg.num_hidden_layers, "q_heads": cfg.num_attention_heads,
                                                         "head_dim": cfg.head_dim, "prefix_len": 40}
    assert all(r["fast"]["cold_s"] > 0 for r in res["rounds"])   # each point's first round (a new bucket) was timed
    assert res["layer_ops"] == "torch" and "graph_unfused" not in res["verify_curve_ms"]   # no Triton on a CPU
    assert res["gemm_table"] == "none" and "GEMM table: none" in text   # which weight-GEMM table ran: none here
    assert res["pdl"] == "off" and "PDL: off" in text   # which programmatic dependent launch ran: none on a CPU
    assert res["tree_tiles"] == "table" and "tree tiles: table" in text   # the tree kernel's shapes: no H100 here
    assert res["blas"] == "none" and "cuBLAS GEMMs: none" in text   # cuBLAS's entry (cublasGemmEx / cuBLASLt): no CUDA
    got = {(r["method"], r["budget"]) for r in res["rounds"]}
    assert got == {("ar", None), ("dflash", None), ("ddtree", 4), ("ddtree", 16)}
    for r in res["rounds"]:
        want = {"verify", "walk", "commit"} if r["method"] == "ar" else {"draft", "tree_build", "tree_compile", "verify", "walk", "commit"}
        assert want <= set(r["fast"]) and r["fast"]["round"] > 0 and 0 <= r["fast"]["overhead_share"] < 1
        assert r["plain"]["same_tokens"] is True
        if r["method"] == "ddtree":   # a CPU has no Triton builders: the exact PyTorch one, untimed
            assert r["fast"]["tree_builder"] == "torch" and r["fast"]["builder_ms"] is None
    assert [ln.split()[-1] for ln in text.splitlines() if ln.split()[:3] == ["ddtree", "B=16", "fast"]] == ["torch"]
    assert [b["budget"] for b in res["build_tree_ms"]] == [4, 16]
    cm = res["cost_model"]
    assert cm["tau_source"] == "given" and cm["best_budget"] in (4, 16)
    p4 = next(p for p in cm["predictions"] if p["budget"] == 4)
    assert p4["tok_s"] == pytest.approx(1000 * 1.5 / p4["round_ms"])
    # calibrated on the end-to-end calls' rounds (every fast round of them), each budget also held out
    e2e_rounds = sum(r["fast"]["rounds"] for r in res["e2e"])
    assert cm["model"] == "calibrated" and cm["calibration_rounds"] == e2e_rounds
    assert f"calibrated on {e2e_rounds} rounds as they ran" in text
    assert all(p["held_out_tok_s"] > 0 for p in cm["predictions"])
    assert cm["isolated_forward"]["best_budget"] in (4, 16) and cm["measured_best_budget"] in (4, 16)
    e2e = {(r["method"], r["budget"]): r for r in res["e2e"]}
    assert e2e[("ddtree", 16)]["fast"]["same_as_ar"] == e2e[("ddtree", 16)]["fast"]["num_prompts"] == 1
    assert res["verify_curve_ms"]["tree_depth"]["1"] == 0 and "depth" in text   # the curve's trees are shown


def test_bench_engine_curve_trees_deepen_with_the_logit_scale(tmp_path, capsys):
    """--curve-logit-scale: sharper random draft logits give the verify curve deeper trees (a confident
    drafter's), recorded per n and in the spec."""
    depths = {}
    for scale in ("1", "12"):
        _, res, _ = cli_json(capsys, "bench-engine", "--model", "random", "--budgets", "4", "--prefix-len", "8",
                             "--rounds", "1", "--verify-tokens", "1,32", "--tau", "4:1.5", "--no-e2e", "--no-plain",
                             "--no-build-table", "--curve-logit-scale", scale, out=tmp_path / f"{scale}.json")
        assert res["spec"]["curve_logit_scale"] == float(scale)
        depths[scale] = res["verify_curve_ms"]["tree_depth"]["32"]
    assert depths["1"] < depths["12"] <= 15


@pytest.mark.parametrize("argv", [["--shape", "qwen9-1t"], ["--verify-tokens", "a,b"], ["--budgets", "3..9"],
                                  ["--tau", "16=2"], ["--device", "cuda:7"] if not torch.cuda.is_available() else ["--rounds", "0"],
                                  ["--layer-ops", "fused"], ["--layer-ops", "triton", "--device", "cpu"],
                                  ["--curve-logit-scale", "0"]])
def test_bench_engine_bad_input_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench-engine", "--model", "random", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("argv", [[], ["--batch", "1,2"]])
def test_bench_engine_refuses_a_hybrid_model_before_loading_it(argv, capsys):
    """The stage timings assume a dense target: the bundled hybrid pair is refused with exit 2 and a pointer to
    --shape qwen3.6-27b, not an AttributeError from deep in the verify curve."""
    with pytest.raises(SystemExit) as e:
        main(["bench-engine", "--model", "toy-hybrid", "--budgets", "16", "--rounds", "1", "--no-e2e", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: bench-engine --model times dense targets" in err
    assert "--shape qwen3.6-27b" in err and "Traceback" not in err


def test_verify_table_shows_the_cublas_sdpa_and_unfused_graphs_beside_the_engine_one():
    from ddtree_bench.perf.tables import render

    res = {"spec": {"shape": "qwen3-8b", "model": "toy", "dtype": "bfloat16", "device": "cuda", "prefix_len": 1024},
           "date": "2026-11-29", "gpu": "NVIDIA H200", "layer_ops": "triton", "rounds": [],
           "verify_curve_ms": {"graph": {1: 5.2, 16: 5.5}, "graph_cublas": {1: 5.4, 16: 5.6}, "graph_sdpa": {1: 5.67, 16: 6.03},
                               "graph_sdpa_whole": {1: 5.9, 16: 6.2}, "graph_unfused": {1: 8.7, 16: 10.28},
                               "eager": {1: 23.4, 16: 16.2}}}
    lines = render(res).splitlines()
    assert "layer ops: triton; graph: the engine's attention and GEMM choices; graph_cublas: the same with every weight GEMM" in lines[2]
    assert "graph_unfused: the PyTorch twin ops" in lines[2]
    assert lines[3].split() == ["tokens", "graph", "graph_cublas", "graph_sdpa", "graph_sdpa_whole", "graph_unfused", "eager"]
    assert lines[5].split() == ["1", "5.20", "5.40", "5.67", "5.90", "8.70", "23.40"]
    assert lines[0].endswith("prefix 1024 tokens, 2026-11-29")   # no knobs set: nothing more
    res["environment"] = {"engine_knobs": {"DDTREE_GPU_EXPERIMENTAL": "pdl", "DDTREE_GEMM_TABLE": "t.json"}}
    assert render(res).splitlines()[0].endswith("2026-11-29, DDTREE_GEMM_TABLE=t.json, DDTREE_GPU_EXPERIMENTAL=pdl")


def test_cost_model_section_says_which_model_it_predicted_with():
    """Random weights (no end-to-end calls): calibrated on bench-engine's rounds, their stage medians;
    with no DDTree rounds it falls back to the isolated-forward model; the table names the model."""
    from ddtree_bench.perf.bench_costmodel import cost_model
    from ddtree_bench.perf.tables import render

    def tree(b, verify):
        fast = {"draft": 2.0, "tree_build": 0.5, "tree_compile": 0.1, "verify": verify, "walk": 0.1, "commit": 0.3}
        fast["round"] = sum(fast.values())
        return {"method": "ddtree", "budget": b, "rounds": 9, "fast": {**fast, "overhead_ms": fast["round"] - 2.0 - verify}}

    rounds = [{"method": "ar", "budget": None, "rounds": 9, "fast": {"verify": 4.0, "walk": 0.1, "commit": 0.2, "round": 4.3,
                                                                     "overhead_ms": 0.3}},
              {"method": "dflash", "budget": None, "rounds": 9, "fast": {"draft": 2.0, "tree_build": 0.2, "verify": 4.5,
                                                                         "walk": 0.1, "commit": 0.3, "round": 7.1, "overhead_ms": 0.6}},
              tree(16, 5.0), tree(64, 6.0), tree(256, 12.0)]
    tau = {16: 6.0, 64: 7.0, 256: 8.0}
    curve = {1: 3.0, 17: 3.5, 65: 4.0, 257: 8.0}    # isolated forwards, faster than the rounds' verify
    cm = cost_model(curve, rounds, tau, "given", [16, 64, 256], 4.3, 16)
    assert cm["model"] == "calibrated" and cm["calibration_rounds"] == 5
    p64 = next(p for p in cm["predictions"] if p["budget"] == 64)
    assert p64["round_ms"] == pytest.approx(2.0 + 1.0 + 6.0)                       # the rounds' own verify
    assert p64["held_out_tok_s"] == pytest.approx(1000 * 7.0 / (2.0 + 1.0 + 5.0 + (12.0 - 5.0) * 48 / 240))
    iso64 = next(p for p in cm["isolated_forward"]["predictions"] if p["budget"] == 64)
    assert iso64["round_ms"] == pytest.approx(2.0 + 1.0 + 4.0)                     # the curve's
    res = {"spec": {"model": "x", "dtype": "bfloat16", "device": "cpu", "prefix_len": 8}, "date": "d", "rounds": [],
           "verify_curve_ms": {"graph": {}, "eager": {}}, "cost_model": cm}
    assert "cost model, calibrated on 5 rounds as they ran (bench-engine's rounds" in render(res)
    assert cost_model(curve, rounds[:1], tau, "given", [16], 4.3, 16) == {}       # no DDTree rounds, no model
    # end-to-end rounds: per-round means, so a slow round counts as it does in the measured tok/s
    slow = {"draft": 8.0, "tree_build": 1.0, "verify": 20.0, "commit": 0.2}
    e2e = {("ar", 0): [{"verify": 4.0, "commit": 0.2}] * 4, ("dflash", 0): [{"draft": 2.0, "verify": 4.5}] * 4,
           ("ddtree", 16): [{"draft": 2.0, "tree_build": 1.0, "verify": 5.0, "commit": 0.2}] * 3 + [slow]}
    cal = cost_model(curve, rounds, {16: 6.0}, "measured", [16], 4.3, 16, e2e_round_log=e2e)
    assert cal["statistic"] == "mean" and cal["calibration_rounds"] == 12
    assert cal["predictions"][0]["round_ms"] == pytest.approx((3 * 8.2 + 29.2) / 4)
    iso = cost_model(curve, rounds, tau, "given", [16, 64, 256], 4.3, 16, e2e_round_log={("ar", 0): [{"verify": 4.0}]})
    assert iso["model"] == "isolated-forward" and "isolated_forward" not in iso
    res["cost_model"] = iso
    assert "cost model, isolated-forward" in render(res)


def test_real_shapes_have_the_published_sizes():
    assert param_count("qwen3-8b") == 8_190_735_360
    assert param_count("qwen3-4b") == 4_022_468_096
    assert param_count("qwen3-1.7b") == 1_720_574_976
    assert param_count("llama3-8b") == 8_030_261_248
    # 5 layers of (attention 41,943,040 + MLP 150,994,944 + norms 8,448), fc 5*4096 -> 4096, hidden_norm, norm
    assert param_count("qwen3-8b", drafter=True) == 5 * 192_946_432 + 5 * 4096 * 4096 + 2 * 4096


def test_random_shaped_pair_runs_fast_and_plain_alike():
    tiny = dict(SHAPES["qwen3-4b"], hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=300)
    t, d = random_shaped_pair(tiny, "float32", "cpu")
    assert t.lm_head.weight is t.model.embed_tokens.weight and d.block_size == 16 and len(d.layers) == 5
    assert all(torch.isfinite(p).all() and p.abs().sum() > 0 for p in t.parameters())
    prompt = list(range(3, 40))
    a = Engine(t, d).generate(prompt, "ddtree", 32, 20)
    b = Engine(t, d, cuda_graphs=True).generate(prompt, "ddtree", 32, 20)
    assert a.output_ids == b.output_ids


def test_end_to_end_timing_never_includes_a_cache_growth(monkeypatch):
    """A growing cache drops and recaptures every graph of the fast engine; inside the timed
    generations that cost landed in tok/s (seen on an H200: the toy's B = 128 at 1.63x measured vs
    2.32x predicted). The warmup must leave a cache big enough for every timed prompt."""
    from ddtree_bench.engine.gpu.loop import FastLoop
    from ddtree_bench.perf import bench

    growths, timed = [], {}
    ensure, generate = FastLoop._ensure, Engine.generate

    def spy_ensure(self, capacity):
        before = self.capacity
        ensure(self, capacity)
        if self.capacity != before:
            growths.append(timed.get("on", False))

    def spy_generate(self, prompt, method, budget, n, **kw):
        key = (id(self), method, budget)
        timed["on"] = key in timed     # the first call per engine and config is the warmup
        timed[key] = True
        return generate(self, prompt, method, budget, n, **kw)

    monkeypatch.setattr(FastLoop, "_ensure", spy_ensure)
    monkeypatch.setattr(Engine, "generate", spy_generate)
    spec = bench.BenchSpec(model="random", budgets=[4, 16], limit=3, max_new_tokens=24, plain=False)
    target, drafter, tok, _ = bench.load_bench_pair(spec)
    bench.end_to_end(target, drafter, tok, spec, lambda s: None)
    assert growths and not any(growths)   # it grew, and only ever in a warmup


def test_no_plain_and_no_build_table_leave_those_parts_out(tmp_path, capsys):
    """--no-plain skips the plain engine everywhere (rounds and end to end); --no-build-table skips the
    per-budget builder table (on a GPU it compiles every kernel at every budget)."""
    out = tmp_path / "b.json"
    main(["bench-engine", "--model", "random", "--budgets", "4", "--prefix-len", "20", "--rounds", "2", "--verify-tokens", "1",
          "--limit", "1", "--max-new-tokens", "6", "--no-plain", "--no-build-table", "--out", str(out)])
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert "build_tree_ms" not in res and "tree build (ms)" not in text
    assert all("plain" not in r for r in res["rounds"]) and all("plain" not in r for r in res["e2e"])
    assert all(r["fast"]["tok_s"] > 0 for r in res["e2e"])
    # no --tau: the cost model's tau is the emitted tokens per round, as the measured tok/s counts them
    tree = next(r["fast"] for r in res["e2e"] if r["method"] == "ddtree")
    cm = res["cost_model"]
    assert cm["tau"]["4"] == pytest.approx(tree["tokens"] / tree["rounds"]) and "emitted" in cm["tau_source"]
    assert cm["model"] == "calibrated" and "held_out_tok_s" not in cm["predictions"][0]   # one budget: nothing to hold out


def test_roofline_rows_reproduce_the_issue_figures_and_the_table_shows_them():
    """roofline(n) = max(W / 4.3 TB/s, 2 P n / 790 TFLOP/s) at the 8B shape's 16.4 GB bf16: ~3.8 ms to n ~ 180,
    then 5.3 / 10.6 / 21.2 ms at n = 257 / 513 / 1025 (issue 20); achieved GB/s and TFLOP/s from the time."""
    from ddtree_bench.perf.roofline import roofline_ms, roofline_rows
    from ddtree_bench.perf.tables import render

    P = param_count("qwen3-8b")
    W = 2 * P
    assert roofline_ms(W, P, 1) == pytest.approx(3.81, abs=0.01) == roofline_ms(W, P, 128)
    for n, ms in [(257, 5.33), (513, 10.64), (1025, 21.25)]:
        assert roofline_ms(W, P, n) == pytest.approx(ms, abs=0.01)
    rows = roofline_rows({1024: 29.26, 1: 5.66}, W, P, {1: 4.12, 1024: 18.96})   # the GEMM-only graph's 12-01 times
    assert [r["tokens"] for r in rows] == [1, 1024]
    assert rows[0]["vs_gemm"] == pytest.approx(5.66 / 4.12) and rows[1]["gemm_only_ms"] == 18.96
    assert rows[0]["ratio"] == pytest.approx(5.66 / 3.81, abs=0.01) and rows[0]["achieved_gb_s"] == pytest.approx(W / 5.66e-3 / 1e9)
    assert rows[1]["achieved_tflop_s"] == pytest.approx(2 * P * 1024 / 29.26e-3 / 1e12)
    res = {"spec": {"shape": "qwen3-8b", "model": "toy", "dtype": "bfloat16", "device": "cuda", "prefix_len": 1024},
           "date": "2026-12-01", "rounds": [], "verify_curve_ms": {"graph": {1: 5.66, 1024: 29.26}, "eager": {}},
           "verify_roofline": {"weight_bytes": W, "params": P, "timing": "graph", "rows": rows,
                               "ar_round": {"ms": 6.0, "roofline_ms": 3.81, "ratio": 6.0 / 3.81}}}
    text = render(res)
    assert "AR round 6.0 ms = 1.57x roofline(1)" in text
    row1 = [ln.split() for ln in text.splitlines() if ln.split()[:2] == ["1", "5.66"]][-1]   # the roofline table's row
    assert row1[2:6] == ["4.12", "1.37", "3.81", "1.49"]   # GEMM-only ms and x, roofline ms and x
    assert roofline_rows({1: 5.66}, W, P)[0]["vs_gemm"] is None   # no GEMM-only time: no ratio
    assert "MHz" not in text   # no clocks sampled (a CPU run): no clock columns
    summary = {"samples": 9, "busy_samples": 8, "sm_clock_mhz_median": 1530.0, "sm_clock_mhz_min": 1215.0,
               "sm_clock_max_mhz": 1980.0, "power_w_median": 690.0, "power_limit_w": 700.0, "power_capped_share": 0.875,
               "thermal_share": 0.0}
    res["verify_curve_ms"]["clocks"] = {"1": {"graph": summary, "gemm_only": {**summary, "sm_clock_mhz_median": 1470.0}},
                                        "1024": {"graph": None, "gemm_only": None}}   # keys as the JSON file has them
    lines = render(res).splitlines()
    head = next(ln.split() for ln in lines if ln.startswith("tokens") and "MHz" in ln)
    assert " ".join(head).endswith("TFLOP/s MHz gemm-only MHz max MHz capped %")
    row1 = [ln.split() for ln in lines if ln.split()[:2] == ["1", "5.66"]][-1]
    assert row1[-4:] == ["1530", "1470", "1980", "88"]
    row1024 = [ln.split() for ln in lines if ln.split()[:2] == ["1024", "29.26"]][-1]
    assert row1024[-4:] == ["-", "-", "-", "-"]
    assert "capped %: its samples at the power cap" in render(res)
    res["verify_curve_ms"]["clocks_error"] = "nvidia-smi: No devices were found"
    assert "; no clocks: nvidia-smi: No devices were found" in render(res)


def test_the_profile_table_puts_the_gemms_beside_their_own_roofline():
    """The GEMMs' roofline counts the weights a forward multiplies (every nn.Linear once: no embedding table
    unless lm_head ties to it): 15.1 GB at the 8B shape, so n = 128's GEMMs at 4.54 ms are 1.29x their limit."""
    from ddtree_bench.engine.loading import random_pair
    from ddtree_bench.perf.roofline import linear_bytes_and_params
    from ddtree_bench.perf.tables import render

    toy, _ = random_pair(seed=1, vocab_size=64)
    linear_bytes, linear_params = linear_bytes_and_params(toy)
    every = sum(p.numel() for p in toy.parameters())
    embed = toy.model.embed_tokens.weight.numel()
    norms = sum(p.numel() for n, p in toy.named_parameters() if p.dim() == 1)
    tied = toy.lm_head.weight.data_ptr() == toy.model.embed_tokens.weight.data_ptr()
    assert linear_params == every - norms - (0 if tied else embed) and linear_bytes == 4 * linear_params

    H, I, V, L = 4096, 12288, 151936, 36
    gp = L * ((32 + 16) * 128 * H + H * 32 * 128 + 3 * H * I) + V * H
    prof = {"graph": {"128": {"source": "graph", "wall_ms": 6.22, "kernel_ms": 5.87, "gap_ms": 0.35, "kernels": [],
                              "families_ms": {"gemm": 4.54, "attention": 0.88}}}}
    res = {"spec": {"shape": "qwen3-8b", "model": "toy", "dtype": "bfloat16", "device": "cuda", "prefix_len": 1024},
           "date": "2026-12-01", "rounds": [], "verify_curve_ms": {"graph": {128: 6.22}, "eager": {}}, "verify_profile": prof,
           "verify_roofline": {"weight_bytes": 2 * gp, "params": gp, "timing": "graph", "rows": [],
                               "gemm_weight_bytes": 2 * gp, "gemm_params": gp}}
    lines = render(res).splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("verify profile (graph)"))
    assert "gemm x = gemm ms / the GEMMs' roofline" in lines[head]
    assert lines[head + 1].split()[-1] == "x" and lines[head + 3].split()[-1] == "1.29"


def test_projections_time_each_weight_gemm_over_every_layer_against_its_own_floor(tmp_path, capsys):
    """--projections: per n, the five projections (q/k/v and gate/up merged as the forward runs them), each with every
    layer's weight counted once, a floor = max(bytes at 4.3 TB/s, FLOPs at 790 TFLOP/s), cuBLAS's and the engine's
    time (on a CPU both PyTorch's, launch "torch") and their ratios; their bytes add up to the GEMMs' roofline W."""
    from ddtree_bench.perf.roofline import DENSE_FLOP_PER_S, HBM_BYTES_PER_S

    text, res, _ = cli_json(capsys, "bench-engine", "--model", "random", "--budgets", "4", "--prefix-len", "8",
                            "--rounds", "1", "--verify-tokens", "1,9", "--tau", "4:1.5", "--no-e2e", "--no-plain",
                            "--no-build-table", "--projections", out=tmp_path / "p.json")
    assert "weight GEMMs by projection" in text
    rows = res["projections"]
    assert [(r["tokens"], r["projection"]) for r in rows] == [(n, p) for n in (1, 9)
                                                               for p in ("qkv", "o_proj", "gate_up", "down", "lm_head")]
    layers = {r["weights"] for r in rows if r["projection"] != "lm_head"}
    assert len(layers) == 1 and next(r["weights"] for r in rows if r["projection"] == "lm_head") == 1
    by = {(r["tokens"], r["projection"]): r for r in rows}
    assert sum(by[(9, p)]["weight_bytes"] for p in ("qkv", "o_proj", "gate_up", "down", "lm_head")) \
        == res["verify_roofline"]["gemm_weight_bytes"]
    for r in rows:
        params = r["weight_bytes"] // 4   # the random pair is fp32
        assert r["floor_ms"] == pytest.approx(1e3 * max(r["weight_bytes"] / HBM_BYTES_PER_S,
                                                        2 * params * r["tokens"] / DENSE_FLOP_PER_S))
        assert r["cublas_ms"] > 0 and r["cublas_x"] == pytest.approx(r["cublas_ms"] / r["floor_ms"])
        assert r["engine_x"] == pytest.approx(r["engine_ms"] / r["floor_ms"]) and r["launch"] == "torch"


def test_projections_are_refused_where_they_would_time_nothing(capsys):
    for extra in (["--batch", "1,2"], ["--shape", "qwen3.6-27b"]):
        with pytest.raises(SystemExit) as e:
            main(["bench-engine", "--model", "random", "--projections", *extra])
        assert e.value.code == 2 and "--projections" in capsys.readouterr().err


@pytest.mark.parametrize("argv,says", [
    (["--shape", "qwen3.6-27b", "--device", "cpu"], "needs 122.0 GiB of weights; cpu has"),   # fp32 on a 24 GiB host
    (["--shape", "qwen3.6-27b", "--tau", "16:8"], "--tau does not apply to a hybrid --shape"),
    (["--shape", "qwen3.6-27b", "--profile", "--batch", "1,2"], "--batch, --profile do not apply"),
    (["--shape", "qwen3-8b", "--model", "toy"], "instead of --model / --draft"),
])
def test_bench_engine_refuses_a_shape_that_cannot_fit_or_flags_it_would_drop(argv, says, capsys, monkeypatch):
    """The hybrid shape on a CPU was an allocator 'internal error' after minutes (or the OOM killer); flags the hybrid
    bench does not take were accepted and dropped."""
    import ddtree_bench.perf.shapes as S

    monkeypatch.setattr(S, "available_bytes", lambda device: 24 << 30)
    with pytest.raises(SystemExit) as e:
        main(["bench-engine", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and "Traceback" not in err, err


def test_the_weights_estimate_counts_what_is_built():
    """qwen3-8b + its drafter in bf16, from the meta device: ~8.2 B + ~1 B parameters (docs' W = 16.38 GB for the
    target alone); the hybrid shape holds the larger of itself and its dense twin."""
    from ddtree_bench.perf.shapes import param_count, weights_bytes

    assert weights_bytes("qwen3-8b", "bfloat16") == 2 * (param_count("qwen3-8b") + param_count("qwen3-8b", drafter=True))
    assert 16.3e9 < 2 * param_count("qwen3-8b") < 16.5e9
    assert weights_bytes("qwen3.6-27b", "float32") == 2 * weights_bytes("qwen3.6-27b", "bfloat16")
