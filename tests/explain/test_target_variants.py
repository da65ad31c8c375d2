"""explain's target-side variants: on a hybrid (Gated DeltaNet) target, a run made with
`--target-variant gdn-crop` (what transformers' Cache.crop does: rejected drafts left in the recurrent
state, z-lab/dflash#172) is not lossless, and explain must name `gdn-crop` as the cause; the exact run
still `matches`. On a dense target the catalog has no target variants and asking for one is exit 2.

The hybrid is a random tiny qwen3_5 pair (tests/hybrid_support.py) with a peaked target, so its greedy
outputs are stable; explain is told nothing of the variant the run used.
"""

from __future__ import annotations

import json

import pytest

from engine_support import one_torch_thread  # noqa: F401 (fixture)
from hybrid_support import random_hybrid_dir
from process_support import cli_in_process as cli

COMMON = ("--suite", "gsm8k", "--limit", "3", "--max-new-tokens", "24", "--quiet")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return random_hybrid_dir(tmp_path_factory.mktemp("hy"), "qwen3_5", layer_types=[
        "linear_attention", "full_attention", "linear_attention", "linear_attention"], logit_scale=30.0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dflash", "ddtree"])
def test_a_gdn_crop_run_is_explained_by_gdn_crop(hybrid, tmp_path, capsys, method):
    pair = ("--model", str(hybrid.target), "--draft", str(hybrid.draft), "--method", method, "--budget", "8")
    bad, ok = tmp_path / "crop", tmp_path / "exact"
    cli(capsys, "run", *pair, "--target-variant", "gdn-crop", "--out", str(bad), *COMMON)
    cli(capsys, "run", *pair, "--out", str(ok), *COMMON)

    out = cli(capsys, "explain", str(bad), "--quiet")  # the default catalog
    res = json.loads((bad / "explain.json").read_text())
    v = res["verdict"]
    assert v["status"] == "explained" and v["variant"] == "gdn-crop", v
    assert "not lossless" in v["text"] and "Gated DeltaNet" in v["fix"] and "gdn-crop" in out.stdout
    row = next(r for r in res["variants"] if r["name"] == "gdn-crop")
    assert row["side"] == "target" and row["scored_by"] == "replay"
    assert row["outputs_equal_to_server"] == 3 and row["round_agreement"]["requests_identical"] == 3
    assert res["reference"]["outputs_equal_to_server"] < 3

    cli(capsys, "explain", str(ok), "--quiet", "--variants", "reference,causal,gdn-crop")
    res = json.loads((ok / "explain.json").read_text())
    assert res["verdict"]["status"] == "matches"
    assert next(r for r in res["variants"] if r["name"] == "gdn-crop")["outputs_equal_to_server"] < 3


def test_dense_targets_have_no_target_variants(tmp_path, capsys):
    run = tmp_path / "dense"
    cli(capsys, "run", "--model", "toy", "--method", "dflash", "--out", str(run), "--suite", "gsm8k", "--limit", "1",
        "--max-new-tokens", "16", "--quiet")
    p = cli(capsys, "explain", str(run), "--quiet", "--variants", "gdn-crop", check=False)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "hybrid" in p.stderr and "Traceback" not in p.stderr
    cli(capsys, "explain", str(run), "--quiet", "--variants", "reference,causal")
    res = json.loads((run / "explain.json").read_text())
    assert [r["name"] for r in res["variants"]] != [] and not any(r.get("side") == "target" for r in res["variants"])
    from ddtree_bench.explain.analyse import _split_variants

    assert _split_variants(None, is_hybrid=False) == (None, [])
    assert [v.name for v in _split_variants(None, is_hybrid=True)[1]] == ["gdn-crop"]
