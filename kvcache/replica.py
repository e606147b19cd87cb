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
`CacheView`; the other ranks rebuild the cache from it, over their own pool.
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
    """A paged cache's bookkeeping without its pool bytes: what another rank needs to run a
    forward over its own copy of them. Page tables only grow during a cache's life, so a view
    carries the pages added since the last view of that cache (`CacheViews` on both sides)."""

    serial: int  # PagedCache.serial: which cache holds the slot now
    slot: int
    new_pages: dict[int, list[int]]  # per source: pages after the first `known` ones
    known: dict[int, int]
    counts: dict[int, int]
    tail_lengths: dict[int, int]
    num_tokens: int
    history: list[int]
    ring_spans: list[tuple[int, int]]


class CacheViews:
    """Rank 0: the views it sends, remembering per slot how much of each page table the other
    ranks have. Ranks 1..W-1: the caches they rebuilt from views, kept per slot (a 1M-token
    cache has ~40K pages: resending and re-uploading its tables every forward cost ms)."""

    def __init__(self, pool=None, config: ModelConfig | None = None):
        self.pool, self.config = pool, config
        self._sent: dict[int, tuple[int, dict[int, int]]] = {}  # slot -> (serial, pages sent per source)
        self._caches: dict[int, object] = {}  # slot -> PagedCache over this rank's pool

    def view(self, cache) -> CacheView:
        serial, sent = self._sent.get(cache.slot, (None, None))
        if serial != cache.serial:
            sent = {s: 0 for s in cache.page_table}
        view = CacheView(cache.serial, cache.slot, {s: t[sent[s]:] for s, t in cache.page_table.items()}, dict(sent),
                         dict(cache.counts), dict(cache.tail_lengths), cache.num_tokens, list(cache.history),
                         [(span.valid_from, span.valid_to) for span in cache.ring_spans])
        self._sent[cache.slot] = (cache.serial, {s: len(t) for s, t in cache.page_table.items()})
        return view

    def open(self, view: CacheView):
        """The cache a view describes, over this rank's pool (allocating nothing: rank 0 owns
        the allocation), its tables extended by the view's new pages."""
        from .paged import PagedCache

        cache = self._caches.get(view.slot)
        if cache is None or cache.serial != view.serial:
            cache = self._caches[view.slot] = PagedCache(self.pool, self.config, slot=view.slot)
            cache.serial = view.serial
        for source, pages in view.new_pages.items():
            table = cache.page_table[source]
            if len(table) != view.known[source]:
                raise RuntimeError(f"slot {view.slot}: rank 0 sent pages from {view.known[source]}, "
                                   f"this rank holds {len(table)}")
            if pages:
                table.extend(pages)
                cache._tables.pop(source, None)
        cache.counts = dict(view.counts)
        cache.tail_lengths = dict(view.tail_lengths)
        cache.num_tokens = view.num_tokens
        cache.history = list(view.history)
        cache.ring_spans = [RingSpan(a, b) for a, b in view.ring_spans]
        cache._keys.clear()  # the reference path's decoded keys: the bytes may have changed since
        return cache
