"""Scoring drafter variants against one reference decode, instead of replaying every variant in full.

Why it is exact: at temperature 0 the loop is lossless whatever the drafter proposes, so under any
drafter variant every request emits the target's greedy continuation y of its prompt, and in every
round the tree walk accepts exactly the longest path of the tree that spells y from the bonus on
(the target's pick at an accepted node is the next token of y). The target's verify forwards
therefore add nothing a variant can change: what a variant changes is only the drafter's logits,
and those depend on (a) the committed context features, which are the target's hidden states of
y's positions, and (b) where rounds start, which follows from the acceptance lengths. So:

  1. `decode_references`: each request is decoded once (the reference run, the real loop); one
     causal target forward over prompt + output gives the hidden states of every layer any variant
     reads (`layers`) and the greedy picks, and a few single-token steps extend y by
     block_size - 1 tokens past where the output was cut (a last round may accept drafts the output
     cut drops; they count in a_r);
  2. `score_variant`: per round, the variant's proposer drafts from the features of the positions
     committed so far, the tree (the DFlash chain or the DDTree build the loop uses) is matched
     against y, a_r = 1 + the matched depth; the output is cut and the last-round rule applied by
     the loop's own `OutputStream` / `wants_round`.

Where it is not bit for bit: the hidden states come from one causal forward, not from the
variant's own verify forwards, so they differ in the last float bits, and a decision that sits
on a near tie could flip. Every decision the acceptance rests on is therefore checked for margin:
  * DFlash: at each depth up to the first mismatch, logit(y token) - best other logit (matched
    depths) or best logit - logit(y token) (the first mismatch);
  * DDTree: with s(u) a prefix's score (summed log-probs), s_in the lowest score in the tree and
    s_out the best score left out, s(y_1..d) - s_out for each matched depth d, and s_in - s(y_1..m+1)
    for the first depth m+1 not in the tree (a prefix stays in / out of the top-B set when every
    score moves by less than half that margin);
  * the target: its top-1 - top-2 logit gap at every token of y (a near tie there could make a
    variant's replay emit another continuation), and its picks must equal the reference output.
A request whose margin falls below `margin_eps` (per dtype, defaults.EXPLAIN_REUSE_MARGIN) under
some variant is replayed in full under that variant (`replay.replay`, the slow obvious twin), and
the result says how many were. Knows the engine's target, proposer, tree build and output stream;
nothing of runs, servers or files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ddtree_bench.explain.curves import Acceptance, Key
from ddtree_bench.explain.replay import ReplayRequest, ReplayResult, replay


# Decision margins below which a request is replayed in full (logit units; summed log-probs for a
# DDTree prefix). fp32: the drafter's logits moved by at most 2.1e-5 between the reuse and a full
# replay on the toy pair (15 variants, 6 gsm8k prompts; docs/explain.md, Speed), so 1e-3 leaves
# ~50x; the target's top-1 - top-2 gap needs 1e-4 (5x that drift, both ways). Half precision
# moves logits by up to ~0.4 (docs/ci-gate.md §4): 1.0 and 1.0.
REUSE_MARGIN = {"float32": 1e-3}
REUSE_TARGET_GAP = {"float32": 1e-4}
REUSE_HALF = 1.0


def margins(dtype: str) -> tuple[float, float]:
    """(drafter decision margin, target gap) under which reuse hands a request to a full replay."""
    return REUSE_MARGIN.get(dtype, REUSE_HALF), REUSE_TARGET_GAP.get(dtype, REUSE_HALF)


@dataclass
class ReferenceDecode:
    """What every drafter variant reuses of one request's reference decode."""

    key: Key
    prompt_len: int
    tokens: list[int]                      # y: the reference output, then the greedy tokens past its cut
    features: dict[int, torch.Tensor]      # target layer id -> hidden states [prompt_len + len(tokens) - 1, H]
    target_min_gap: float                  # smallest top-1 - top-2 target logit over y's tokens
    consistent: bool                       # the scoring forward's greedy picks equal the reference output


@dataclass
class ScoreResult:
    """One variant's acceptance over the requests, and which requests had to be replayed in full."""

    result: ReplayResult
    replayed_in_full: list[Key] = field(default_factory=list)
    min_margin: float = math.inf           # the smallest decision margin seen in the requests scored by reuse


