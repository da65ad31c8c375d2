"""The T > 0 verdict: are a run's sampled tokens drawn from the target's tempered distribution?

Lossless speculative sampling (DDTree / DFlash, vLLM's and SGLang's rejection or sample-and-match
verification) emits every token from the target's distribution given the tokens before it:
    q_t(x) = softmax(logits_t / T)(x), optionally cut to the top-p nucleus and renormalised
(the reference engine's rule, `engine/verify.pick`: sort most-likely-first, keep a token while the
mass before it is < top_p, so the most likely token is always kept). Greedy decoding passes
every greedy diff; at T > 0 outputs equal greedy decoding only in distribution, so `compare` cannot
diff them token by token. This module tests the distribution instead.

Probability integral transform (randomised, exact for discrete distributions). Order the
vocabulary most-likely-first under q_t, ties by token id. For the emitted token x_t let
    F_t = sum of q_t(y) over the tokens y ordered before x_t,   p_t = q_t(x_t),
    u_t = F_t + V_t * p_t,   V_t ~ Uniform[0, 1) independent of everything (seeded: `PIT_SEED` with the
    run's own --seed, `run_pit_seed`, so runs at other seeds get fresh V: with one V for every run of a
    prompt, the test's 1% false-alarm rate held only on average over V, and one unlucky V failed 3 of 19
    honest 8-token runs).
If x_t ~ q_t then u_t ~ Uniform[0, 1] exactly, whatever q_t is (the interval [F_t, F_t + p_t) of
each token has length p_t, and V_t spreads u uniformly inside it), and u_t is independent of the
tokens before it; so the u of one request, and of all requests pooled, are i.i.d. Uniform[0, 1].
A near-degenerate q_t (one token with p ~ 1) gives u_t ~ V_t: no power, but still exactly uniform
(without V the test would be wrong, not weak). A server that decodes greedily emits the most likely
token: u_t = V_t * p_t <= p_t piles u near 0 wherever the target was unsure; one that samples too
cold (T' < T) skews u low, one too hot skews it high; a top-p it ignores puts u in (top_p, 1].

Test. u are pooled over every emitted token of every scored request, cut after the first stop
token (the stop token itself is emitted and counted; what a server emitted after it is not), and
tested for uniformity with the two-sided Kolmogorov-Smirnov statistic
    D_n = max(D+, D-),  D+ = max_i (i/n - u_(i)),  D- = max_i (u_(i) - (i-1)/n)
(u_(1) <= ... <= u_(n); D+ > D- means u skewed low: greedy or too cold; D- > D+ skewed high).
p = P(D_n >= d) for n i.i.d. uniforms: exact (Marsaglia, Tsang and Wang 2003, J. Stat. Softw.
8(18): the Durbin matrix H of size m = 2k - 1, k = floor(n d) + 1, h = k - n d, raised to the n-th
power, P(D_n < d) = n! / n^n * (H^n)[k-1, k-1]) while m <= EXACT_MAX_MATRIX, else the Kolmogorov
limit with Stephens' correction, Q(lambda) = 2 sum_{j>=1} (-1)^(j-1) exp(-2 j^2 lambda^2),
lambda = (sqrt(n) + 0.12 + 0.11 / sqrt(n)) d (that regime is large n, where it is accurate, or
p far below any false-alarm rate). `gate` fails the run when p < the false-alarm rate
(`FALSE_ALARM_RATE` = 1% unless the rules say otherwise): an honest sampler fails 1 run in 100.
A run's length depends on its tokens (a stop ends it), so the pooled u are exactly i.i.d. only for
requests that ran to max_new_tokens; a stop conditions one u per request (documented, negligible
at a few stops per hundreds of tokens).

Scoring: the reference engine loads the baseline's target (the same rules as the near-tie
re-check, `near_tie_recheck.loadable`, and the same model hash) in float32 and runs one
teacher-forced forward per request over prompt_ids + output_ids[:-1]; row i predicts output i.
Where it cannot (server or imported baselines, a model not on this machine, another hash) the
verdict is "not judged", never a pass. What it does not know: numerics of the server (a bf16
server's q differs slightly from the fp32 reference's; at a few thousand tokens that is far below
the test's resolution), and whether the server's randomness is independent across requests.
Knows records, baselines and the engine's target forward; nothing of rules or rendering.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

FALSE_ALARM_RATE = 0.01   # the gate's default: an honest T > 0 run fails 1 time in 100
PIT_SEED = 0              # seed of the randomisation V (per request: sha256 of seed/prompt_id/turn)
HISTOGRAM_BINS = 20       # equal bins of [0, 1] for the u histogram (compare's JSON, the report)
EXACT_MAX_MATRIX = 401    # largest Durbin matrix (m = 2k - 1) for the exact p-value
ROW_CHUNK = 256           # output positions turned into probabilities at once (memory: ROW_CHUNK x vocab x 8 bytes)


# ---------------------------------------------------------------------------- the target's sampling rule


def tempered_probs(logits: Any, temperature: float, top_p: float = 1.0) -> Any:
    """logits [N, V] -> q [N, V] float64: softmax(logits / T), cut to the top-p nucleus as the reference
    engine's `pick` cuts it (most likely first, ties by token id; a token is kept while the mass before
    it is < top_p) and renormalised."""
    import torch

    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def pit_values(probs: Any, tokens: Any, v: Any) -> tuple[Any, Any]:
    """Randomised PIT of each row's token: (u [N] float64, outside [N] bool).
    u = F + V p with F the mass of the tokens ordered before the token (more likely, or as likely with
    a smaller id). `outside`: the token has probability 0 (e.g. outside the top-p nucleus); its u is
    F, the whole kept mass (1)."""
    import torch

    tok = tokens.long().reshape(-1, 1)
    p_tok = probs.gather(1, tok)
    ids = torch.arange(probs.shape[1], device=probs.device).reshape(1, -1)
    before = (probs > p_tok) | ((probs == p_tok) & (ids < tok))
    f = (probs * before).sum(1)
    p = p_tok.squeeze(1)
    u = (f + v.double() * p).clamp(0.0, 1.0)
    return u, p <= 0


def pit_value_slow(probs: Sequence[float], token: int, v: float) -> float:
    """Slow twin of `pit_values` for one row: sort the vocabulary explicitly and add up the masses in
    front of the token."""
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    f = 0.0
    for i in order:
        if i == token:
            break
        f += probs[i]
    return min(1.0, max(0.0, f + v * probs[token]))


# ---------------------------------------------------------------------------- Kolmogorov-Smirnov


@dataclass
class KSResult:
    n: int
    statistic: float        # D_n
    d_plus: float           # max(i/n - u_(i)): u skewed low
    d_minus: float          # max(u_(i) - (i-1)/n): u skewed high
    p_value: float
    p_method: str           # exact | asymptotic

    @property
    def skew(self) -> str:
        return "low" if self.d_plus >= self.d_minus else "high"


def ks_statistic(u: Sequence[float]) -> tuple[float, float, float]:
    """(D_n, D+, D-) of u against Uniform[0, 1]."""
    s = sorted(u)
    n = len(s)
    if n == 0:
        raise ValueError("no values")
    d_plus = max((i + 1) / n - x for i, x in enumerate(s))
    d_minus = max(x - i / n for i, x in enumerate(s))
    d_plus, d_minus = max(d_plus, 0.0), max(d_minus, 0.0)
    return max(d_plus, d_minus), d_plus, d_minus


def kolmogorov_sf(d: float, n: int) -> float:
    """The Kolmogorov limit with Stephens' finite-n correction: Q(lambda), lambda = (sqrt n + 0.12 + 0.11/sqrt n) d."""
    rn = math.sqrt(n)
    lam = (rn + 0.12 + 0.11 / rn) * d
    if lam <= 0:
        return 1.0
    if lam < 1.0:  # the theta-function form converges fast for small lambda: 1 - sqrt(2 pi)/lambda sum exp(-(2j-1)^2 pi^2 / (8 lambda^2))
        s = sum(math.exp(-((2 * j - 1) ** 2) * math.pi ** 2 / (8 * lam * lam)) for j in range(1, 8))
        return min(1.0, max(0.0, 1.0 - math.sqrt(2 * math.pi) / lam * s))
    s = sum((-1) ** (j - 1) * math.exp(-2 * j * j * lam * lam) for j in range(1, 101))
    return min(1.0, max(0.0, 2.0 * s))


