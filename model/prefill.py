"""Prefill as resumable jobs: several requests' chunks share one forward.

A `PrefillJob` appends `tokens` to a cache that may already hold a prefix (prefix reuse:
only the new tokens are computed). Exact mode runs every layer over every chunk. CED mode
runs the encoder over every chunk and keeps the streams of the last `tail` tokens; once all
tokens are encoded, one decoder pass over that tail produces the last logits (bounded
replay). Either way the job ends with the logits of its last position and the DSpark taps
of its last ring-capacity positions. A job asked for prompt logprobs (echo, evaluation
harnesses) runs exact, takes every row's logits, chunk by chunk of at most
PROMPT_LOGPROBS_ROWS rows, each in a forward of its own (a chunk's [rows, vocab] fp32 logits:
0.5 GB at 1,024, and as much again for their log-softmax), and scores each of its tokens after
the first by the row before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kvcache.state import SequenceCache
from .batch import SeqRun
from .deepseek_v41 import DeepseekV41
from .logprobs import TokenLogprob, token_logprobs

PROMPT_LOGPROBS_ROWS = 1024


@dataclass
class PrefillOutput:
    logits: torch.Tensor  # [V] fp32, at the last position
    taps: torch.Tensor | None  # [k, targets*H] for positions taps_start .. num_tokens-1
    taps_start: int
    prompt_logprobs: list[TokenLogprob] | None = None  # the job's tokens after its first, where asked for


@dataclass
class PrefillJob:
    cache: SequenceCache
    tokens: torch.Tensor  # the new tokens, after what the cache already holds
    ced: bool = False
    tail: int = 0  # CED: decoder rows to replay (>= the new tokens makes it exact)
    want_taps: bool = True
    prompt_logprobs: int | None = None  # score the tokens with this many alternatives each (None: off)
    done: int = 0  # tokens already encoded / computed
    output: PrefillOutput | None = None
    _kept: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    _taps: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    _start: int = -1
    _history_before: list[int] = field(default_factory=list)
    _scored: list[TokenLogprob] = field(default_factory=list)

    def __post_init__(self):
        if self.prompt_logprobs is not None and self.ced:
            raise ValueError("prompt logprobs need every row's logits: an exact job")
        self.tokens = self.tokens.to(torch.long)
        self._start = self.cache.num_tokens
        self._history_before = list(self.cache.history)

    @property
    def total(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def remaining(self) -> int:
        return self.total - self.done

    @property
    def finished(self) -> bool:
        return self.output is not None

    @property
    def next_chunk_limit(self) -> int:
        """The most tokens the next chunk may take: what is left, or a scoring job's row cap."""
        return min(self.remaining, PROMPT_LOGPROBS_ROWS) if self.prompt_logprobs is not None else self.remaining

    def next_run(self, max_tokens: int) -> SeqRun:
        max_tokens = min(max_tokens, self.next_chunk_limit)
        piece = self.tokens[self.done: self.done + max_tokens]
        return SeqRun(cache=self.cache, tokens=piece, start=self.cache.num_tokens, history=list(self.cache.history))

    def taps_needed(self, run: SeqRun) -> bool:
        """Exact mode: does this chunk reach into the positions the DSpark rings keep?"""
        return self.want_taps and run.start + run.n > self._start + self.total - self.cache.ring_capacity

    # ------------------------------------------------------------ after a forward

    def after_exact(self, run: SeqRun, logits: torch.Tensor | None, taps: torch.Tensor | None) -> None:
        """logits: the chunk's last row, or all its rows for a job scoring its tokens."""
        if self.prompt_logprobs is not None:  # row i is followed by token done + i + 1
            following = self.tokens[self.done + 1: self.done + run.n + 1].tolist()
            self._scored += token_logprobs(logits[:len(following)], following, self.prompt_logprobs, rank=True)
        self.cache.commit(run.tokens.tolist())
        self.done += run.n
        if taps is not None:
            self._taps.append((run.start, taps))
        if self.remaining == 0:
            self.output = self._output(logits[-1])

    def after_encode(self, run: SeqRun, X: torch.Tensor, pre: torch.Tensor) -> None:
        self.cache.commit(run.tokens.tolist())
        keep_from = self.total - self.decoder_rows  # first kept token (job-relative)
        first = max(0, keep_from - self.done)
        if first < run.n:
            self._kept.append((X[first:], pre[first:]))
        self.done += run.n

    @property
    def decoder_rows(self) -> int:
        return min(self.tail, self.total)

    def decoder_run(self) -> tuple[SeqRun, torch.Tensor, torch.Tensor]:
        n = self.decoder_rows
        start = self._start + self.total - n
        before = (self._history_before + self.tokens[: self.total - n].tolist())[-self.cache.HISTORY_KEEP:]
        run = SeqRun(cache=self.cache, tokens=self.tokens[self.total - n:], start=start, history=before)
        X = torch.cat([x for x, _ in self._kept])
        pre = torch.cat([p for _, p in self._kept])
        return run, X, pre

    def after_decode(self, run: SeqRun, logits: torch.Tensor, taps: torch.Tensor | None) -> None:
        if taps is not None:
            self._taps.append((run.start, taps))
        self._kept.clear()
        self.output = self._output(logits[-1])

    def _output(self, logits: torch.Tensor) -> PrefillOutput:
        end = self._start + self.total
        keep_from = end - self.cache.ring_capacity
        rows, start = [], None
        for first, taps in self._taps:
            lo = max(0, keep_from - first)
            if lo < taps.shape[0]:
                rows.append(taps[lo:])
                start = first + lo if start is None else start
        self._taps.clear()
        taps = torch.cat(rows) if rows else None
        scored = self._scored if self.prompt_logprobs is not None else None
        return PrefillOutput(logits=logits, taps=taps, taps_start=start if start is not None else end,
                             prompt_logprobs=scored)


