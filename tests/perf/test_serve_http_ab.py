"""benchmarks/gpu_serve_http_ab.sh on a CPU: two servers, one run each through HTTP, a line per run, each side's median
TPOT, B / A and the output-ids check; each side runs its own copy of the package (from the repo root, where
`python3 -m` would put the repo's package first); without CODE_B, or with a folder that holds no package, it refuses
to start."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import ddtree_bench
from file_module_support import load_file

ROOT = Path(__file__).resolve().parents[2]


def _copy_with_version(dest: Path, version: str) -> Path:
    """A copy of the package in dest/ddtree_bench (links to the repo's files) whose __version__ is `version`."""
    pkg = dest / "ddtree_bench"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "ddtree_bench").iterdir():
        if entry.name not in ("__init__.py", "__pycache__"):
            (pkg / entry.name).symlink_to(entry)
    text = (ROOT / "ddtree_bench" / "__init__.py").read_text()
    (pkg / "__init__.py").write_text(re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', text))
    return dest


def test_two_sides_one_server_each_with_their_figures_and_equal_outputs(tmp_path):
    code_b = _copy_with_version(tmp_path / "code-b", "0.0.0+side-b")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CODE_B": str(code_b), "CODE_A": str(ROOT), "DEVICE": "cpu",
           "ROUNDS": "1", "LIMIT": "2", "NEW": "6"}
    r = subprocess.run(["bash", "benchmarks/gpu_serve_http_ab.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = re.findall(r"^([AB])-1\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", r.stdout, re.M)
    assert [x[0] for x in rows] == ["A", "B"] and all(float(v) > 0 for x in rows for v in x[1:]), r.stdout
    assert re.search(r"^A: TPOT median [\d.]+ ms over 1 servers", r.stdout, re.M)
    assert re.search(r"^B / A: TPOT [\d.]+x; output ids identical request by request$", r.stdout, re.M), r.stdout
    assert re.search(r"^paired sign-flip test over 1 rounds: p = 1\.000 \(within .*\)$", r.stdout, re.M), r.stdout
    assert (out / "B-1" / "run" / "records.jsonl").stat().st_size > 0
    assert f"B runs {code_b}/ddtree_bench" in r.stdout
    versions = {side: json.loads((out / f"{side}-1" / "run" / "run.json").read_text())["backend"]["server_version"]
                for side in "AB"}
    assert versions == {"A": ddtree_bench.__version__, "B": "0.0.0+side-b"}   # each side's servers ran its own copy


def test_a_folder_without_the_package_is_refused_before_any_server_starts(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "CODE_B": str(tmp_path), "DEVICE": "cpu"}
    r = subprocess.run(["bash", "benchmarks/gpu_serve_http_ab.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and f"does not run the ddtree_bench package in {tmp_path}" in r.stderr
    assert not list((tmp_path / "out").iterdir())


def test_without_the_other_copy_it_says_so_and_starts_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CODE_B"} | {"OUT": str(tmp_path)}
    r = subprocess.run(["bash", "benchmarks/gpu_serve_http_ab.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "CODE_B" in r.stderr and not list(tmp_path.iterdir())


def test_time_s_stops_between_rounds_and_summarises_the_ones_that_ran(tmp_path):
    """Under TIME_S no round starts that would end past it (judged by the round before), and the rounds that ran are
    summarised, as a device call's limit needs (the first always runs: nothing tells its length before it); with
    nothing run, the script says so instead of summarising."""
    env = {**os.environ, "OUT": str(tmp_path), "CODE_B": str(ROOT), "CODE_A": str(ROOT), "DEVICE": "cpu",
           "ROUNDS": "3", "LIMIT": "1", "NEW": "4", "TIME_S": "1"}   # a round (two servers) takes seconds
    r = subprocess.run(["bash", "benchmarks/gpu_serve_http_ab.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TIME_S=1: stopping after 1 of 3 rounds" in r.stdout
    assert re.search(r"^B: TPOT median [\d.]+ ms over 1 servers", r.stdout, re.M) and not (tmp_path / "A-2").exists()
    none = subprocess.run(["bash", "benchmarks/gpu_serve_http.sh"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**env, "OUT": str(tmp_path / "none"), "REPS": "0"})
    assert none.returncode == 1 and "no repetition ran" in none.stdout   # no summary of nothing


def test_a_failed_run_stops_the_script_at_once(tmp_path):
    """A run that fails (here: NEW=0, which `run` refuses) stops the script at the first round, saying so, instead of
    spending a device call on rounds that fail alike and a summary that crashes; gpu_serve_http.sh the same."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CODE_B": str(ROOT), "DEVICE": "cpu", "ROUNDS": "3", "LIMIT": "1", "NEW": "0"}
    r = subprocess.run(["bash", "benchmarks/gpu_serve_http_ab.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and "run A-1 failed, stopping" in r.stdout, r.stdout + r.stderr
    assert not (out / "B-1").exists() and "Traceback" not in r.stdout + r.stderr
    r = subprocess.run(["bash", "benchmarks/gpu_serve_http.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**env, "OUT": str(tmp_path / "http"), "REPS": "2", "METHOD": "ar"})
    assert r.returncode == 1 and "run (max-batch 1) failed (2), stopping" in r.stdout, r.stdout + r.stderr
    assert not list((tmp_path / "http").glob("serve-mb4-*")) and "Traceback" not in r.stdout + r.stderr


def _load_summary():
    return load_file("serve_ab_summary", ROOT / "benchmarks" / "serve_ab_summary.py")


def test_the_paired_test_reads_a_consistent_lean_as_beyond_the_spread_and_a_mixed_one_as_within():
    p = _load_summary().sign_flip_p
    assert p([0.1] * 6) == 2 / 64                          # every round B slower: only it and its mirror
    assert p([0.1] * 5) == 2 / 32 > 0.05                   # five rounds can never reach 0.05
    assert p([0.1, -0.1, 0.1, -0.1, 0.1, -0.1]) == 1.0     # a wash
    assert 0.05 < p([0.12, -0.05, 0.08, 0.03, -0.09, 0.10]) < 1.0
    assert p([]) == 1.0


def test_the_summary_of_six_rounds_where_b_is_always_slower(tmp_path, capsys):
    for i in range(1, 7):
        for side, tpot in (("A", 0.30 + 0.01 * i), ("B", 0.33 + 0.01 * i)):
            d = tmp_path / f"{side}-{i}" / "run"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"tpot_ms": {"p50": tpot}, "ttft_ms": {"p50": 9.0},
                                                        "e2e_ms": {"p50": 70.0}, "output_throughput_tok_s": 3000.0}))
            (d / "records.jsonl").write_text(json.dumps({"prompt_id": "p", "turn": 0, "output_ids": [1, 2]}) + "\n")
    _load_summary().main(str(tmp_path), 6)
    out = capsys.readouterr().out
    assert "A: TPOT median 0.3350 ms over 6 servers, range 0.3100-0.3600" in out
    assert "output ids identical request by request" in out
    assert "paired sign-flip test over 6 rounds: p = 0.031 (beyond what one code's rounds spread; mean B / A" in out


def test_max_batch_against_one_summarises_with_its_paired_test(tmp_path):
    """benchmarks/gpu_serve_http.sh on a CPU, one repetition: `--max-batch 1` then `--max-batch 2`, each run's line, the
    ratios with the output-ids check, and the paired test's line (one repetition: p = 1, within the spread)."""
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "REPS": "1", "LIMIT": "1", "NEW": "4", "METHOD": "ar",
           "MAX_BATCH": "2"}
    r = subprocess.run(["bash", "benchmarks/gpu_serve_http.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"runs {ROOT}/ddtree_bench" in r.stdout
    assert re.search(r"^mb1\s+r1 ", r.stdout, re.M) and re.search(r"^mb2\s+r1 ", r.stdout, re.M), r.stdout
    assert re.search(r"^max-batch 2 / max-batch 1 \(medians over 1 runs each\): .*output ids identical", r.stdout, re.M)
    assert re.search(r"^paired sign-flip test over 1 repetitions: p = 1\.000 \(within ", r.stdout, re.M), r.stdout
