"""runner.execute and the suites package: one entry per run, and the loaded suite is what is sent and recorded.

A fake HTTP-kind backend answers every turn with one token, so no model or server is involved.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from ddtree_bench import runner
from ddtree_bench.records import GenerationRequest, RequestRecord
from ddtree_bench.run_spec import RunSpec
from ddtree_bench.suites import prompts as suite_prompts


class EchoBackend:
    """One token per turn, at once; records every request."""

    kind = "fake"

    def __init__(self):
        self.calls: list[GenerationRequest] = []

    async def start(self):
        pass

    async def aclose(self):
        pass

    def describe(self):
        return {"kind": self.kind}

    async def generate(self, req: GenerationRequest) -> RequestRecord:
        self.calls.append(req)
        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn, t_send_ns=time.perf_counter_ns())
        rec.t_first_token_ns = rec.t_done_ns = time.perf_counter_ns()
        rec.output_text = "ok"
        rec.output_ids, rec.num_output_tokens, rec.chunk_times_ns, rec.chunk_tokens = [1], 1, [rec.t_done_ns], [1]
        return rec


def _spec(suite: str = "gsm8k", limit: int | None = 2) -> RunSpec:
    return RunSpec(backend="standalone", url="http://127.0.0.1:9", model="toy", method="ar", suite=suite,
                   limit=limit, max_new_tokens=4, warmup=0)


def _counting(monkeypatch, name: str) -> list:
    calls: list = []
    real = getattr(suite_prompts, name)
    monkeypatch.setattr(suite_prompts, name, lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_a_run_looks_its_suite_up_once(tmp_path, monkeypatch):
    loads = _counting(monkeypatch, "load_suite")
    finds = _counting(monkeypatch, "find_spec")
    gets = _counting(monkeypatch, "get_spec")
    backend = EchoBackend()
    res = runner.execute(_spec(), tmp_path / "run", progress=False, backend=backend)
    assert len(loads) == 1 and len(finds) + len(gets) == 1
    assert [c.prompt_id for c in backend.calls] == [r.prompt_id for r in res.records]
    assert len(backend.calls) == 2


def test_a_loaded_suite_is_used_as_is_without_entering_the_suites_package(tmp_path, monkeypatch):
    loaded = suite_prompts.load_suite("gsm8k", 2)

    def refuse(*a, **k):
        raise AssertionError("the suites package was entered again")

    for name in ("load_suite", "find_spec", "get_spec", "read_jsonl_suite"):
        monkeypatch.setattr(suite_prompts, name, refuse)
    backend = EchoBackend()
    runner.execute(_spec(), tmp_path / "run", progress=False, backend=backend, suite=loaded)
    assert [c.prompt_id for c in backend.calls] == [p.prompt_id for p in loaded.prompts]
    assert [c.messages[-1]["content"] for c in backend.calls] == [p.turns[0] for p in loaded.prompts]
    run_json = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    assert run_json["suite"] == loaded.info.to_dict()


@pytest.mark.parametrize("asked", [("humaneval", 2, None), ("gsm8k", 3, None), ("gsm8k", 2, "first")])
def test_a_loaded_suite_that_is_not_the_specs_is_refused_before_anything_is_written(tmp_path, asked):
    name, limit, subset = asked
    loaded = suite_prompts.load_suite(name, limit, subset=subset)
    with pytest.raises(ValueError, match="is not the spec's"):
        runner.execute(_spec("gsm8k", 2), tmp_path / "run", progress=False, backend=EchoBackend(), suite=loaded)
    assert not (tmp_path / "run" / "run.json").exists()


def test_a_limit_over_the_suites_size_is_said_not_silently_shrunk(tmp_path, capsys):
    res = runner.execute(_spec("smoke", 10), tmp_path / "run", progress=True, backend=EchoBackend())
    assert len({r.prompt_id for r in res.records}) == 3
    assert "note: --limit 10, but smoke has 3 prompts: running 3" in capsys.readouterr().err


@pytest.mark.parametrize("sig,code,line", [(signal.SIGTERM, 143, "error: terminated (SIGTERM)"),
                                           (signal.SIGINT, 130, "error: interrupted")])
def test_an_interrupted_run_says_how_and_leaves_no_staging_behind(tmp_path, sig, code, line):
    """SIGTERM (a CI timeout, systemd) is handled like Ctrl-C: one line, exit 128 + the signal, the staging directory
    removed (a SIGTERM killed the process outright before: exit 143 with no word and the staging left)."""
    from process_support import wait_for

    out = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "ddtree_bench", "run", "--suite", "gsm8k", "--limit", "64",
                             "--max-new-tokens", "256", "--out", str(out), "-q"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a shell's background job (CI under nohup) ignores SIGINT, and a child inherits that
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        staged = wait_for(lambda: [d for d in tmp_path.glob(".r.partial-*") if (d / "records.jsonl").stat().st_size > 0],
                          timeout_s=120)
        assert staged, "the run never wrote a record"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code and err.strip().splitlines()[-1] == line, err
    assert "Traceback" not in err and not out.exists() and not list(tmp_path.glob(".r.*"))
