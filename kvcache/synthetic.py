"""Caches of any length filled with random but valid bytes, without running a prefill.

A decode step's cost and its CUDA graphs depend on the cache's length, not its values, so
benchmarks (bench/h200.py) and the decode worker's graph warm-up (decode_worker/warmup.py)
stand up caches of thousands of tokens this way in milliseconds. The bytes are valid codes
(no NaN FP8 values, scales in range), so every kernel runs as it would on a real cache.
"""

from __future__ import annotations

import torch

from .paged import PagedCache
from .state import RingSpan


def fill_synthetic(cache: PagedCache, tokens: int, generator: torch.Generator, vocab_size: int) -> None:
    """Make `cache` hold `tokens` positions of random bytes, with a history of random token ids."""
    layout, pool = cache.layout, cache.pool
    for source, count in layout.entries_for(tokens).items():
        cache._ensure_pages(source, count)
        cache.counts[source] = count
        ids = torch.tensor(cache.page_table[source], device=pool.device)
        if len(ids):
            pool.pages[ids] = torch.randint(0, 255, (len(ids), layout.page_bytes), dtype=torch.uint8,
                                            device=pool.device, generator=generator)
            for name, byte in (("kv_scales", 0x30), ("key_scales", 120)):
                off, width = layout.page_sections()[name]
                pool.pages[ids, off: off + width * layout.page_entries] = byte
    slot = pool.slots[cache.slot]
    slot[: layout.ring_scales_offset] = torch.randint(0, 0x77, (layout.ring_scales_offset,), dtype=torch.uint8,
                                                      device=pool.device, generator=generator)
    slot[layout.ring_scales_offset: layout.ring_bytes] = 120
    cache.num_tokens = tokens
    cache.history = torch.randint(3, min(vocab_size, 100000), (min(tokens, 64),),
                                  generator=torch.Generator().manual_seed(tokens)).tolist()
    cache.ring_spans = [RingSpan(max(0, tokens - layout.ring_capacity), tokens) for _ in cache.ring_spans]
    cache.bytes_changed()