def _gaps(logits: torch.Tensor) -> torch.Tensor:
    top = logits.float().topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


@torch.inference_mode()
def decode_references(target, requests: Sequence[ReplayRequest], reference: ReplayResult, layers: Sequence[int],
                      extra: int) -> dict[Key, ReferenceDecode]:
    """Hidden states of `layers` over each request's prompt + reference output, and y extended by
    `extra` greedy tokens (see the module docstring)."""
    dev = target.lm_head.weight.device
    layers = sorted(set(int(x) for x in layers))
    out: dict[Key, ReferenceDecode] = {}
    for r in requests:
        y = list(reference.acceptance.outputs[r.key])
        P = len(r.prompt_ids)
        seq = list(r.prompt_ids) + y
        cache = target.new_cache(len(seq) + extra + 1)
        ids = torch.tensor(seq, dtype=torch.long, device=dev)
        logits, hidden = target(ids, torch.arange(len(seq), device=dev), cache, 0, hidden_layers=layers)
        picks = logits.argmax(dim=-1)
        consistent = picks[P - 1: P - 1 + len(y)].tolist() == y
        gaps = [float(_gaps(logits[P - 1:]).min())]
        rows = [hidden]
        tok = int(picks[-1])
        tokens = y + [tok]
        for j in range(extra - 1):  # y's tokens past the cut, one greedy step each
            pos = len(seq) + j
            logits, hidden = target(torch.tensor([tok], device=dev), torch.tensor([pos], device=dev), cache, pos,
                                    mask=None, hidden_layers=layers)
            rows.append(hidden)
            gaps.append(float(_gaps(logits).min()))
            tok = int(logits[0].argmax())
            tokens.append(tok)
        h = torch.cat(rows)
        H = h.shape[1] // len(layers)
        feats = {l: h[:, i * H:(i + 1) * H] for i, l in enumerate(layers)}
        out[r.key] = ReferenceDecode(r.key, P, tokens, feats, min(gaps), consistent)
    return out


def _chain_accept(logits: torch.Tensor, y: list[int]) -> tuple[int, float]:
    """DFlash: drafts matched against y (y[d] = the token at depth d + 1), and the decision margin."""
    lg = logits.float()
    best = lg.argmax(dim=-1).tolist()
    m, margin = 0, math.inf
    for d in range(lg.shape[0]):
        row, want = lg[d], y[d]
        if best[d] == want:
            others = row.clone()
            others[want] = -math.inf
            margin = min(margin, float(row[want] - others.max()))
            m += 1
        else:
            margin = min(margin, float(row[best[d]] - row[want]))
            break
    return m, margin


def _tree_accept(logits: torch.Tensor, tree, y: list[int], budget: int) -> tuple[int, float]:
    """DDTree: the depth of the tree's longest path spelling y, and the decision margin."""
    L = logits.shape[0]
    lp = logits.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)
    toks, pars, deps = tree.token_ids.tolist(), tree.parents.tolist(), tree.depths.tolist()
    n = len(toks)
    children: dict[int, dict[int, int]] = {}
    score = [0.0] * (n + 1)
    nkids = [0] * (n + 1)
    for i in range(1, n + 1):
        p, d, t = pars[i - 1], deps[i - 1], toks[i - 1]
        children.setdefault(p, {})[t] = i
        score[i] = score[p] + float(lp[d - 1, t])
        nkids[p] += 1
    cur, m = 0, 0
    while m < L and y[m] in children.get(cur, {}):
        cur = children[cur][y[m]]
        m += 1
    # the y path's scores, the lowest score kept and the best score left out
    path = [0.0]
    for d in range(min(m + 1, L)):
        path.append(path[-1] + float(lp[d, y[d]]))
    s_in = min(score[1:]) if n else math.inf
    need = min(max(nkids) + 1, lp.shape[1])
    top = lp.topk(need, dim=-1).values.tolist()
    s_out = -math.inf
    for i in range(n + 1):
        d = deps[i - 1] if i else 0
        if d < L and nkids[i] < len(top[d]):
            s_out = max(s_out, score[i] + top[d][nkids[i]])
    margin = math.inf
    for d in range(1, m + 1):
        margin = min(margin, path[d] - s_out)
    if m < L:
        margin = min(margin, s_in - path[m + 1])
    return m, margin