def _ks_cdf_exact(d: float, n: int) -> float:
    """P(D_n < d) by Marsaglia, Tsang and Wang (2003): (n!/n^n) (H^n)[k-1, k-1], H the m x m Durbin matrix."""
    import numpy as np

    k = int(n * d) + 1
    m = 2 * k - 1
    h = k - n * d
    i = np.arange(m).reshape(-1, 1)
    j = np.arange(m).reshape(1, -1)
    H = (i - j + 1 >= 0).astype(np.float64)
    powers = h ** np.arange(1, m + 1)
    H[:, 0] -= powers
    H[m - 1, :] -= powers[::-1]
    if 2 * h - 1 > 0:
        H[m - 1, 0] += (2 * h - 1) ** m
    diff = i - j + 1
    pos = diff > 0
    inv_fact = np.exp(-np.array([math.lgamma(x + 1) for x in range(m + 1)]))  # 1 / x!
    H = np.where(pos, H * inv_fact[np.where(pos, diff, 0)], H)
    # H^n by squaring, keeping each factor's scale as a power of 2 so nothing overflows
    result, r_exp = np.eye(m), 0
    base, b_exp = H, 0
    e = n
    while e:
        if e & 1:
            result = result @ base
            r_exp += b_exp
            result, r_exp = _rescale(result, r_exp)
        e >>= 1
        if e:
            base = base @ base
            b_exp *= 2
            base, b_exp = _rescale(base, b_exp)
    q = result[k - 1, k - 1]
    if q <= 0:
        return 0.0
    log_cdf = math.log(q) + r_exp * math.log(2.0) + math.lgamma(n + 1) - n * math.log(n)
    return min(1.0, math.exp(log_cdf))


