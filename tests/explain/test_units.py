"""explain's pieces without a server: curves and partings, variant names, the reference variant
being the reference bit for bit, one drafter-side and one proposer-side variant changing acceptance,
and the classic config faults caught from files alone."""

from __future__ import annotations

import json
import shutil

import pytest

from ddtree_bench.engine.draft_variants import REFERENCE, DraftVariant, parse_variant
from ddtree_bench.explain.config_check import check_pair, diff_configs
from ddtree_bench.explain.curves import Acceptance, curve_distance, first_parting, rates_by_depth, round_agreement
from ddtree_bench.pair import TOY_DIR


def test_rates_and_distance():
    assert rates_by_depth([1, 2, 3, 3], 3) == [0.75, 0.5, 0.0]
    assert curve_distance([0.5, 0.5], [0.5, 0.5]) == 0.0
    assert curve_distance([1.0, 0.0], [0.0, 0.0]) == pytest.approx((0.5) ** 0.5)
    assert curve_distance([0.2], [0.2, 0.2]) == pytest.approx((0.04 / 2) ** 0.5)  # padded with zeros


def test_first_parting_names_round_depth_and_token():
    out = list(range(100, 120))
    p = first_parting(("q", 0), [3, 2, 1], [3, 4, 1], out, out)
    # round 1 starts after output[0..3]; depth 2 was accepted by the reference only; it drafted output[3 + 2]
    assert (p.round, p.depth, p.output_index, p.token_id, p.a, p.b) == (1, 2, 5, 105, 2, 4)
    assert p.first_output_difference is None
    same = first_parting(("q", 0), [2, 2], [2, 2], out[:4], out[:4])
    assert same.round is None
    a = Acceptance("a", {("q", 0): [3, 2, 1]})
    b = Acceptance("b", {("q", 0): [3, 4, 1]})
    ra = round_agreement(a, b, [("q", 0)])
    assert ra["leading_rounds_matched"] == 1 and ra["requests_identical"] == 0


def test_variant_names_parse_and_describe():
    v = parse_variant("layer_ids+1")
    assert v.target_layer_id_offset == 1 and v.changes() == {"target_layer_id_offset": 1}
    assert parse_variant("ctx_k_norm=layer0").context_k_norm_layer == 0
    assert parse_variant("reference").is_reference
    assert "causal" in parse_variant("causal").describe()
    with pytest.raises(ValueError, match="unknown drafter variant"):
        parse_variant("layer_ids")
    assert DraftVariant(causal=True).layer_attention(False, None) == (True, None)
    assert DraftVariant(ignore_sliding_window=True).layer_attention(True, 64) == (True, None)


