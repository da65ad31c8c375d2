"""Small terminal tables for humans (the files on disk are the machine-readable output)."""

from __future__ import annotations

from typing import Any, Sequence


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_summary(summary: dict[str, Any]) -> str:
    """Headline numbers of one run as `key  value` lines."""
    rows = [
        ("requests (errors)", f"{summary['num_requests']} ({summary['num_errors']})"),
        ("acceptance length (mean of means)", fmt(summary.get("acceptance_length_mean"))),
        ("acceptance length (token-weighted)", fmt(summary.get("acceptance_length_token_weighted"))),
        ("output tokens", summary.get("total_output_tokens")),
        ("output throughput tok/s", fmt(summary.get("output_throughput_tok_s"), 1)),
        ("TTFT p50 / p99 ms", f"{fmt(summary['ttft_ms'].get('p50'), 1)} / {fmt(summary['ttft_ms'].get('p99'), 1)}"),
        ("TPOT p50 / p99 ms", f"{fmt(summary['tpot_ms'].get('p50'), 2)} / {fmt(summary['tpot_ms'].get('p99'), 2)}"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)
