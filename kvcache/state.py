"""A request's cache state, as explicit data the model reads and writes.

What a DeepSeek-V4.1 request carries between forwards:
- one window ring per layer (backbone + DSpark stages): the FP8 K=V latents of the last
  `sliding_window` positions;
- per KV-source layer, the global compressed entries (FP4 KV) and index keys (FP4), one
  per `ratio` tokens;
- per ratio>1 source, the open group: projected kv and gate of the tokens since the last
  complete group;
- the last N-1 token ids for Engram hashing.

`SequenceCache` holds the bookkeeping shared by every storage (positions, ring validity,
rollback of a speculative block); subclasses store the tensors: `DenseCache` keeps fp32
values (the reference path, also with the quantizers off), `kvcache.paged.PagedCache` keeps
the real byte formats in pool pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.config import ModelConfig
from .layout import default_ring_capacity


@dataclass
class _TailJournal:
    """kv/gate of every token since the oldest open group seen in the current forward, so a
    rollback to any position inside that forward can rebuild the open group exactly."""

    first_position: int
    rows: torch.Tensor  # [2, n, D] fp32: kv, then gate (a rollback's rebuild is one slice)


@dataclass
class RingSpan:
    """Positions [valid_from, valid_to) hold real data in a layer's ring (CED leaves gaps)."""

    valid_from: int = 0
    valid_to: int = 0


