"""The draft-shortening rule that makes a llama.cpp run's acceptance comparable with the reference engine's."""

from __future__ import annotations

import pytest

from ddtree_bench.records import RequestRecord
from ddtree_bench.verdict.comparable_acceptance import shorten_records, shorten_to_budget, shortens_drafts


def simulate_server(full_rounds_accepted: list[int], n_max: int, block: int = 16) -> list[int]:
    """The slow obvious twin: run llama-server's loop (get_n_draft_max) on a stream whose drafts would accept
    `full_rounds_accepted[r]` tokens (bonus included) if the whole block were drafted."""
    out, g, r = [], 1, 0
    while g < n_max:
        d = min(block - 1, n_max - g - 1)
        if d <= 0:                 # no draft fits: one plain decoding step
            g += 1
            continue
        accepted = min(full_rounds_accepted[r] - 1, d)
        out.append(accepted + 1)
        g += accepted + 1
        r += 1
    return out


@pytest.mark.parametrize("n_max", [2, 3, 16, 17, 31, 32, 64])
@pytest.mark.parametrize("seed", range(20))
def test_rule_equals_the_servers_loop(n_max, seed):
    import random

    rng = random.Random(seed)
    rounds = [rng.randint(1, 16) for _ in range(64)]
    # the reference runs rounds while fewer than n_max tokens are out, each a whole block
    ref, g = [], 1
    for a in rounds:
        if g >= n_max:
            break
        ref.append(a)
        g += a
    assert shorten_to_budget(ref, n_max) == simulate_server(rounds, n_max)


def test_rule_is_idempotent_and_leaves_early_rounds_alone():
    ref = [16, 16, 5, 16]
    once = shorten_to_budget(ref, 40)
    assert once == [16, 16, 5, 2] and shorten_to_budget(once, 40) == once
    assert shorten_to_budget([16, 16], 1000) == [16, 16]


def test_records_and_run_flag():
    r = RequestRecord(prompt_id="p", turn=0, accept_lengths=[16, 16, 16])
    assert shorten_records([r], 32)[0].accept_lengths == [16, 15] and r.accept_lengths == [16, 16, 16]
    assert shortens_drafts({"backend": {"drafts_shortened_to_budget": True}})
    assert not shortens_drafts({"backend": {"kind": "vllm"}})
