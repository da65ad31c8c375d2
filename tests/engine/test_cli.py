"""`ddtree-bench run` on the in-process engine: bad input exits 2 with exactly one `error:` line
(optionally one `hint:` line), no traceback and nothing left in --out; the good path writes the
three result files and emits AR's greedy tokens for DFlash and DDTree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_bench.cli import main
from ddtree_bench.engine.loading import random_configs, random_pair, save_hf
from engine_support import one_torch_thread  # noqa: F401 (fixture)

GOOD = ["--model", "random", "--suite", "smoke", "--max-new-tokens", "6", "-q"]


def run_cli(args: list[str]) -> int:
    try:
        main(["run", *args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def assert_usage_error(capsys, args: list[str], out: Path, needle: str) -> str:
    code = run_cli([*args, "--out", str(out)])
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2, (args, err)
    assert lines and lines[0].startswith("error: "), err
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), err
    assert "Traceback" not in err
    assert needle in lines[0], (needle, lines[0])
    assert not (out / "summary.json").exists()
    assert not out.exists() and not (out.parent / f".{out.name}.partial").exists()  # nothing half-written
    return lines[0]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """HF directories of the random pair (byte-tokenizer vocabulary): a good target with the toy
    tokenizer and its drafter, a target whose weights are truncated, one without a tokenizer, and a
    drafter whose config does not fit the target."""
    from ddtree_bench.toy.tokenizer import VOCAB_SIZE, write_tokenizer

    root = tmp_path_factory.mktemp("cli-models")
    target, drafter = random_pair(seed=0, vocab_size=VOCAB_SIZE)
    tcfg, dcfg = random_configs(vocab_size=VOCAB_SIZE)
    save_hf(target, tcfg, root / "good")
    write_tokenizer(root / "good")
    save_hf(drafter, dcfg, root / "draft")
    save_hf(drafter, {**dcfg, "dflash_config": {"mask_token_id": 9999, "target_layer_ids": [1, 2]}}, root / "badmask")
    save_hf(target, tcfg, root / "corrupt")
    w = root / "corrupt" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    save_hf(target, tcfg, root / "notok")
    return root


@pytest.mark.parametrize("args,needle", [
    (["--method", "beam"], "unknown --method 'beam'"),
    (["--method", "ddtree", "--budget", "-1"], "--budget must be >= 1 for --method ddtree"),
    (["--method", "dflash", "--budget", "-1"], "--budget must be an integer >= 0"),
    (["--method", "ddtree", "--budget", "many"], "--budget"),
    (["--method", "ddtree", "--budget", "2.5"], "--budget"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be a positive integer"),
    (["--max-new-tokens", "-4"], "--max-new-tokens must be a positive integer"),
    (["--suite", "no-such-suite"], "unknown suite 'no-such-suite'"),
    (["--model", "/nonexistent/model/dir"], "does not exist"),
])
def test_bad_flags(capsys, tmp_path, args, needle):
    base = [a for a in GOOD]
    for flag in ("--method", "--max-new-tokens", "--suite", "--model"):
        if flag in args and flag in base:
            i = base.index(flag)
            del base[i:i + 2]
    assert_usage_error(capsys, [*base, *args], tmp_path / "out", needle)


def test_missing_and_malformed_suites(capsys, tmp_path):
    out = tmp_path / "out"
    base = [a for a in GOOD if a not in ("--suite", "smoke")]
    assert_usage_error(capsys, [*base, "--suite", str(tmp_path / "missing.jsonl")], out, "does not exist")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "turns": ["hi"]}\n{"id": "b", "turns": ["oops"\n')
    assert_usage_error(capsys, [*base, "--suite", str(bad)], out, "bad.jsonl:2: malformed JSON")
    bad.write_text('{"id": "a", "turns": ["hi"]}\n\n{"id": "b", "turns": "not a list"}\n')
    assert_usage_error(capsys, [*base, "--suite", str(bad)], out, "bad.jsonl:3:")
    bad.write_text('{"id": "a", "turns": ["hi"]}\n{"id": "a", "turns": ["again"]}\n')
    assert_usage_error(capsys, [*base, "--suite", str(bad)], out, "bad.jsonl:2: duplicate id 'a'")
    bad.write_text("\n")
    assert_usage_error(capsys, [*base, "--suite", str(bad)], out, "has no prompts")


def test_bad_model_directories(capsys, tmp_path, dirs):
    out = tmp_path / "out"
    base = [a for a in GOOD if a not in ("--model", "random")]
    cases = [
        (["--model", str(dirs / "corrupt"), "--method", "ar"], "corrupt or truncated"),
        (["--model", str(dirs / "notok"), "--method", "ar"], "has no tokenizer.json"),
        (["--model", str(tmp_path), "--method", "ar"], "has no config.json"),
        (["--model", str(dirs / "good"), "--method", "ddtree"], "--method ddtree needs a drafter"),
        (["--model", str(dirs / "good"), "--method", "dflash", "--draft", str(dirs / "corrupt")], "no block_size"),  # a target as --draft
        (["--model", str(dirs / "good"), "--method", "dflash", "--draft", str(dirs / "badmask")], "mask_token_id 9999 is outside"),
        (["--model", str(dirs / "good"), "--method", "dflash", "--draft", str(tmp_path / "nodraft")], "does not exist"),
    ]
    for args, needle in cases:
        assert_usage_error(capsys, [*base, *args], out, needle)


def test_hf_directory_pair_runs(capsys, tmp_path, dirs):
    out = tmp_path / "hf"
    base = [a for a in GOOD if a not in ("--model", "random")]
    args = [*base, "--model", str(dirs / "good"), "--draft", str(dirs / "draft"), "--method", "ddtree", "--budget", "4"]
    assert run_cli([*args, "--out", str(out)]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["backend"]["draft_path"] == str(dirs / "draft") and run["backend"]["model_hash"].startswith("sha256:")
    assert json.loads((out / "summary.json").read_text())["num_errors"] == 0
    capsys.readouterr()


def test_out_is_a_file(capsys, tmp_path):
    f = tmp_path / "results.txt"
    f.write_text("not a directory")
    code = run_cli([*GOOD, "--out", str(f)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "is a file" in err and "Traceback" not in err
    assert f.read_text() == "not a directory"


def test_console_script_exit_code(tmp_path):
    """The real entry point, in a subprocess: exit 2, one error line on stderr, nothing on stdout."""
    p = subprocess.run([sys.executable, "-m", "ddtree_bench", "run", "--budget", "-3", "--method", "ddtree",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines()[0] == "error: --budget must be >= 1 for --method ddtree, got -3"
    assert "Traceback" not in p.stderr and not (tmp_path / "o").exists()


def test_good_run_writes_results_and_is_lossless(capsys, tmp_path):
    outputs = {}
    for method in ("ar", "dflash", "ddtree"):
        out = tmp_path / method
        assert run_cli([*GOOD, "--method", method, "--budget", "8", "--out", str(out)]) == 0
        assert {p.name for p in out.iterdir()} >= {"run.json", "records.jsonl", "summary.json"}
        summary = json.loads((out / "summary.json").read_text())
        records = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
        assert summary["num_requests"] == len(records) == 4 and summary["num_errors"] == 0
        for key in ("acceptance_length_mean", "acceptance_length_token_weighted", "acceptance_histogram",
                    "acceptance_rate_by_depth", "output_throughput_tok_s"):
            assert key in summary
        for r in records:
            assert r["error"] is None and 1 <= r["num_output_tokens"] <= 6 and r["prompt_ids"]
        run = json.loads((out / "run.json").read_text())
        assert run["spec"]["method"] == method
        # what the run measured under: the drafter's attention (the random pair's: full, non-causal) and the stop rule
        assert run["drafter_attention"] == (None if method == "ar" else
                                            {"mode": "full", "layers": [{"causal": False, "window": None}] * 2})
        assert run["stop_id_rule"]["rule"] == "tokenizer eos_token" and run["stop_id_rule"]["tokenizer_eos_id"] == 258
        outputs[method] = [(r["prompt_id"], r["turn"], r["output_ids"]) for r in records]
    capsys.readouterr()
    assert outputs["dflash"] == outputs["ar"] and outputs["ddtree"] == outputs["ar"]


@pytest.mark.parametrize("argv,says", [(["run", "--temperature", "inf"], "--temperature must be a finite number >= 0"),
                                       (["compare", "RUN", "--near-tie-gap", "inf"], "--near-tie-gap must be a finite number")])
def test_infinite_numbers_are_bad_input(argv, says, tmp_path, capsys):
    """run --temperature inf was stored as null and judged greedy; compare --near-tie-gap inf excused every divergence."""
    from baseline_support import STOP, baseline_file, entry, record, run_dir
    from ddtree_bench.cli import main

    if argv[0] == "compare":
        out_ids = [10, 11, STOP]
        argv = ["compare", str(run_dir(tmp_path / "r", [record("a", out_ids)])), "--baseline",
                str(baseline_file(tmp_path / "b.jsonl", [entry("a", out_ids)])), *argv[2:]]
    with pytest.raises(SystemExit) as e:
        main([*argv, *(["--out", str(tmp_path / "o"), "-q"] if argv[0] == "run" else [])])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and not (tmp_path / "o").exists()
