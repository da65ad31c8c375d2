"""ddtree-bench against a real SGLang: SGLang 0.5.23 on this CPU (with ddtree-bench's CPU shim) serving the
bundled toy pair in fp32, AR and DFlash.

What a user does with their deployment, with our CLI: runs over both endpoints, streaming and not, for AR
and DFlash, token-for-token parity with the reference engine's stored baseline; SGLang's own per-request
speculative stats (`spec_verify_ct`, `spec_correct_drafts_histogram`) equal to the reference engine's
per-round acceptance, prompt by prompt, on a suite the shim was not tuned on (mt-bench, both turns, over
/v1/completions); the same stats equal to SGLang's /metrics counters, and the sweep's
counter cross-check agreeing on a correct server; the gate passing on AR and DFlash; and a sweep that
launches SGLang itself, survives a server killed in the middle of a point, records DDTree as unsupported
(PR #29907), and resumes only what failed.

The two servers are module-scoped (`sglang_servers`: AR and DFlash started at once, shared by every test
here; nothing restarts or kills them). Tests that read /metrics read the before/after difference around
one run (`dflash_run`) and nothing else reaches that server meanwhile. The sweep test launches its own
servers. Without SGLang these tests skip with the reason; under CI=true they fail (tests/sglang_support.py).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from live_support import assert_greedy_record, baseline_entries, records
from process_support import assert_resume_reruns_only_the_failed_point, assert_the_killed_point_failed_alone, \
    run_cli, sweep_killing_the_ar_server

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ddtree_bench"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# the suite the shim was not tuned on (it was built on gsm8k): short prompts keep the CPU runs small
UNTUNED, UNTUNED_LIMIT, UNTUNED_TOKENS, UNTUNED_ARGS = "mt-bench", 4, 48, ("--endpoint", "completions")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sglang_servers(tmp_path_factory):
    """One SGLang-CPU AR server and one DFlash server (toy pair, fp32), started at once, for this module.
    DDTREE_BENCH_SGLANG_AR_URL / _DFLASH_URL point them at servers already running (for iterating)."""
    from sglang_support import require_sglang, start_sglang

    from process_support import started_together

    given = {m: os.environ.get(f"DDTREE_BENCH_SGLANG_{m.upper()}_URL") for m in ("ar", "dflash")}
    if all(given.values()):
        yield {m: SimpleNamespace(url=u.rstrip("/"), log_path=None) for m, u in given.items()}
        return
    py = require_sglang()
    logs = tmp_path_factory.mktemp("sglang-logs")
    with started_together({m: (lambda m=m: start_sglang(m, logs, py)) for m in ("ar", "dflash")}) as servers:
        yield servers


def run_sglang(url: str, method: str, out: Path, *extra: str, suite: str = "gsm8k", limit: int = 2,
               tokens: int = 32) -> Path:
    """`ddtree-bench run --backend sglang ...` through the CLI's main in this process; must exit 0."""
    rc = run_cli(["run", "--backend", "sglang", "--url", url, "--model", "toy", "--method", method, "--suite", suite,
                  "--limit", str(limit), "--max-new-tokens", str(tokens), "--warmup", "0", "--out", str(out), "--quiet",
                  *extra])
    assert rc == 0, f"ddtree-bench run --backend sglang --method {method} exited {rc} (its output is above)"
    return out


def record_reference(out: Path, suite: str, limit: int, tokens: int) -> Path:
    """The reference engine's fp32 baseline with DFlash's per-round acceptance (`--accept-method dflash`)."""
    rc = run_cli(["baseline", "record", "--model", "toy", "--suite", suite, "--limit", str(limit), "--max-new-tokens",
                  str(tokens), "--accept-method", "dflash", "--out", str(out), "--quiet"])
    assert rc == 0, f"baseline record exited {rc}"
    return out


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_every_endpoint_and_shape_parses_and_matches_greedy(sglang_servers, tmp_path, method, endpoint, stream):
    run = run_sglang(sglang_servers[method].url, method, tmp_path / "run", "--endpoint", endpoint,
                     "--stream" if stream else "--no-stream")
    base = baseline_entries(ROOT / "baselines" / "toy-gsm8k.jsonl")   # reference engine, AR greedy, fp32
    recs = records(run)
    assert len(recs) == 2
    for r in recs:
        ref = assert_greedy_record(r, base, 32)       # whole, and greedy parity token for token
        n = r["num_output_tokens"]
        # chat: SGLang rendered the template; its prompt ids equal the reference engine's rendering
        assert r["prompt_ids"] == ref["prompt_ids"]
        if method == "dflash":
            if stream:
                assert max(r["chunk_tokens"]) > 1      # speculative chunks carry several tokens
            a = r["accept_lengths"]
            assert r["accept_lengths_source"] == "histogram" and a and all(1 <= x <= 16 for x in a)
            assert 1 + sum(a) >= n >= len(a)          # prefill's token + each round's a_r (before truncation)
            assert r["server_stats"]["spec_verify_ct"] == len(a)
        else:
            assert not r["accept_lengths"]


