"""Acceptance length tau(B) of the bundled toy pair (fp32 greedy, device-independent) on the first
3 gsm8k prompts, 96 new tokens, with a check that every method emits AR's tokens.
Run: python benchmarks/toy_tau.py  (CPU, a few minutes)"""

import json

import torch

from ddtree_bench.pair import load_pair
from ddtree_bench.suites.prompts import load_suite

torch.set_num_threads(1)
lp = load_pair("toy", None, "ddtree", "float32", "cpu")
eng, tok = lp.engine, lp.tokenizer
prompts = load_suite("gsm8k", 3).prompts
ids = [tok.apply_chat_template([{"role": "user", "content": p.turns[0]}]) for p in prompts]
out = {"prompt_tokens": [len(i) for i in ids]}
ar = [eng.generate(p, "ar", 0, 96).output_ids for p in ids]
for m, b in [("dflash", 0)] + [("ddtree", b) for b in (16, 32, 64, 128, 256, 512, 1024)]:
    acc, same = [], 0
    for p, r in zip(ids, ar):
        g = eng.generate(p, m, b, 96)
        acc += g.accept_lengths
        same += g.output_ids == r
    out[f"{m}{b or ''}"] = {"tau": sum(acc) / len(acc), "rounds": len(acc), "same_as_ar": same}
    print(m, b, out[f"{m}{b or ''}"], flush=True)
print(json.dumps(out))
