"""A decoding request's state and the events the engine emits for it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from ..kvcache.paged import PagedCache
from ..model.logprobs import TokenLogprob
from ..model.prefill import PrefillOutput
from .sampling import RequestSampler, SamplingParams


class DecodeStatus(enum.Enum):
    WAITING = "waiting"  # has no cache yet (recompute pending) or waits for a slot
    PREFILLING = "prefilling"  # its cache is being (re)built locally
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens
    ABORT = "abort"  # cancelled by the client
    ERROR = "error"


@dataclass
class TokenEvent:
    request_id: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # the first event's: the prompt's tokens after its first


@dataclass
class DecodeStats:
    created_s: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None
    finished_s: float | None = None
    step_ms: list[float] = field(default_factory=list)  # each decode step this request took part in
    accepted: list[int] = field(default_factory=list)  # tokens emitted per decode step
    preemptions: int = 0

    @property
    def average_iteration_ms(self) -> float:
        return sum(self.step_ms) / len(self.step_ms) if self.step_ms else 0.0

    @property
    def average_accept_length(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0


@dataclass
class DecodeRequest:
    request_id: str
    prompt: list[int]  # tokens the cache must hold before decoding
    params: SamplingParams
    conversation_id: str | None = None  # keep the cache for this conversation after the turn
    # Keep the conversation's cache as of the prompt minus its last token (history_drops_reply):
    # the cache arrives one token short, is copied into `snapshot`, then completed here.
    keep_before_last: bool = False
    snapshot: PagedCache | None = None
    cache: PagedCache | None = None  # arrives from a prefill worker, or is rebuilt here
    prefill: PrefillOutput | None = None  # logits of the last prompt position + DSpark taps
    status: DecodeStatus = DecodeStatus.WAITING
    output: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    pending: int | None = None  # chosen, emitted, not yet run through the target
    finish_reason: FinishReason | None = None
    error: str | None = None
    sampler: RequestSampler | None = None
    stop_matcher: object | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)

    @property
    def processed_tokens(self) -> list[int]:
        """Tokens whose KV the cache must hold: the prompt and every output but the pending one."""
        return self.prompt + (self.output[:-1] if self.pending is not None else self.output)

    @property
    def num_processed_tokens(self) -> int:
        """len(processed_tokens), without building a prompt-sized list (the scheduler asks often)."""
        return len(self.prompt) + len(self.output) - (self.pending is not None)
