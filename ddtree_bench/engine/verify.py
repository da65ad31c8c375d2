"""The target's decoding rule and the tree walk.

`pick` applies the target's rule to every verified position at once: argmax at temperature 0,
otherwise one independent sample per position from softmax(logits / T) (optionally top-p). The walk
then follows, from the root, the child whose token equals the target's pick at the current node;
where none matches, the pick there is the bonus token. Every committed token is the target's own
pick in its true context, so the output is exactly greedy decoding at T = 0 and exactly the
target's distribution at T > 0 (sample-and-match, no rejection sampling - DDTree paper §4.4).

`walk` is the slow, obvious loop over a child map; `walk_fast` does it with tensor ops and one host
transfer, using the ancestor matrix the verify mask was built from. Knows nothing of models.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.tree import Tree

GREEDY_EPS = 1e-5  # below this temperature decoding is greedy (the papers, SGLang, vLLM)


def request_generator(device, temperature: float, seed: int | None) -> torch.Generator | None:
    """The generator every sample of one request comes from: None when greedy (`pick` draws nothing),
    else one on the engine's device seeded with the request's seed (0 when None). The batch-1, batched
    and CUDA-graph loops all seed it so and draw from it in the same order, which is what makes a
    request's samples the same batched as alone (docs/batching.md, Seeds)."""
    if temperature < GREEDY_EPS:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(0 if seed is None else seed)
    return gen


def pick(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [T, V] -> token ids [T]: argmax when greedy, else one sample per row."""
    if temperature < GREEDY_EPS:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        keep[..., 0] = True   # the most probable token, also where top_p underflows to 0 in float32
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def walk(tree: Tree, root_token: int, post: list[int]) -> tuple[list[int], int]:
    """Slow twin. post[i] = target pick at verify position i (0 = root). Returns (accepted node
    indices starting with 0 for the root, bonus token)."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tree.token_ids.tolist(), tree.parents.tolist()), start=1):
        children.setdefault(par, {})[tok] = i
    cur, accepted = 0, [0]
    nxt = post[0]
    while nxt in children.get(cur, {}):
        cur = children[cur][nxt]
        accepted.append(cur)
        nxt = post[cur]
    return accepted, nxt


def walk_fast(tree: Tree, anc: torch.Tensor, post: torch.Tensor) -> tuple[list[int], int]:
    """Same as `walk`, vectorised: a node is accepted iff it and all its ancestors match their
    parent's pick. anc: [1+N, 1+N] ancestor-or-self matrix; post: [1+N] picks (any device).
    Accepted nodes form one path; parents precede children, so index order is depth order."""
    n = tree.num_nodes
    if n == 0:
        return [0], int(post[0])
    par = torch.cat([torch.zeros(1, dtype=torch.long, device=post.device), tree.parents])
    tok = torch.cat([post[:1], tree.token_ids])  # the root "matches" by definition
    match = tok == post[par]
    match[0] = True
    ok = ~(anc & ~match[None, :]).any(dim=1)
    idx = torch.nonzero(ok).squeeze(1)
    bonus = post[idx[-1]]
    out = torch.cat([idx, bonus.reshape(1)]).tolist()  # the one host transfer of the round
    return out[:-1], out[-1]
