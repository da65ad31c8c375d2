"""Real results directories for the report tests, made with `ddtree-bench run --model random`.

`build(root)` makes (once per process) a sweep-shaped directory following docs/design.md §3
(sweep.json, summary.csv, points/<id>/ run directories + server.log; a failed point listed in the
CSV without a directory), a single DDTree run over a hostile custom suite (ids and turns full of
markup) with a compare.json beside it shaped as `ddtree-bench compare --json` writes it, and a
standalone compare document shaped differently (token pieces in `context`). The sweep is
built here rather than with `ddtree-bench sweep` so these tests don't depend on that command.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from ddtree_bench import metrics
from ddtree_bench.cli import main
from ddtree_bench.results import read_json, read_records

HOSTILE = '<script>alert("x")</script>'
HOSTILE_ID = f'p1{HOSTILE}"><img src=x onerror=alert(2)>'
HOSTILE_POINT = 'ddtree-b4-c2-"><img src=x onerror=alert(3)>'
BUDGETS = (4, 16, 64)
CONCURRENCY = (1, 2)
CSV_COLUMNS = (
    "backend", "model", "method", "budget", "spec_tokens", "concurrency", "request_rate", "temperature", "suite",
    "status", "error", "acceptance_length_mean", "acceptance_length_token_weighted", "output_throughput_tok_s",
    "speedup_vs_ar", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
)


@dataclass
class Fixtures:
    sweep: Path
    run: Path            # the hostile-suite DDTree run (has compare.json)
    ar_run: Path         # an AR run over the smoke suite (no compare.json)
    compare: Path        # a standalone compare --json document
    rate_runs: list[Path]  # DDTree B=16 at two open-loop request rates


_cache: dict[str, Fixtures] = {}


def run(out: Path, method: str, budget: int = 16, concurrency: int = 1, suite: str = "smoke", limit: int = 2,
        request_rate: float | None = None) -> Path:
    rate = ["--request-rate", str(request_rate)] if request_rate is not None else []
    main(["run", "--model", "random", "--suite", suite, "--max-new-tokens", "24", "--limit", str(limit),
          "--method", method, "--budget", str(budget), "--concurrency", str(concurrency), "--warmup", "0",
          *rate, "--out", str(out), "-q"])
    return out


def _point_id(method: str, budget: int, c: int) -> str:
    if method == "ddtree" and budget == 4 and c == 2:
        return HOSTILE_POINT
    return f"{method}" + (f"-b{budget}" if method == "ddtree" else "") + f"-c{c}"


def build_sweep(root: Path) -> Path:
    sweep = root / "sweep-demo"
    grid = [(m, b, c) for c in CONCURRENCY for m, b in [("ar", 0), ("dflash", 0)] + [("ddtree", b) for b in BUDGETS]]
    points = []
    for m, b, c in grid:
        pid = _point_id(m, b, c)
        pdir = run(sweep / "points" / pid, m, b or 16, c)
        (pdir / "server.log").write_text("in-process backend: no server\n", encoding="utf-8")
        points.append((pid, m, b, c, pdir))
    rows = []
    for pid, m, b, c, pdir in points:
        s = read_json(pdir / "summary.json")
        ar_dir = next(d for q, mm, _, cc, d in points if mm == "ar" and cc == c)
        sp = metrics.speedup_vs_ar(read_records(pdir), read_records(ar_dir))
        rows.append({
            "backend": "inprocess", "model": "random", "method": m, "budget": b if m == "ddtree" else "",
            "spec_tokens": "", "concurrency": c, "request_rate": "", "temperature": 0.0, "suite": "smoke",
            "status": "ok", "error": "", "acceptance_length_mean": s["acceptance_length_mean"],
            "acceptance_length_token_weighted": s["acceptance_length_token_weighted"],
            "output_throughput_tok_s": s["output_throughput_tok_s"], "speedup_vs_ar": sp,
            "ttft_ms_p50": s["ttft_ms"]["p50"], "ttft_ms_p99": s["ttft_ms"]["p99"],
            "tpot_ms_p50": s["tpot_ms"]["p50"], "tpot_ms_p99": s["tpot_ms"]["p99"],
        })
    rows.append({**{k: "" for k in CSV_COLUMNS}, "backend": "inprocess", "model": "random", "method": "ddtree",
                 "budget": 1024, "concurrency": 4, "temperature": 0.0, "suite": "smoke", "status": "failed",
                 "error": f"server exited before ready: {HOSTILE}"})
    with open(sweep / "summary.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (sweep / "sweep.json").write_text(json.dumps({
        "kind": "ddtree-bench-sweep", "version": 1,
        "command": ["ddtree-bench", "sweep", "--model", "random", "--budgets", "4,16,64", "--concurrency", "1,2"],
        "points": [{"id": pid, "method": m, "budget": b, "concurrency": c} for pid, m, b, c, _ in points],
    }, indent=1), encoding="utf-8")
    return sweep


def compare_doc(prompt_id: str, output_text: str) -> dict:
    """A `compare --json` document (docs/design.md §3 keys; `context` an object with token pieces) with one
    divergence and one near tie."""
    return {
        "exact_match_rate": 0.5, "num_prompts": 3, "num_confident_divergences": 1, "num_near_ties": 1,
        "baseline": f"baselines/{HOSTILE}.jsonl",
        "prompts": [
            {"prompt_id": "ok-0", "turn": 0, "match": True, "first_divergence": None, "gap": None, "kind": "match",
             "baseline_len": 24, "output_len": 24, "context": None},
            {"prompt_id": prompt_id, "turn": 0, "match": False, "first_divergence": 7, "gap": 3.25, "kind": "divergence",
             "baseline_len": 24, "output_len": 24,
             "context": {"prefix": ["The", " answer"], "baseline": [" is", " 42", HOSTILE], "output": [" is", " <b>41</b>"]}},
            {"prompt_id": "tie-2", "turn": 1, "match": False, "first_divergence": 3, "gap": 0.01, "kind": "near_tie",
             "baseline_len": 20, "output_len": 22, "context": f"...{HOSTILE} vs {output_text[:20]}..."},
        ],
    }


def compare_doc_as_written(prompt_id: str) -> dict:
    """The shape `ddtree-bench compare --json` writes today: `context` text plus `context_ids`
    (before / baseline / run token ids), a reason and an explanation, and more top-level keys."""
    return {
        "exact_match_rate": 0.5, "num_prompts": 2, "num_confident_divergences": 1, "num_near_ties": 0,
        "prompts": [
            {"prompt_id": "p2", "turn": 0, "kind": "match", "match": True, "first_divergence": None, "gap": None,
             "baseline_len": 24, "output_len": 24, "context": None, "reason": None, "explanation": None, "context_ids": None},
            {"prompt_id": prompt_id, "turn": 0, "kind": "divergence", "match": False, "first_divergence": 5, "gap": 2.5,
             "baseline_len": 24, "output_len": 24, "reason": None, "explanation": f"gap 2.5 > near-tie gap; {HOSTILE}",
             "context": f"...'ab' then baseline '{HOSTILE}' / run 'xyz'",
             "context_ids": {"position": 5, "before": [97, 98], "baseline": [60, 115, 99], "run": [120, 121, 122]}},
        ],
        "kind": "ddtree-bench-compare", "version": 1, "run": "results/x", "baseline": "baselines/b.jsonl",
        "token_comparable": True, "not_comparable_reason": None, "near_tie_gap": 0.5, "num_matches": 1,
        "warnings": [f"a warning with {HOSTILE}"], "acceptance": {}, "run_info": {}, "baseline_info": {},
    }


def build(root: Path) -> Fixtures:
    key = str(root)
    if key in _cache:
        return _cache[key]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: one thread is faster, and spinning threads hurt on a shared 2-core box
    try:
        _cache[key] = _build(root)
    finally:
        torch.set_num_threads(threads)
    return _cache[key]


def _build(root: Path) -> Fixtures:
    root.mkdir(parents=True, exist_ok=True)
    suite = root / "hostile.jsonl"
    suite.write_text(json.dumps({"id": HOSTILE_ID, "turns": [f"{HOSTILE} & 'q' \"q\" </td></table>"]}) + "\n"
                     + json.dumps({"id": "p2", "turns": ["plain"]}) + "\n", encoding="utf-8")
    hostile = run(root / "runs" / "hostile-ddtree", "ddtree", 16, suite=str(suite), limit=2)
    (hostile / "compare.json").write_text(json.dumps(compare_doc_as_written(HOSTILE_ID)), encoding="utf-8")
    ar_run = run(root / "runs" / "smoke-ar", "ar")
    cmp_path = root / "compare-extra.json"
    text = read_records(hostile)[0].output_text
    cmp_path.write_text(json.dumps(compare_doc("smoke-0", text)), encoding="utf-8")
    rates = [run(root / "runs" / f"rate-{r:g}", "ddtree", 16, request_rate=r) for r in (20.0, 80.0)]
    return Fixtures(sweep=build_sweep(root), run=hostile, ar_run=ar_run, compare=cmp_path, rate_runs=rates)