def _rescale(a: Any, exp: int) -> tuple[Any, int]:
    import numpy as np

    top = float(np.abs(a).max())
    if top > 0 and (top > 1e100 or top < 1e-100):
        shift = math.frexp(top)[1]
        return a * 2.0 ** -shift, exp + shift
    return a, exp


def ks_pvalue(d: float, n: int) -> tuple[float, str]:
    """P(D_n >= d) for n i.i.d. uniforms and how it was computed (exact | asymptotic)."""
    if d <= 0:
        return 1.0, "exact"
    if d >= 1:
        return 0.0, "exact"
    if n * d * d > 18:  # p < 1e-15 (Kolmogorov: 2 exp(-36)); the exact matrix would be large for nothing
        return kolmogorov_sf(d, n), "asymptotic"
    m = 2 * (int(n * d) + 1) - 1
    if m > EXACT_MAX_MATRIX:
        return kolmogorov_sf(d, n), "asymptotic"
    return max(0.0, 1.0 - _ks_cdf_exact(d, n)), "exact"


def ks_uniform(u: Sequence[float]) -> KSResult:
    """Two-sided one-sample KS test of u against Uniform[0, 1]."""
    d, dp, dm = ks_statistic(u)
    p, how = ks_pvalue(d, len(u))
    return KSResult(len(u), d, dp, dm, p, how)


def histogram(u: Sequence[float], bins: int = HISTOGRAM_BINS) -> list[int]:
    """Counts of u in `bins` equal bins of [0, 1] (1.0 in the last)."""
    out = [0] * bins
    for x in u:
        out[min(bins - 1, max(0, int(x * bins)))] += 1
    return out


# ---------------------------------------------------------------------------- scoring a run


