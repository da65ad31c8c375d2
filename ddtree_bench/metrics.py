"""Pure functions from `RequestRecord`s to numbers. Every backend's records go through here.

Definitions (the contract in docs/design.md §4; acceptance counts the bonus token, as the DDTree and
DFlash papers and vLLM do):

* a_r — tokens committed by verify round r counting the root (the previous round's bonus token),
  before truncation for EOS / max_new_tokens. AR rounds have a_r = 1.
* per-request tau = mean_r a_r.
* acceptance_length_mean = mean over requests of per-request tau ("mean of means", the papers').
* acceptance_length_token_weighted = sum a_r / number of rounds, pooled over all requests
  (Spec-Bench; vLLM's 1 + accepted / drafts).
* acceptance_histogram[k] = fraction of all rounds with a_r = k, k = 1..block_size.
* acceptance_rate_by_depth[d-1] = fraction of rounds with a_r - 1 >= d, d = 1..block_size-1.
* TTFT = t_first_token - t_send. E2E = t_done - t_send.
* TPOT = (t_done - t_first_token) / (output tokens - 1), for requests with >= 2 output tokens.
* ITL samples are per token: a chunk carrying k tokens that arrives a gap g after the previous
  chunk contributes k samples of g / k (tokens of the first chunk are covered by TTFT).
* output_throughput_tok_s = sum output tokens / (last t_done - first t_send) over ok requests.
* speedup_vs_ar = sum_p (e2e_AR,p / n_AR,p) * n_m,p / sum_p e2e_m,p over the requests ok in both runs
  (paired by prompt and turn; each side per output token, so pairs of different lengths still compare
  time per token; for equal lengths exactly sum e2e_AR / sum e2e_m); see `speedup_vs_ar`.
* intervals (`speedup_vs_ar_interval`, `output_throughput_interval`; methods in `stats.py`): the
  speedup's is a percentile bootstrap over paired prompts (two-way over repeats and prompts when
  there are several), tok/s's a Student t interval over repeats (>= 2). Level, resamples and seed
  are `defaults.CI_*`.

* batching (`concurrency_summary`, docs/batching.md): batch_size_mean = sum_r n_r / R over the R
  engine rounds (n_r requests shared round r), rebuilt from the per-request lists
  `server_stats["batch_sizes"]` (a round of n_r requests appears in n_r of them, so
  R = sum over request-rounds of 1 / n_r); observed_decode_concurrency = sum over ok requests of
  (t_done - t_first_token) / (last t_done - first t_send), the mean number of requests decoding at
  once; max_decode_overlap = the most decoding at one instant (1 when a backend ran them one at a
  time, which marks a closed-loop run at concurrency > 1 `concurrency_honoured: false`).
* throughput_ratio_vs_ar = output_throughput_tok_s / the AR point's output_throughput_tok_s at the
  same concurrency (`throughput_ratio_vs_ar`): the batched speedup, beside the latency-based one.

Errored requests count in num_requests / num_errors only. Undefined values are None, never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ddtree_bench.records import RequestRecord

DEFAULT_BLOCK_SIZE = 16
PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default) of already-sorted values; None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def distribution(values: Iterable[float]) -> dict[str, float | int | None]:
    """{n, mean, p50, p90, p99, max} of the values (None fields when there are none)."""
    vals = sorted(float(v) for v in values)
    out: dict[str, float | int | None] = {"n": len(vals), "mean": (sum(vals) / len(vals)) if vals else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(vals, q)
    out["max"] = vals[-1] if vals else None
    return out


def request_tau(accept_lengths: Sequence[int] | None) -> float | None:
    """Per-request tau = mean_r a_r (None when the request reported no rounds)."""
    if not accept_lengths:
        return None
    return sum(accept_lengths) / len(accept_lengths)


def acceptance_length_mean(records: Sequence[RequestRecord]) -> float | None:
    """Mean over ok requests of per-request tau (the papers' mean of means)."""
    taus = [t for r in records if r.ok and (t := request_tau(r.accept_lengths)) is not None]
    return sum(taus) / len(taus) if taus else None


def pooled_rounds(records: Sequence[RequestRecord]) -> list[int]:
    """All a_r of all ok requests, concatenated."""
    return [a for r in records if r.ok and r.accept_lengths for a in r.accept_lengths]


def acceptance_length_token_weighted(records: Sequence[RequestRecord]) -> float | None:
    """sum a_r / number of rounds, pooled over ok requests."""
    rounds = pooled_rounds(records)
    return sum(rounds) / len(rounds) if rounds else None


def acceptance_histogram(records: Sequence[RequestRecord], block_size: int = DEFAULT_BLOCK_SIZE) -> dict[str, float] | None:
    """{k: fraction of rounds with a_r = k} for k = 1..max(block_size, largest a_r); keys are strings."""
    rounds = pooled_rounds(records)
    if not rounds:
        return None
    top = max(block_size, max(rounds))
    counts = [0] * (top + 1)
    for a in rounds:
        counts[a] += 1
    return {str(k): counts[k] / len(rounds) for k in range(1, top + 1)}


def acceptance_rate_by_depth(records: Sequence[RequestRecord], block_size: int = DEFAULT_BLOCK_SIZE) -> list[float] | None:
    """[d-1] = fraction of rounds with a_r - 1 >= d, d = 1..block_size-1 (vLLM's per-position rate for a chain)."""
    rounds = pooled_rounds(records)
    if not rounds:
        return None
    depth = max(block_size, max(rounds)) - 1
    return [sum(1 for a in rounds if a - 1 >= d) / len(rounds) for d in range(1, depth + 1)]


def ttft_ms(r: RequestRecord) -> float | None:
    """TTFT = t_first_token - t_send, in ms."""
    if r.t_first_token_ns is None or r.t_send_ns is None:
        return None
    return (r.t_first_token_ns - r.t_send_ns) / 1e6


def e2e_ms(r: RequestRecord) -> float | None:
    """E2E = t_done - t_send, in ms."""
    if r.t_done_ns is None or r.t_send_ns is None:
        return None
    return (r.t_done_ns - r.t_send_ns) / 1e6


def tpot_ms(r: RequestRecord) -> float | None:
    """TPOT = (t_done - t_first_token) / (output tokens - 1), in ms; None below 2 output tokens."""
    n = r.num_output_tokens
    if n is None or n < 2 or r.t_done_ns is None or r.t_first_token_ns is None:
        return None
    return (r.t_done_ns - r.t_first_token_ns) / 1e6 / (n - 1)


def itl_samples_ms(r: RequestRecord) -> list[float]:
    """Per-token inter-token latencies: a k-token chunk after a gap g gives k samples of g/k (ms)."""
    out: list[float] = []
    times, toks = r.chunk_times_ns, r.chunk_tokens
    for i in range(1, min(len(times), len(toks))):
        k = toks[i]
        if k <= 0:
            continue
        gap_ms = (times[i] - times[i - 1]) / 1e6
        out.extend([gap_ms / k] * k)
    return out


def output_throughput_tok_s(records: Sequence[RequestRecord]) -> float | None:
    """sum output tokens / (last t_done - first t_send) over ok requests, tokens per second."""
    ok = [r for r in records if r.ok and r.t_send_ns is not None and r.t_done_ns is not None]
    if not ok:
        return None
    span_s = (max(r.t_done_ns for r in ok) - min(r.t_send_ns for r in ok)) / 1e9
    tokens = sum(r.num_output_tokens or 0 for r in ok)
    return tokens / span_s if span_s > 0 else None


def request_throughput_req_s(records: Sequence[RequestRecord]) -> float | None:
    """ok requests / (last t_done - first t_send), requests per second."""
    ok = [r for r in records if r.ok and r.t_send_ns is not None and r.t_done_ns is not None]
    if not ok:
        return None
    span_s = (max(r.t_done_ns for r in ok) - min(r.t_send_ns for r in ok)) / 1e9
    return len(ok) / span_s if span_s > 0 else None


def stage_ms_totals(records: Sequence[RequestRecord]) -> dict[str, float] | None:
    """Sum over ok requests of each engine stage's milliseconds (draft, tree_build, verify, commit, ...)."""
    totals: dict[str, float] = {}
    for r in records:
        if r.ok and r.stage_ms:
            for k, v in r.stage_ms.items():
                totals[k] = totals.get(k, 0.0) + float(v)
    return totals or None


def speedup_pairs(records: Sequence[RequestRecord], ar_records: Sequence[RequestRecord]) -> dict[tuple[str, int], tuple[float, float]]:
    """{(prompt_id, turn): (AR time on the method's token count, method e2e)} for requests ok in both runs.

    Each pair's numerator is e2e_AR,p / n_AR,p * n_m,p (AR's time per token times the method's
    tokens) and its denominator e2e_m,p, both in ms; `speedup_vs_ar` is their sum ratio.
    """
    ar = {(r.prompt_id, r.turn): r for r in ar_records if r.ok}
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for r in records:
        a = ar.get((r.prompt_id, r.turn))
        if not r.ok or a is None:
            continue
        e_m, e_a = e2e_ms(r), e2e_ms(a)
        n_m, n_a = r.num_output_tokens or 0, a.num_output_tokens or 0
        if e_m is None or e_a is None or n_m <= 0 or n_a <= 0:
            continue
        out[(r.prompt_id, r.turn)] = (e_a / n_a * n_m, e_m)
    return out


def speedup_vs_ar(records: Sequence[RequestRecord], ar_records: Sequence[RequestRecord]) -> float | None:
    """Paired speedup over AR: sum of AR e2e / sum of the method's e2e over requests present and ok in both.

    Pairs are keyed by (prompt_id, turn). Each side's e2e is normalised per output token first, so
    pairs whose lengths differ (T > 0, or a divergence) still compare time per token:
    speedup = sum_p (e2e_AR,p / n_AR,p) * w_p / sum_p (e2e_m,p / n_m,p) * w_p with w_p = n_m,p,
    which for equal lengths is exactly sum e2e_AR / sum e2e_m.
    """
    pairs = speedup_pairs(records, ar_records)
    num = sum(a for a, _ in pairs.values())
    den = sum(m for _, m in pairs.values())
    return num / den if den > 0 else None


def speedup_vs_ar_interval(records_by_repeat: Sequence[Sequence[RequestRecord]],
                           ar_records_by_repeat: Sequence[Sequence[RequestRecord]], *, level: float | None = None,
                           resamples: int | None = None, seed: int | None = None):
    """`speedup_vs_ar` pooled over repeats, with its confidence interval (a `stats.Interval`, or None).

    Repeat r of the method pairs with repeat r of AR (same settings, same seed), prompt by prompt,
    as in `speedup_pairs`; the estimate is sum over repeats and prompts of the AR side / sum of the
    method side (for one repeat exactly `speedup_vs_ar`). The interval is the percentile bootstrap
    over prompts, two-way over repeats and prompts when there are several
    (`stats.paired_ratio_interval`; defaults CI_LEVEL = 0.95, CI_RESAMPLES = 2000, CI_SEED = 0 in
    defaults.py). None with fewer than 2 paired prompts.
    """
    from ddtree_bench import defaults as D
    from ddtree_bench.stats import paired_ratio_interval

    if len(records_by_repeat) != len(ar_records_by_repeat):
        raise ValueError("one AR repeat per method repeat")
    per_repeat = [speedup_pairs(m, a) for m, a in zip(records_by_repeat, ar_records_by_repeat)]
    keys = sorted({k for d in per_repeat for k in d}, key=lambda k: (str(k[0]), k[1]))
    num = [[d[k][0] if k in d else None for k in keys] for d in per_repeat]
    den = [[d[k][1] if k in d else None for k in keys] for d in per_repeat]
    return paired_ratio_interval(num, den, level=D.CI_LEVEL if level is None else level,
                                 resamples=D.CI_RESAMPLES if resamples is None else resamples,
                                 seed=D.CI_SEED if seed is None else seed)


def output_throughput_interval(records_by_repeat: Sequence[Sequence[RequestRecord]], *, level: float | None = None):
    """Mean over repeats of `output_throughput_tok_s`, with the Student t interval over repeats.

    mean ± t_{(1+level)/2, R-1} · s / sqrt(R) over the R repeats' tok/s (`stats.repeat_mean_interval`;
    level CI_LEVEL = 0.95), the lower bound clipped at 0 tok/s. Throughput is one number per repeat,
    so its spread comes from repeats only: None below 2 repeats with a throughput.
    """
    from ddtree_bench import defaults as D
    from ddtree_bench.stats import repeat_mean_interval

    return repeat_mean_interval([output_throughput_tok_s(rs) for rs in records_by_repeat],
                                level=D.CI_LEVEL if level is None else level, floor=0.0)


def summarize(records: Sequence[RequestRecord], block_size: int = DEFAULT_BLOCK_SIZE) -> dict[str, Any]:
    """The run's summary.json (see the module docstring for every formula)."""
    ok = [r for r in records if r.ok]
    summary: dict[str, Any] = {
        "num_requests": len(records),
        "num_errors": len(records) - len(ok),
        "num_ok": len(ok),
        "total_prompt_tokens": sum(r.num_prompt_tokens or 0 for r in ok),
        "total_output_tokens": sum(r.num_output_tokens or 0 for r in ok),
        "num_rounds": len(pooled_rounds(records)),
        "acceptance_length_mean": acceptance_length_mean(records),
        "acceptance_length_token_weighted": acceptance_length_token_weighted(records),
        "acceptance_histogram": acceptance_histogram(records, block_size),
        "acceptance_rate_by_depth": acceptance_rate_by_depth(records, block_size),
        "output_throughput_tok_s": output_throughput_tok_s(records),
        "request_throughput_req_s": request_throughput_req_s(records),
    }
    spans = [r for r in ok if r.t_send_ns is not None and r.t_done_ns is not None]
    summary["duration_s"] = ((max(r.t_done_ns for r in spans) - min(r.t_send_ns for r in spans)) / 1e9) if spans else None
    summary["ttft_ms"] = distribution(v for r in ok if (v := ttft_ms(r)) is not None)
    summary["tpot_ms"] = distribution(v for r in ok if (v := tpot_ms(r)) is not None)
    summary["itl_ms"] = distribution(v for r in ok for v in itl_samples_ms(r))
    summary["e2e_ms"] = distribution(v for r in ok if (v := e2e_ms(r)) is not None)
    summary["stage_ms"] = stage_ms_totals(records)
    errors: dict[str, int] = {}
    for r in records:
        if r.error:
            key = r.error.split(":", 1)[0][:80]
            errors[key] = errors.get(key, 0) + 1
    summary["error_kinds"] = errors or None
    return summary


def batch_fullness(records: Sequence[RequestRecord]) -> dict[str, float | int | None]:
    """{batch_rounds R, batch_size_mean, batch_size_max} of the engine rounds behind the ok records,
    from each record's `server_stats["batch_sizes"]` (one entry per round it took part in):
    R = sum over request-rounds of 1 / n, mean = request-rounds / R. All None without such lists."""
    sizes = [int(n) for r in records if r.ok and isinstance(r.server_stats, dict)
             for n in (r.server_stats.get("batch_sizes") or []) if int(n) > 0]
    if not sizes:
        return {"batch_rounds": None, "batch_size_mean": None, "batch_size_max": None}
    rounds = sum(1.0 / n for n in sizes)
    return {"batch_rounds": round(rounds), "batch_size_mean": len(sizes) / rounds, "batch_size_max": max(sizes)}


def observed_decode_concurrency(records: Sequence[RequestRecord]) -> float | None:
    """sum over ok requests of (t_done - t_first_token) / (last t_done - first t_send): how many
    requests were decoding at once on average (None without timestamps or with a zero span)."""
    ok = [r for r in records if r.ok and r.t_send_ns is not None and r.t_done_ns is not None and r.t_first_token_ns is not None]
    if not ok:
        return None
    span = max(r.t_done_ns for r in ok) - min(r.t_send_ns for r in ok)
    busy = sum(r.t_done_ns - r.t_first_token_ns for r in ok)
    return busy / span if span > 0 else None


def max_decode_overlap(records: Sequence[RequestRecord]) -> int | None:
    """The most ok requests decoding at the same instant (open intervals t_first_token .. t_done)."""
    ev = []
    for r in records:
        if r.ok and r.t_first_token_ns is not None and r.t_done_ns is not None and r.t_done_ns > r.t_first_token_ns:
            ev += [(r.t_first_token_ns, 1), (r.t_done_ns, -1)]
    if not ev:
        return None
    ev.sort(key=lambda e: (e[0], e[1]))  # an end at the same instant as a start does not overlap it
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def concurrency_summary(records: Sequence[RequestRecord], concurrency: int, request_rate: float | None,
                        batching: dict[str, Any] | None) -> dict[str, Any]:
    """The summary.json fields that say whether a run's concurrency was real.

    `batching` is the backend's own account ({"max_batch", "honoured", "why"}; None when the backend
    cannot tell, e.g. a server). Without one, a closed-loop run at concurrency > 1 in which no two
    requests were ever decoding at the same time (`max_decode_overlap` <= 1) is marked not
    honoured; otherwise `concurrency_honoured` stays None (unknown). Fewer conversations than the
    concurrency (each runs one turn at a time) is not honoured either. Open-loop runs request a rate,
    not a concurrency: `concurrency_requested` is None there.
    """
    requested = None if request_rate is not None else concurrency
    observed = observed_decode_concurrency(records)
    honoured, why, max_batch = None, None, None
    if batching:
        honoured, why, max_batch = batching.get("honoured"), batching.get("why"), batching.get("max_batch")
    overlap = max_decode_overlap(records)
    if honoured is None and requested is not None and requested > 1 and overlap is not None and overlap <= 1:
        honoured = False
        why = f"no two requests were decoding at the same time at --concurrency {requested}: the backend ran them one at a time"
    conversations = len({r.prompt_id for r in records})
    if requested is not None and requested > 1 and 0 < conversations < requested and honoured is not False:
        honoured = False   # each conversation is one request at a time: the load never reached `requested`
        why = f"only {conversations} conversations for --concurrency {requested}: at most {conversations} were ever in flight"
    if requested == 1 and honoured is None:
        honoured = True
    return {"concurrency_requested": requested, "concurrency_honoured": honoured, "concurrency_why": why,
            "max_batch": max_batch, **batch_fullness(records), "observed_decode_concurrency": observed,
            "max_decode_overlap": overlap}


def throughput_ratio_vs_ar(tok_s: float | None, ar_tok_s: float | None) -> float | None:
    """output tok/s of a point / output tok/s of the AR point at the same concurrency (None if either is missing)."""
    if tok_s is None or ar_tok_s is None or ar_tok_s <= 0:
        return None
    return tok_s / ar_tok_s