@pytest.fixture(scope="module")
def dflash_run(sglang_servers, tmp_path_factory):
    """One DFlash run on mt-bench (a suite the shim was not tuned on: it was built on gsm8k), 4 conversations x
    2 turns x 48 tokens over /v1/completions (the client's template and token ids; the second turn holds the
    server's own first answer), with the server's /metrics scraped just before and after (nothing else reaches
    the server in between); the reference engine's DFlash baseline of the same conversations beside it."""
    from ddtree_bench.sweep import counters as C

    tmp = tmp_path_factory.mktemp("sglang-dflash")
    url = sglang_servers["dflash"].url
    before, text = C.scrape_with_text("sglang", url)
    run = run_sglang(url, "dflash", tmp / "run", *UNTUNED_ARGS, suite=UNTUNED, limit=UNTUNED_LIMIT, tokens=UNTUNED_TOKENS)
    after, _ = C.scrape_with_text("sglang", url)
    ref = record_reference(tmp / "ref-dflash.jsonl", UNTUNED, UNTUNED_LIMIT, UNTUNED_TOKENS)
    return SimpleNamespace(run=run, before=before, before_text=text, after=after, ref=ref)


def test_dflash_matches_the_reference_token_for_token_and_round_for_round(dflash_run):
    ref = baseline_entries(dflash_run.ref)
    recs = records(dflash_run.run)
    assert len(recs) == 2 * UNTUNED_LIMIT and {r["turn"] for r in recs} == {0, 1}
    for r in recs:
        e = ref[(r["prompt_id"], r["turn"])]
        assert r["error"] is None, r["error"]
        assert r["prompt_ids"] == e["prompt_ids"]
        assert r["output_ids"] == e["output_ids"], (r["prompt_id"], r["turn"])    # token for token
        # SGLang's own per-request stats: its histogram of accepted drafts per verify round and its count of
        # verify rounds equal the reference engine's rounds exactly (the histogram has no order: a multiset)
        hist = r["server_stats"]["spec_correct_drafts_histogram"]
        assert Counter({j + 1: c for j, c in enumerate(hist) if c}) == Counter(e["accept_lengths"]), r["prompt_id"]
        assert r["server_stats"]["spec_verify_ct"] == len(e["accept_lengths"])
        assert sorted(r["accept_lengths"]) == sorted(e["accept_lengths"])


def test_per_request_stats_equal_the_metrics_counters_and_the_crosscheck_agrees(dflash_run):
    from ddtree_bench.results import read_records
    from ddtree_bench.sweep import counters as C

    text = dflash_run.before_text
    assert text and "sglang:spec_verify_calls_total" in text and "sglang:generation_tokens_total" in text
    recs = read_records(dflash_run.run)
    server = C.server_acceptance("sglang", dflash_run.before, dflash_run.after, len(recs))
    per_req = C.per_request_acceptance(recs)
    assert per_req["source"] == "sglang-sglext"
    assert server["delta_spec_verify_calls"] == per_req["sum_spec_verify_ct"] == sum(len(r.accept_lengths) for r in recs)
    assert server["delta_generation_tokens"] == per_req["sum_completion_tokens"] == sum(r.num_output_tokens for r in recs)
    assert server["acceptance_length_comparable"] == pytest.approx(per_req["acceptance_length_comparable"], abs=1e-12)
    cross = C.crosscheck(C.client_acceptance_length("sglang", recs), server, per_req)
    assert cross["server_source"] == "counters" and cross["agree"] is True
    assert cross["rel_diff"] == pytest.approx(0.0, abs=1e-12)


