"""`ddtree-bench sweep`: run a grid of configurations (servers or the in-process engine) into one directory.

Modules, one concept each:
* `grid`     — the grid spec (flags and/or YAML, unknown keys are errors) and its expansion into points;
* `profiles` — backend profiles (YAML data in `ddtree_bench/profiles/`) that turn a point into a
  server command line;
* `server`   — `ServerProcess`: launch a server in its own process group, wait until ready, kill it;
* `counters` — server-side acceptance counters (vLLM Prometheus deltas, SGLang totals) and the
  cross-check against the client's per-request acceptance;
* `layout`   — the sweep directory on disk (sweep.json, summary.csv, points/<id>/);
* `run`      — the sweep loop (one server per server-side combination, resume, failures).
"""

from ddtree_bench.sweep.grid import GridSpec, Point, expand  # noqa: F401
