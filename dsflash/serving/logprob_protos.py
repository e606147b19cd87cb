"""TokenLogprobs to and from their proto: the prefill tier sends a prompt's to the decode tier,
which sends them on, with the generated tokens', to the gateway."""

from __future__ import annotations

from collections.abc import Iterable

from ..model.logprobs import TokenLogprob
from ..v1 import worker_pb2
from .worker import MAX_MESSAGE_BYTES


def logprobs_to_proto(items: Iterable[TokenLogprob] | None) -> list[worker_pb2.TokenLogprob]:
    return [worker_pb2.TokenLogprob(token_id=lp.token, logprob=lp.logprob, rank=lp.rank,
                                    top=[worker_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top])
            for lp in items or ()]


def logprobs_from_proto(items: Iterable[worker_pb2.TokenLogprob]) -> list[TokenLogprob]:
    return [TokenLogprob(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top], lp.rank)
            for lp in items]


def most_scored_tokens(top: int) -> int:
    """The longest prompt whose scores, `top` alternatives a token, fit one gRPC message (the
    prefill worker's reply, the decode worker's first chunk) with a quarter of it to spare for
    what travels beside them. A scored token takes ~16 bytes and ~11 an alternative (measured:
    235 bytes at 20 alternatives, 69 at 5): 213K tokens at 20, 708K at 5, beyond the context at 2 or fewer."""
    return MAX_MESSAGE_BYTES * 3 // 4 // (16 + 11 * top)
