"""The in-process knob A/B (perf/knob_ab.py) on a CPU: arms parse, their variables hold only while their
forward is built, every arm of an unchanged forward gives the reference's logits, and the table reads back."""

from __future__ import annotations

import os

import pytest
import torch

from ddtree_bench.errors import UsageError
from ddtree_bench.perf.knob_ab import Arm, arm_env, run_ab, table


def test_arm_parse():
    assert Arm.parse("default") == Arm("default", {})
    assert Arm.parse("pdl DDTREE_GPU_EXPERIMENTAL=pdl X=1").env == {"DDTREE_GPU_EXPERIMENTAL": "pdl", "X": "1"}
    for bad in ["", "A=1", "rope DDTREE_GPU_EXPERIMENTAL"]:
        with pytest.raises(UsageError):
            Arm.parse(bad)


def test_arm_env_sets_unsets_and_restores(monkeypatch):
    monkeypatch.setenv("KNOB_B", "outer")
    monkeypatch.delenv("KNOB_A", raising=False)
    with arm_env(Arm("a", {"KNOB_A": "1"}), frozenset({"KNOB_A", "KNOB_B"})):
        assert os.environ["KNOB_A"] == "1" and "KNOB_B" not in os.environ   # another arm's knob is not inherited
    assert "KNOB_A" not in os.environ and os.environ["KNOB_B"] == "outer"


def test_run_ab_on_the_toy_pair(monkeypatch):
    from ddtree_bench.perf.bench import BenchSpec, CurveSetup, load_bench_pair

    seen = []
    import ddtree_bench.engine.gpu.forward as fwd

    real = fwd.target_forward

    def spy(*a, **k):   # which arm's variable the forward ran under
        seen.append(os.environ.get("KNOB_X"))
        return real(*a, **k)

    monkeypatch.setattr(fwd, "target_forward", spy)
    target, drafter, _, _ = load_bench_pair(BenchSpec(model="toy", device="cpu", dtype="float32"))
    setup = CurveSetup(target, drafter.target_layer_ids, 12, [1, 6], torch.device("cpu"))
    arms = [Arm("ref"), Arm("x", {"KNOB_X": "on"})]
    rows = run_ab(setup, arms, [1, 6], rounds=2, reps=1)
    assert [r["tokens"] for r in rows] == [1, 6]
    for r in rows:
        assert [a["arm"] for a in r["arms"]] == ["ref", "x"]
        assert all(a["max_abs_logit_diff"] == 0.0 and a["ms"] > 0 for a in r["arms"])
        assert r["arms"][0]["vs_first"] == 1.0
    assert "on" in seen and None in seen   # each arm's forward saw its own variables
    text = table(rows, roofline=lambda n: 1.0)
    assert "ref ms" in text and "x x" in text and "x /roof" in text and len(text.splitlines()) == 3


def test_run_ab_times_floors_beside_the_arms_and_divides_by_the_first():
    from ddtree_bench.perf.bench import BenchSpec, CurveSetup, gemm_only, load_bench_pair

    target, drafter, _, _ = load_bench_pair(BenchSpec(model="toy", device="cpu", dtype="float32"))
    setup = CurveSetup(target, drafter.target_layer_ids, 12, [1, 6], torch.device("cpu"))
    made = []

    def floor(n):
        made.append((n, os.environ.get("KNOB_X")))
        return gemm_only(target, n, torch.device("cpu"))
    rows = run_ab(setup, [Arm("ref"), Arm("x", {"KNOB_X": "on"})], [1, 6], rounds=2, reps=1,
                  floors={"gemm_only": floor})
    assert made == [(1, None), (6, None)]   # one floor per n, built under no arm's variables
    for r in rows:
        (f,) = r["floors"]
        assert f["name"] == "gemm_only" and f["ms"] > 0 and f["spread_ms"] >= 0
    text = table(rows)
    head = text.splitlines()[0].split()
    assert head[head.index("gemm_only") + 1] == "ms"   # the floor's own column
    r = rows[0]
    ratio = r["arms"][1]["ms"] / r["floors"][0]["ms"]
    assert head.count("/gemm_only") == 2 and f"{ratio:.3f}" in text.splitlines()[1].split()


def test_run_ab_reports_the_clock_each_arm_and_floor_was_timed_at(tmp_path):
    from nvsmi_support import fake_nvidia_smi

    from ddtree_bench.perf.bench import BenchSpec, CurveSetup, gemm_only, load_bench_pair
    from ddtree_bench.noise.gpu_clocks import ClockSampler

    target, drafter, _, _ = load_bench_pair(BenchSpec(model="toy", device="cpu", dtype="float32"))
    setup = CurveSetup(target, drafter.target_layer_ids, 12, [6], torch.device("cpu"))
    with ClockSampler(None, 20, exe=fake_nvidia_smi(tmp_path)) as sampler:
        rows = run_ab(setup, [Arm("ref"), Arm("x")], [6], rounds=3, reps=40,
                      floors={"gemm_only": lambda n: gemm_only(target, n, torch.device("cpu"))}, sampler=sampler)
    (r,) = rows
    timed = [*r["arms"], *r["floors"]]
    for t in timed:   # each from samples inside its own spans only
        label = f"{t.get('arm', t.get('name'))}@6"
        inside = [s.sm_clock_mhz for s in sampler.samples if any(a <= s.t_s <= b for a, b in sampler.spans[label])]
        assert inside and min(inside) <= t["sm_clock_mhz"] <= max(inside)
    assert 0 < r["power_capped_share"] < 1
    text = table(rows)
    assert "ref MHz" in text and "gemm_only MHz" in text and "capped %" in text
    assert "MHz" not in table([{**r, "arms": [{**a, "sm_clock_mhz": None} for a in r["arms"]],
                                "floors": [{**f, "sm_clock_mhz": None} for f in r["floors"]]}])   # no clocks, no columns


