"""bench-engine's hybrid path at a tiny scale on CPU: the hybrid shape's verify under both commits and the
dense twin's, per verify size, the per-node memory formula, and the largest budget next to the weights."""

from __future__ import annotations

import copy

from ddtree_bench.engine.hybrid.replay import node_memory
from ddtree_bench.perf.bench_hybrid import bench_hybrid, render_hybrid
from ddtree_bench.perf.shapes import HYBRID_SHAPES


def tiny_shape() -> dict:
    s = copy.deepcopy(HYBRID_SHAPES["qwen3.6-27b"])
    s["target"]["text_config"].update(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                                      linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    s["dense_twin"] = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 300, "hidden_size": 64,
                       "intermediate_size": 96, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "head_dim": 16, "hidden_act": "silu"}
    return s


def test_bench_hybrid_tiny_on_cpu():
    res = bench_hybrid(tiny_shape(), device="cpu", dtype="float32", sizes=(1, 9, 33), prefix_len=20, reps=1,
                       device_memory_gib=0.01, context_tokens=64)
    for mode in ("full", "replay"):
        assert set(res["hybrid"]["verify"][mode]) == {1, 9, 33}
        assert all(r["verify_ms"] > 0 for r in res["hybrid"]["verify"][mode].values())
    assert set(res["dense"]["verify"]) == {1, 9, 33}
    mem = node_memory(6, 4, 16, 16, 128, 4, 4)
    assert res["node_memory"]["full_state_mib"] * (1 << 20) == mem.full_state_bytes
    assert res["hybrid"]["budget_max_replay"] > res["hybrid"]["budget_max_full_state"] >= 0
    text = render_hybrid(res)
    assert "largest budget" in text and "replay" in text
    print(text)


def test_real_shape_memory_per_node():
    """The figures docs/hybrid-targets.md quotes for Qwen3.6-27B (48 GDN layers, Hv 48, dk = dv = 128,
    conv_dim 10240, fp32 state, bf16 activations)."""
    m = node_memory(48, 48, 128, 128, 10240, 4, 2)
    assert round(m.full_state_bytes / 2**20, 1) == 144.9 and round(m.replay_bytes / 2**20, 2) == 3.21
