"""Benchmark suites: from a name or file to the prompts a run sends, and what is recorded about them.

Modules, one concept each:
* `prompts` — `load_suite`, a run's one entry: a `SuitePrompts` record (prompts in run order, `SuiteInfo`);
* `catalog` — where named suite YAMLs are found (`DDTREE_BENCH_SUITES`, `suite_specs/`, `suites/`);
* `spec`    — one suite YAML: schema, validation, Jinja2 user-turn templates;
* `sources` — a source's raw items: bundled/local JSONL or a Hugging Face dataset;
* `subsets` — which items a run uses (z-lab's shuffles, or the first n).

The suite YAML files themselves are data, not part of this package: the top-level `suites/`
folder, shipped as `ddtree_bench/suite_specs/`. Knows nothing of models or HTTP.
"""
