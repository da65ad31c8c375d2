"""What a new user tripped over (issue 33, item 6): --debug after the subcommand, --budget 0, a baseline of
another model, and where a sweep with --out puts its report."""

from __future__ import annotations

from pathlib import Path

import pytest

from process_support import run_cli

SMALL = ["--suite", "smoke", "--limit", "1", "--max-new-tokens", "4", "-q"]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_is_accepted_before_or_after_the_subcommand_and_shows_the_traceback(where, tmp_path, monkeypatch, capsys):
    import ddtree_bench.sweep.plan as plan

    def boom(*a, **k):
        raise RuntimeError("boom in the plan")

    monkeypatch.setattr(plan, "dry_run", boom)
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--dry-run", "--models", "random"]
    assert run_cli(argv) == 1
    err = capsys.readouterr().err
    assert "error: internal error: RuntimeError: boom in the plan" in err and "rerun with --debug" in err
    assert "Traceback" not in err
    assert run_cli(["--debug", *argv] if where == "before" else [*argv, "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: boom in the plan" in err
    assert "No such option" not in err


def test_debug_after_a_bare_double_dash_is_left_alone():
    from ddtree_bench.cli import take_debug

    assert take_debug(["run", "--debug", "--", "--debug"]) == (["run", "--", "--debug"], True)
    assert take_debug(["run", "--", "--debug"]) == (["run", "--", "--debug"], False)


@pytest.mark.parametrize("budget", ["0", "-3"])
def test_run_refuses_a_ddtree_budget_below_one(budget, tmp_path, capsys):
    out = tmp_path / "r"
    assert run_cli(["run", "--model", "random", "--method", "ddtree", "--budget", budget, *SMALL, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --budget must be ") and "Traceback" not in err and not out.exists()



def test_serve_refuses_a_ddtree_budget_of_zero_before_loading_anything(capsys):
    assert run_cli(["serve", "--model", "random", "--method", "ddtree", "--budget", "0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --budget must be >= 1 for --method ddtree") and "Traceback" not in err

def test_run_ignores_the_budget_of_a_method_without_a_tree(tmp_path):
    assert run_cli(["run", "--model", "random", "--method", "dflash", "--budget", "0", *SMALL, "--out", str(tmp_path / "r")]) == 0


def test_a_baseline_of_another_model_is_bad_input_for_compare_and_gate_unless_allowed(tmp_path, capsys):
    run = tmp_path / "run"
    base = tmp_path / "toy.jsonl"
    assert run_cli(["run", "--model", "random", "--method", "ddtree", "--budget", "4", *SMALL, "--out", str(run)]) == 0
    assert run_cli(["baseline", "record", "--model", "toy", "--suite", "smoke", "--limit", "1", "--max-new-tokens", "4",
                    "--out", str(base), "-q"]) == 0
    capsys.readouterr()
    for cmd in ("compare", "gate"):
        assert run_cli([cmd, str(run), "--baseline", str(base)]) == 2, cmd
        err = capsys.readouterr().err
        assert "is not the baseline's" in err and "hint:" in err and "--allow-model-mismatch" in err, err
    assert run_cli(["compare", str(run), "--baseline", str(base), "--allow-model-mismatch"]) == 0
    assert "is not the baseline's" in capsys.readouterr().out  # still said, as a warning
    assert run_cli(["gate", str(run), "--baseline", str(base), "--allow-model-mismatch"]) in (0, 1)


def test_a_sweep_with_out_writes_its_report_beside_the_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "elsewhere" / "sw"
    assert run_cli(["sweep", "--models", "random", "--suites", "smoke", "--methods", "dflash", "--limit", "1",
                    "--max-new-tokens", "4", "-q", "--out", str(out)]) == 0
    assert f"report: {out.parent / 'sw.html'}" in capsys.readouterr().out
    assert (out.parent / "sw.html").is_file() and not (tmp_path / "reports").exists()


def test_a_default_sweep_directory_keeps_its_report_under_reports():
    from ddtree_bench.cli.sweep import report_path

    assert report_path(Path("results/20261202-sweep-inprocess"), False) == Path("reports/20261202-sweep-inprocess.html")
    assert report_path(Path("results/20261202-sweep-inprocess"), True) == Path("reports/20261202-sweep-inprocess.html")
    assert report_path(Path("/data/runs/nightly"), True) == Path("/data/runs/nightly.html")
