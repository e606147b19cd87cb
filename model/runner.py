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
                taps: bool = False, tail: int | None = None) -> ForwardResult:
    """Bounded replay: encoder layers (and the last KV source's compressor) over every token,
    decoder layers only over the last `tail` tokens. Exact when `tail` covers all new tokens and
    the decoder rings already hold the positions before them; an approximation otherwise (the
    tail's first rows see a truncated window in the decoder layers)."""
    tail = tail if tail is not None else ced_tail_length(model)
    n = tokens.shape[0]
    start = cache.num_tokens
    history_before = list(cache.history)
    keep = min(tail, n)
    kept_X, kept_pre = [], []
    for lo in range(0, n, chunk):
        piece = tokens[lo:lo + chunk].to(torch.long)
        run = SeqRun(cache=cache, tokens=piece, start=cache.num_tokens, history=list(cache.history))
        X, pre = model.encode([run])
        cache.commit(piece.tolist())
        first_kept = max(0, (n - keep) - lo)
        if first_kept < piece.shape[0]:
            kept_X.append(X[first_kept:])
            kept_pre.append(pre[first_kept:])
    tail_tokens = tokens[n - keep:].to(torch.long)
    history = (history_before + tokens[: n - keep].tolist())[-cache.HISTORY_KEEP:]
    run = SeqRun(cache=cache, tokens=tail_tokens, start=start + n - keep, history=history)
    return model.decode_rows([run], torch.cat(kept_X), torch.cat(kept_pre), logits="last", taps=taps)


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
