"""Running prompts through the model with an explicit cache: one-shot, chunked, token by token,
and the CED prefill (encoder over every token, decoder over the tail).

Every function here advances the cache exactly by the tokens it processed, so the three
modes are interchangeable: a cache built one way continues identically another way.
"""

from __future__ import annotations

import torch

from ..kvcache.state import DenseCache, SequenceCache
from .batch import SeqRun
from .deepseek_v41 import DeepseekV41, ForwardResult
from .prefill import PrefillJob, PrefillOutput, prefill_step


def step(model: DeepseekV41, caches: list[SequenceCache], tokens: list[torch.Tensor], *, logits: str = "last",
         taps: bool = False) -> ForwardResult:
    """One forward over several requests, each continuing its own cache; commits the tokens."""
    runs = [SeqRun(cache=c, tokens=t.to(torch.long), start=c.num_tokens, history=list(c.history))
            for c, t in zip(caches, tokens)]
    result = model.forward(runs, logits=logits, taps=taps)
    for c, t in zip(caches, tokens):
        c.commit(t.tolist())
    return result


def parse_mode(mode: str) -> tuple[str, int]:
    """'full' | 'incremental' | 'chunked:N' -> (kind, chunk size)."""
    if mode == "full":
        return "full", 0
    if mode == "incremental":
        return "chunked", 1
    if mode.startswith("chunked:"):
        try:
            size = int(mode.split(":", 1)[1])
        except ValueError:
            size = 0
        if size >= 1:
            return "chunked", size
    raise ValueError(f"mode must be full, incremental or chunked:N with N >= 1, got {mode!r}")


def prompt_logits(model: DeepseekV41, tokens: torch.Tensor, mode: str = "full",
                  cache: SequenceCache | None = None) -> torch.Tensor:
    """fp32 logits at every position [T, V] of `tokens`, computed in the given mode."""
    kind, size = parse_mode(mode)
    cache = cache if cache is not None else DenseCache(model.config, device=model.device)
    if kind == "full":
        return step(model, [cache], [tokens], logits="all").logits[0]
    rows = []
    for lo in range(0, tokens.shape[0], size):
        rows.append(step(model, [cache], [tokens[lo:lo + size]], logits="all").logits[0])
    return torch.cat(rows)


def ced_tail_length(model: DeepseekV41) -> int:
    """Decoder rows a CED prefill recomputes: one window plus one speculative block."""
    c = model.config
    return c.sliding_window + c.dspark_block_size


def prefill_ced(model: DeepseekV41, cache: SequenceCache, tokens: torch.Tensor, chunk: int = 4096,
                taps: bool = False, tail: int | None = None) -> PrefillOutput:
    """Bounded replay: encoder layers (and the last KV source's compressor) over every token,
    decoder layers only over the last `tail` tokens. Exact when `tail` covers all new tokens and
    the decoder rings already hold the positions before them; an approximation otherwise (the
    tail's first rows see a truncated window in the decoder layers)."""
    job = PrefillJob(cache, tokens, ced=True, tail=tail if tail is not None else ced_tail_length(model), want_taps=taps)
    while not job.finished:
        prefill_step(model, [(job, chunk)])
    return job.output


def greedy(model: DeepseekV41, tokens: torch.Tensor, steps: int, cache: SequenceCache | None = None) -> list[int]:
    """Plain greedy decoding with the cache (one target forward per token)."""
    cache = cache if cache is not None else DenseCache(model.config, device=model.device)
    logits = step(model, [cache], [tokens]).logits[0][-1]
    out = []
    for _ in range(steps):
        token = int(torch.argmax(logits))
        out.append(token)
        logits = step(model, [cache], [torch.tensor([token])]).logits[0][-1]
    return out