def prefill_step(model: DeepseekV41, chunks: list[tuple[PrefillJob, int]]) -> None:
    """Advance several jobs by one forward: each (job, max tokens) contributes its next chunk.
    Exact and CED jobs may be mixed; CED jobs whose last chunk is encoded also run their
    decoder pass here, batched."""
    exact = [(job, job.next_run(size)) for job, size in chunks if not job.ced and job.remaining]
    ced = [(job, job.next_run(size)) for job, size in chunks if job.ced and job.remaining]
    # A job scoring its tokens takes every row's logits, in a forward of its own: one chunk's
    # [rows, vocab] fp32 logits at a time.
    _exact_forward(model, [(job, run) for job, run in exact if job.prompt_logprobs is None], "last")
    for pair in [(job, run) for job, run in exact if job.prompt_logprobs is not None]:
        _exact_forward(model, [pair], "all")
    if ced:
        runs = [run for _, run in ced]
        X, pre = model.encode(runs)
        for job, run in ced:
            job.after_encode(run, X[run.rows], pre[run.rows])
        ready = [job for job, _ in ced if job.remaining == 0]
        if ready:
            parts = [job.decoder_run() for job in ready]
            result = model.decode_rows([p[0] for p in parts], torch.cat([p[1] for p in parts]),
                                       torch.cat([p[2] for p in parts]), logits="last",
                                       taps=any(job.want_taps for job in ready))
            for job, (run, _, _), logits, taps in zip(ready, parts, result.logits, result.taps):
                job.after_decode(run, logits, taps)


def _exact_forward(model: DeepseekV41, pairs: list[tuple[PrefillJob, SeqRun]], logits: str) -> None:
    if not pairs:
        return
    runs = [run for _, run in pairs]
    want = any(job.taps_needed(run) for job, run in pairs)
    result = model.forward(runs, logits=logits, taps=want)
    for (job, run), rows, taps in zip(pairs, result.logits, result.taps):
        job.after_exact(run, rows, taps if want and job.taps_needed(run) else None)