@pytest.fixture(scope="module")
def toy():
    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites.prompts import load_suite

    pair = load_pair("toy", None, "dflash")
    prompts = load_suite("gsm8k", 2).prompts
    ids = [pair.tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    return pair, ids


def _run(pair, ids, variant):
    from ddtree_bench.explain.replay import ReplayRequest, replay

    reqs = [ReplayRequest((str(i), 0), x, 40) for i, x in enumerate(ids)]
    return replay(pair.engine, reqs, "dflash", 64, list(pair.stop_ids), variant).acceptance


def test_reference_variant_is_the_reference_engine(toy):
    pair, ids = toy
    acc = _run(pair, ids, REFERENCE)
    for i, x in enumerate(ids):
        g = pair.engine.generate(x, method="dflash", max_new_tokens=40, stop_ids=list(pair.stop_ids))
        assert acc.rounds[(str(i), 0)] == g.accept_lengths
        assert acc.outputs[(str(i), 0)] == g.output_ids


@pytest.mark.parametrize("name", ["ctx_k_norm=layer0", "layer_ids-1"])
def test_variants_change_acceptance_not_outputs(toy, name):
    """A deviating drafter only proposes worse: greedy outputs stay the target's, acceptance falls."""
    pair, ids = toy
    ref, var = _run(pair, ids, REFERENCE), _run(pair, ids, parse_variant(name))
    assert var.outputs == ref.outputs
    assert var.tau() < ref.tau()
    assert pair.engine.drafter.variant is None  # the shared drafter is left as it was


def _rig(tmp_path, name, **changes):
    d = tmp_path / name
    shutil.copytree(TOY_DIR / "draft", d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if k in ("mask_token_id", "target_layer_ids"):
            cfg["dflash_config"][k] = v
        elif v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_config_faults_are_caught_from_files(tmp_path):
    target = TOY_DIR / "target"
    assert [f for f in check_pair(TOY_DIR / "draft", target) if f.severity == "error"] == []
    codes = lambda d: {f.code for f in check_pair(d, target)}  # noqa: E731
    assert "layer_ids_vs_fc" in codes(_rig(tmp_path, "ids4", target_layer_ids=[0, 1, 2, 3]))
    assert "layer_ids_range" in codes(_rig(tmp_path, "ids9", target_layer_ids=[1, 2, 9]))
    assert "mask_is_special" in codes(_rig(tmp_path, "eos", mask_token_id=258))
    assert "mask_range" in codes(_rig(tmp_path, "big", mask_token_id=5000))
    assert "layer_types_len" in codes(_rig(tmp_path, "types", layer_types=["full_attention"] * 3))
    assert "sliding_window_missing" in codes(_rig(tmp_path, "swa", layer_types=["sliding_attention", "full_attention"]))
    assert "num_layers" in codes(_rig(tmp_path, "layers", num_hidden_layers=3, layer_types=None))


def test_config_diff_names_the_variant(tmp_path):
    diff = diff_configs(TOY_DIR / "draft", _rig(tmp_path, "shift", target_layer_ids=[2, 3, 4], is_causal=True))
    named = {f.variant for f in diff}
    assert {"layer_ids+1", "causal"} <= named


def _row(name, distance, changes):
    return {"name": name, "distance": distance, "changes": changes, "tau": 3.0, "description": name, "round_agreement": None}


@pytest.mark.parametrize("rows,status,variant", [
    ([_row("reference", 0.01, {})], "matches", "reference"),
    ([_row("causal", 0.0, {"causal": True}), _row("reference", 0.1, {})], "explained", "causal"),
    ([_row("causal", 0.01, {"causal": True}), _row("layer_ids-1", 0.012, {"target_layer_id_offset": -1}),
      _row("reference", 0.1, {})], "ambiguous", "causal"),
    ([_row("causal", 0.05, {"causal": True}), _row("reference", 0.1, {})], "unexplained", None),
    ([_row("causal", 0.02, {"causal": True}), _row("reference", 0.035, {})], "unexplained", None),  # not half the reference's
])
def test_verdict_rules(rows, status, variant):
    from ddtree_bench.explain.analyse import _verdict

    ref = next(r for r in rows if not r["changes"])
    res = {"server": {"tau": 3.0}, "depth_gap": {"largest_depth": 2, "largest": -0.2}}
    v = _verdict(res, sorted(rows, key=lambda r: r["distance"]), ref, [])
    assert v["status"] == status and v["variant"] == variant
    if status == "unexplained":
        assert v["nearest"] == "causal" and "depth 2" in v["text"]


def test_replay_reports_the_chain_drafted_at_each_depth(toy):
    """drafted[r][d-1] is the token the reference drafted at depth d of round r: accepted depths equal the output."""
    from ddtree_bench.explain.replay import ReplayRequest, replay

    pair, ids = toy
    res = replay(pair.engine, [ReplayRequest(("0", 0), ids[0], 40)], "dflash", 64, list(pair.stop_ids), REFERENCE)
    rounds, out, chains = res.acceptance.rounds[("0", 0)], res.acceptance.outputs[("0", 0)], res.drafted[("0", 0)]
    s = 0
    for r, a in enumerate(rounds):
        for d in range(1, a):
            if s + d < len(out):
                assert chains[r][d - 1] == out[s + d]
        if a < len(chains[r]) + 1 and s + a < len(out):
            assert chains[r][a - 1] != out[s + a]  # the first rejected depth drafted something else
        s += a


def test_round_agreement_breaks_a_curve_tie():
    from ddtree_bench.explain.analyse import _verdict

    a = {**_row("layer_ids+1", 0.010, {"target_layer_id_offset": 1}), "round_agreement": {"leading_round_share": 1.0, "requests_identical": 3, "requests": 3}}
    b = {**_row("layer_ids-1", 0.012, {"target_layer_id_offset": -1}), "round_agreement": {"leading_round_share": 0.02}}
    ref = _row("reference", 0.13, {})
    res = {"server": {"tau": 3.0}, "depth_gap": {}}
    assert _verdict(res, [a, b, ref], ref, [])["status"] == "explained"
    b["round_agreement"]["leading_round_share"] = 0.9
    assert _verdict(res, [a, b, ref], ref, [])["status"] == "ambiguous"


def test_a_served_drafter_whose_layer_ids_leave_the_target_is_named_so(tmp_path):
    """--server-draft with target_layer_ids [1, 3, 99] on an 8-layer target: the diff against the reference's ids and
    the served drafter's own fault (99 is no layer of the target)."""
    import json
    import shutil

    from ddtree_bench.explain.analyse import _config_findings
    from ddtree_bench.pair import BUNDLED

    pair = BUNDLED["toy-hybrid"]
    served = shutil.copytree(pair / "draft", tmp_path / "served")
    cfg = json.loads((served / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 3, 99]
    (served / "config.json").write_text(json.dumps(cfg))
    found = {f.code: f for f in _config_findings(pair / "target", pair / "draft", str(served))}
    assert "server_layer_ids" in found and found["server_layer_ids_range"].severity == "error"
    assert "the server's drafter: target_layer_ids [1, 3, 99] has [99] outside the target's 8 layers" in found["server_layer_ids_range"].message
