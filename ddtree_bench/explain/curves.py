"""Acceptance curves and where two runs of the same prompts part.

An *acceptance* here is one run's per-round acceptance lengths a_r (root counted, 1..block_size)
per (prompt_id, turn). From them:
  per-depth rate  rate_d = #{rounds with a_r - 1 >= d} / #rounds, d = 1..D (D = block_size - 1);
                  for a chain this is vLLM's per-position acceptance rate;
  tau             mean over requests of mean_r a_r (the papers' mean of means, as metrics.py);
  distance        RMS over d = 1..D of (rate_d(a) - rate_d(b)): one number in [0, 1] saying how far
                  two per-depth curves are apart (0 = the same curve);
  first parting   per request, the first round r where a_r differ; its depth d* = min(a_r, b_r)
                  (depths < d* were accepted by both, depth d* by exactly one) and the output index
                  of the token drafted at d*: S_r + d*, S_r = sum_{j<r} a_j (output[0] is the
                  prefill token, round r emits output[S_r + 1 .. S_r + a_r]).
Pure Python; knows nothing of engines, servers or files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

Key = tuple[str, int]


@dataclass
class Acceptance:
    """Per-round acceptance lengths of one run, by (prompt_id, turn); `outputs` when known."""

    label: str
    rounds: dict[Key, list[int]]
    outputs: dict[Key, list[int]] = field(default_factory=dict)
    ordered: bool = True        # False when rounds were rebuilt from a histogram (order lost)

    def pooled(self, keys: Sequence[Key] | None = None) -> list[int]:
        ks = self.rounds.keys() if keys is None else keys
        return [a for k in ks for a in self.rounds.get(k, [])]

    def tau(self, keys: Sequence[Key] | None = None) -> float | None:
        ks = list(self.rounds.keys() if keys is None else keys)
        taus = [sum(r) / len(r) for k in ks if (r := self.rounds.get(k))]
        return sum(taus) / len(taus) if taus else None

    def rates(self, depth: int, keys: Sequence[Key] | None = None) -> list[float] | None:
        return rates_by_depth(self.pooled(keys), depth)


def rates_by_depth(rounds: Sequence[int], depth: int) -> list[float] | None:
    """[d-1] = fraction of rounds with a - 1 >= d, d = 1..depth (None without rounds)."""
    if not rounds:
        return None
    return [sum(1 for a in rounds if a - 1 >= d) / len(rounds) for d in range(1, depth + 1)]


def curve_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """RMS over depths of the per-depth rate difference (the curves padded with zeros to one length)."""
    n = max(len(a), len(b))
    if n == 0:
        return 0.0
    pa, pb = list(a) + [0.0] * (n - len(a)), list(b) + [0.0] * (n - len(b))
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(pa, pb)) / n)


@dataclass
class Parting:
    """Where two runs of one request first differ."""

    prompt_id: str
    turn: int
    round: int | None           # first round whose acceptance differs (None: the same rounds)
    depth: int | None           # depth accepted by exactly one of them in that round
    output_index: int | None    # index in the output of the token drafted at that depth
    token_id: int | None        # the target's token there (from the reference's output)
    a: int | None               # acceptance of run a (server) in that round
    b: int | None               # acceptance of run b (reference) in that round
    first_output_difference: int | None   # first index where the outputs differ (None: same / unknown)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def first_parting(key: Key, a: list[int], b: list[int], out_a: list[int] | None, out_b: list[int] | None) -> Parting:
    """Compare two acceptance sequences of one request (a = server, b = reference)."""
    diff_out = None
    if out_a is not None and out_b is not None:
        n = min(len(out_a), len(out_b))
        diff_out = next((i for i in range(n) if out_a[i] != out_b[i]), None if len(out_a) == len(out_b) else n)
    s = 0
    for r, (x, y) in enumerate(zip(a, b)):
        if x != y:
            d = min(x, y)
            idx = s + d
            tok = out_b[idx] if out_b is not None and idx < len(out_b) else None
            return Parting(key[0], key[1], r, d, idx, tok, x, y, diff_out)
        s += x
    if len(a) != len(b):
        r = min(len(a), len(b))
        return Parting(key[0], key[1], r, None, None, None, a[r] if r < len(a) else None, b[r] if r < len(b) else None, diff_out)
    return Parting(key[0], key[1], None, None, None, None, None, None, diff_out)


def round_agreement(a: Acceptance, b: Acceptance, keys: Sequence[Key]) -> dict[str, Any]:
    """How closely b reproduces a round for round: requests with identical sequences, and the share
    of a's rounds that b matches before the first parting (rounds after it are not aligned)."""
    same, leading, total = 0, 0, 0
    for k in keys:
        x, y = a.rounds.get(k, []), b.rounds.get(k, [])
        total += len(x)
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        leading += n
        same += x == y
    return {"requests_identical": same, "requests": len(keys),
            "leading_rounds_matched": leading, "rounds": total,
            "leading_round_share": leading / total if total else None}