def test_gate_passes_where_sglang_is_right(sglang_servers, dflash_run, tmp_path, capsys):
    runs = {"ar": run_sglang(sglang_servers["ar"].url, "ar", tmp_path / "ar", *UNTUNED_ARGS, suite=UNTUNED,
                             limit=UNTUNED_LIMIT, tokens=UNTUNED_TOKENS),
            "dflash": dflash_run.run}
    for method, run in runs.items():
        junit = tmp_path / f"gate-{method}.xml"
        capsys.readouterr()
        rc = run_cli(["gate", str(run), "--baseline", str(dflash_run.ref), "--junit", str(junit)])
        said = capsys.readouterr()
        cases = {c.get("name"): c.find("failure") is None for c in ET.parse(junit).getroot().iter("testcase")}
        assert rc == 0, said.out + said.err
        assert cases and all(cases.values()), cases
        if method == "dflash":
            assert any("acceptance" in name for name in cases), cases   # the acceptance rule ran, and passed


@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_t1_sampling_verdict_catches_the_dflash_greedy_fallback(sglang_servers, tmp_path, capsys, method):
    """At T = 1 SGLang-CPU's AR samples from the target's distribution and passes `sampling_distribution`;
    its DFlash logs "falling back to greedy argmax verification" (first token sampled, the rest greedy) and
    the gate fails it, u skewed low (issue 32; docs/ci-gate.md section 7). 12 gsm8k prompts x 48 tokens."""
    run = run_sglang(sglang_servers[method].url, method, tmp_path / method, "--temperature", "1", limit=12, tokens=48)
    capsys.readouterr()
    rc = run_cli(["gate", str(run), "--baseline", str(ROOT / "baselines" / "toy-gsm8k.jsonl")])
    said = capsys.readouterr()
    line = next(x for x in said.out.splitlines() if "sampling_distribution" in x)
    if method == "ar":
        assert rc == 0 and line.startswith("PASS"), said.out + said.err
    else:
        assert rc == 1 and line.startswith("FAIL") and "skewed low" in line, said.out + said.err


def test_sweep_launches_sglang_survives_a_killed_server_and_resumes(tmp_path):
    from ddtree_bench.sweep import counters as C
    from sglang_support import require_sglang

    py = require_sglang()
    out = tmp_path / "sweep"
    args = ["sweep", "--backends", "sglang", "--methods", "ar,dflash,ddtree", "--budgets", "16", "--suites", "gsm8k",
            "--limit", "3", "--max-new-tokens", "32", "--server-python", py, "--out", str(out),
            "--no-report", "-q"]
    # SGLang adds a request's tokens when it finishes: past the warmup, one measured request is done
    killed = sweep_killing_the_ar_server(CLI + args, "sglang", C.SGL_GEN_TOKENS, ENV, ROOT)
    point = assert_the_killed_point_failed_alone(killed, out, "29907")
    assert point.server["version"] == "0.5.23" and "sglang.launch_server" in point.server["command"]
    env = point.server["env"]
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["DDTREE_BENCH_SGLANG_CPU_SHIM"] == "1"
    assert "p6_input_embeds_in_model_dtype" in point.server["cpu_shim"]     # the server ran with the shim, fp32 fix too
    assert point.counters["crosscheck"]["server_source"] == "counters"
    dflash_records = (point.dflash_dir / "records.jsonl").read_bytes()

    p = subprocess.run(CLI + ["sweep", "--resume", str(out), "--no-report", "-q"], capture_output=True, text=True,
                       env=ENV, timeout=900, cwd=ROOT)
    assert_resume_reruns_only_the_failed_point(p, out, "sglang", dflash_records, point.dflash_dir)


def test_sweep_records_a_hybrid_target_on_cpu_as_unsupported_naming_the_missing_op(tmp_path):
    """A Gated DeltaNet target (qwen3_5_text) on SGLang-CPU: every point `unsupported` with the reason, no
    server launched, no crash (SGLang's CPU GDN path needs compiled sgl-kernel ops; docs/sglang-cpu.md)."""
    from hybrid_support import random_hybrid_dir
    from sglang_support import require_sglang

    py = require_sglang()
    dirs = random_hybrid_dir(tmp_path / "hybrid", "qwen3_5_text")
    out = tmp_path / "sweep"
    p = subprocess.run(CLI + ["sweep", "--backends", "sglang", "--model", str(dirs.target), "--draft", str(dirs.draft),
                              "--methods", "ar,dflash", "--suites", "gsm8k", "--limit", "2", "--max-new-tokens", "8",
                              "--server-python", py, "--out", str(out), "--no-report", "-q"],
                       capture_output=True, text=True, env=ENV, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "starting sglang server" not in p.stdout
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert {r["method"] for r in rows} == {"ar", "dflash"}
    for r in rows:
        assert r["status"] == "unsupported", r
        assert "fused_sigmoid_mul_cpu" in r["error"] and "Gated DeltaNet" in r["error"], r["error"]
