"""The counter cross-check compares like with like per engine (sweep/counters.py).

SGLang's counters count delivered tokens; its per-request histograms (and the client's a_r) count a last
round's tokens past max_tokens too. A correct SGLang run must show no disagreement, and a wrong one must.
"""

from __future__ import annotations

import pytest

from ddtree_bench.metrics import acceptance_length_token_weighted
from ddtree_bench.records import RequestRecord
from ddtree_bench.sweep import counters as C

SGLANG_METRICS = """\
sglang:generation_tokens_total{{is_streaming="true",model_name="toy"}} {g}
sglang:spec_verify_calls_total{{model_name="toy"}} {v}
"""


def _records(rounds_per_request: list[list[int]], max_tokens: int) -> list[RequestRecord]:
    """Records as a client keeps them: a_r from the server's histograms (untruncated), output cut at max_tokens."""
    out = []
    for i, rounds in enumerate(rounds_per_request):
        n_out = min(max_tokens, 1 + sum(rounds))
        out.append(RequestRecord(prompt_id=f"p{i}", output_ids=list(range(n_out)), num_output_tokens=n_out,
                                 accept_lengths=list(rounds), accept_lengths_source="histogram"))
    return out


def _sglang_window(records: list[RequestRecord], extra_verify: int = 0) -> dict:
    gen = sum(r.num_output_tokens for r in records)
    ver = sum(len(r.accept_lengths) for r in records) + extra_verify
    before = C.snapshot("sglang", SGLANG_METRICS.format(g=100.0, v=10.0))
    after = C.snapshot("sglang", SGLANG_METRICS.format(g=100.0 + gen, v=10.0 + ver))
    return C.server_acceptance("sglang", before, after, num_requests=len(records))


def test_a_correct_sglang_run_whose_last_rounds_overshoot_max_tokens_agrees_exactly():
    # 32 tokens asked; the last rounds accept 16 + 16 + 3 = 35 tokens after the prefill token: 4 past the limit
    recs = _records([[16, 16, 3], [8, 8, 8, 8], [2, 16, 16]], max_tokens=32)
    server = _sglang_window(recs)
    client = C.client_acceptance_length("sglang", recs)
    assert client == pytest.approx(server["acceptance_length_comparable"], abs=1e-12)
    cross = C.crosscheck(client, server, None)
    assert cross["agree"] is True and cross["rel_diff"] == pytest.approx(0.0, abs=1e-12)
    # the token-weighted τ (what is compared with the reference engine) counts the overshoot: the old check
    # compared it with the counters and flagged this correct run
    tau = acceptance_length_token_weighted(recs)
    assert tau > client
    assert C.crosscheck(tau, server, None)["agree"] is False


def test_an_sglang_server_that_counts_rounds_wrongly_disagrees():
    recs = _records([[4, 4, 4], [3, 5, 2, 6]], max_tokens=64)
    server = _sglang_window(recs, extra_verify=2)   # two verify calls the records never saw
    cross = C.crosscheck(C.client_acceptance_length("sglang", recs), server, None)
    assert cross["agree"] is False and cross["rel_diff"] > C.D.CROSSCHECK_REL_TOL


def test_other_engines_keep_the_token_weighted_definition():
    recs = _records([[16, 16, 3]], max_tokens=32)
    for kind in ("vllm", "standalone", None):
        assert C.client_acceptance_length(kind, recs) == acceptance_length_token_weighted(recs)
    assert set(C.CLIENT_DEFINITION) >= {"vllm", "standalone", "sglang"}


def test_records_without_rounds_give_no_sglang_figure():
    recs = [RequestRecord(prompt_id="p", output_ids=[1, 2], num_output_tokens=2)]
    assert C.client_acceptance_length("sglang", recs) is None
