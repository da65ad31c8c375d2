"""Server-side acceptance counters, and their cross-check against the client's per-request numbers.

The client measures acceptance per request (`RequestRecord.accept_lengths`, pooled by
`metrics.acceptance_length_token_weighted`). The server keeps its own counters; a sweep snapshots
them before and after each point (after the server's warmup, with no other traffic) and compares:

* vLLM (serving-engines.md §2.3): Prometheus counters `vllm:spec_decode_num_drafts_total`,
  `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position}`
  (summed over `model_name`/`engine` labels). Mean acceptance length = 1 + Δaccepted / Δdrafts;
  acceptance rate = Δaccepted / Δdraft_tokens; per-position rate[i] = Δper_pos[i] / Δdrafts. Directly
  comparable with the client's pooled Σa_r / rounds.
* SGLang (§1.5, §1.7, §1.8): Prometheus `sglang:generation_tokens_total` and
  `sglang:spec_verify_calls_total` (both added per finished request), so the window's accept length is
  Δgeneration_tokens / Δverify_calls = Σcompletion_tokens / Σspec_verify_ct. That counts the first
  token (made by prefill, not by a verify round), so the comparable figure is
  (Σcompletion_tokens − N requests) / Σspec_verify_ct: tokens *delivered* per verify round. SGLang's
  counters cannot say more: a request's last round may accept tokens past `max_tokens`, which its
  per-request histograms (and the client's a_r, and the reference engine's rounds) count but its
  completion tokens do not. So the client side of SGLang's check uses the same delivered-token
  definition (`client_acceptance_length`): Σ(output tokens − 1) / Σ rounds over the client's records,
  equal to the counters' figure exactly when the server is right. (Client τ = Σa_r / rounds is the
  figure compared with the reference engine; it differs from this one by the last rounds' overshoot.)
  `/server_info` `internal_states[i].avg_spec_accept_length` is a lifetime figure folded in every
  `--decode-log-interval` batches: recorded, not compared.
* per-request stats the client kept in `RequestRecord.server_stats` (SGLang `spec_verify_ct` with the
  completion tokens; vLLM `num_spec_steps` / `num_accepted_draft_tokens`) give the same sums without
  Prometheus.
* ddtree-bench serve (`backends/server_metrics.py`): vLLM's counter names under the `ddtree:` prefix,
  read the same way (exact: the server counts the same rounds the client records).
* llama.cpp's llama-server (`--metrics`, `snapshot_llamacpp`): `llamacpp:spec_decode_num_drafts_total`
  (verify steps), `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`,
  `..._num_accepted_tokens_per_pos_total{position}`, added when a request finishes: vLLM's definitions,
  so 1 + Δaccepted / Δdrafts. The client rebuilds the same rounds from each chunk's `timings`
  (backends/parsers.py), so the two agree exactly when the server is right; both count the server's
  rounds as it ran them, drafts shortened to max_tokens (verdict/comparable_acceptance.py).

Differences beyond `defaults.CROSSCHECK_REL_TOL` are flagged (`agree: false`), not failed: truncation
at max_new_tokens and EOS makes the two sides differ slightly by construction.
Knows HTTP GETs and payload shapes; nothing of grids or engines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.records import RequestRecord

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+([^\s]+)(\s+-?\d+)?\s*$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

# vLLM's spec-decode counters (§2.3); ddtree-bench serve exports the same names under "ddtree:".
SPEC_COUNTERS = {"num_drafts": "spec_decode_num_drafts_total", "num_draft_tokens": "spec_decode_num_draft_tokens_total",
                 "num_accepted_tokens": "spec_decode_num_accepted_tokens_total"}
SPEC_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
PREFIX = {"vllm": "vllm:", "standalone": "ddtree:"}
LLAMACPP_PREFIX = "llamacpp:"
SGL_GEN_TOKENS = "sglang:generation_tokens_total"
SGL_VERIFY = "sglang:spec_verify_calls_total"


def _unescape(x: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), x)


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value). Comments and junk lines skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, _, labels, value = m.group(1), m.group(2), m.group(3), m.group(4)
        try:
            v = float(value)
        except ValueError:
            continue
        lab = {k: _unescape(x) for k, x in _LABEL.findall(labels or "")}
        out.append((name, lab, v))
    return out


def metric_sum(samples: Sequence[tuple[str, dict[str, str], float]], name: str, **match: str) -> float | None:
    """Sum of a metric over all label sets (optionally only those whose labels match); None if absent."""
    vals = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in match.items())]
    return sum(vals) if vals else None


def _per_pos(samples, name: str) -> dict[int, float]:
    pos: dict[int, float] = {}
    for n, lab, v in samples:
        if n == name and "position" in lab:
            try:
                i = int(lab["position"])
            except ValueError:
                continue
            pos[i] = pos.get(i, 0.0) + v
    return pos


def snapshot(kind: str | None, samples_text: str | None, server_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The counters a sweep keeps for one moment: flat {counter: value} (+ per-position, server_info bits)."""
    snap: dict[str, Any] = {}
    if samples_text is not None:
        s = parse_prometheus(samples_text)
        if kind in PREFIX:
            for key, name in SPEC_COUNTERS.items():
                snap[key] = metric_sum(s, PREFIX[kind] + name)
            snap["accepted_per_pos"] = {str(k): v for k, v in sorted(_per_pos(s, PREFIX[kind] + SPEC_PER_POS).items())} or None
        elif kind == "llamacpp":
            snap.update(snapshot_llamacpp(s))
        elif kind == "sglang":
            snap["generation_tokens"] = metric_sum(s, SGL_GEN_TOKENS)
            snap["spec_verify_calls"] = metric_sum(s, SGL_VERIFY)
    if kind == "sglang" and server_info:
        states = server_info.get("internal_states")
        if not states and isinstance(server_info.get("decode"), list) and server_info["decode"]:
            states = server_info["decode"][0].get("internal_states")  # PD disaggregation
        if isinstance(states, list):
            snap["avg_spec_accept_length_lifetime"] = [st.get("avg_spec_accept_length") for st in states if isinstance(st, dict)]
    return snap


