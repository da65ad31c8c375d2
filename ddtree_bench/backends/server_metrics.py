"""Server-side counters of `ddtree-bench serve`, exposed at `GET /metrics` in Prometheus text format.

Names follow vLLM's (serving-engines.md §2.3) under the `ddtree:` prefix, so a scraper written for
vLLM reads ours by swapping the prefix. Speculative counters, per finished DFlash/DDTree request
(AR requests have no drafts and add nothing):

    ddtree:spec_decode_num_drafts_total              verify rounds R
    ddtree:spec_decode_num_draft_tokens_total        tree nodes verified (DDTree: budget/round; DFlash: block_size-1)
    ddtree:spec_decode_num_accepted_tokens_total     accepted drafts, bonus excluded: sum(a_r - 1)
    ddtree:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   rounds with a_r - 1 > i (depth i+1 accepted)
    ddtree:spec_decode_rounds_total{accept_length="k"}                   rounds with a_r = k (exact histogram)

so mean acceptance length = 1 + Δaccepted / Δdrafts (= the token-weighted a_r) and the per-depth
rate[i] = Δper_pos{position=i} / Δdrafts, as for vLLM. Request metrics: requests by endpoint and
status, running/waiting gauges, prompt/generation token counters, and histograms of queue time,
TTFT, per-token inter-token latency (a k-token chunk after a gap g is k samples of g/k) and E2E.
Counters only grow (deltas between two scrapes scope them to a run).

Knows Prometheus text; nothing of HTTP handlers or models.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

PREFIX = "ddtree:"
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                     7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    esc = lambda v: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels) + "}"


def _num(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v)) if abs(v) < 1e15 else repr(float(v))


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += n
        self.sum += v * n
        self.count += n


class ServerMetrics:
    """Thread-safe registry of the server's counters, gauges and histograms."""

    def __init__(self, model_name: str, block_size: int):
        self.model = model_name
        self.block_size = block_size
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self._gauges: dict[str, float] = {}
        self._hists: dict[str, _Histogram] = {}
        self._help: dict[str, tuple[str, str]] = {}
        for name, kind, text in (
            ("spec_decode_num_drafts", "counter", "Verify rounds of speculative (DFlash/DDTree) requests."),
            ("spec_decode_num_draft_tokens", "counter", "Draft tokens (tree nodes) verified."),
            ("spec_decode_num_accepted_tokens", "counter", "Accepted draft tokens, bonus token excluded."),
            ("spec_decode_num_accepted_tokens_per_pos", "counter", "Rounds that accepted a draft at depth position+1."),
            ("spec_decode_rounds", "counter", "Verify rounds by exact acceptance length a_r (bonus counted)."),
            ("request_success", "counter", "Finished requests by finish reason."),
            ("http_requests", "counter", "HTTP requests by endpoint and status code."),
            ("prompt_tokens", "counter", "Prompt tokens of finished requests."),
            ("generation_tokens", "counter", "Generated tokens of finished requests."),
            ("num_requests_running", "gauge", "Requests being generated."),
            ("num_requests_waiting", "gauge", "Requests waiting for the engine."),
            ("request_queue_time_seconds", "histogram", "Arrival to the engine starting the request."),
            ("time_to_first_token_seconds", "histogram", "Arrival to the first token sent."),
            ("inter_token_latency_seconds", "histogram", "Per-token gaps (a k-token chunk counts k times g/k)."),
            ("e2e_request_latency_seconds", "histogram", "Arrival to the last token sent."),
        ):
            self._help[name] = (kind, text)
            if kind == "gauge":
                self._gauges[name] = 0.0
            elif kind == "histogram":
                self._hists[name] = _Histogram(LATENCY_BUCKETS_S)
        self._counters["spec_decode_num_drafts"][()] += 0
        self._counters["spec_decode_num_draft_tokens"][()] += 0
        self._counters["spec_decode_num_accepted_tokens"][()] += 0
        for i in range(max(0, block_size - 1)):
            self._counters["spec_decode_num_accepted_tokens_per_pos"][(("position", str(i)),)] += 0

    # ------------------------------------------------------------------ updates

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        with self._lock:
            self._counters[name][tuple(sorted(labels.items()))] += value

    def gauge_add(self, name: str, delta: float) -> None:
        with self._lock:
            self._gauges[name] += delta

    def gauge_set(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def observe(self, name: str, seconds: float, n: int = 1) -> None:
        with self._lock:
            self._hists[name].observe(seconds, n)

    def spec_request(self, method: str, accept_lengths: list[int], draft_tokens: int) -> None:
        """Fold one finished speculative request's rounds into the spec counters (no-op for AR)."""
        if method == "ar" or not accept_lengths:
            return
        with self._lock:
            c = self._counters
            c["spec_decode_num_drafts"][()] += len(accept_lengths)
            c["spec_decode_num_draft_tokens"][()] += draft_tokens
            c["spec_decode_num_accepted_tokens"][()] += sum(a - 1 for a in accept_lengths)
            for a in accept_lengths:
                for i in range(a - 1):
                    c["spec_decode_num_accepted_tokens_per_pos"][(("position", str(i)),)] += 1
                c["spec_decode_rounds"][(("accept_length", str(a)),)] += 1

    # ------------------------------------------------------------------ exposition

    def render(self) -> str:
        """Prometheus text exposition format 0.0.4."""
        model = (("model_name", self.model),)
        out: list[str] = []
        with self._lock:
            for name, (kind, text) in self._help.items():
                full = PREFIX + name
                if kind == "counter":
                    series = self._counters.get(name, {})
                    out += [f"# HELP {full}_total {text}", f"# TYPE {full}_total counter"]
                    def order(item):
                        return [(k, int(v) if v.isdigit() else v) for k, v in item[0]]
                    for labels, v in sorted(series.items(), key=order):
                        out.append(f"{full}_total{_labels(model + labels)} {_num(v)}")
                elif kind == "gauge":
                    out += [f"# HELP {full} {text}", f"# TYPE {full} gauge", f"{full}{_labels(model)} {_num(self._gauges[name])}"]
                else:
                    h = self._hists[name]
                    out += [f"# HELP {full} {text}", f"# TYPE {full} histogram"]
                    cum = 0
                    for le, n in zip(list(h.buckets) + [float("inf")], h.counts):
                        cum += n
                        le_s = "+Inf" if le == float("inf") else repr(le)
                        out.append(f"{full}_bucket{_labels(model + (('le', le_s),))} {cum}")
                    out.append(f"{full}_sum{_labels(model)} {repr(h.sum)}")
                    out.append(f"{full}_count{_labels(model)} {h.count}")
        return "\n".join(out) + "\n"


def parse_prometheus(text: str) -> dict[str, float]:
    """{'name{labels}': value} of a text exposition (comments skipped). For tests and cross-checks."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out
