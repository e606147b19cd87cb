"""Capture a decode worker's CUDA graphs before it serves.

A part of the forward is captured the second time it runs (model/graphs.py), so without a
warm-up the first steps at each batch-size bucket run eagerly and then capture, several times
slower than a replay, in front of real users (vLLM and SGLang capture at startup for the same
reason). Here every bucket up to the engine's batch limit runs a few decode steps on synthetic
caches (kvcache/synthetic.py) held in the worker's own pool, which the graphs are keyed by;
then the requests are dropped and their pages given back.
"""

from __future__ import annotations

import logging
import time

import torch

from ..kvcache.paged import PagedCache
from ..kvcache.synthetic import fill_synthetic
from ..model.graphs import batch_bucket
from ..model.prefill import PrefillOutput
from .engine import DecodeEngine
from .request import DecodeRequest
from .sampling import SamplingParams

log = logging.getLogger("dsflash.decode")

STEPS = 3  # the eager run, the capture, one replay
MAX_TOKENS = 32  # a warm-up request's budget: STEPS steps of up to spec_tokens + 1 tokens


def synthetic_request(engine: DecodeEngine, request_id: str, context: int, generator: torch.Generator,
                      max_tokens: int = 64) -> DecodeRequest:
    """A greedy request whose cache holds `context` synthetic tokens, as if a prefill worker had
    just handed it over (random last-position logits and DSpark taps)."""
    config, pool = engine.model.config, engine.pool
    cache = PagedCache(pool, config)
    fill_synthetic(cache, context, generator, config.vocab_size)
    layout, device = pool.layout, engine.model.device
    taps = len(config.dspark_target_layers) * config.hidden_size
    prefill = PrefillOutput(torch.randn(config.vocab_size, generator=generator, device=generator.device).to(device),
                            torch.randn(layout.ring_capacity, taps, generator=generator, device=generator.device
                                        ).to(device) * 0.1,
                            context - layout.ring_capacity)
    return DecodeRequest(request_id, list(cache.history),
                         SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True), cache=cache,
                         prefill=prefill)


def warm_up_sizes(max_running: int, max_rows: int, rows_per_request: int) -> list[int]:
    """One batch size per bucket a running batch can fall in (its graphs serve the whole bucket)."""
    limit = min(max_running, max_rows // rows_per_request)
    return sorted({min(batch_bucket(n), limit) for n in range(1, limit + 1)})


def _largest_ratio(config) -> int:
    return max((role.ratio for role in config.roles if role.ratio), default=1)


def warm_up_context(config) -> int:
    """A context at which every layer's entry list is full (index_topk entries of the largest
    compression ratio): the lists long conversations attend with, whose whole-layer graphs
    are then ready (model/deepseek_v41.py, _graphable_attention)."""
    ratio = _largest_ratio(config)
    return max(2 * config.index_topk * ratio, 2 * config.sliding_window)


def partial_context(config) -> int:
    """A context at which the largest ratio's entry lists are partial, their count odd in 16
    (the bench preset's and the release's: 1,000 tokens, 500 of 512 entries). A request's first
    steps there attend in a split form at an entry count the full lists never have: a 1,000-token
    prompt's first decode step compiled it after the full-context warm-up (H100, sixty-first
    session, call BI: 2.5 s on an empty cache)."""
    ratio = _largest_ratio(config)
    entries = config.index_topk - 12
    entries -= entries % 16 == 0
    # (past the sliding window; a whole group of the largest ratio, which the others divide:
    # a synthetic cache ends on one)
    return ratio * max(entries, -(-(config.sliding_window + 1) // ratio))


def warm_up(engine: DecodeEngine, context: int | None = None, sizes: list[int] | None = None) -> list[int]:
    """Run every bucket's batch size (or `sizes`) through STEPS decode steps on caches of
    `context` tokens (by default warm_up_context's, then partial_context's); returns the sizes
    warmed (those the pool had room for). Without CUDA graphs there is nothing to warm unless
    sizes are given. The engine must be idle."""
    model, pool = engine.model, engine.pool
    if sizes is None:
        if model.graphs is None:
            return []
        sizes = warm_up_sizes(engine.config.max_running, model.graphs.max_rows, engine.spec_tokens + 1)
    contexts = [context] if context else [warm_up_context(model.config), partial_context(model.config)]
    generator = torch.Generator(device=pool.device).manual_seed(0)
    need = pool.layout.pages_for(max(contexts) + MAX_TOKENS + engine.spec_tokens + 1)  # pages a request may take
    warmed, began = [], time.monotonic()
    for batch in sizes:
        if pool.free_page_count < batch * need or pool.free_slot_count < batch:
            break
        for held in contexts:
            ids = [f"warm-up-{batch}-{i}" for i in range(batch)]
            for request_id in ids:
                engine.add(synthetic_request(engine, request_id, held, generator, MAX_TOKENS))
            try:
                with torch.inference_mode():
                    for _ in range(STEPS + 1):  # the first step admits them
                        engine.step()
            finally:
                for request_id in ids:
                    engine.abort(request_id)
        warmed.append(batch)
    if engine.drafter is not None and model.graphs is not None:  # its absorb's row counts vary by step
        engine.drafter.warm_up(engine.config.max_running * (engine.spec_tokens + 1), pool)
    log.info("decode warmed up for batches of %s in %.1f s (%d CUDA graphs)", warmed, time.monotonic() - began,
             model.graphs.captured() if model.graphs is not None else 0)
    return warmed
