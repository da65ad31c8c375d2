"""Honest concurrency: the in-process backend and `serve --max-batch` run the batched engine.

* `run --backend inprocess --concurrency C`: the C requests really overlap (decoding intervals
  overlap, batches fill), every record equals the concurrency-1 run's (outputs, acceptance
  lengths, chunks), and summary.json says concurrency_honoured true with the batch fullness.
* `--cuda-graphs` at C > 1 runs the batched fast loop (gpu/batch_loop.py, without capture on a
  CPU): the requests overlap, equal the concurrency-1 run's records, run.json says batch_loop fast;
  `serve --max-batch 2 --cuda-graphs` starts the same loop; `--max-batch 0` exits 2; through HTTP, a request
  alone runs through the single loop and hands over to the batch when others arrive, outputs unchanged.
* `serve --max-batch N`: concurrent HTTP requests overlap on the server and equal the in-process
  outputs; /server_info reports max_batch; a serial server (max-batch 1) at concurrency 4 is
  detected from its records (no two requests decoding at once) and flagged not honoured.
* sweep rows carry throughput_ratio_vs_ar; a group whose concurrency was not honoured gives no
  takeaway.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import requests

from ddtree_bench import metrics
from ddtree_bench.backends.client import HTTPBackend
from ddtree_bench.backends.inprocess import InProcessBackend
from ddtree_bench.backends.serve_engine import EngineSource
from ddtree_bench.backends.standalone import build_app
from ddtree_bench.run_spec import RunSpec
from ddtree_bench.driver import drive
from ddtree_bench.pair import load_pair
from ddtree_bench.records import Prompt, RequestRecord
from ddtree_bench.runner import execute
from engine_support import one_torch_thread  # noqa: F401 (fixture)
from http_support import ThreadedServer

PROMPTS = [Prompt(f"p{i}", [t]) for i, t in enumerate(
    ["Hi.", "What is 12 + 30?", "Name three colours.", "Write a haiku about trees.", "Say something long about the sea.",
     "2+2?"])]
MAX_NEW = 14


@pytest.fixture(scope="module")
def pair():
    return load_pair("random", None, "ddtree")


def run_inprocess(pair, method, budget, concurrency, **kw):
    spec = RunSpec(method=method, budget=budget, concurrency=concurrency)
    b = InProcessBackend(pair, method, budget, spec)
    return asyncio.run(drive(b, PROMPTS, max_new_tokens=MAX_NEW, concurrency=concurrency, progress=False, **kw)), b


def by_key(recs):
    return {(r.prompt_id, r.turn): r for r in recs}


@pytest.mark.parametrize("method,budget", [("ar", 0), ("ddtree", 16)])
def test_inprocess_concurrency_overlaps_for_real_and_equals_concurrency_1(pair, method, budget):
    kw = dict(temperature=0.8, seed=3)
    one, _ = run_inprocess(pair, method, budget, 1, **kw)
    four, b = run_inprocess(pair, method, budget, 4, **kw)
    ref = by_key(one)
    for r in four:
        w = ref[(r.prompt_id, r.turn)]
        assert r.ok and r.output_ids == w.output_ids and r.accept_lengths == w.accept_lengths
        assert r.chunk_tokens == w.chunk_tokens
    assert metrics.max_decode_overlap(four) >= 2 and metrics.max_decode_overlap(one) == 1
    full = metrics.batch_fullness(four)
    assert full["batch_size_max"] == 4 and full["batch_size_mean"] > 1.5
    assert metrics.batch_fullness(one)["batch_size_max"] == 1
    assert b.describe()["max_batch"] == 4 and b.batching()["honoured"] is True


def test_run_summary_records_honoured_concurrency_and_batch_fullness(pair, tmp_path):
    spec = RunSpec(method="dflash", concurrency=3, limit=4, max_new_tokens=10, warmup=0)
    res = execute(spec, tmp_path / "run", progress=False, backend=InProcessBackend(pair, "dflash", 0, spec))
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["concurrency_requested"] == 3 and s["concurrency_honoured"] is True and s["concurrency_why"] is None
    assert s["max_batch"] == 3 and s["batch_size_max"] == 3 and 1 < s["batch_size_mean"] <= 3
    assert s["batch_rounds"] >= 1 and s["max_decode_overlap"] >= 2
    assert all(r.server_stats["batch_sizes"] for r in res.records)


def test_cuda_graphs_at_concurrency_above_1_runs_the_batched_fast_loop(tmp_path, capsys):
    pair = load_pair("random", None, "ddtree", cuda_graphs=True)
    outs = {}
    for c in (1, 2):
        spec = RunSpec(method="ddtree", budget=16, concurrency=c, limit=3, max_new_tokens=8, warmup=0, cuda_graphs=True)
        backend = InProcessBackend(pair, "ddtree", 16, spec)
        res = execute(spec, tmp_path / f"run{c}", progress=False, backend=backend)
        outs[c] = {r.prompt_id: (r.output_ids, r.accept_lengths) for r in res.records}
        assert backend.describe()["batch_loop"] == ("fast" if c == 2 else None)
    s = json.loads((tmp_path / "run2" / "summary.json").read_text())
    assert s["concurrency_honoured"] is True and s["concurrency_why"] is None
    assert s["max_batch"] == 2 and s["batch_size_max"] == 2
    assert outs[1] == outs[2]
    assert "warning: --cuda-graphs" not in capsys.readouterr().err


def test_serve_cuda_graphs_with_max_batch_runs_the_fast_loop_and_bad_max_batch_exits_2(capsys):
    from ddtree_bench.cli import main

    src = EngineSource(load_pair("random", None, "ddtree", cuda_graphs=True), "ddtree", 16, "random", max_batch=2)
    try:
        assert src.info["batch_loop"] == "fast"
    finally:
        src.close()
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "random", "--max-batch", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and "--max-batch" in err and "Traceback" not in err


def serve_records(pair, max_batch, concurrency, **kw):
    src = EngineSource(pair, "ddtree", 16, "random", max_batch=max_batch)
    try:
        with ThreadedServer(build_app(src)) as s:
            info = requests.get(s.url + "/server_info", timeout=30).json()
            b = HTTPBackend("standalone", s.url, model="random", timeout_s=300)
            recs = asyncio.run(drive(b, PROMPTS, max_new_tokens=MAX_NEW, concurrency=concurrency, progress=False, **kw))
    finally:
        src.close()
    return recs, info


def test_serve_max_batch_overlaps_and_equals_in_process(pair):
    ref = by_key(run_inprocess(pair, "ddtree", 16, 1)[0])
    recs, info = serve_records(pair, 4, 4)
    assert info["max_batch"] == 4
    for r in recs:
        w = ref[(r.prompt_id, r.turn)]
        assert r.ok, r.error
        assert r.output_ids == w.output_ids and r.accept_lengths == w.accept_lengths
    assert metrics.max_decode_overlap(recs) >= 2
    s = metrics.concurrency_summary(recs, 4, None, None)
    assert s["concurrency_honoured"] is None  # a server's batching is not the client's to vouch for


def test_serve_cuda_graphs_serves_a_lone_request_through_the_single_loop_and_batches_the_rest(monkeypatch):
    """`serve --max-batch 3 --cuda-graphs`: one client at a time, every request runs through the single loop
    (BatchFastLoop.run_alone, once a request); three at once overlap in the batch (a request alone hands over when
    the others arrive). Outputs and acceptance lengths equal the single loop's either way."""
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop

    fast = load_pair("random", None, "ddtree", cuda_graphs=True)
    calls, real = [], BatchFastLoop.run_alone
    monkeypatch.setattr(BatchFastLoop, "run_alone", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    ref = by_key(run_inprocess(fast, "ddtree", 16, 1)[0])   # the single fast loop (batch 1 in process)
    for c in (1, 3):
        calls.clear()
        recs, info = serve_records(fast, 3, c)
        assert info["max_batch"] == 3 and info["batch_loop"] == "fast"
        for r in recs:
            w = ref[(r.prompt_id, r.turn)]
            assert r.ok, r.error
            assert r.output_ids == w.output_ids and r.accept_lengths == w.accept_lengths, (c, r.prompt_id)
        if c == 1:
            assert len(calls) == len(PROMPTS) and metrics.max_decode_overlap(recs) == 1
        else:
            assert metrics.max_decode_overlap(recs) >= 2


def test_a_batch_engine_that_cannot_recover_answers_errors_and_an_unhealthy_health_never_a_hang(pair):
    """`serve --max-batch N` whose engine thread stops (a round raised and ending its requests raised too): the
    request in flight gets a 500 with the reason, /health turns 503 with it (a load balancer stops sending), and
    a later request is a 500 at once instead of waiting forever on a thread that is gone."""
    src = EngineSource(pair, "ddtree", 16, "random", max_batch=2)

    def boom(*a, **kw):
        raise RuntimeError("device lost")

    def stuck(error):
        raise RuntimeError("cannot reset the slots")

    loop = src._batch.loop
    loop.step, loop.fail_all = boom, stuck
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}
    try:
        with ThreadedServer(build_app(src)) as s:
            assert requests.get(s.url + "/health", timeout=10).status_code == 200
            first = requests.post(s.url + "/v1/completions", json=body, timeout=60)
            assert first.status_code == 500 and "cannot reset the slots" in first.json()["error"]["message"]
            health = requests.get(s.url + "/health", timeout=10)
            msg = health.json()["error"]["message"]
            assert health.status_code == 503 and "batch engine stopped" in msg and "device lost" in msg
            later = requests.post(s.url + "/v1/completions", json=body, timeout=20)
            assert later.status_code == 500 and "could not recover" in later.json()["error"]["message"]
    finally:
        src.close()


