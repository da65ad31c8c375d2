"""Verdicts on a run: is it correct against a baseline, and does it pass CI?

Modules, one concept each:
* `compare`          — greedy diff of a run against a baseline per (prompt, turn), near-tie triage,
  acceptance deltas (`ddtree-bench compare`);
* `compare_render`   — the human view of a `Comparison` (the JSON is `Comparison.to_json`);
* `near_tie_recheck` — what a near tie may excuse: the run's own output teacher-forced through the
  reference engine;
* `distribution`     — the T > 0 verdict: every emitted token scored under the target's tempered
  distribution, the pooled randomised PIT u tested for uniformity (KS);
* `rules`            — the gate's rules: packaged `gate_rules.yaml` + a user's file, checked;
* `gate`             — the CI verdict: rules applied to a comparison and reference runs (`ddtree-bench gate`);
* `gate_render`      — what the gate writes: JUnit XML, markdown, the terminal view.

Which sweep configuration is fastest (a verdict about speed under noise) is `ddtree_bench.noise.verdict`.
"""