@dataclass
class SamplingReport:
    """The distribution section of `compare --json` (`to_json`) and what the gate's
    `sampling_distribution` rule judges. `judged` False: `reason` says why not."""

    judged: bool
    reason: str
    temperature: float
    top_p: float
    num_requests: int = 0              # requests whose tokens were scored
    num_requests_unscored: int = 0     # ok requests without prompt or output ids (or with re-tokenized ones)
    num_tokens: int = 0                # u values tested
    num_tokens_after_stop: int = 0     # emitted after the first stop token: not tested
    num_outside_support: int = 0       # tokens the target gives probability 0 (outside top-p)
    statistic: float | None = None     # KS D_n
    d_plus: float | None = None
    d_minus: float | None = None
    p_value: float | None = None
    p_method: str | None = None
    skew: str | None = None            # low (greedy / too cold) | high (too hot)
    mean_u: float | None = None        # 0.5 under the null
    histogram: list[int] = field(default_factory=list)
    test: str = "two-sided Kolmogorov-Smirnov of the randomised PIT u against Uniform[0, 1]"
    seed: int = PIT_SEED
    scored_with: str | None = None     # the reference model, dtype, device
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the console."""
        head = f"sampling distribution at T={self.temperature:g}" + (f", top_p={self.top_p:g}" if self.top_p < 1 else "")
        if not self.judged:
            return f"{head}: NOT JUDGED ({self.reason})"
        skew = {"low": "u skewed low: greedy or too cold?", "high": "u skewed high: too hot, or another distribution (model, state)?"}.get(self.skew or "", "")
        return (f"{head}: KS D = {self.statistic:.4f} over {self.num_tokens} tokens of {self.num_requests} requests, "
                f"p = {self.p_value:.3g} ({self.p_method}); mean u {self.mean_u:.3f} (0.5 if sampled right)"
                + (f"; {skew}" if self.p_value is not None and self.p_value < FALSE_ALARM_RATE and skew else ""))


def run_pit_seed(run_info: dict[str, Any], seed: int = PIT_SEED) -> int:
    """The V seed of a run: `seed` mixed with the run's own sampling --seed (the same run judged twice gets the same V)."""
    run_seed = (run_info.get("spec") or {}).get("seed")
    if run_seed is None:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/run-seed/{run_seed}".encode()).digest()[:4], "big")


