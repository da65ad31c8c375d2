"""`ddtree-bench explain` on rigged deployments: a drafter with a known deviation, served by a real
`ddtree-bench serve` process or run in-process, must be recognised and named; a faithful run must
come out as `matches`; bad input is exit 2 with one error line.

The rigged drafters are the toy drafter with one config change (the weights are the toy's), so the
deviation is exactly one DraftVariant; explain is told only the correct drafter. The CLI calls run
in this process (`cli_in_process`, torch on one thread); the served drafter is a real server process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddtree_bench.pair import TOY_DIR
from engine_support import one_torch_thread  # noqa: F401 (fixture)
from process_support import cli_in_process as cli

VARIANTS = "reference,causal,layer_ids+1,layer_ids-1,ctx_k_norm=layer0"
RUN_ARGS = ("--method", "dflash", "--suite", "gsm8k", "--limit", "3", "--max-new-tokens", "48", "--quiet")


def rig(tmp_path: Path, name: str, **changes) -> Path:
    d = tmp_path / name
    shutil.copytree(TOY_DIR / "draft", d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if k == "target_layer_ids":
            cfg["dflash_config"][k] = v
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def explain(capsys, run: Path, *extra: str) -> dict:
    p = cli(capsys, "explain", str(run), "--draft", str(TOY_DIR / "draft"), "--variants", VARIANTS, "--quiet", *extra)
    assert "verdict:" in p.stdout
    return json.loads((run / "explain.json").read_text())


@pytest.mark.slow
def test_served_drafter_with_shifted_layer_ids_is_named(tmp_path, capsys):
    from http_support import ServeProcess

    shifted = rig(tmp_path, "shifted", target_layer_ids=[2, 3, 4])
    srv = ServeProcess("--model", "toy", "--draft", str(shifted), "--method", "dflash", startup_timeout_s=300).wait_ready()
    try:
        run = tmp_path / "served"
        cli(capsys, "run", "--backend", "standalone", "--url", srv.url, "--model", "toy", "--out", str(run), *RUN_ARGS)
    finally:
        srv.terminate()
    res = explain(capsys, run)
    assert res["verdict"]["status"] == "explained", res["verdict"]
    assert res["verdict"]["variant"] == "layer_ids+1"
    best = res["variants"][0]
    assert best["name"] == "layer_ids+1" and best["distance"] == 0.0
    assert best["round_agreement"]["requests_identical"] == 3
    assert res["reference"]["distance"] > 0.03
    assert res["parting"]["requests_parted"] >= 1 and res["parting"]["first"]["depth"] >= 1


@pytest.mark.slow
def test_in_process_causal_drafter_is_named_and_its_config_diff_too(tmp_path, capsys):
    causal = rig(tmp_path, "causal", is_causal=True)
    run = tmp_path / "causal-run"
    cli(capsys, "run", "--model", "toy", "--draft", str(causal), "--out", str(run), *RUN_ARGS)
    res = explain(capsys, run, "--server-draft", str(causal))
    assert res["verdict"]["status"] == "explained", res["verdict"]
    assert res["verdict"]["variant"] == "causal"
    assert res["variants"][0]["name"] == "causal"
    assert any(f["code"] == "server_causal" and f["variant"] == "causal" for f in res["config_findings"])
    assert "bidirectional" in res["verdict"]["fix"]


@pytest.mark.slow
def test_faithful_run_matches_and_the_report_shows_it(tmp_path, capsys):
    run = tmp_path / "faithful"
    cli(capsys, "run", "--model", "toy", "--out", str(run), *RUN_ARGS)
    res = explain(capsys, run)
    assert res["verdict"]["status"] == "matches"
    assert res["reference"]["distance"] == 0.0
    assert res["parting"]["requests_parted"] == 0
    html = tmp_path / "r.html"
    cli(capsys, "report", str(run), "--out", str(html))
    page = html.read_text(encoding="utf-8")
    assert 'id="explain"' in page and "accepts like z-lab" in page and "&lt;h3&gt;" not in page
    nested = tmp_path / "not" / "yet" / "x.json"   # --out's directories are made, after the replay as before it
    cli(capsys, "explain", str(run), "--draft", str(TOY_DIR / "draft"), "--variants", "reference", "--limit", "1",
        "--quiet", "--out", str(nested))
    assert json.loads(nested.read_text())["verdict"]["status"] == "matches"
    p = cli(capsys, "explain", str(run), "--model", "toy-hybrid", "--quiet", check=False)   # not the run's target
    assert p.returncode == 2 and "is not the run's toy" in p.stderr and "--allow-model-mismatch" in p.stderr, p.stderr
    cli(capsys, "explain", str(run), "--model", "toy-hybrid", "--variants", "reference", "--limit", "1", "--quiet",
        "--allow-model-mismatch", "--out", str(nested))
    assert [f["code"] for f in json.loads(nested.read_text())["config_findings"]] == ["model_mismatch"]
    info = json.loads((run / "run.json").read_text())   # labelled by the --method default of an unlabelled server
    info["spec"]["extra"] = {**(info["spec"].get("extra") or {}),
                             "labels_from": {"source": "--method default (the server does not say)", "method": "dflash"}}
    (run / "run.json").write_text(json.dumps(info))
    cli(capsys, "explain", str(run), "--variants", "reference", "--limit", "1", "--quiet", "--out", str(nested))
    found = json.loads(nested.read_text())["config_findings"]
    assert [f["code"] for f in found] == ["method_unlabelled"] and "re-run with the server's --method" in found[0]["message"]


@pytest.mark.slow
def test_a_server_that_shortens_its_last_drafts_matches_under_its_rule(tmp_path, capsys):
    """A correct llama.cpp-like server: the reference's rounds with the last drafts cut to the token budget
    (verdict/comparable_acceptance.py). explain puts the reference's rounds under the same rule, so the run
    matches round for round; on raw rounds the last ones differ by construction and a variant could win."""
    from ddtree_bench.verdict.comparable_acceptance import shorten_to_budget

    run = tmp_path / "lcpp"
    cli(capsys, "run", "--model", "toy", "--out", str(run), *RUN_ARGS)
    info = json.loads((run / "run.json").read_text())
    info["backend"] = {**(info.get("backend") or {}), "drafts_shortened_to_budget": True}
    (run / "run.json").write_text(json.dumps(info))
    lines = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    changed = 0
    for rec in lines:
        short = shorten_to_budget(rec["accept_lengths"], 48)
        changed += short != rec["accept_lengths"]
        rec["accept_lengths"] = short
    assert changed, "the requests must reach the budget for the rule to matter"
    (run / "records.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = explain(capsys, run)
    assert res["acceptance_definition"].startswith("rounds as a server that shortens")
    assert res["verdict"]["status"] == "matches", res["verdict"]
    assert res["reference"]["distance"] == 0.0 and res["parting"]["requests_parted"] == 0


def test_bad_input_is_exit_2(tmp_path, capsys):
    p = cli(capsys, "explain", str(tmp_path / "nope"), check=False)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    ar = tmp_path / "ar"
    ar.mkdir()
    (ar / "run.json").write_text(json.dumps({"kind": "ddtree-bench-run", "version": 1, "spec": {"method": "ar"}}))
    (ar / "records.jsonl").write_text("")
    p = cli(capsys, "explain", str(ar), check=False)
    assert p.returncode == 2 and "dflash or ddtree" in p.stderr
    for empty in ("", " , "):
        p = cli(capsys, "explain", str(ar), "--variants", empty, check=False)
        assert p.returncode == 2 and "names no variant" in p.stderr, p.stderr
    for text, says in (("{}", 'no "spec" object'), ("[1]", "expected a JSON object"), ("\x00\x01", "malformed JSON"),
                       ('{"kind": "other", "spec": {"method": "ddtree"}}', "not a ddtree-bench run")):
        (ar / "run.json").write_text(text)
        p = cli(capsys, "explain", str(ar), check=False)
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, (text, p.stderr)