def snapshot_llamacpp(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    """llama-server's spec-decode counters under vLLM's keys (num_drafts = verify steps; module docstring)."""
    snap: dict[str, Any] = {key: metric_sum(samples, LLAMACPP_PREFIX + name) for key, name in SPEC_COUNTERS.items()}
    pos = _per_pos(samples, LLAMACPP_PREFIX + SPEC_PER_POS)
    snap["accepted_per_pos"] = {str(k): v for k, v in sorted(pos.items())} or None
    return snap


def _d(after: dict, before: dict, key: str) -> float | None:
    a, b = after.get(key), before.get(key)
    if a is None:
        return None
    return a - (b or 0.0)


def server_acceptance(kind: str | None, before: dict[str, Any], after: dict[str, Any], num_requests: int) -> dict[str, Any]:
    """Acceptance from counter deltas over a point. `acceptance_length_comparable` uses the client's definition."""
    out: dict[str, Any] = {}
    if kind in PREFIX or kind == "llamacpp":
        drafts, dtoks, acc = (_d(after, before, k) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
        out.update(delta_num_drafts=drafts, delta_num_draft_tokens=dtoks, delta_num_accepted_tokens=acc)
        if drafts and acc is not None:
            out["acceptance_length"] = 1.0 + acc / drafts
            out["acceptance_length_comparable"] = out["acceptance_length"]
            pa, pb = after.get("accepted_per_pos") or {}, before.get("accepted_per_pos") or {}
            out["per_position_rate"] = [(pa[k] - pb.get(k, 0.0)) / drafts for k in sorted(pa, key=int)] or None
        if dtoks and acc is not None:
            out["acceptance_rate"] = acc / dtoks
    elif kind == "sglang":
        gen, ver = _d(after, before, "generation_tokens"), _d(after, before, "spec_verify_calls")
        out.update(delta_generation_tokens=gen, delta_spec_verify_calls=ver)
        if ver and gen is not None:
            out["acceptance_length"] = gen / ver
            out["acceptance_length_comparable"] = (gen - num_requests) / ver
        if "avg_spec_accept_length_lifetime" in after:
            out["avg_spec_accept_length_lifetime"] = after["avg_spec_accept_length_lifetime"]
    return out


def _stat(stats: dict[str, Any] | None, *keys: str) -> float | None:
    """First of `keys` found in a server_stats dict or one level below (e.g. vLLM's speculative_decoding)."""
    if not isinstance(stats, dict):
        return None
    for k in keys:
        if isinstance(stats.get(k), (int, float)) and not isinstance(stats.get(k), bool):
            return float(stats[k])
    for v in stats.values():
        if isinstance(v, dict):
            x = _stat(v, *keys)
            if x is not None:
                return x
    return None


def per_request_acceptance(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """Sums of the engine's own per-request stats (SGLang: Σcompletion / Σspec_verify_ct; vLLM:
    1 + Σaccepted / Σspec steps); None when no record carries them."""
    ok = [r for r in records if r.ok and r.server_stats]
    comp = ver = n = 0.0
    steps = acc = 0.0
    per_step: list[int] = []   # vLLM "detailed": accepted drafts of every spec step, pooled over requests
    have_sgl = have_vllm = False
    source = None
    for r in ok:
        source = source or r.server_stats.get("source")
        v = _stat(r.server_stats, "spec_verify_ct")
        if v:
            c = _stat(r.server_stats, "completion_tokens")
            comp += c if c is not None else float(r.num_output_tokens or 0)
            ver += v
            n += 1
            have_sgl = True
        s, a = _stat(r.server_stats, "num_spec_steps"), _stat(r.server_stats, "num_accepted_draft_tokens")
        if s and a is not None:
            steps += s
            acc += a
            have_vllm = True
            ps = r.server_stats.get("per_step_accepted")
            if isinstance(ps, list) and all(isinstance(x, int) for x in ps):
                per_step += ps
    if have_sgl:
        return {"source": source or "sglang", "requests": int(n), "sum_completion_tokens": comp,
                "sum_spec_verify_ct": ver, "acceptance_length": comp / ver, "acceptance_length_comparable": (comp - n) / ver}
    if have_vllm:
        out = {"source": source or "vllm", "sum_num_spec_steps": steps,
               "sum_num_accepted_draft_tokens": acc, "acceptance_length": 1 + acc / steps,
               "acceptance_length_comparable": 1 + acc / steps}
        if per_step:  # rate[i] = steps that accepted more than i drafts / steps (vLLM's per_pos counter / drafts)
            depth = max(max(per_step), 1)
            out["per_position_rate"] = [sum(1 for x in per_step if x > i) / len(per_step) for i in range(depth)]
        return out
    return None


# What each engine's counters measure, as a figure of the client's records (see the module docstring).
CLIENT_DEFINITION = {
    "vllm": "sum a_r / rounds (accepted drafts per spec step + 1, as vLLM counts them)",
    "standalone": "sum a_r / rounds (ddtree-bench serve counts the rounds the client records)",
    "sglang": "sum(output tokens - 1) / rounds (tokens delivered per verify round, as SGLang's counters count them)",
}


def client_acceptance_length(kind: str | None, records: Sequence[RequestRecord]) -> float | None:
    """The client's acceptance length under the definition `kind`'s counters measure (CLIENT_DEFINITION):
    SGLang: Σ(num_output_tokens − 1) / Σ rounds over ok records that have rounds; every other kind: the
    token-weighted τ = Σa_r / Σ rounds."""
    from ddtree_bench import metrics

    if kind != "sglang":
        return metrics.acceptance_length_token_weighted(records)
    emitted = rounds = 0
    for r in records:
        if r.ok and r.accept_lengths and r.num_output_tokens:
            emitted += r.num_output_tokens - 1
            rounds += len(r.accept_lengths)
    return emitted / rounds if rounds else None


def crosscheck(client_tau: float | None, server: dict[str, Any] | None, per_request: dict[str, Any] | None,
               tol: float = D.CROSSCHECK_REL_TOL) -> dict[str, Any]:
    """Compare the client's pooled acceptance with the server's (counters first, else per-request sums)."""
    ref = None
    source = None
    for name, block in (("counters", server), ("per_request", per_request)):
        if block and block.get("acceptance_length_comparable") is not None:
            ref, source = block["acceptance_length_comparable"], name
            break
    out: dict[str, Any] = {"client_acceptance_length": client_tau, "server_acceptance_length": ref, "server_source": source,
                           "rel_diff": None, "agree": None, "tolerance": tol}
    if ref is not None and client_tau:
        out["rel_diff"] = abs(ref - client_tau) / client_tau
        out["agree"] = out["rel_diff"] <= tol
    a, b = (server or {}).get("per_position_rate"), (per_request or {}).get("per_position_rate")
    if a and b:  # counters vs per-request stats, position by position (missing tail positions are 0)
        n = max(len(a), len(b))
        pad = lambda v: list(v) + [0.0] * (n - len(v))
        out["per_position_max_abs_diff"] = max(abs(x - y) for x, y in zip(pad(a), pad(b)))
    return out


def fetch_json(base_url: str, path: str, timeout_s: float, api_key: str | None = None) -> dict[str, Any] | None:
    from ddtree_bench.sweep.server import http_get

    status, body, _ = http_get(base_url + path, timeout_s, api_key)
    if status != 200:
        return None
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def scrape(kind: str | None, base_url: str, timeout_s: float = D.SERVER_HEALTH_TIMEOUT_S, api_key: str | None = None) -> dict[str, Any]:
    """One snapshot from a live server (/metrics, and /server_info for SGLang). Missing endpoints -> empty."""
    return scrape_with_text(kind, base_url, timeout_s, api_key)[0]


def scrape_with_text(kind: str | None, base_url: str, timeout_s: float = D.SERVER_HEALTH_TIMEOUT_S,
                     api_key: str | None = None) -> tuple[dict[str, Any], str | None]:
    """`scrape`, plus the raw /metrics text (None when the server has no /metrics) for the point directory."""
    from ddtree_bench.sweep.server import http_get

    if kind is None:
        return {}, None
    status, body, _ = http_get(base_url + "/metrics", timeout_s, api_key)
    text = body.decode("utf-8", errors="replace") if status == 200 else None
    info = fetch_json(base_url, "/server_info", timeout_s, api_key) if kind == "sglang" else None
    return snapshot(kind, text, info), text
