"""Log-probabilities of chosen tokens, each with its row's most likely tokens: what the OpenAI
APIs report as logprobs, for generated tokens and (echo) prompt tokens alike. They are the
model's own distribution, before any sampling knob."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

MAX_TOP = 20  # alternatives a token may ask for (OpenAI's limit)


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token, logprob), most likely first
    rank: int = 0  # the token's place in its row, 1 = the most likely (0: not known)


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int, rank: bool = False) -> list[TokenLogprob]:
    """logits [n, V] (row i chose or was followed by tokens[i]) -> n TokenLogprobs with `top`
    alternatives each, and each token's rank where asked; one copy to the host for all."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.as_tensor(list(tokens), dtype=torch.long, device=logp.device)
    chosen = logp.gather(1, ids[:, None])
    columns = [chosen]
    if rank:
        columns.append((logp > chosen).sum(-1, keepdim=True) + 1)
    if top:
        values, indices = torch.topk(logp, top, dim=-1)
        columns += [values, indices]
    # float64 holds the fp32 logprobs and every token id and rank exactly
    rows = torch.cat([c.double() for c in columns], 1).tolist()
    out = []
    for token, row in zip(ids.tolist(), rows):
        alternatives = row[1 + rank:]
        out.append(TokenLogprob(token, row[0], [(int(t), v) for v, t in zip(alternatives[:top], alternatives[top:])],
                                int(row[1]) if rank else 0))
    return out
