"""End-to-end sweeps: in-process over `--model random` (one engine load, resume, failed points) and
standalone over real `ddtree-bench serve` processes, one of which is killed mid-point."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path

import pytest

from ddtree_bench.records import RequestRecord
from ddtree_bench.results import load, read_records
from ddtree_bench.sweep.layout import COLUMNS, SUMMARY_COLUMNS
from process_support import run_cli, csv_rows, alive

DESIGN_COLUMNS = ["backend", "model", "method", "budget", "spec_tokens", "concurrency", "request_rate", "temperature",
                  "suite", "status", "error", "acceptance_length_mean", "acceptance_length_token_weighted",
                  "output_throughput_tok_s", "speedup_vs_ar", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99"]
SMOKE_TURNS = {("smoke-0", 0), ("smoke-1", 0), ("smoke-2", 0), ("smoke-2", 1)}


def test_summary_columns_are_the_design_contract_then_extras():
    assert list(SUMMARY_COLUMNS) == DESIGN_COLUMNS
    assert list(COLUMNS[: len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS and len(set(COLUMNS)) == len(COLUMNS)


def test_inprocess_sweep_loads_once_resumes_and_loads_into_pandas(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    import ddtree_bench.pair as pair_mod

    loads = []
    real = pair_mod.load_pair
    monkeypatch.setattr(pair_mod, "load_pair", lambda *a, **k: loads.append(a) or real(*a, **k))
    out = tmp_path / "sw"
    argv = ["sweep", "--models", "random", "--suites", "smoke", "--methods", "dflash,ddtree", "--budgets", "8,32",
            "--limit", "3", "--max-new-tokens", "6", "--out", str(out), "--no-report", "-q"]
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "AR baseline was added" in printed and "speedup" in printed and "[4/4] inprocess ddtree B=32: ok" in printed
    assert len(loads) == 1 and loads[0][2] == "dflash"  # one engine (with its drafter) for every point

    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["method"] for p in sweep["points"]] == ["ar", "dflash", "ddtree", "ddtree"]
    assert sweep["grid"]["budgets"] == [8, 32] and sweep["auto_ar"] is True and sweep["complete"] is True
    with open(out / "summary.csv", newline="") as f:
        assert next(csv.reader(f)) == list(COLUMNS)
    rows = csv_rows(out)
    assert [r["point_id"] for r in rows] == [p["id"] for p in sweep["points"]]
    assert all(r["status"] == "ok" and r["error"] == "" for r in rows)
    ar, dflash = rows[0], rows[1]
    assert float(ar["speedup_vs_ar"]) == pytest.approx(1.0) and float(ar["acceptance_length_mean"]) == 1.0
    assert ar["budget"] == "" and ar["spec_tokens"] == ""
    assert float(dflash["speedup_vs_ar"]) > 0 and dflash["spec_tokens"] == "15"  # the random drafter's block is 16
    for p in sweep["points"]:
        d = out / "points" / p["id"]
        assert {"run.json", "records.jsonl", "summary.json", "status.json"} <= {f.name for f in d.iterdir()}
        assert json.loads((d / "run.json").read_text())["sweep"]["point_id"] == p["id"]
        assert {(r.prompt_id, r.turn) for r in read_records(d)} == SMOKE_TURNS

    # the notebook API
    data = load(out)
    assert len(data.summary) == 4 and list(data.summary.columns[: len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS
    assert len(data.records) == 16 and set(data.records["point_id"]) == {p["id"] for p in sweep["points"]}
    assert {"method", "budget", "repeat", "dtype", "device", "draft"} <= set(data.records.columns)

    # resume with everything finished: nothing runs, nothing is duplicated
    mtimes = {p.name: (p / "records.jsonl").stat().st_mtime_ns for p in (out / "points").iterdir()}
    assert run_cli(["sweep", "--resume", str(out), "-q", "--no-report"]) == 0
    assert {p.name: (p / "records.jsonl").stat().st_mtime_ns for p in (out / "points").iterdir()} == mtimes
    assert [r["point_id"] for r in csv_rows(out)] == [p["id"] for p in sweep["points"]]
    # a point without summary.json (crashed mid-way) runs again, alone
    victim = sweep["points"][2]["id"]
    (out / "points" / victim / "summary.json").unlink()
    assert run_cli(["sweep", "--resume", str(out), "-q", "--no-report"]) == 0
    assert len(loads) == 2  # loaded again for the one point that ran
    changed = [n for n, m in mtimes.items() if (out / "points" / n / "records.jsonl").stat().st_mtime_ns != m]
    assert changed == [victim]
    assert len(csv_rows(out)) == 4 and len(load(out).records) == 16
    # a point whose records.jsonl is gone (its summary.json kept) is not finished either: it runs again
    victim = sweep["points"][3]["id"]
    (out / "points" / victim / "records.jsonl").unlink()
    assert run_cli(["sweep", "--resume", str(out), "-q", "--no-report"]) == 0
    assert {(r.prompt_id, r.turn) for r in read_records(out / "points" / victim)} == SMOKE_TURNS
    assert len(csv_rows(out)) == 4 and len(load(out).records) == 16


def test_a_failed_point_exits_1_and_a_bare_resume_completes_it(tmp_path, monkeypatch, capsys):
    from ddtree_bench.backends.inprocess import InProcessBackend

    monkeypatch.chdir(tmp_path)

    real = InProcessBackend.generate_sync

    def broken(self, req):
        if self.method == "ddtree":
            return RequestRecord(prompt_id=req.prompt_id, turn=req.turn, error="engine: RuntimeError: injected")
        return real(self, req)

    monkeypatch.setattr(InProcessBackend, "generate_sync", broken)
    argv = ["sweep", "--models", "random", "--suites", "smoke", "--methods", "ddtree", "--budgets", "16",
            "--limit", "1", "--max-new-tokens", "4", "--no-report", "-q"]
    assert run_cli(argv) == 1
    (out,) = [d.relative_to(tmp_path) for d in (tmp_path / "results").iterdir()]  # results/<sweep-id>/
    err = capsys.readouterr().err
    assert "1 of 2 points failed" in err and f"--resume {out}" in err
    rows = csv_rows(out)
    assert [r["status"] for r in rows] == ["ok", "failed"] and "injected" in rows[1]["error"]
    assert not (out / "points" / rows[1]["point_id"] / "summary.json").exists()
    assert json.loads((out / "sweep.json").read_text())["complete"] is False

    monkeypatch.setattr(InProcessBackend, "generate_sync", real)
    assert run_cli(["sweep", "--resume", "-q", "--no-report"]) == 0  # the latest sweep under results/
    assert f"resuming {out}" in capsys.readouterr().out
    rows = csv_rows(out)
    assert [r["status"] for r in rows] == ["ok", "ok"] and rows[1]["speedup_vs_ar"] != ""


def test_out_dir_that_exists_is_refused(tmp_path, capsys):
    out = tmp_path / "sw"
    out.mkdir()
    (out / "x").write_text("x")
    assert run_cli(["sweep", "--models", "random", "--suites", "smoke", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def _kill_after_first_request(monkeypatch, killed: list[int]) -> None:
    """SIGKILL the ddtree server's process group right after the first measured request it answered
    (warmup requests excluded): deterministic, mid-point, with one finished record before the kill."""
    from ddtree_bench.backends.client import HTTPBackend
    from ddtree_bench.sweep.server import _LIVE

    real = HTTPBackend.generate

    async def generate(self, req):
        rec = await real(self, req)
        if not killed and not req.prompt_id.startswith("warmup"):
            for srv in list(_LIVE):
                if srv.url == self.url and "ddtree" in srv.argv and srv.alive():
                    killed.append(srv.pid)
                    os.killpg(srv.pid, signal.SIGKILL)
        return rec

    monkeypatch.setattr(HTTPBackend, "generate", generate)


def _slow_teardown(monkeypatch, killed: list[int]) -> None:
    """Instant polls for 2 s after the kill still say alive, as for a SIGKILLed vLLM while the kernel
    frees its memory (its sockets already closed, so the point's later requests failed); a poll that
    waits (settle_s > 0) sees the truth and ends the pretence."""
    from ddtree_bench.sweep.server import ServerProcess

    real, dying_since = ServerProcess.alive, []

    def alive(self, settle_s: float = 0.0) -> bool:
        if killed and self.pid == killed[0] and dying_since != [None]:
            if settle_s > 0:
                dying_since[:] = [None]
            else:
                dying_since[:] = dying_since or [time.monotonic()]
                if time.monotonic() - dying_since[0] < 2.0:
                    return True
        return real(self, settle_s)

    monkeypatch.setattr(ServerProcess, "alive", alive)


@pytest.mark.slow
def test_standalone_sweep_survives_a_killed_server_and_resume_completes_it(tmp_path, monkeypatch):
    from ddtree_bench.sweep.grid import build_grid, expand

    out = tmp_path / "sw"
    suite = tmp_path / "six.jsonl"
    suite.write_text("".join(json.dumps({"id": f"q{i}", "turns": [f"Count from {i} to {i + 9}."]}) + "\n" for i in range(6)))
    expected = {(f"q{i}", 0) for i in range(6)}
    flags = {"backends": "standalone", "models": "random", "suites": str(suite), "methods": "ddtree", "budgets": "4",
             "concurrency": "1,2", "limit": 6, "max_new_tokens": 8}
    points = expand(build_grid(overrides=flags))
    assert [(p.method, p.concurrency) for p in points] == [("ar", 1), ("ar", 2), ("ddtree", 1), ("ddtree", 2)]
    victim = points[2].id
    killed: list[int] = []
    _kill_after_first_request(monkeypatch, killed)
    _slow_teardown(monkeypatch, killed)
    argv = ["sweep", *[x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", str(v))],
            "--out", str(out), "--no-report", "-q"]
    assert run_cli(argv) == 1
    assert len(killed) == 1
    rows = {r["point_id"]: r for r in csv_rows(out)}
    assert len(rows) == 4, rows
    assert rows[victim]["status"] == "failed", rows[victim]
    assert any(r.ok for r in read_records(out / "points" / victim))  # killed mid-point, after a request finished
    assert "server exited with code -9 while the point ran" in rows[victim]["error"], rows[victim]
    assert all(rows[p.id]["status"] == "ok" for p in points if p.id != victim)
    status = json.loads((out / "points" / victim / "status.json").read_text())
    assert status["log_tail"] and "ddtree_bench serve" in status["log_tail"]
    assert (out / "points" / victim / "server.log").stat().st_size > 0
    # the next point of the same server group ran on a restarted server
    logs = sorted(p.name for p in (out / "servers").iterdir())
    assert [n for n in logs if "-ddtree-" in n and n.endswith("-1.log")]
    ok_ddtree = out / "points" / points[3].id
    server = json.loads((ok_ddtree / "server.json").read_text())
    assert server["restarts"] == 1 and server["version"] and "--budget 4" in server["command"]
    assert json.loads((ok_ddtree / "run.json").read_text())["sweep"]["server"]["command"] == server["command"]
    counters = json.loads((ok_ddtree / "counters.json").read_text())
    assert counters["kind"] == "standalone" and counters["crosscheck"]["agree"] is True
    assert counters["server_counters"]["delta_num_drafts"] > 0  # scoped to the point: deltas, not lifetime totals

    assert run_cli(["sweep", "--resume", str(out), "-q", "--no-report"]) == 0
    rows = csv_rows(out)
    assert sorted(r["point_id"] for r in rows) == sorted(p.id for p in points)  # one row per point, no duplicates
    assert all(r["status"] == "ok" for r in rows)
    for p in points:  # no lost or duplicated records
        recs = read_records(out / "points" / p.id)
        assert sorted((r.prompt_id, r.turn) for r in recs) == sorted(expected) and all(r.ok for r in recs)
    assert len(load(out).records) == 24

    # no orphans: every server this test started is gone, grandchildren included
    pids = set(killed)
    ports = set()
    for d in (out / "points").iterdir():
        if (d / "server.json").exists():
            s = json.loads((d / "server.json").read_text())
            pids.add(s["pid"])
            ports.add(s["url"].rsplit(":", 1)[1])
    assert pids and not [p for p in pids if alive(p)]
    leftovers = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and alive(int(proc.name)):
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in cmd and any(port.encode() in cmd for port in ports):
                leftovers.append(int(proc.name))
    assert not leftovers


def test_a_server_whose_port_was_taken_as_it_started_is_started_again(tmp_path, monkeypatch):
    """The port the sweep picked for a server is taken before the server binds it (as a second SGLang server's
    torch.distributed port was, in CI on 2026-12-05: both servers of a group failed before they were ready): the real
    `ddtree-bench serve` fails with "address already in use", the sweep starts it again on a fresh port, and the
    group runs. The failed try keeps its own log; server.json counts the restart."""
    import socket

    import ddtree_bench.sweep.loop as loop_mod

    real_free_port = loop_mod.free_port
    picked: list[int] = []
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)

        def first_taken(host):
            picked.append(holder.getsockname()[1] if not picked else real_free_port(host))
            return picked[-1]

        monkeypatch.setattr(loop_mod, "free_port", first_taken)
        out = tmp_path / "sw"
        assert run_cli(["sweep", "--backends", "standalone", "--models", "random", "--suites", "smoke", "--methods",
                        "ar", "--limit", "1", "--max-new-tokens", "4", "--out", str(out), "--no-report", "-q"]) == 0
    assert len(picked) == 2
    (row,) = csv_rows(out)
    assert row["status"] == "ok"
    logs = sorted((out / "servers").glob("*.log"))
    assert [p.name[-6:] for p in logs] == ["-0.log", "-1.log"]
    assert "address already in use" in logs[0].read_text() and "address already in use" not in logs[1].read_text()
    server = json.loads((out / "points" / row["point_id"] / "server.json").read_text())
    assert server["restarts"] == 1 and f"--port {picked[1]}" in server["command"]