def v_generator(prompt_id: str, turn: int, seed: int = PIT_SEED) -> random.Random:
    """The V stream of one request: independent of the request's order in the run and of the server."""
    digest = hashlib.sha256(f"{seed}/{prompt_id}/{turn}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def cut_after_stop(output_ids: list[int], stop_ids: Sequence[int]) -> list[int]:
    """output_ids up to and including the first stop token."""
    stops = set(stop_ids)
    for i, x in enumerate(output_ids):
        if x in stops:
            return list(output_ids[:i + 1])
    return list(output_ids)


def score_request(target: Any, prompt_ids: list[int], output_ids: list[int], temperature: float, top_p: float,
                  v: list[float]) -> tuple[list[float], int]:
    """u of every output token (teacher-forced: one forward over prompt + output[:-1]) and the number
    of tokens outside the target's support."""
    import torch

    if not output_ids:
        return [], 0
    seq = list(prompt_ids) + list(output_ids[:-1])
    dev = target.lm_head.weight.device
    with torch.inference_mode():
        cache = target.new_cache(len(seq))
        logits, _ = target(torch.tensor(seq, dtype=torch.long, device=dev), torch.arange(len(seq), device=dev), cache, 0)
        rows = logits[len(prompt_ids) - 1:]
        toks = torch.tensor(output_ids, dtype=torch.long, device=dev)
        vv = torch.tensor(v, dtype=torch.float64, device=dev)
        us, outside = [], 0
        for a in range(0, rows.shape[0], ROW_CHUNK):
            q = tempered_probs(rows[a:a + ROW_CHUNK], temperature, top_p)
            u, out = pit_values(q, toks[a:a + ROW_CHUNK], vv[a:a + ROW_CHUNK])
            us += u.tolist()
            outside += int(out.sum())
    return us, outside


def uniformity_verdict(values: list[float], report: SamplingReport) -> SamplingReport:
    """Fill `report` with the KS test of the pooled u."""
    ks = ks_uniform(values)
    report.statistic, report.d_plus, report.d_minus = ks.statistic, ks.d_plus, ks.d_minus
    report.p_value, report.p_method, report.skew = ks.p_value, ks.p_method, ks.skew
    report.mean_u = sum(values) / len(values)
    report.histogram = histogram(values)
    report.num_tokens = len(values)
    return report


def score_records(target: Any, records: list[Any], temperature: float, top_p: float, stop_ids: Sequence[int],
                  seed: int = PIT_SEED, scored_with: str | None = None) -> SamplingReport:
    """Score every ok record with `target` and test the pooled u (not judged when nothing could be scored)."""
    rep = SamplingReport(False, "", temperature, top_p, seed=seed, scored_with=scored_with)
    pooled: list[float] = []
    for r in records:
        if not r.ok:
            continue  # failed requests are the request_errors rule's
        if r.prompt_ids is None or r.output_ids is None or r.token_source == "retokenized":
            rep.num_requests_unscored += 1  # re-tokenized text is not the token sequence the server sampled
            continue
        out = cut_after_stop(r.output_ids, stop_ids)
        rep.num_tokens_after_stop += len(r.output_ids) - len(out)
        vocab = target.cfg.vocab_size
        if any(t >= vocab for t in r.prompt_ids):
            rep.num_requests_unscored += 1
            continue
        oov = next((k for k, t in enumerate(out) if t >= vocab), None)   # a token the model cannot emit at all
        g = v_generator(r.prompt_id, r.turn, seed)
        scored = out if oov is None else out[:oov]
        u, outside = score_request(target, r.prompt_ids, scored, temperature, top_p, [g.random() for _ in scored])
        if oov is not None:   # probability 0 under any distribution of the target: u = 1, as outside the nucleus
            u, outside = u + [1.0], outside + 1
            rep.warnings.append(f"{r.prompt_id} turn {r.turn}: token id {out[oov]} is outside the model's vocabulary "
                                f"of {vocab}; the tokens after it were not scored")
        pooled += u
        rep.num_outside_support += outside
        rep.num_requests += 1
    if rep.num_requests_unscored:
        rep.warnings.append(f"{rep.num_requests_unscored} requests carry no prompt or output token ids (or only ids re-tokenized "
                            "from the server's text, which need not be the tokens it sampled) and were not scored")
    if rep.num_tokens_after_stop:
        rep.warnings.append(f"{rep.num_tokens_after_stop} tokens came after a stop token and were not tested")
    if rep.num_outside_support:
        rep.warnings.append(f"{rep.num_outside_support} emitted tokens have probability 0 under the target's "
                            f"T={temperature:g}, top_p={top_p:g} distribution (outside the nucleus)")
    if not pooled:
        rep.reason = "no emitted token could be scored (no request with the server's own prompt and output token ids)"
        return rep
    rep.judged = True
    rep.reason = f"scored with the reference engine: {scored_with}" if scored_with else "scored"
    return uniformity_verdict(pooled, rep)


def judge_sampling(records: list[Any], run_info: dict[str, Any], baseline: Any, seed: int = PIT_SEED) -> SamplingReport | None:
    """The distribution verdict of a run (None at T = 0, where the greedy diff judges it): load the
    baseline's target in float32 with the reference engine, score every emitted token, test."""
    from ddtree_bench import defaults as D
    from ddtree_bench.errors import UsageError
    from ddtree_bench.results import run_fact
    from ddtree_bench.verdict.near_tie_recheck import loadable

    spec = run_info.get("spec") or {}
    temperature = float(spec.get("temperature") or 0.0)
    if temperature < D.GREEDY_EPS:
        return None
    seed = run_pit_seed(run_info, seed)
    top_p = float(spec.get("top_p") if spec.get("top_p") is not None else 1.0)
    ok, why = loadable(baseline.header)
    if not ok:
        return SamplingReport(False, f"the reference engine cannot score the run: {why}", temperature, top_p, seed=seed)
    h = baseline.header
    from ddtree_bench.pair import load_pair

    device = str(h.get("device") or "cpu")
    try:
        pair = load_pair(h["model"], None, "ar", "float32", device)
    except UsageError as e:
        return SamplingReport(False, f"the reference engine cannot load {h['model']!r}: {e}", temperature, top_p, seed=seed)
    got = pair.info.get("model_hash")
    if h.get("model_hash") and got and h["model_hash"] != got:
        return SamplingReport(False, f"the model loaded here ({got}) is not the baseline's ({h['model_hash']})", temperature, top_p,
                              seed=seed)
    run_hash = run_fact(run_info, "model_hash")
    if run_hash and got and run_hash != got:
        return SamplingReport(False, f"the run's target ({run_hash}) is not the model loaded here ({got})", temperature, top_p,
                              seed=seed)
    stops = list(baseline.stop_ids or pair.stop_ids)
    return score_records(pair.engine.target, records, temperature, top_p, stops, seed,
                         scored_with=f"{h['model']} (float32, {device}, one teacher-forced forward per request)")
