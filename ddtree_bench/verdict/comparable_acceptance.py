"""Acceptance lengths of a server that shortens its last drafts to the token budget, made comparable with the
reference engine's.

llama.cpp's llama-server drafts at most `max_tokens - generated - 1` tokens (`get_n_draft_max`): near the
end of a request its drafts are shorter than the drafter's block, and when one token is left it decodes
it without a draft (no verify round). The reference engine always drafts a whole block and cuts the
output afterwards (engine/generate.py, the last-round rule). The rounds before the end are the same on
both sides; the last ones are not, so the raw τ of the two differ by construction (on gsm8k, 32
tokens: 4.69 vs 4.75) even when the server is exactly right.

The definition used (`shorten_to_budget`): the rounds the reference *would* record under the server's
rule. Walk a request's rounds with g = tokens out so far (1 after the prefill's token), N =
max_new_tokens:

    a round that starts with g >= N - 1 is dropped  (no draft fits: a plain decoding step, not a round)
    otherwise a'_r = min(a_r, N - g);  g += a'_r     (a draft of N - g - 1 tokens accepts at most that many,
                                                      plus the bonus token)

For greedy decoding the drafter proposes the same tokens at the same positions on both sides (the shorter
draft is the longer one's prefix), so a correct server's rounds equal the transformed reference rounds
one for one. The rule is idempotent: applied to the server's own rounds it changes nothing, so
`compare` applies it to both sides whenever the run's backend says it shortens drafts
(`drafts_shortened_to_budget` in run.json's backend description: llama.cpp), and every acceptance figure
compare and gate report for such a run (τ, token-weighted τ, per-depth rates, histograms) is over the
transformed rounds; `acceptance.definition` says so. A stop token inside a round ends the request on
both sides alike (accepted drafts past it are counted by both).
Knows acceptance lengths and records; nothing of servers or HTTP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ddtree_bench.records import RequestRecord

DEFINITION = ("rounds as a server that shortens each draft to the remaining token budget records them "
              "(verdict/comparable_acceptance.py): a'_r = min(a_r, N - g), no round once g >= N - 1")


def shorten_to_budget(accept_lengths: Sequence[int], max_new_tokens: int) -> list[int]:
    """The rounds a budget-shortening server records for these full-draft rounds (module docstring)."""
    out: list[int] = []
    g = 1
    for a in accept_lengths:
        if g >= max_new_tokens - 1:
            break
        a2 = min(int(a), max_new_tokens - g)
        out.append(a2)
        g += a2
    return out


def shorten_records(records: Sequence[RequestRecord], max_new_tokens: int) -> list[RequestRecord]:
    """Copies of `records` whose accept_lengths follow `shorten_to_budget` (records without rounds unchanged)."""
    return [dataclasses.replace(r, accept_lengths=shorten_to_budget(r.accept_lengths, max_new_tokens))
            if r.accept_lengths else r for r in records]


def shortens_drafts(run_info: dict) -> bool:
    """Does the run's backend shorten its drafts to the token budget (run.json backend description)?"""
    return bool((run_info.get("backend") or {}).get("drafts_shortened_to_budget"))
