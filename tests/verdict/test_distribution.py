"""The T > 0 distribution verdict's statistics (verdict/distribution.py) on synthetic data: the PIT's
fast and slow twins agree, the KS p-value matches known values, the 1% false-alarm rate holds on
tokens sampled by the engine's own rule (near-degenerate rows included), and the rule's gate wiring
says NOT JUDGED where no reference can score the run. The toy-pair runs are in test_distribution_toy.py."""

from __future__ import annotations

import math
import random

import pytest
import torch

from baseline_support import STOP, baseline_file, cli, entry, record, run_dir
from ddtree_bench.engine.verify import pick
from ddtree_bench.verdict import distribution as dist

OUT = [10, 11, 12, 13, STOP]


def _logits(n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Rows from flat to near-degenerate: N(0, 1) logits times a scale log-uniform in [0.3, 30]."""
    scale = torch.exp(torch.empty(n, 1, dtype=torch.float64).uniform_(math.log(0.3), math.log(30.0), generator=gen))
    return (torch.randn(n, vocab, generator=gen, dtype=torch.float64) * scale).float()


def test_pit_fast_equals_slow_twin_with_ties_top_p_and_degenerate_rows():
    gen = torch.Generator().manual_seed(1)
    logits = _logits(60, 12, gen)
    logits[:5, 3:6] = logits[:5, 3:4]           # exact ties: ordered by token id
    logits[5:10] = 0.0                          # a flat row: everything tied
    logits[10:15, 0] = 80.0                     # near-degenerate
    for t, top_p in ((1.0, 1.0), (0.7, 0.9), (1.3, 0.5)):
        q = dist.tempered_probs(logits, t, top_p)
        assert torch.allclose(q.sum(-1), torch.ones(60, dtype=torch.float64))
        toks = pick(logits, t, top_p, torch.Generator().manual_seed(2))
        v = torch.rand(60, generator=gen, dtype=torch.float64)
        u, outside = dist.pit_values(q, toks, v)
        assert not outside.any()  # the engine's own picks are inside its nucleus
        for i in range(60):
            assert u[i].item() == pytest.approx(dist.pit_value_slow(q[i].tolist(), int(toks[i]), float(v[i])), abs=1e-12)
    # a token the nucleus excludes: outside the support, u = the whole kept mass
    q = dist.tempered_probs(torch.tensor([[5.0, 4.0, -9.0]]), 1.0, 0.5)
    u, outside = dist.pit_values(q, torch.tensor([2]), torch.tensor([0.3], dtype=torch.float64))
    assert outside.tolist() == [True] and u.item() == pytest.approx(1.0)


def test_ks_pvalue_known_values():
    # n = 1: D = max(u, 1 - u), so P(D >= d) = 2 (1 - d) for d >= 1/2
    for d in (0.55, 0.7, 0.93):
        p, how = dist.ks_pvalue(d, 1)
        assert how == "exact" and p == pytest.approx(2 * (1 - d), abs=1e-12)
    # Massey (1951)'s two-sided critical values: n = 10 at 5% 0.409, at 1% 0.490 (three decimals)
    assert dist.ks_pvalue(0.409, 10)[0] == pytest.approx(0.05, abs=0.002)
    assert dist.ks_pvalue(0.490, 10)[0] == pytest.approx(0.01, abs=0.0005)
    # exact and the Stephens-corrected limit agree at large n; the far tail goes asymptotic
    for n, d in ((576, 0.0678), (2000, 0.036), (576, 0.13)):
        p, how = dist.ks_pvalue(d, n)
        assert how == "exact" and p == pytest.approx(dist.kolmogorov_sf(d, n), rel=0.06)
    assert dist.ks_pvalue(0.5, 576)[1] == "asymptotic" and dist.ks_pvalue(0.5, 576)[0] < 1e-15
    assert dist.ks_pvalue(0.0, 5)[0] == 1.0 and dist.ks_pvalue(1.0, 5)[0] == 0.0
    d, dp, dm = dist.ks_statistic([0.1, 0.2, 0.3])  # ECDF 1/3, 2/3, 1 at 0.1, 0.2, 0.3: D+ = 1 - 0.3
    assert d == pytest.approx(0.7) and dp == pytest.approx(0.7) and dm == pytest.approx(0.1)


def _rejections(u: torch.Tensor, runs: int, alpha: float = dist.FALSE_ALARM_RATE) -> int:
    return sum(dist.ks_uniform(row.tolist()).p_value < alpha for row in u.reshape(runs, -1))


def test_false_alarm_rate_is_one_percent_on_engine_sampled_tokens():
    """2,000 runs of 200 tokens, each token sampled by the engine's `pick` from rows that range from flat to
    near-degenerate, half of them at T = 0.7 with top_p 0.9: an honest sampler is rejected at 1%.
    Rejections ~ Binomial(2000, 0.01): mean 20, sd 4.4; the band [8, 35] is beyond 2.7 sd either side
    (and the data are seeded, so the count is the same on every run). With the midpoint PIT
    (V = 1/2 instead of a uniform V) the same data are rejected far more often: V keeps it exact."""
    runs, n, vocab = 2000, 200, 24
    gen = torch.Generator().manual_seed(0)
    logits = _logits(runs * n, vocab, gen)
    half = runs * n // 2
    toks = torch.cat([pick(logits[:half], 1.0, 1.0, gen), pick(logits[half:], 0.7, 0.9, gen)])
    q = torch.cat([dist.tempered_probs(logits[:half], 1.0, 1.0), dist.tempered_probs(logits[half:], 0.7, 0.9)])
    v = torch.rand(runs * n, generator=gen, dtype=torch.float64)
    u, outside = dist.pit_values(q, toks, v)
    assert not outside.any()
    rejected = _rejections(u, runs)
    assert 8 <= rejected <= 35, rejected
    midpoint, _ = dist.pit_values(q, toks, torch.full_like(v, 0.5))
    assert _rejections(midpoint, runs) > 10 * rejected


def test_wrong_sampling_is_rejected_on_synthetic_rows():
    """Greedy, too cold, too hot and an ignored top-p, labelled T = 1 (top_p 0.6 for the last), at 576 tokens."""
    gen = torch.Generator().manual_seed(3)
    logits = _logits(576, 24, gen)
    v = torch.rand(576, generator=gen, dtype=torch.float64)
    cases = {"greedy": (pick(logits, 0.0), 1.0, "low"), "T=0.5": (pick(logits, 0.5, 1.0, gen), 1.0, "low"),
             "T=2": (pick(logits, 2.0, 1.0, gen), 1.0, "high"), "top_p ignored": (pick(logits, 1.0, 1.0, gen), 0.6, "high")}
    for name, (toks, top_p, skew) in cases.items():
        u, _ = dist.pit_values(dist.tempered_probs(logits, 1.0, top_p), toks, v)
        ks = dist.ks_uniform(u.tolist())
        assert ks.p_value < dist.FALSE_ALARM_RATE and ks.skew == skew, (name, ks)
    honest, _ = dist.pit_values(dist.tempered_probs(logits, 1.0, 1.0), pick(logits, 1.0, 1.0, gen), v)
    assert dist.ks_uniform(honest.tolist()).p_value >= dist.FALSE_ALARM_RATE


def test_v_stream_is_per_request_and_seeded():
    a = [dist.v_generator("p1", 0).random() for _ in range(3)]
    assert a == [dist.v_generator("p1", 0).random() for _ in range(3)]
    assert a != [dist.v_generator("p1", 1).random() for _ in range(3)]
    assert dist.cut_after_stop([1, STOP, 2, 3], [STOP]) == [1, STOP] and dist.cut_after_stop([1, 2], [STOP]) == [1, 2]
    assert dist.histogram([0.0, 0.05, 0.5, 1.0], bins=4) == [2, 0, 1, 1]


def test_gate_says_not_judged_where_no_reference_can_score(tmp_path, capsys):
    """A baseline whose model the reference engine cannot load (here a made-up name; in practice a
    server baseline): the rule is NOT JUDGED, a warning by default, a failure with sampling_not_judged: fail."""
    base = baseline_file(tmp_path / "b.jsonl", [entry("a", OUT), entry("b", OUT)])
    run = run_dir(tmp_path / "t1", [record("a", OUT[:3] + [20, STOP]), record("b", OUT)], temperature=1.0)
    code, out, _ = cli(["gate", run, "--baseline", base], capsys)
    assert code == 0 and "WARN  sampling_distribution" in out and "NOT JUDGED: the reference engine cannot score the run" in out
    assert "gate: PASSED (NOT JUDGED: sampling_distribution)" in out
    strict = tmp_path / "strict.yaml"
    strict.write_text("correctness:\n  sampling_not_judged: fail\n")
    code, out, err = cli(["gate", run, "--baseline", base, "--rules", strict], capsys)
    assert code == 1 and "sampling_distribution" in err
    server = baseline_file(tmp_path / "s.jsonl", [entry("a", OUT), entry("b", OUT)], source="server")
    code, out, _ = cli(["compare", run, "--baseline", server, "--json"], capsys)
    import json

    d = json.loads(out)["distribution"]
    assert code == 0 and d["judged"] is False and "not from the reference engine" in d["reason"]
    off = tmp_path / "off.yaml"
    off.write_text("correctness:\n  sampling_distribution: false\n")
    code, out, _ = cli(["gate", run, "--baseline", base, "--rules", off], capsys)
    assert code == 0 and "SKIP  sampling_distribution" in out
    greedy = run_dir(tmp_path / "t0", [record("a", OUT), record("b", OUT)])
    code, out, _ = cli(["gate", greedy, "--baseline", base], capsys)
    assert code == 0 and "sampling_distribution" not in out  # T = 0: the token rules judge
    for bad in ("sampling_alpha: 1.5", "sampling_not_judged: maybe", "sampling_distribution: 1"):
        (tmp_path / "bad.yaml").write_text(f"correctness:\n  {bad}\n")
        code, _, err = cli(["gate", run, "--baseline", base, "--rules", tmp_path / "bad.yaml"], capsys)
        assert code == 2 and err.startswith("error: ") and bad.split(":")[0] in err


def test_random_seed_independence_of_v_from_order():
    """The same request scored in another order gets the same V (its stream is keyed by prompt and turn)."""
    rng = random.Random(0)
    ids = [(f"p{i}", i % 2) for i in range(5)]
    first = {k: dist.v_generator(*k).random() for k in ids}
    rng.shuffle(ids)
    assert {k: dist.v_generator(*k).random() for k in ids} == first


def test_requests_without_the_servers_own_ids_are_not_scored():
    """Re-tokenized text need not be the token sequence the server sampled; failed requests are the
    request_errors rule's. With nothing left the verdict is 'not judged' (no model forward is needed to say so)."""
    import dataclasses

    retok = dataclasses.replace(record("a", OUT), token_source="retokenized")
    rep = dist.score_records(None, [retok, record("b", None, error="timeout"), record("c", None)], 1.0, 1.0, [STOP])
    assert not rep.judged and rep.num_requests_unscored == 2 and rep.num_requests == 0 and "re-tokenized" in rep.warnings[0]


def test_honest_runs_at_other_seeds_false_alarm_at_about_the_stated_rate():
    """The toy target sampled honestly at T = 1, one gsm8k prompt x 8 tokens, 60 runs at seeds 0..59, each judged
    as `gate` judges it (V seeded with the run's --seed): at alpha = 0.01 about 0.6 false alarms are expected
    (P(>= 4) < 0.4%). With one V for every run of a prompt, 51 of 200 such runs failed (2026-12-08): u ~ V on
    near-degenerate rows, and that V was an unlucky draw for every run alike."""
    from types import SimpleNamespace

    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites.prompts import load_suite

    pair = load_pair("toy", None, "ar")
    prompt = load_suite("gsm8k", 1).prompts[0]
    ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": prompt.turns[0]}])
    alarms = 0
    for s in range(60):
        g = pair.engine.generate(ids, method="ar", max_new_tokens=8, temperature=1.0, seed=s, stop_ids=pair.stop_ids)
        rec = SimpleNamespace(ok=True, prompt_ids=ids, output_ids=list(g.output_ids), token_source="server",
                              prompt_id=prompt.prompt_id, turn=0)
        rep = dist.score_records(pair.engine.target, [rec], 1.0, 1.0, pair.stop_ids, dist.run_pit_seed({"spec": {"seed": s}}))
        alarms += rep.p_value < 0.01
    assert alarms <= 3, alarms


def test_a_token_outside_the_vocabulary_scores_as_impossible_not_a_crash():
    from types import SimpleNamespace

    from ddtree_bench.pair import load_pair

    pair = load_pair("toy", None, "ar")
    ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    rec = SimpleNamespace(ok=True, prompt_ids=ids, output_ids=[104, 105, 99999, 106], token_source="server", prompt_id="p", turn=0)
    rep = dist.score_records(pair.engine.target, [rec], 1.0, 1.0, pair.stop_ids)
    assert rep.judged and rep.num_outside_support == 1 and any("99999 is outside the model's vocabulary" in w for w in rep.warnings)
