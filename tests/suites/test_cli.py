"""`ddtree-bench suites` listing / show, and the one-line failure of HF-only suites without the hub.

The offline tests run the CLI in a subprocess with an empty HF cache and a hub endpoint that
refuses connections, so they behave the same on machines with and without network access and
cannot pick up a cached dataset.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ddtree_bench.cli import main
from ddtree_bench.errors import UsageError
from ddtree_bench.suites import sources as suite_sources
from ddtree_bench.suites.prompts import load_suite


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_every_suite_with_offline_and_counts(capsys):
    code, out, _ = _cli(capsys, "suites")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip() and not line.startswith("`")}
    for name in ["gsm8k", "math500", "aime24", "aime25", "humaneval", "mbpp", "livecodebench", "swe-bench",
                 "mt-bench", "alpaca", "sharegpt", "chat-mix", "smoke"]:
        assert name in rows, name
    assert "offline" in rows["gsm8k"] and " 128 " in rows["gsm8k"] and "zlab-paper" in rows["gsm8k"]
    assert "needs datasets" in rows["math500"] and "HuggingFaceH4/MATH-500" in rows["math500"]
    assert "Please reason step by step" in rows["gsm8k"]


def test_list_json(capsys):
    code, out, _ = _cli(capsys, "suites", "--json")
    assert code == 0
    entries = {e["name"]: e for e in json.loads(out)}
    assert entries["aime24"]["n"] == 30 and entries["aime24"]["data"] == "needs datasets"
    assert entries["mt-bench"]["data"] == "offline" and entries["mt-bench"]["n"] == 80
    assert entries["humaneval"]["template"].startswith("Write a solution to the following problem")


def test_show_prints_rendered_turns(capsys):
    code, out, _ = _cli(capsys, "suites", "show", "gsm8k", "--limit", "2")
    assert code == 0
    first = load_suite("gsm8k", 1).prompts[0]
    assert f"id {first.prompt_id}" in out and first.turns[0] in out
    assert "selected  128 of 1319 items, subset rule zlab-paper" in out
    assert out.count("=== [") == 2
    code, out, _ = _cli(capsys, "suites", "show", "mt-bench", "--limit", "1", "--subset", "zlab-current", "--n", "5")
    assert code == 0 and "id 137" in out and "--- turn 2 (user)" in out and "selected  5 of 80" in out


def test_show_jsonl_round_trips_as_a_custom_suite(capsys, tmp_path):
    code, out, _ = _cli(capsys, "suites", "show", "humaneval", "--jsonl", "--n", "4")
    assert code == 0
    path = tmp_path / "he4.jsonl"
    path.write_text(out, encoding="utf-8")
    mine = load_suite(str(path)).prompts
    ref = load_suite("humaneval", 4).prompts
    assert [(p.prompt_id, p.turns) for p in mine] == [(p.prompt_id, p.turns) for p in ref]


def test_show_unknown_suite_exits_2(capsys):
    code, _, err = _cli(capsys, "suites", "show", "nope")
    assert code == 2 and err.startswith("error: unknown suite 'nope'")


def test_missing_datasets_package_is_one_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    with pytest.raises(UsageError, match=r"suite 'math500' loads the Hugging Face dataset HuggingFaceH4/MATH-500 .*needs the `datasets` package") as e:
        load_suite("math500", 3)
    assert "ddtree-bench[datasets]" in e.value.hint


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once we return: connections are refused


def test_hub_probe_is_quick_when_unreachable(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    assert suite_sources.hub_reachable(timeout_s=2.0) is False
    assert time.monotonic() - t0 < 3.5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suite, env, reason", [
    ("swe-bench", {}, "is unreachable and it is not in the local cache"),
    ("livecodebench", {}, "is unreachable and it is not in the local cache"),
    ("aime25", {"HF_HUB_OFFLINE": "1"}, "is offline (HF_HUB_OFFLINE is set) and it is not in the local cache"),
])
def test_hf_suite_without_hub_fails_with_one_line(tmp_path, suite, env, reason):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    base.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", **env)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ddtree_bench", "suites", "show", suite], env=base,
                       capture_output=True, text=True, timeout=110, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: suite '{suite}' needs the Hugging Face dataset ") and reason in lines[0]
    assert len(lines) == 2 and lines[1].startswith("hint: ") and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 60


def test_list_shows_the_good_suites_and_names_each_broken_file(capsys, tmp_path, monkeypatch):
    """One bad YAML under DDTREE_BENCH_SUITES: the listing still shows every good suite, then one error line per
    broken file and exit 2 (a mix that names a missing part is broken too)."""
    from ddtree_bench.suites import catalog

    monkeypatch.setenv(catalog.ENV_DIRS, str(tmp_path))
    (tmp_path / "bad.yaml").write_text("source: {file: x.jsonl\nturns: [x]\n")
    (tmp_path / "mixed.yaml").write_text("mix: [{suite: nowhere, n: 1}]\n")
    for args in (("suites",), ("suites", "--json")):
        code, out, err = _cli(capsys, *args)
        assert code == 2 and "gsm8k" in out and "smoke" in out and "bad.yaml" not in out, (args, out)
        lines = err.strip().splitlines()
        assert [ln.startswith("error: ") for ln in lines].count(True) == 2 and "bad.yaml" in err and "mixed.yaml: unknown suite 'nowhere'" in err
        assert "Traceback" not in err
    assert _cli(capsys, "suites", "show", "gsm8k", "--limit", "1")[0] == 0


def test_a_suites_directory_that_does_not_exist_is_said(capsys, tmp_path, monkeypatch):
    from ddtree_bench.suites import catalog

    monkeypatch.setenv(catalog.ENV_DIRS, str(tmp_path / "nope"))
    code, out, err = _cli(capsys, "suites")
    assert code == 0 and "gsm8k" in out and f"note: DDTREE_BENCH_SUITES names {tmp_path / 'nope'}, which is not a directory" in err
