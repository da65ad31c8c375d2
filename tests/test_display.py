"""The console tables (display.py): a run or sweep point under load says whether its concurrency was
honoured, with the why when it was not, beside the throughput ratio vs AR and the batch fill.

Rows here are written by hand in summary.csv's shape; tests/sweep/test_concurrency.py runs real sweeps.
"""

from __future__ import annotations

from ddtree_bench import metrics
from ddtree_bench.display import run_summary, sweep_table

WHY = "the server runs one request at a time (its /server_info max_batch = 1)"


def row(method, c, tok_s, honoured, budget=None, fill=None, ratio=None, why=None):
    return {"backend": "standalone", "model": "toy", "method": method, "budget": budget, "concurrency": c,
            "request_rate": None, "temperature": 0.0, "suite": "gsm8k", "status": "ok", "repeat": 0,
            "acceptance_length_mean": 1.0, "output_throughput_tok_s": tok_s, "speedup_vs_ar": 1.0,
            "ttft_ms_p50": 10.0, "tpot_ms_p50": 2.0, "concurrency_honoured": honoured, "concurrency_why": why,
            "batch_size_mean": fill, "batch_size_max": 4 if fill else None, "throughput_ratio_vs_ar": ratio}


def _lines(text: str) -> dict[str, str]:
    """Table body lines keyed by 'method c' (the first and third cells)."""
    out = {}
    for line in text.splitlines()[2:]:
        cells = line.split()
        if len(cells) > 3 and cells[0] in ("ar", "ddtree"):
            out[f"{cells[0]} {cells[2]}"] = line
    return out


def test_a_sweep_at_one_load_has_no_batching_columns():
    out = sweep_table([row("ar", 1, 10.0, True), row("ddtree", 1, 15.0, True, budget=16)])
    assert "load honoured" not in out and "tok/s x AR" not in out and "NOT honoured" not in out


def test_loaded_rows_show_ratio_fill_and_honoured_and_a_serial_load_says_why():
    rows = [row("ar", 1, 10.0, True, fill=1.0, ratio=1.0), row("ddtree", 1, 15.0, True, budget=16, fill=1.0, ratio=1.5),
            row("ar", 4, 30.0, True, fill=4.0, ratio=1.0), row("ddtree", 4, 36.0, True, budget=16, fill=2.7, ratio=1.2)]
    out = sweep_table(rows)
    head = out.splitlines()[0]
    assert "tok/s x AR" in head and "batch fill" in head and "load honoured" in head
    body = _lines(out)
    assert "1.20" in body["ddtree 4"] and "2.7 / 4" in body["ddtree 4"] and " yes " in body["ddtree 4"]
    assert " yes " not in body["ddtree 1"]  # c = 1 is no load to honour
    assert "NOT honoured" not in out

    rows[2:] = [row("ar", 4, 11.0, False, ratio=1.0, why=WHY), row("ddtree", 4, 16.0, False, budget=16, ratio=1.45, why=WHY)]
    out = sweep_table(rows)
    body = _lines(out)
    assert " NO " in body["ar 4"] and " NO " in body["ddtree 4"]
    footer = [line for line in out.splitlines() if line.startswith("NOT honoured")]
    assert footer == [f"NOT honoured (standalone, c=4): {WHY}. Its rows are not measurements at that load; "
                      "no takeaway is drawn there."]


def test_a_run_summary_under_load_says_whether_it_was_honoured():
    base = metrics.summarize([])
    assert "concurrency" not in run_summary({**base, "concurrency_requested": 1, "concurrency_honoured": True})
    ok = run_summary({**base, "concurrency_requested": 4, "concurrency_honoured": True, "batch_size_mean": 2.5,
                      "batch_size_max": 4})
    assert "4 requested, honoured (batches 2.5 full on average, 4 at most)" in ok
    bad = run_summary({**base, "concurrency_requested": 4, "concurrency_honoured": False, "concurrency_why": WHY})
    assert f"4 requested, NOT honoured: {WHY}" in bad
    unknown = run_summary({**base, "concurrency_requested": 4, "concurrency_honoured": None, "max_decode_overlap": 3})
    assert "not known to be honoured" in unknown and "at most 3 requests were decoding at once" in unknown
