"""The GPU fast loop as production runs it, against the plain loop: the trained toy drafter (tau ~6,
so deep accepted paths), the DFlash drafter's draft queued ahead of the host's read, accepted paths
that are not a prefix of the node order (KV compaction of a sibling path), stop ids, a request
cancelled from its streaming callback, and cache growth - on CUDA with graphs, Triton builders and
fused ops. The CPU tests (test_fastpath.py) use the random drafter (tau ~1) or an oracle proposer,
which drafts eagerly; this is the only test of the loop's production configuration.
Skips cleanly without CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [
    "Tom has 3 apples and buys 5 more. How many apples does he have?\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\ndef add(a, b):\n    \"\"\"Return a + b.\"\"\"\n\n```",
    "Tell me about the sea.",
]


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def toy():
    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.pair import load_pair

    pair = load_pair("toy", None, "ddtree", device="cuda")
    plain = pair.engine
    fast = Engine(plain.target, plain.drafter, cuda_graphs=True)
    ids = [pair.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    return pair, plain, fast, ids


def _same(a, b):
    assert a.output_ids == b.output_ids
    assert a.accept_lengths == b.accept_lengths
    assert a.finish_reason == b.finish_reason


def test_trained_drafter_with_draft_ahead_equals_the_plain_loop(toy, monkeypatch):
    from ddtree_bench.engine.gpu.loop import FastLoop

    pair, plain, fast, prompts = toy
    ahead = []
    launch = FastLoop._launch

    def spy(self, *a, **kw):
        ahead.append(launch(self, *a, **kw))
        return ahead[-1]

    monkeypatch.setattr(FastLoop, "_launch", spy)
    non_prefix, taus = 0, []
    for ids in prompts:
        for method, budget in (("dflash", 0), ("ddtree", 32), ("ddtree", 128)):
            a = plain.generate(ids, method, budget, 160, stop_ids=pair.stop_ids, record_trees=True)
            b = fast.generate(ids, method, budget, 160, stop_ids=pair.stop_ids, record_trees=True)
            _same(a, b)
            assert [t.accepted for t in a.trees] == [t.accepted for t in b.trees]
            non_prefix += sum(t.accepted != list(range(len(t.accepted))) for t in b.trees)
            taus.append(sum(b.accept_lengths) / len(b.accept_lengths))
    loop = fast.fast_loop()
    assert loop.graphs and loop.draft_stage is not None and loop.draft_stage.captured
    assert sum(ahead) >= len(ahead) // 2, "the DFlash drafter's draft is queued ahead in most rounds"
    assert non_prefix > 0, "some accepted paths are not a prefix of the node order"
    assert min(taus) > 2.0, taus   # a trained drafter: deep accepted paths


def test_stop_ids_inside_a_round_and_at_the_first_token(toy):
    pair, plain, fast, prompts = toy
    ids = prompts[0]
    ref = plain.generate(ids, "ddtree", 64, 120)
    for stop in (ref.output_ids[37], ref.output_ids[0]):
        for method, budget in (("dflash", 0), ("ddtree", 64)):
            a = plain.generate(ids, method, budget, 120, stop_ids=[stop])
            b = fast.generate(ids, method, budget, 120, stop_ids=[stop])
            _same(a, b)
            assert b.finish_reason == "stop" and b.output_ids[-1] == stop
    first = fast.generate(ids, "ddtree", 64, 120, stop_ids=[ref.output_ids[0]])
    assert first.output_ids == ref.output_ids[:1] and len(first.accept_lengths) == 1


def test_a_cancelled_request_leaves_the_loop_ready_for_the_next(toy):
    """serve cancels a request by raising from its on_chunk callback; in the fast loop the next
    round (and its draft) is already queued then. The next request must be unaffected."""
    pair, plain, fast, prompts = toy
    for method, budget in (("dflash", 0), ("ddtree", 32)):
        seen = []

        def cancel(tokens):
            seen.append(tokens)
            if len(seen) == 3:
                raise _Stop

        with pytest.raises(_Stop):
            fast.generate(prompts[1], method, budget, 160, stop_ids=pair.stop_ids, on_chunk=cancel)
        _same(plain.generate(prompts[2], method, budget, 120, stop_ids=pair.stop_ids),
              fast.generate(prompts[2], method, budget, 120, stop_ids=pair.stop_ids))


def test_cache_growth_mid_session_keeps_the_tokens(toy):
    pair, plain, fast, prompts = toy
    loop = fast.fast_loop()
    fast.generate(prompts[2], "ddtree", 32, 16, stop_ids=pair.stop_ids)
    small = loop.capacity
    long_prompt = prompts[0] * 6
    for method, budget in (("ddtree", 32), ("dflash", 0)):
        _same(plain.generate(long_prompt, method, budget, 200, stop_ids=pair.stop_ids),
              fast.generate(long_prompt, method, budget, 200, stop_ids=pair.stop_ids))
    assert loop.capacity > small
    _same(plain.generate(prompts[2], "ddtree", 32, 64, stop_ids=pair.stop_ids),
          fast.generate(prompts[2], "ddtree", 32, 64, stop_ids=pair.stop_ids))


WARM_PROBE = r'''
import json, sys
import torch, triton
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.gpu import loop as fast_loop
from ddtree_bench.pair import load_pair

fast_loop.WARM_ROUND = sys.argv[1] == "on"
pair = load_pair("toy", None, "ddtree", device="cuda")
fast = Engine(pair.engine.target, pair.engine.drafter, cuda_graphs=True)
ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me about the sea."}])
loop = fast.fast_loop()
loop._ensure(len(ids) + 256)   # no cache growth in the generates below (a new size re-makes the buckets)
seen = []
triton.knobs.runtime.jit_post_compile_hook = lambda *a, **kw: seen.append(getattr(kw.get("fn"), "name", "?"))
out = {}
for method, budget in (("ar", 0), ("dflash", 0), ("ddtree", 40)):
    n = len(seen)
    with torch.inference_mode():
        loop._bucket(method, budget, True, ctx_rows=len(ids))   # its builder checked, GEMMs and round warmed
    made, n = seen[n:], len(seen)
    fast.generate(ids, method, budget, 24)
    out[method] = {"bucket": made, "round": seen[n:]}
print(json.dumps(out))
'''


@pytest.mark.parametrize("arm", ["on", "off"])
def test_a_new_buckets_first_round_compiles_nothing_after_its_warm(arm):
    """FastLoop._warm_round compiles, as a bucket is made, every Triton kernel of its first round besides the tree
    build and the GEMMs (warmed apart): the eager draft from the prompt's rows, the captured draft, the tree compile,
    the verify forward's layer ops and attention, the argmax, the walk and the commit - so the bucket's first generate
    compiles nothing, for AR, DFlash and DDTree in turn. A fresh process (Triton's in-memory cache empty) counts every
    compile with Triton's post-compile hook. With the warm off (arm off) the first generates compile them themselves:
    what the test would miss if the warm left a variant out."""
    import json
    import subprocess
    import sys

    import triton

    if not hasattr(getattr(triton, "knobs", None), "runtime") or not hasattr(triton.knobs.runtime, "jit_post_compile_hook"):
        pytest.skip(f"Triton {triton.__version__} has no knobs.runtime.jit_post_compile_hook")
    p = subprocess.run([sys.executable, "-c", WARM_PROBE, arm], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for method in ("ar", "dflash", "ddtree"):
        if arm == "on":
            assert got[method]["bucket"] and got[method]["round"] == [], (method, got[method])
        elif method != "ddtree":   # (DDTree after DFlash may share every kernel but its builder's)
            assert got[method]["round"], (method, got[method])