def test_the_ceilings_script_patches_only_its_arms(tmp_path):
    """benchmarks/gpu_ceilings.py on a CPU: the default arm is the engine's forward (the reference's logits), each
    patched arm computes something else (its patch was live while its forward ran), and the GEMM-only floor is
    timed beside them."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_ceilings.py"
    out = tmp_path / "ceil.json"
    args = [sys.executable, str(script), "--model", "toy", "--device", "cpu", "--dtype", "float32", "--prefix-len",
            "12", "--tokens", "1,4", "--rounds", "1", "--reps", "1", "--out", str(out)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (rows,) = json.loads(out.read_text())["by_scale"].values()
    for row in rows:
        diff = {a["arm"]: a["max_abs_logit_diff"] for a in row["arms"]}
        assert list(diff) == ["default", "nonorm", "nonorm_all", "nonorm_raw", "noattn", "both"]
        assert diff.pop("default") == 0.0 and min(diff.values()) > 0.1
        assert [f["name"] for f in row["floors"]] == ["gemm_only"]


def test_the_ab_script_on_the_toy_pair_writes_its_tables_and_json(tmp_path):
    """benchmarks/gpu_verify_ab.py end to end on a CPU: a table per tree scale, one row per n, and the JSON with
    every arm per n; a malformed arm is exit 2 with one line."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_verify_ab.py"
    out = tmp_path / "ab.json"
    args = [sys.executable, str(script), "--model", "toy", "--device", "cpu", "--dtype", "float32", "--prefix-len", "12",
            "--tokens", "1,4", "--scales", "3,12", "--rounds", "1", "--reps", "1", "--arm", "a", "--arm", "b KNOB_X=1"]
    r = subprocess.run(args + ["--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("## curve trees") == 2 and "b x" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["arms"] == [{"name": "a", "env": {}}, {"name": "b", "env": {"KNOB_X": "1"}}]
    assert [[row["tokens"] for row in rows] for rows in doc["by_scale"].values()] == [[1, 4], [1, 4]]
    bad = subprocess.run(args[:-2] + ["--arm", "b KNOB_X"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "KNOB_X" in bad.stderr


def test_the_batched_ab_script_on_the_toy_pair_prints_a_row_per_point_and_batch():
    """benchmarks/gpu_batch_ab.py end to end on a CPU (eager batched rounds): one row per (point, batch) naming every
    arm with its ms and ratio; a malformed arm or point is exit 2 with one line."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_batch_ab.py"
    args = [sys.executable, str(script), "--model", "toy", "--device", "cpu", "--dtype", "float32", "--prefix-len", "12",
            "--batches", "1,2", "--rounds", "2", "--steps", "1", "--warmup", "1", "--arm", "a", "--arm", "b KNOB_X=1"]
    r = subprocess.run(args + ["--points", "ddtree:4,dflash"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if " batch " in line and ": " in line]
    assert [line[:line.index(": ")] for line in rows] == [
        "ddtree:4 batch 1", "ddtree:4 batch 2", "dflash batch 1", "dflash batch 2"]
    for line in rows:
        assert re.search(r" a \d+\.\d+ \(1\.000x", line) and re.search(r" b \d+\.\d+ \(\d\.\d+x", line), line
    for bad in (["--arm", "b KNOB_X"], ["--points", "tree:4"]):
        out = subprocess.run(args[:-4] + ["--arm", "a"] + bad + (["--arm", "c"] if bad[0] == "--points" else []),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr


def test_the_batched_ab_gives_each_arm_the_clock_of_its_own_steps(tmp_path):
    import argparse
    import sys
    from pathlib import Path

    from nvsmi_support import fake_nvidia_smi

    from ddtree_bench.perf.bench import BenchSpec, load_bench_pair
    from ddtree_bench.noise.gpu_clocks import ClockSampler

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_batch_ab

    target, drafter, _, _ = load_bench_pair(BenchSpec(model="toy", device="cpu", dtype="float32"))
    a = argparse.Namespace(warmup=1, rounds=2, steps=16, prefix_len=12)   # ~0.13 s a span: several 20 ms samples
    with ClockSampler(None, 20, exe=fake_nvidia_smi(tmp_path)) as sampler:
        got = gpu_batch_ab.ab(target, drafter, "dflash", 16, 2, [Arm("a"), Arm("b")], a, sampler)
    for arm in ("a", "b"):
        inside = [s.sm_clock_mhz for s in sampler.samples if any(x <= s.t_s <= y for x, y in sampler.spans[arm])]
        assert inside and min(inside) <= got[f"{arm} MHz"] <= max(inside)
    assert gpu_batch_ab.ab(target, drafter, "ar", 0, 1, [Arm("a")], a)["a MHz"] is None   # no sampler, no clock
