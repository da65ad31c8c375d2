"""benchmarks/norm_fold_numerics.py: its fold is the same function as the model it folds (fp32, to rounding), and
the script prints its comparison on the bundled prompts."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "norm_fold_numerics.py"
sys.path.insert(0, str(SCRIPT.parent))

import norm_fold_numerics as nf  # noqa: E402

from ddtree_bench.perf.bench import BenchSpec, load_bench_pair  # noqa: E402


def test_the_fold_keeps_the_function_and_moves_the_norm_weights():
    ref, _, tok, _ = load_bench_pair(BenchSpec(model="toy", device="cpu", dtype="float32"))
    folded = copy.deepcopy(ref)
    nf.fold(folded)
    layer, orig = folded.model.layers[0], ref.model.layers[0]
    assert torch.all(layer.input_layernorm.weight == 1) and torch.all(layer.post_attention_layernorm.weight == 1)
    assert not torch.equal(layer.self_attn.q_proj.weight, orig.self_attn.q_proj.weight)
    assert torch.equal(folded.model.norm.weight, ref.model.norm.weight)   # the final norm stays
    ids = tok.encode(nf.prompts(1)[0])[:64]
    want, got = nf.logits(ref, ids), nf.logits(folded, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_script_prints_both_counts():
    r = subprocess.run([sys.executable, str(SCRIPT), "--prompts", "1", "--max-len", "32"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("all 64 positions: bf16 max |dlogit|") and "folded" in last