def test_a_serial_server_at_concurrency_4_is_flagged(pair):
    recs, info = serve_records(pair, 1, 4)
    assert info["max_batch"] == 1 and all(r.ok for r in recs)
    s = metrics.concurrency_summary(recs, 4, None, None)
    assert s["max_decode_overlap"] == 1
    assert s["concurrency_honoured"] is False and "one at a time" in s["concurrency_why"]


def rec(pid, t0, t1, t2, sizes=None):
    return RequestRecord(prompt_id=pid, t_send_ns=t0, t_first_token_ns=t1, t_done_ns=t2, num_output_tokens=4,
                         server_stats={"batch_sizes": sizes} if sizes else None)


def test_batch_fullness_and_overlap_formulas():
    # two requests shared 3 rounds, then one ran 2 rounds alone: 5 rounds, 8 request-rounds
    recs = [rec("a", 0, 10, 100, [2, 2, 2]), rec("b", 0, 20, 200, [2, 2, 2, 1, 1])]
    f = metrics.batch_fullness(recs)
    assert f == {"batch_rounds": 5, "batch_size_mean": 8 / 5, "batch_size_max": 2}
    assert metrics.max_decode_overlap(recs) == 2
    assert metrics.observed_decode_concurrency(recs) == pytest.approx((90 + 180) / 200)
    serial = [rec("a", 0, 10, 100), rec("b", 0, 100, 200)]  # b starts decoding when a is done
    assert metrics.max_decode_overlap(serial) == 1
    assert metrics.throughput_ratio_vs_ar(30.0, 20.0) == 1.5 and metrics.throughput_ratio_vs_ar(30.0, None) is None


