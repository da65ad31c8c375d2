"""Greedy baselines: the reference outputs a run is diffed against (`compare`, `gate`).

Modules, one concept each:
* `file`      — the baseline JSONL format (docs/design.md §3): `Baseline`, `BaselineEntry`, reading
  with validation, writing atomically without machine paths;
* `record`    — recording one with the reference engine, or from a running OpenAI-compatible server
  (`ddtree-bench baseline record`), and re-scoring logit gaps;
* `import_pt` — importing the DDTree authors' `benchmark.py --save-path RUN.pt` files
  (`ddtree-bench baseline import`), matched to a suite by prompt tokens.

The baseline files themselves live wherever the user keeps them (the repository's top-level
`baselines/` holds the project's own). Judging a run against one is `ddtree_bench.verdict`.
"""
