"""Keeping the KV pools of a worker's other ranks equal to rank 0's.

Under tensor parallelism every rank of a worker holds the whole KV cache (model/parallel.py:
the compressor, indexer and window rows are computed identically everywhere). Rank 0 alone
runs the worker: it allocates pages, receives transfers, rolls back rejected drafts, copies
caches. The other ranks' pools follow rank 0's pool in two ways (model/lockstep.py):
- a forward's own writes happen on every rank, since every rank computes them;
- every other write into rank 0's pool (a transfer landing, a cache copy, a rollback's
  rebuilt open group, the drafter's ring rows, a new slot's zeroing) is recorded here as it
  happens, and its bytes reach the other ranks before the next forward that could read them.
A cache's bookkeeping (page tables, counts, positions) goes with each forward as a
`CacheView`: the other ranks keep no cache objects, only pool bytes.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

from ..model.config import ModelConfig
from .mirror import Range, coalesce
from .state import RingSpan


class PoolWrites:
    """Writes into a pool made outside the forwards every rank runs (thread-safe: transfers
    land on other threads than the engine's)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._zeroed: list[Range] = []
        self._written: list[Range] = []
        self._computing = threading.local()

    @contextmanager
    def computing(self):
        """Writes the calling thread makes meanwhile are a forward's: every rank makes them."""
        self._computing.active = True
        try:
            yield
        finally:
            self._computing.active = False

    def zeroed(self, ranges: list[Range]) -> None:
        self._note(self._zeroed, ranges)

    def written(self, ranges: list[Range]) -> None:
        self._note(self._written, ranges)

    def _note(self, into: list[Range], ranges: list[Range]) -> None:
        if getattr(self._computing, "active", False):
            return
        with self._lock:
            into.extend(ranges)

    def take(self) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
        """(zeroed, written) as (segment, start, end) runs since the last take. Apply the zeros
        first, then copy the written runs' current bytes: a range zeroed and written again
        since has a written entry, and a write made before a zeroing reads the zeros now."""
        with self._lock:
            zeroed, written = self._zeroed, self._written
            self._zeroed, self._written = [], []
        return coalesce(zeroed), coalesce(written)


@dataclass
class CacheView:
    """A paged cache's bookkeeping without its pool: what another rank needs to run a forward
    over the same pool bytes (its own copy of them)."""

    slot: int
    page_table: dict[int, list[int]]
    counts: dict[int, int]
    tail_lengths: dict[int, int]
    num_tokens: int
    history: list[int]
    ring_spans: list[tuple[int, int]]

    @classmethod
    def of(cls, cache) -> "CacheView":
        return cls(cache.slot, {s: list(t) for s, t in cache.page_table.items()}, dict(cache.counts),
                   dict(cache.tail_lengths), cache.num_tokens, list(cache.history),
                   [(span.valid_from, span.valid_to) for span in cache.ring_spans])

    def open(self, pool, config: ModelConfig):
        """A PagedCache over `pool` at this view's slot and pages, allocating nothing (rank 0
        owns the allocation; the object is dropped after the forward)."""
        from .paged import PagedCache

        cache = PagedCache(pool, config, slot=self.slot)
        cache.page_table = {s: list(t) for s, t in self.page_table.items()}
        cache.counts = dict(self.counts)
        cache.tail_lengths = dict(self.tail_lengths)
        cache.num_tokens = self.num_tokens
        cache.history = list(self.history)
        cache.ring_spans = [RingSpan(a, b) for a, b in self.ring_spans]
        return cache