@dataclass
class SequenceCache:
    config: ModelConfig
    ring_capacity: int
    num_tokens: int = 0  # positions [0, num_tokens) are committed
    history: list[int] = field(default_factory=list)  # last token ids (Engram look-back + rollback slack)
    ring_spans: list[RingSpan] = field(default_factory=list)
    _journal: dict[int, _TailJournal] = field(default_factory=dict)

    HISTORY_KEEP = 64

    def __post_init__(self):
        if not self.ring_spans:
            self.ring_spans = [RingSpan() for _ in range(self.config.num_all_layers)]
        if self.ring_capacity < self.config.sliding_window:
            raise ValueError("ring capacity must hold at least one window")

    # ------------------------------------------------------------ storage API (subclasses)

    def ring_write(self, layer: int, positions: torch.Tensor, values: torch.Tensor, packed) -> None:
        """Store rows at slots pos % capacity; `packed` = (FP8 codes, e8m0 scales) of the values
        when the window quantizer is on, else None."""
        raise NotImplementedError

    def ring_read(self, layer: int, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def num_entries(self, source: int) -> int:
        raise NotImplementedError

    def entries_append(self, source: int, kv: torch.Tensor, index_keys: torch.Tensor, packed) -> None:
        """Append entries; `packed` = ((kv FP4 codes, e4m3 scales), (key FP4 codes, e8m0 scales))
        exactly as the quantizers produced them, or None with the quantizers off."""
        raise NotImplementedError

    @classmethod
    def entries_append_runs(cls, source: int, parts: list[tuple[SequenceCache, int]], kv: torch.Tensor,
                            index_keys: torch.Tensor, packed) -> None:
        """A forward's new entries for several caches: parts [(cache, n)] take the next n rows
        each, in order (entries_append each; a paged pool writes them all at once)."""
        at = 0
        for cache, n in parts:
            rows, at = slice(at, at + n), at + n
            cache.entries_append(source, kv[rows], index_keys[rows],
                                 None if packed is None else tuple(tuple(t[rows] for t in codes) for codes in packed))

    def entries_gather(self, source: int, idx: torch.Tensor) -> torch.Tensor:
        """Compressed KV rows [..., D] for entry ids idx (>= 0)."""
        raise NotImplementedError

    def index_keys(self, source: int) -> torch.Tensor:
        """All index keys [n, Di] of a KV source."""
        raise NotImplementedError

    def _truncate_entries(self, source: int, count: int) -> None:
        raise NotImplementedError

    def tail(self, source: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        raise NotImplementedError

    def _set_tail(self, source: int, rows: torch.Tensor) -> None:
        """Keep the open group's kv and gate, rows [2, n, D]."""
        raise NotImplementedError

    # ------------------------------------------------------------ shared bookkeeping

    def window_positions(self, layer: int, start: int, end: int, device: str | torch.device | None = None
                         ) -> torch.Tensor:
        """Cached positions in [start, end) whose ring slots hold valid data, ascending."""
        lo, hi = self.window_bounds(layer, start, end)
        return torch.arange(lo, hi, dtype=torch.long, device=device)

    def window_bounds(self, layer: int, start: int, end: int) -> tuple[int, int]:
        """[lo, hi): the positions of [start, end) whose ring slots hold valid data (lo <= hi)."""
        span = self.ring_spans[layer]
        lo = max(start, span.valid_from, span.valid_to - self.ring_capacity)
        return lo, max(lo, min(end, span.valid_to))

    def ring_store(self, layer: int, start: int, values: torch.Tensor, packed) -> None:
        """Write the rows of positions start.. (only the last `ring_capacity` survive). The start
        comes as a host int: reading it from a device tensor would synchronize."""
        n = values.shape[0]
        keep = min(n, self.ring_capacity)
        part = None if packed is None else (packed[0][-keep:], packed[1][-keep:])
        positions = torch.arange(start + n - keep, start + n, dtype=torch.long, device=values.device)
        self.ring_write(layer, positions, values[-keep:], part)
        self.note_ring_write(layer, start, n)

    @classmethod
    def ring_store_runs(cls, layer: int, parts: list[tuple[SequenceCache, int, int]], values: torch.Tensor,
                        packed) -> None:
        """One layer's ring rows for several caches: parts [(cache, start, n)] take the next n
        rows each, in order (ring_store each; a paged pool writes them all at once)."""
        at = 0
        for cache, start, n in parts:
            rows, at = slice(at, at + n), at + n
            cache.ring_store(layer, start, values[rows], None if packed is None else tuple(t[rows] for t in packed))

    def note_ring_write(self, layer: int, start: int, count: int) -> None:
        span = self.ring_spans[layer]
        if start != span.valid_to:
            span.valid_from = start  # a gap (CED skipped these positions in this layer)
        span.valid_to = start + count

    def set_tail(self, source: int, first_position: int, kv: torch.Tensor, gate: torch.Tensor, keep_from: int) -> None:
        """Record kv/gate of tokens [first_position, ...) of the running group stream and keep
        the ones from keep_from on as the open group."""
        rows = torch.stack([kv, gate])
        self._journal[source] = _TailJournal(first_position, rows)
        type(self)._set_tails([(self, source, rows[:, keep_from - first_position:])])

    def commit(self, tokens: list[int]) -> None:
        """The model has processed these tokens at positions num_tokens.."""
        self.num_tokens += len(tokens)
        self.history = (self.history + list(tokens))[-self.HISTORY_KEEP:]

    def truncate(self, num_tokens: int) -> None:
        """Roll back to `num_tokens` committed positions (rejected speculative tokens).

        Only positions written by the last forward can be dropped: their entries are cut,
        the open groups rebuilt from the journal, the rings need nothing (their capacity
        leaves room for a whole speculative block past the window).
        """
        SequenceCache.truncate_many([(self, num_tokens)])

    @staticmethod
    def truncate_many(cuts: list[tuple[SequenceCache, int]]) -> None:
        """truncate of each (cache, num_tokens), their open groups rebuilt together (_set_tails:
        a paged pool's in one launch, where a decode step's requests took ~8 each)."""
        tails = [tail for cache, num_tokens in cuts for tail in cache._roll_back(num_tokens)]
        for kind in {type(cache) for cache, _, _ in tails}:  # (one kind in a decode step)
            kind._set_tails([tail for tail in tails if type(tail[0]) is kind])

    def _roll_back(self, num_tokens: int) -> list[tuple[SequenceCache, int, torch.Tensor]]:
        """truncate's bookkeeping; returns the open groups to rebuild, (cache, source, rows)."""
        dropped = self.num_tokens - num_tokens
        if dropped < 0 or dropped > len(self.history):
            raise ValueError(f"cannot roll back from {self.num_tokens} to {num_tokens}")
        if dropped == 0:
            return []
        tails = []
        for role in self.config.roles:
            if not role.is_kv_source:
                continue
            ratio = role.ratio
            self._truncate_entries(role.index, num_tokens // ratio)
            if ratio > 1:
                group_start = (num_tokens // ratio) * ratio
                journal = self._journal.get(role.index)
                if journal is None or journal.first_position > group_start:
                    raise ValueError("rollback reaches before the last forward")
                lo, hi = group_start - journal.first_position, num_tokens - journal.first_position
                tails.append((self, role.index, journal.rows[:, lo:hi]))
        for span in self.ring_spans:
            span.valid_to = min(span.valid_to, num_tokens)
            span.valid_from = min(span.valid_from, span.valid_to)
        self.history = self.history[: len(self.history) - dropped]
        self.num_tokens = num_tokens
        return tails

    @classmethod
    def _set_tails(cls, tails: list[tuple[SequenceCache, int, torch.Tensor]]) -> None:
        """_set_tail of each (cache, source, rows)."""
        for cache, source, rows in tails:
            cache._set_tail(source, rows)


class DenseCache(SequenceCache):
    """fp32 tensors, grown on demand: the reference storage (exact with the quantizers on or off)."""

    def __init__(self, config: ModelConfig, ring_capacity: int | None = None, device="cpu"):
        cap = ring_capacity or default_ring_capacity(config)
        super().__init__(config=config, ring_capacity=cap)
        self.device = torch.device(device)
        self.rings = torch.zeros(config.num_all_layers, cap, config.head_dim, device=self.device)
        self._entries: dict[int, torch.Tensor] = {}
        self._index_keys: dict[int, torch.Tensor] = {}
        self._counts: dict[int, int] = {}
        self._tails: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for s in config.kv_source_layers:
            self._entries[s] = torch.zeros(0, config.head_dim, device=self.device)
            self._index_keys[s] = torch.zeros(0, config.index_head_dim, device=self.device)
            self._counts[s] = 0

    def ring_write(self, layer, positions, values, packed):
        self.rings[layer, positions.to(self.device) % self.ring_capacity] = values.to(self.device, torch.float32)

    def ring_read(self, layer, positions):
        return self.rings[layer, positions.to(self.device) % self.ring_capacity]

    def num_entries(self, source):
        return self._counts[source]

    def entries_append(self, source, kv, index_keys, packed):
        n = self._counts[source]
        need = n + kv.shape[0]
        for store, new in ((self._entries, kv), (self._index_keys, index_keys)):
            buf = store[source]
            if buf.shape[0] < need:
                grown = torch.zeros(max(need, 2 * buf.shape[0]), buf.shape[1], device=self.device)
                grown[:n] = buf[:n]
                store[source] = buf = grown
            buf[n:need] = new.to(self.device, torch.float32)
        self._counts[source] = need

    def entries_gather(self, source, idx):
        return self._entries[source][idx.to(self.device)]

    def index_keys(self, source):
        return self._index_keys[source][: self._counts[source]]

    def _truncate_entries(self, source, count):
        self._counts[source] = min(self._counts[source], count)

    def tail(self, source):
        return self._tails.get(source)

    def _set_tail(self, source, rows):
        self._tails[source] = (rows[0].to(self.device, torch.float32), rows[1].to(self.device, torch.float32))