@torch.inference_mode()
def _score_one(proposer, ref: ReferenceDecode, method: str, budget: int, max_new_tokens: int,
               stop_ids: Sequence[int]) -> tuple[list[int], list[int], float]:
    """(acceptance lengths, output, smallest margin) of one request under `proposer`, by reuse."""
    from ddtree_bench.engine.interface import OutputStream, wants_round
    from ddtree_bench.engine.tree import build_tree_fast

    P, y = ref.prompt_len, ref.tokens
    feats = torch.cat([ref.features[l] for l in proposer.target_layer_ids], dim=-1)
    block = proposer.block_size
    width = 1 + (budget if method == "ddtree" else block - 1)
    dcache = proposer.new_cache(P + max_new_tokens + max(width, block) + 1)
    stream = OutputStream(max_new_tokens, stop_ids)
    stream.emit([y[0]], 0)
    accept: list[int] = []
    margin = math.inf
    start, draft_len, e = P, 0, 1          # bonus y[e - 1] sits at position start = P + e - 1
    ctx = feats[:P]
    while wants_round(len(stream.out), stream.stopped, len(accept), max_new_tokens, True):
        logits = proposer.propose(ctx, y[e - 1], dcache, draft_len, start)
        draft_len = start
        ahead = y[e: e + logits.shape[0] + 1]
        if len(ahead) < logits.shape[0] + 1:  # cannot happen (y reaches block_size - 1 past the cut); replay in full
            return accept, list(stream.out), -math.inf
        if method == "dflash":
            m, mg = _chain_accept(logits, ahead)
        else:
            m, mg = _tree_accept(logits, build_tree_fast(logits, budget), ahead, budget)
        margin = min(margin, mg)
        a = 1 + m
        stream.emit(y[e: e + a], 0)
        accept.append(a)
        ctx = feats[start: start + a]
        start += a
        e += a
    return accept, list(stream.out), margin


def score_variant(engine, requests: Sequence[ReplayRequest], refs: dict[Key, ReferenceDecode], method: str, budget: int,
                  stop_ids: Sequence[int], variant, margin_eps: float, target_eps: float,
                  on_request: Callable[[], None] | None = None) -> ScoreResult:
    """`variant`'s acceptance by reuse of `refs`; a request with a decision margin below `margin_eps`
    (or a target gap below `target_eps`, or an inconsistent reference) is replayed in full."""
    from ddtree_bench.engine.draft_variants import VariantProposer

    proposer = VariantProposer(engine.drafter, engine.target, variant)
    rounds: dict[Key, list[int]] = {}
    outputs: dict[Key, list[int]] = {}
    full: list[ReplayRequest] = []
    low = math.inf
    for r in requests:
        ref = refs[r.key]
        if not ref.consistent or ref.target_min_gap < target_eps:
            full.append(r)
            continue
        acc, out, mg = _score_one(proposer, ref, method, budget, r.max_new_tokens, stop_ids)
        if mg < margin_eps:
            full.append(r)
            continue
        rounds[r.key], outputs[r.key] = acc, out
        low = min(low, mg)
        if on_request is not None:
            on_request()
    if full:
        slow = replay(engine, full, method, budget, list(stop_ids), variant, on_request=on_request)
        rounds.update(slow.acceptance.rounds)
        outputs.update(slow.acceptance.outputs)
    keys = [r.key for r in requests]
    acc = Acceptance(variant.name, {k: rounds[k] for k in keys}, {k: outputs[k] for k in keys})
    return ScoreResult(ReplayResult(acc, {}), [r.key for r in full], low)


def layers_needed(engine, variants: Sequence[Any]) -> list[int]:
    """Every target layer any of `variants` reads its context features from (those in range)."""
    n = engine.target.cfg.num_hidden_layers
    ids = {i + v.target_layer_id_offset for v in variants for i in engine.drafter.target_layer_ids}
    return sorted(i for i in ids if 0 <= i < n)
