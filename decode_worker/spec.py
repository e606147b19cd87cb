"""Speculative verification of a DSpark block.

The target scored [y, d1..dk] in one forward: row i is its distribution for the token after
d_i (d_0 = y). Greedy requests accept the longest prefix of drafts equal to the target's own
choice and then take the target's token (the "bonus"). Sampled requests use speculative
rejection sampling: accept d_{i+1} with probability min(1, p_i(d)/q_i(d)), else draw from
normalize(max(0, p_i - q_i)) and stop; if every draft is accepted, draw the bonus from p_k.
The emitted tokens then follow the target's distribution exactly, whatever the drafter does.
"""

from __future__ import annotations

import torch

from ..model.ops import argmax_rows
from .sampling import RequestSampler


def greedy_targets(samplers: list[RequestSampler], logits: list[torch.Tensor]) -> dict[int, list[int]]:
    """The target's own token at every row of the plain-greedy requests ({request index: row
    tokens}), from one argmax over all their rows: one synchronization, not one per row."""
    plain = [j for j, sampler in enumerate(samplers) if sampler.plain_greedy]
    if not plain:
        return {}
    tokens = argmax_rows(torch.cat([logits[j] for j in plain]).float()).tolist()
    out, at = {}, 0
    for j in plain:
        out[j], at = tokens[at:at + logits[j].shape[0]], at + logits[j].shape[0]
    return out


def accept_greedy(targets: list[int], drafts: list[int]) -> list[int]:
    """accept_block for a plain-greedy request, given the target's token at each row."""
    for i, draft in enumerate(drafts):
        if targets[i] != draft:
            return drafts[:i] + [targets[i]]
    return drafts + [targets[len(drafts)]]


def accept_block(sampler: RequestSampler, target_logits: torch.Tensor, drafts: list[int],
                 draft_dists: list[torch.Tensor] | None) -> list[int]:
    """target_logits [k+1, V]; drafts d1..dk; draft_dists q_0..q_{k-1} (None for greedy requests).
    Returns the emitted tokens: accepted drafts then one target token (1 .. k+1 tokens)."""
    emitted: list[int] = []
    for i, draft in enumerate(drafts):
        if sampler.params.greedy:
            token = int(torch.argmax(sampler.processed(target_logits[i], emitted)))
            if token != draft:
                return emitted + [token]
        else:
            p = sampler.distribution(target_logits[i], emitted)
            q = draft_dists[i]
            if not sampler.uniform() < min(1.0, float(p[draft]) / max(float(q[draft]), 1e-30)):
                residual = (p - q).clamp_min(0)
                total = float(residual.sum())
                token = sampler.draw(residual / total) if total > 0 else sampler.draw(p)
                return emitted + [token]
        emitted.append(draft)
    token, _ = sampler.choose(target_logits[len(drafts)], emitted)
    return emitted + [token]