def test_no_takeaway_from_a_load_that_was_not_honoured():
    from ddtree_bench.sweep.aggregate import takeaways

    def row(method, c, tok_s, honoured):
        return {"backend": "inprocess", "model": "toy", "method": method, "budget": "", "concurrency": c, "request_rate": "",
                "temperature": 0.0, "suite": "gsm8k", "status": "ok", "repeat": 0, "output_throughput_tok_s": tok_s,
                "speedup_vs_ar": "", "concurrency_honoured": honoured}

    rows = [row("ar", 1, 10.0, True), row("dflash", 1, 20.0, True), row("ar", 4, 10.0, False), row("dflash", 4, 26.0, False)]
    labels = [label for label, _ in takeaways(rows)]
    assert labels == ["c=1"]


def test_a_server_that_reports_a_smaller_batch_than_the_concurrency_is_not_honoured():
    """ddtree-bench serve's /server_info max_batch (SGLang's max_running_requests) below the run's
    concurrency: the others queued, so the run is flagged even where some requests did overlap."""
    spec = RunSpec(backend="standalone", url="http://127.0.0.1:9", model="toy", concurrency=4)
    b = HTTPBackend.from_spec(spec)
    assert b.batching() is None  # nothing known of the server yet
    b.info["server_info"] = {"max_batch": 2}
    got = b.batching()
    assert got["honoured"] is False and got["max_batch"] == 2
    assert "at most 2 requests at once (its /server_info max_batch = 2)" in got["why"]
    b.info["server_info"] = {"max_batch": 1}
    assert "one request at a time" in b.batching()["why"]
    b.info["server_info"] = {"max_batch": 4}
    assert b.batching() is None  # enough room: whether it batched is judged from the records
    sglang = HTTPBackend.from_spec(RunSpec(backend="sglang", url="http://127.0.0.1:9", model="toy", concurrency=8))
    sglang.info["server_info"] = {"max_running_requests": 4}
    assert sglang.batching()["honoured"] is False and "max_running_requests = 4" in sglang.batching()["why"]
    rate = HTTPBackend.from_spec(RunSpec(backend="standalone", url="http://127.0.0.1:9", model="toy", concurrency=4,
                                         request_rate=2.0))
    rate.info["server_info"] = {"max_batch": 1}
    assert rate.batching() is None  # open loop: a rate was asked, not a concurrency
    # what summary.json then says, with two requests overlapping (which alone would leave it unknown)
    recs = [rec("a", 0, 10, 100), rec("b", 0, 20, 200)]
    b.info["server_info"] = {"max_batch": 2}
    s = metrics.concurrency_summary(recs, 4, None, b.batching())
    assert s["max_decode_overlap"] == 2 and s["concurrency_honoured"] is False and "max_batch = 2" in s["concurrency_why"]
    recs4 = recs + [rec("c", 0, 30, 300), rec("d", 0, 40, 400)]
    assert metrics.concurrency_summary(recs4, 4, None, None)["concurrency_honoured"] is None
    few = metrics.concurrency_summary(recs, 4, None, None)   # two conversations cannot make a load of four
    assert few["concurrency_honoured"] is False and "only 2 conversations for --concurrency 4" in few["concurrency_why"]
