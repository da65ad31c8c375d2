"""bench-engine --batch on the CPU with the random tiny pair: one row per (batch, method point) with
every stage of the batched fast loop, tok/s that follow from tau and the round time, the given tau
used where given, the best budget per batch, JSON (last stdout line and --out) and CSV beside it;
a bad --batch exits 2."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from ddtree_bench.cli import main
from ddtree_bench.engine.gpu.loop import ROUND_STAGES
from ddtree_bench.perf.bench_batch import parse_batches
from process_support import run_cli


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_batch_table_rows_and_sane_numbers(tmp_path, capsys):
    out = tmp_path / "bb.json"
    main(["bench-engine", "--model", "random", "--batch", "1,3", "--budgets", "4,16", "--prefix-len", "12", "--rounds", "3",
          "--tau", "16:2.5", "--out", str(out)])
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert json.loads(text.strip().splitlines()[-1])["rows"] == res["rows"]
    assert "batched fast loop" in text and "best DDTree budget per batch" in text
    got = {(r["batch"], r["method"], r["budget"]) for r in res["rows"]}
    assert got == {(b, m, k) for b in (1, 3) for m, k in (("ar", None), ("dflash", None), ("ddtree", 4), ("ddtree", 16))}
    for r in res["rows"]:
        want = ["verify", "walk", "commit"] if r["method"] == "ar" else list(ROUND_STAGES)
        assert all(r[f"{s}_ms"] > 0 for s in want), r
        assert r["rounds"] == 3 and r["bucket"] == r["batch"]   # every measured round ran the whole batch
        assert r["round_ms"] == pytest.approx(sum(r[f"{s}_ms"] for s in want), rel=0.5)
        assert r["tok_s"] == pytest.approx(r["batch"] * r["tau"] / r["round_ms"] * 1e3)
        assert r["tok_s_per_request"] == pytest.approx(r["tok_s"] / r["batch"])
        assert r["first_round_ms"] > 0 and math.isfinite(r["tok_s"])
        if r["method"] == "ar":
            assert r["tau"] == 1.0
        elif r["budget"] == 16:
            assert (r["tau"], r["tau_source"]) == (2.5, "given")
        else:
            assert r["tau_source"] == "measured" and 1.0 <= r["tau"] <= 16
    assert [b["batch"] for b in res["best"]] == [1, 3] and all(b["best_budget"] in (4, 16) for b in res["best"])
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res["rows"]) and {"tok_s", "verify_ms", "first_round_ms"} <= set(rows[0])


def test_parse_batches_and_bad_batch_exits_2(capsys):
    assert parse_batches("16,1, 4,2,8") == [1, 2, 4, 8, 16]
    assert run_cli(["bench-engine", "--model", "random", "--batch", "1,,2"]) == 2
    assert run_cli(["bench-engine", "--model", "random", "--batch", "0,2"]) == 2
    assert run_cli(["bench-engine", "--model", "random", "--batch", "two"]) == 2
    err = capsys.readouterr().err
    assert "--batch" in err and "Traceback" not in err
