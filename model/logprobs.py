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


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """logits [n, V] (row i chose or was followed by tokens[i]) -> n TokenLogprobs with `top`
    alternatives each; one host copy for all rows."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.as_tensor(list(tokens), dtype=torch.long, device=logp.device)
    chosen = logp.gather(1, ids[:, None])
    ranks = ((logp > chosen).sum(-1) + 1).tolist()
    chosen = chosen[:, 0].tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in chosen]
    if top:
        values, indices = torch.topk(logp, top, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
    return [TokenLogprob(t, c, alternatives, rank)
            for t, c, alternatives, rank in zip(ids.tolist(), chosen, tops, ranks)]
