"""The sweep hands the engine's knobs to its in-process points: `cuda_graphs` (a grid key) reaches
the RunSpec and the loaded pair, so a GPU sweep point runs the CUDA-graph loop it asked for (the
grid's spec builder and the point runner used to drop it: every in-process point ran the eager loop).
"""

from __future__ import annotations

import json

from ddtree_bench.cli import main
from ddtree_bench.sweep.grid import build_grid, expand, to_spec


def test_cuda_graphs_reaches_every_in_process_point(tmp_path, capsys):
    cfg = tmp_path / "grid.yaml"
    cfg.write_text("cuda_graphs: true\n")
    grid = build_grid(cfg, {"backends": "inprocess", "models": "random", "methods": "ar,ddtree", "budgets": "4"})
    assert grid.cuda_graphs is True and all(to_spec(p, grid).cuda_graphs for p in expand(grid))
    assert build_grid(None, {}).cuda_graphs is False
    out = tmp_path / "sw"
    code = main(["sweep", "--config", str(cfg), "--backends", "inprocess", "--models", "random", "--methods", "ar,ddtree",
                 "--budgets", "4", "--limit", "1", "--max-new-tokens", "4", "--out", str(out), "-q", "--no-report"])
    capsys.readouterr()
    assert code in (0, None)
    runs = [json.loads(p.read_text()) for p in out.rglob("run.json")]
    assert len(runs) == 2 and all(r["backend"]["cuda_graphs"] is True for r in runs)
