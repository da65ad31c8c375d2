"""The oracles on the bundled toy hybrid pair (`--model toy-hybrid`, trained: its drafter accepts, so the
loops accept long paths for real): (a) every tree node vs transformers on its root path, (c) the flat
negative control fails, (b) AR / DFlash / DDTree loops with its own drafter equal transformers' greedy
`generate`, and DDTree accepts more per round than DFlash. Skips (saying so) only where the pair is not
bundled in this checkout."""

from __future__ import annotations

import pytest

from ddtree_bench.engine.generate import Engine
from ddtree_bench.pair import PACKAGE_DIR

TOY = PACKAGE_DIR / "models" / "toy-hybrid"


@pytest.fixture(scope="module")
def toy_world():
    if not (TOY / "target" / "config.json").exists():
        pytest.skip("the toy hybrid pair is not bundled in this checkout (ddtree_bench/models/toy-hybrid)")
    from hybrid_support import world_from_dirs

    return world_from_dirs("toy-hybrid", TOY / "target", TOY / "draft")


def test_per_node_oracle_and_negative_control_on_the_toy_hybrid(toy_world):
    from hybrid_support import ATOL, two_rounds

    errs, _, _ = two_rounds(toy_world, "depth")
    assert all(e <= ATOL for e in errs), f"max {max(errs)}"
    flat, _, _ = two_rounds(toy_world, "flat")
    bad = sum(1 for e in flat if not e <= ATOL)
    print(f"toy-hybrid: {len(errs)} nodes equal transformers (max {max(errs):.1e}); flat control: {bad} wrong")
    assert bad >= len(flat) // 4


def test_loops_with_the_trained_drafter_equal_transformers_greedy(toy_world):
    from ddtree_bench.tokenizer import ChatTokenizer

    tok = ChatTokenizer(TOY / "target")
    prompt = tok.apply_chat_template([{"role": "user", "content": "Natalia sold clips to 48 of her friends in April, "
                                       "and then she sold half as many clips in May. How many clips did she sell?"}])
    truth = toy_world.oracle_greedy(prompt, 64)
    eng = Engine(toy_world.target, toy_world.drafter)
    tau = {}
    for method, budget in (("ar", 0), ("dflash", 0), ("ddtree", 16), ("ddtree", 64)):
        g = eng.generate(prompt, method, budget=budget, max_new_tokens=64)
        assert g.output_ids == truth, f"{method} B={budget}"
        tau[(method, budget)] = sum(g.accept_lengths) / len(g.accept_lengths)
    print("toy-hybrid tau:", {f"{m} {b}": round(v, 2) for (m, b), v in tau.items()})
    assert tau[("ddtree", 64)] > tau[("dflash", 0)] > 1.0
