"""The hybrid target through the CLI: `run` (DFlash, DDTree) passes `gate` against an AR baseline recorded
by the reference engine; the same run under `--target-variant gdn-crop` (what transformers' Cache.crop
does) fails it; bad input exits 2 with one line: --cuda-graphs on a hybrid, gdn-crop on a dense target,
an unknown variant, unsupported or broken hybrid configs."""

from __future__ import annotations

import json

import pytest

from http_support import ServeProcess
from hybrid_support import random_hybrid_dir
from process_support import cli_in_process

COMMON = ["--suite", "gsm8k", "--limit", "3", "--max-new-tokens", "24", "--quiet"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return random_hybrid_dir(tmp_path_factory.mktemp("hy"), "qwen3_5", layer_types=[
        "linear_attention", "full_attention", "linear_attention", "linear_attention"], logit_scale=30.0)


def test_run_passes_gate_and_gdn_crop_fails_it(pair, tmp_path, capsys):
    base = tmp_path / "base.jsonl"
    cli_in_process(capsys, "baseline", "record", "--model", str(pair.target), "--out", str(base), *COMMON)
    for method in ("dflash", "ddtree"):
        ok = tmp_path / f"ok-{method}"
        cli_in_process(capsys, "run", "--model", str(pair.target), "--draft", str(pair.draft), "--method", method,
                       "--budget", "8", "--out", str(ok), *COMMON)
        assert cli_in_process(capsys, "gate", str(ok), "--baseline", str(base), check=False).returncode == 0
        bad = tmp_path / f"crop-{method}"
        cli_in_process(capsys, "run", "--model", str(pair.target), "--draft", str(pair.draft), "--method", method,
                       "--budget", "8", "--target-variant", "gdn-crop", "--out", str(bad), *COMMON)
        run = json.loads((bad / "run.json").read_text())
        assert run["backend"]["target_variant"] == "gdn-crop"
        res = cli_in_process(capsys, "gate", str(bad), "--baseline", str(base), check=False)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "FAULT INJECTION: the run's target ran under target variant 'gdn-crop'" in res.stdout + res.stderr
        cli_in_process(capsys, "report", str(bad), "--out", str(tmp_path / f"{method}.html"))
        assert "FAULT INJECTION" in (tmp_path / f"{method}.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("variant, verdict", [(None, 0), ("gdn-crop", 1)])
def test_serve_batched_hybrid_ddtree_through_the_standalone_backend(pair, tmp_path, capsys, variant, verdict):
    base = tmp_path / "base.jsonl"
    cli_in_process(capsys, "baseline", "record", "--model", str(pair.target), "--out", str(base), *COMMON)
    args = ["--model", str(pair.target), "--draft", str(pair.draft), "--method", "ddtree", "--budget", "8", "--max-batch", "2"]
    srv = ServeProcess(*args, *(["--target-variant", variant] if variant else []), startup_timeout_s=300).wait_ready()
    try:
        out = tmp_path / "served"
        cli_in_process(capsys, "run", "--backend", "standalone", "--url", srv.url, "--model", str(pair.target),
                       "--method", "ddtree", "--budget", "8", "--concurrency", "2", "--out", str(out), *COMMON)
    finally:
        srv.terminate()
    res = cli_in_process(capsys, "gate", str(out), "--baseline", str(base), check=False)
    assert res.returncode == verdict, res.stdout + res.stderr


def one_line_error(res) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert lines and lines[0].startswith("error:") and "Traceback" not in res.stderr
    return lines[0]


def test_refusals_exit_2_with_one_line(pair, tmp_path, capsys):
    run = ["run", "--model", str(pair.target), "--draft", str(pair.draft), "--method", "dflash", *COMMON]
    msg = one_line_error(cli_in_process(capsys, *run, "--cuda-graphs", "--out", str(tmp_path / "a"), check=False))
    assert "cuda-graphs" in msg and "hybrid" in msg
    msg = one_line_error(cli_in_process(capsys, *run, "--target-variant", "nope", "--out", str(tmp_path / "b"), check=False))
    assert "gdn-crop" in msg
    msg = one_line_error(cli_in_process(capsys, "run", "--model", "toy", "--method", "dflash", "--target-variant", "gdn-crop",
                                        *COMMON, "--out", str(tmp_path / "c"), check=False))
    assert "hybrid" in msg
    msg = one_line_error(cli_in_process(capsys, "run", "--model", str(pair.target), "--method", "ar", "--target-variant",
                                        "gdn-crop", *COMMON, "--out", str(tmp_path / "d"), check=False))
    assert "--method ar verifies no tree, so it would change nothing" in msg


@pytest.mark.parametrize("change, needle", [
    (lambda c: c.update(model_type="mamba2"), "not supported"),
    (lambda c: c.pop("text_config"), "text_config"),
    (lambda c: c["text_config"].update(layer_types=["linear_attention", "cross_attention", "full_attention", "full_attention"]), "layer_types"),
    (lambda c: c["text_config"].pop("linear_num_key_heads"), "linear_num_key_heads"),
    (lambda c: c["text_config"].update(mamba_ssm_dtype="float8"), "mamba_ssm_dtype"),
])
def test_unsupported_configs_name_what_is_missing(pair, tmp_path, capsys, change, needle):
    import shutil

    d = tmp_path / "t"
    shutil.copytree(pair.target, d)
    cfg = json.loads((d / "config.json").read_text())
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    msg = one_line_error(cli_in_process(capsys, "run", "--model", str(d), "--method", "ar", *COMMON,
                                        "--out", str(tmp_path / "o"), check=False))
    assert needle in msg, msg


def test_the_report_never_ranks_a_failed_or_fault_injected_point_fastest(pair, tmp_path, capsys):
    """A gdn-crop run beside an honest one: the takeaways say 'not ranked' for it, whatever its speed."""
    runs = []
    for name, extra in (("ok", []), ("crop", ["--target-variant", "gdn-crop"])):
        out = tmp_path / name
        cli_in_process(capsys, "run", "--model", str(pair.target), "--draft", str(pair.draft), "--method", "ddtree",
                       "--budget", "8", "--out", str(out), *extra, *COMMON)
        runs.append(str(out))
    ar = tmp_path / "ar"
    cli_in_process(capsys, "run", "--model", str(pair.target), "--method", "ar", "--out", str(ar), *COMMON)
    html = tmp_path / "r.html"
    cli_in_process(capsys, "report", str(ar), *runs, "--out", str(html))
    page = html.read_text(encoding="utf-8")
    assert "not ranked" in page and "fault injection (target variant gdn-crop)" in page
