"""The T > 0 verdict end to end on the bundled toy pair, 12 gsm8k prompts x 48 tokens, in-process backend
(issue 32 item 5): the reference engine's own T = 1 DFlash run passes the gate; runs labelled T = 1 that
were decoded greedily, with SGLang-CPU's fallback (first token sampled at prefill, the rest greedy
argmax verification), or sampled at T = 0.5 fail it on `sampling_distribution`.

Everything is seeded, so each case gives the same p on every run of one torch build (measured: honest
0.089; greedy 4e-10, fallback 3e-9, T = 0.5 3e-6). The honest run's p is one draw of a uniform: a
torch build whose sampler draws other tokens gets another draw, and 1 build in 100 would see that
case fail - the false-alarm rate the gate documents, not a flake."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from baseline_support import cli
from ddtree_bench.verdict.distribution import FALSE_ALARM_RATE

pytestmark = pytest.mark.slow

BASELINE = Path(__file__).resolve().parents[2] / "baselines" / "toy-gsm8k.jsonl"
RUN = ["run", "--model", "toy", "--method", "dflash", "--suite", "gsm8k", "--limit", "12", "--max-new-tokens", "48", "--warmup", "0", "-q"]


def _relabel(run: Path, temperature: float) -> Path:
    """What a server that does not sample as asked looks like to the client: the run says `temperature`."""
    info = json.loads((run / "run.json").read_text())
    info["spec"]["temperature"] = temperature
    (run / "run.json").write_text(json.dumps(info))
    return run


def _fallback_run(honest: Path, out: Path) -> Path:
    """SGLang-CPU's DFlash at T > 0 (issue 32): the prefill samples the first token, every later round
    verifies greedily. Built from the honest run's first tokens and the reference engine's greedy
    continuation of prompt + that token, for as many tokens as the run allows."""
    from ddtree_bench.pair import load_pair
    from ddtree_bench.results import read_records

    pair = load_pair("toy", None, "ar")
    shutil.copytree(honest, out)
    lines = []
    for r in read_records(honest):
        first = r.output_ids[0]
        rest = [] if first in pair.stop_ids else list(pair.engine.generate(r.prompt_ids + [first], method="ar", max_new_tokens=47,
                                                                          stop_ids=pair.stop_ids).output_ids)
        ids = [first] + rest
        lines.append(dataclasses.replace(r, output_ids=ids, num_output_tokens=len(ids), output_text=pair.tokenizer.decode(ids)).to_json())
    (out / "records.jsonl").write_text("".join(line + "\n" for line in lines))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ddtree_bench.cli import main

    root = tmp_path_factory.mktemp("sampling")
    out = {}
    for name, t in (("t1", "1"), ("greedy", "0"), ("cold", "0.5")):
        try:
            main(RUN + ["--temperature", t, "--out", str(root / name)])
        except SystemExit as e:
            assert not e.code, e.code
        out[name] = root / name
    _relabel(out["greedy"], 1.0)
    _relabel(out["cold"], 1.0)
    out["fallback"] = _fallback_run(out["t1"], root / "fallback")
    return out


def _gate(run: Path):
    from ddtree_bench.verdict.gate import run_gate

    g = run_gate(run, BASELINE)
    return g, next(c for c in g.checks if c.name == "sampling_distribution"), g.comparison.distribution


def test_honest_t1_run_passes(runs, capsys):
    code, out, err = cli(["compare", runs["t1"], "--baseline", BASELINE, "--json"], capsys)
    d = json.loads(out)["distribution"]
    print("t1", d["statistic"], d["p_value"], d["num_tokens"])
    assert code == 0 and d["judged"] and 0 < d["num_tokens"] <= 12 * 48
    assert d["p_value"] >= FALSE_ALARM_RATE and sum(d["histogram"]) == d["num_tokens"] and d["num_requests"] == 12
    g, check, _ = _gate(runs["t1"])
    assert g.passed and check.status == "pass", check.message


@pytest.mark.parametrize("name", ["greedy", "fallback", "cold"])
def test_mislabelled_runs_fail(runs, capsys, name):
    g, check, d = _gate(runs[name])
    print(name, d.statistic, d.p_value, d.num_tokens)
    assert not g.passed and check.status == "fail" and "skewed low" in check.message, check.message
    assert d.judged and d.p_value < FALSE_ALARM_RATE and d.skew == "low" and d.mean_u < 0.5
    if name == "greedy":  # the CLI's exit code and console say so too
        code, out, err = cli(["gate", runs[name], "--baseline", BASELINE], capsys)
        assert code == 1 and "FAIL  sampling_distribution" in out and "sampling_distribution" in err
