#!/usr/bin/env python3
"""Does folding each RMSNorm's weight into the next GEMM's weight cost accuracy in bf16? (issue 35, item 2)

The fold that gpu_ceilings.py's `nonorm` arm bounds (in speed) computes (x / rms(x)) @ (W * g)^T where the engine
computes ((x / rms(x)) * g) @ W^T: the same function, rounded in other places (W * g rounded to bf16 once, at load;
the normed row no longer rounded after its product with g). This runs the toy pair's target (trained, so its norm
weights are not ones) over prompts of the bundled suites in fp32, in bf16 as it is, and in bf16 with the input and
post-attention norms folded into q/k/v and gate/up (norm weight 1), and prints, against fp32, the largest logit
difference and the positions whose greedy token differs. It bounds the rounding, not the fused kernels' order; CPU,
seconds. The final norm (before lm_head) is left alone: its output is also a hidden state the drafter reads.

  python3 benchmarks/norm_fold_numerics.py --prompts 8
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

from ddtree_bench.perf.bench import BenchSpec, load_bench_pair

DATA = Path(__file__).resolve().parents[1] / "ddtree_bench" / "data"


def prompts(n: int) -> list[str]:
    """The first n HumanEval prompts and n MT-Bench first turns (bundled, licensed in ddtree_bench/data)."""
    he = [json.loads(line)["prompt"] for line in (DATA / "humaneval.jsonl").read_text().splitlines()[:n]]
    mt = [json.loads(line)["turns"][0] for line in (DATA / "mt_bench_questions.jsonl").read_text().splitlines()[:n]]
    return he + mt


@torch.no_grad()
def fold(target) -> None:
    """In place: each layer's input / post-attention norm weight g into the q/k/v / gate/up weights (W * g along K,
    in fp32, rounded once to the weights' dtype), the norm weight set to 1."""
    for layer in target.model.layers:
        for norm, linears in ((layer.input_layernorm, (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                        layer.self_attn.v_proj)),
                              (layer.post_attention_layernorm, (layer.mlp.gate_proj, layer.mlp.up_proj))):
            g = norm.weight.float()
            for lin in linears:
                lin.weight.copy_((lin.weight.float() * g).to(lin.weight.dtype))
            norm.weight.fill_(1.0)


@torch.no_grad()
def logits(target, ids: list[int]) -> torch.Tensor:
    t = torch.tensor(ids)
    return target(t, torch.arange(len(ids)), target.new_cache(len(ids)), 0)[0].float()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8, help="of each suite")
    ap.add_argument("--max-len", type=int, default=256)
    a = ap.parse_args(argv)
    ref, _, tok, _ = load_bench_pair(BenchSpec(model="toy", device="cpu", dtype="float32"))
    plain = copy.deepcopy(ref).to(torch.bfloat16)
    folded = copy.deepcopy(ref)
    fold(folded)
    folded = folded.to(torch.bfloat16)
    gs = torch.cat([torch.cat([l.input_layernorm.weight, l.post_attention_layernorm.weight]) for l in ref.model.layers]).detach()
    print(f"toy target: {len(ref.model.layers)} layers, hidden {ref.cfg.hidden_size}; norm weights "
          f"{float(gs.min()):.3f} .. {float(gs.max()):.3f} (mean {float(gs.mean()):.3f})")
    rows, tot = [], {"plain": [0.0, 0], "folded": [0.0, 0]}
    positions = 0
    for text in prompts(a.prompts):
        ids = tok.encode(text)[: a.max_len]
        want = logits(ref, ids)
        greedy = want.argmax(-1)
        cells = [len(ids)]
        for name, model in (("plain", plain), ("folded", folded)):
            got = logits(model, ids)
            d, flips = float((got - want).abs().max()), int((got.argmax(-1) != greedy).sum())
            tot[name][0] = max(tot[name][0], d)
            tot[name][1] += flips
            cells += [d, flips]
        positions += len(ids)
        rows.append(cells)
    print("tokens  bf16 max|dlogit|  bf16 flips  folded max|dlogit|  folded flips")
    for r in rows:
        print(f"{r[0]:6d}  {r[1]:16.4f}  {r[2]:10d}  {r[3]:18.4f}  {r[4]:12d}")
    print(f"all {positions} positions: bf16 max |dlogit| {tot['plain'][0]:.4f}, {tot['plain'][1]} greedy flips; "
          f"folded {tot['folded'][0]:.4f}, {tot['folded'][1]} flips (both against fp32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
