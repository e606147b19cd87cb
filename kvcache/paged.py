"""A request's cache in pool memory, in the real storage formats (see layout.py).

The model reads and writes it through the `SequenceCache` interface; values come back exactly
as the model's quantizers produced them, so a paged cache behaves like the dense reference
one. The same object can be copied to another pool (device <-> host) or flattened into one
byte buffer for transfer, exactly.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from ..model.config import ModelConfig
from ..model.device import tables_to_device, to_device
from ..model.kernels.page_offsets import page_offsets_kernel
from ..model.quant import fp4_dequantize, fp8_dequantize
from .layout import CacheLayout
from .pool import CachePool
from .state import RingSpan, SequenceCache


_SERIALS = itertools.count()


@dataclass
class CacheDescriptor:
    """Everything about a cache that is not pool bytes; travels with (or ahead of) the bytes."""

    layout_fingerprint: str
    num_tokens: int
    entry_counts: dict[int, int]
    tail_lengths: dict[int, int]
    ring_spans: list[tuple[int, int]]
    history: list[int]
    page_counts: dict[int, int] = field(default_factory=dict)

    def payload_bytes(self, layout: CacheLayout) -> int:
        return layout.slot_bytes + sum(self.page_counts.values()) * layout.page_bytes


class PagedCache(SequenceCache):
    def __init__(self, pool: CachePool, config: ModelConfig, slot: int | None = None):
        """A new cache with a slot of its own; with `slot`, a view of one another rank's pool
        allocated (replica.CacheView)."""
        layout = pool.layout
        super().__init__(config=config, ring_capacity=layout.ring_capacity)
        self.pool, self.layout = pool, layout
        self.slot = pool.allocate_slot() if slot is None else slot
        self.serial = next(_SERIALS)  # tells this cache from earlier holders of its slot (replica.py)
        self.page_table: dict[int, list[int]] = {s: [] for s in layout.sources}
        self._tables: dict[int, torch.Tensor] = {}  # page_table on the pool's device, rebuilt when it changes
        self.counts = {s: 0 for s in layout.sources}
        self._sealed = {s: 0 for s in layout.sources}  # leading pages whose checksums are sealed
        self.tail_lengths = {s: 0 for s in layout.tail_offsets()}
        self._tail_regions: dict[int, torch.Tensor] = {}  # _tail_region's views
        self._keys: dict[int, torch.Tensor] = {}  # dequantized index keys, extended as entries arrive
        self.released = False
        self._staging = threading.Lock()  # a staging copy and release() never overlap
        D = layout.head_dim
        slot = pool.slots[self.slot]
        rows = layout.num_ring_layers * layout.ring_capacity
        self._ring_codes = slot[: rows * D].view(layout.num_ring_layers, layout.ring_capacity, D)
        self._ring_scales = slot[layout.ring_scales_offset: layout.ring_scales_offset + rows * (D // 32)].view(
            layout.num_ring_layers, layout.ring_capacity, D // 32)
        self._sections = {name: pool.pages[:, off: off + width * layout.page_entries].view(
            pool.num_pages, layout.page_entries, width) for name, (off, width) in layout.page_sections().items()}

    @property
    def pool_bytes(self) -> int:
        """The pool memory this cache holds: its slot and its pages."""
        return self.layout.slot_bytes + sum(len(t) for t in self.page_table.values()) * self.layout.page_bytes

    # ------------------------------------------------------------ ring

    def ring_write(self, layer, positions, values, packed):
        if packed is None:
            raise ValueError("paged storage keeps the quantized caches: run the model with its quantizers on")
        idx = (positions % self.ring_capacity).to(self.pool.device)
        self._ring_codes[layer, idx] = packed[0].to(self.pool.device)
        self._ring_scales[layer, idx] = packed[1].to(self.pool.device)

    def ring_read(self, layer, positions):
        idx = (positions % self.ring_capacity).to(self.pool.device)
        return fp8_dequantize(self._ring_codes[layer, idx], self._ring_scales[layer, idx])

    def ring_store(self, layer, start, values, packed):
        super().ring_store(layer, start, values, packed)
        self._note_ring_bytes(layer, start, values.shape[0])

    @classmethod
    def ring_store_runs(cls, layer, parts, values, packed):
        caches = [cache for cache, _, _ in parts]
        if not cls._write_together(caches, packed):
            return super().ring_store_runs(layer, parts, values, packed)
        cap = caches[0].layout.ring_capacity
        kept, taken, at = [], [], 0  # the rows each ring keeps, and where they are in values
        for cache, start, n in parts:
            keep = min(n, cap)
            kept.append((cache, start + n - keep, keep))
            taken += range(at + n - keep, at + n)
            at += n
        pool = caches[0].pool
        where, taken = tables_to_device(pool.device, cls.ring_targets(kept), np.array(taken, dtype=np.int64))
        cls.ring_scatter(pool, layer, where, *(t if len(taken) == at else t[taken] for t in packed))
        cls.note_ring_stores(layer, parts)

    @classmethod
    def ring_targets(cls, parts: list[tuple[PagedCache, int, int]]) -> np.ndarray | None:
        """Where the rows of parts [(cache, start, n)] (n within the ring's capacity) go in the
        pool's rings, [rows, 2] (slot, row in the ring) for ring_scatter; None unless every cache
        is paged in one pool. Built on the host: the rows' ring bytes can then be written in a
        CUDA graph (the drafter's absorb)."""
        caches = [cache for cache, _, _ in parts]
        if not cls._in_one_pool(caches):
            return None
        return np.concatenate([cls.slot_targets(cache.pool, cache.slot, start, n) for cache, start, n in parts])

    @staticmethod
    def slot_targets(pool: CachePool, slot: int, start: int, n: int) -> np.ndarray:
        """ring_targets of positions start .. start + n in `slot`'s rings."""
        rows = np.arange(start, start + n, dtype=np.int64) % pool.layout.ring_capacity
        return np.stack([np.full(n, slot, dtype=np.int64), rows], 1)

    @staticmethod
    def ring_scatter(pool: CachePool, layer: int, where: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor
                     ) -> None:
        """Write ring rows' FP8 codes and e8m0 scales at ring_targets' `where` (on the device) of
        `layer`, in torch ops alone (a CUDA graph may hold them); note_ring_stores then."""
        for ring, data in zip(_pool_rings(pool), (codes, scales)):
            ring[where[:, 0], layer, where[:, 1]] = data.to(pool.device)

    @classmethod
    def note_ring_stores(cls, layer: int, parts: list[tuple[PagedCache, int, int]]) -> None:
        """The bookkeeping of ring rows written for parts [(cache, start, n)] (ring_scatter)."""
        for cache, start, n in parts:
            cache.note_ring_write(layer, start, n)
            cache._note_ring_bytes(layer, start, n)

    @classmethod
    def _write_together(cls, caches: list, packed) -> bool:
        """Whether several caches' rows go in one write: all paged in one pool, bytes given."""
        return packed is not None and len(caches) > 1 and cls._in_one_pool(caches)

    @classmethod
    def _in_one_pool(cls, caches: list) -> bool:
        """All paged caches of one pool (their rows can be written together)."""
        return all(type(c) is cls and c.pool is caches[0].pool for c in caches)

    def _note_ring_bytes(self, layer: int, start: int, n: int) -> None:
        if self.pool.writes is not None:  # the drafter's rings are written outside a forward
            self.pool.note_written(self._ring_ranges(layer, start + n - min(n, self.ring_capacity), start + n))

    def _ring_ranges(self, layer: int, first: int, end: int) -> list[tuple[str, int, int]]:
        """The slot bytes (codes and scales) of ring rows for positions [first, end)."""
        L, D, cap = self.layout, self.layout.head_dim, self.ring_capacity
        base = self.slot * L.slot_bytes
        lo = first % cap
        runs = [(lo, min(cap, lo + end - first))]
        if lo + end - first > cap:  # wraps around
            runs.append((0, lo + end - first - cap))
        seg, out = self.pool.slots_segment, []
        for a, b in runs:
            row = layer * cap
            out.append((seg, base + (row + a) * D, (b - a) * D))
            out.append((seg, base + L.ring_scales_offset + (row + a) * (D // 32), (b - a) * (D // 32)))
        return out

    # ------------------------------------------------------------ global entries

    def num_entries(self, source):
        return self.counts[source]

    def _ensure_pages(self, source: int, count: int) -> None:
        table = self.page_table[source]
        need = -(-count // self.layout.page_entries) - len(table)
        if need > 0:
            table.extend(self.pool.allocate_pages(need))
            self._tables.pop(source, None)

    def device_table(self, source: int) -> torch.Tensor:
        """The source's page table on the pool's device: one copy each time pages are added,
        not one (synchronizing) copy per lookup (valid until pages are added)."""
        table = self._tables.get(source)
        if table is None:
            table = self._tables[source] = to_device(torch.tensor(self.page_table[source], dtype=torch.long),
                                                     self.pool.device)
        return table

    def reserve(self, extra_tokens: int) -> None:
        """Allocate now every page the next `extra_tokens` tokens will need (raises PoolExhausted),
        so a forward never runs out of memory half way."""
        for source, count in self.layout.entries_for(self.num_tokens + extra_tokens).items():
            self._ensure_pages(source, count)

    def pages_needed(self, extra_tokens: int) -> int:
        total = 0
        for source, count in self.layout.entries_for(self.num_tokens + extra_tokens).items():
            total += max(0, -(-count // self.layout.page_entries) - len(self.page_table[source]))
        return total

    def _locate(self, source: int, entry_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, P = entry_ids.to(self.pool.device), self.layout.page_entries
        return self.device_table(source)[ids // P], ids % P

    def entries_append(self, source, kv, index_keys, packed):
        if packed is None:
            raise ValueError("paged storage keeps the quantized caches: run the model with its quantizers on")
        n, start = kv.shape[0], self.counts[source]
        self._ensure_pages(source, start + n)
        self._write_entries(*self._locate(source, torch.arange(start, start + n, device=self.pool.device)), packed)
        self._appended(source, index_keys)

    @classmethod
    def entries_append_runs(cls, source, parts, kv, index_keys, packed):
        caches = [cache for cache, _ in parts]
        if not cls._write_together(caches, packed):
            return super().entries_append_runs(source, parts, kv, index_keys, packed)
        pages, rows = [], []  # on the host: the page tables are host lists, so one copy serves every cache
        for cache, n in parts:
            start, table, P = cache.counts[source], cache.page_table[source], cache.layout.page_entries
            cache._ensure_pages(source, start + n)
            pages += [table[i // P] for i in range(start, start + n)]
            rows += [i % P for i in range(start, start + n)]
        where = to_device(torch.tensor([pages, rows], dtype=torch.long), caches[0].pool.device)
        caches[0]._write_entries(where[0], where[1], packed)
        at = 0
        for cache, n in parts:
            cache._appended(source, index_keys[at:at + n])
            at += n

    def _write_entries(self, pages: torch.Tensor, rows: torch.Tensor, packed) -> None:
        (kv_codes, kv_scales), (key_codes, key_scales) = packed
        for name, data in (("kv_codes", kv_codes), ("kv_scales", kv_scales), ("key_codes", key_codes),
                           ("key_scales", key_scales)):
            self._sections[name][pages, rows] = data.to(self.pool.device)

    def _appended(self, source: int, index_keys: torch.Tensor) -> None:
        """Count entries written to the pages; extend the dequantized keys where kept."""
        start = self.counts[source]
        self.counts[source] = start + index_keys.shape[0]
        keys = self._keys.get(source)
        if keys is not None:  # kept only once index_keys() was asked for: the kernels read the pages
            self._keys[source] = torch.cat([keys[:start], index_keys.float().to(self.pool.device)])

    def entries_gather(self, source, idx):
        pages, rows = self._locate(source, idx.reshape(-1))
        codes = self._sections["kv_codes"][pages, rows]
        scales = self._sections["kv_scales"][pages, rows]
        return fp4_dequantize(codes, scales, 16, e4m3_scales=True).reshape(*idx.shape, -1)

    def index_keys(self, source):
        count = self.counts[source]
        keys = self._keys.get(source)
        if keys is None or keys.shape[0] < count:
            keys = self._decode_keys(source, count)
            self._keys[source] = keys
        return keys[:count]

    def _decode_keys(self, source: int, count: int) -> torch.Tensor:
        pages, rows = self._locate(source, torch.arange(count, device=self.pool.device))
        return fp4_dequantize(self._sections["key_codes"][pages, rows], self._sections["key_scales"][pages, rows], 32)

    def _truncate_entries(self, source, count):
        self.counts[source] = min(self.counts[source], count)
        self._unseal_from(source, self.counts[source] // self.layout.page_entries)

    # ------------------------------------------------------------ sealed page checksums

    def seal_full_pages(self) -> None:
        """Seal the checksums of pages that filled up since the last call: their bytes are
        final (entries are only appended), so a transfer sends them without summing them."""
        for source, table in self.page_table.items():
            full = min(self.counts[source] // self.layout.page_entries, len(table))
            if full > self._sealed[source]:
                self.pool.seal_pages(table[self._sealed[source]:full])
                self._sealed[source] = full

    def _unseal_from(self, source: int, first_page: int) -> None:
        if self._sealed[source] > first_page:
            self.pool.unseal_pages(self.page_table[source][first_page:self._sealed[source]])
            self._sealed[source] = first_page

    # ------------------------------------------------------------ byte offsets (kernels read the pool)

    def ring_offsets(self, layer: int, positions):
        """Byte offsets in pool.slots_buffer of the FP8 codes and the e8m0 scales of ring rows
        at `positions`: a tensor, or an int64 numpy array (tables built on the host)."""
        L, D = self.layout, self.layout.head_dim
        if isinstance(positions, torch.Tensor):
            positions = positions.to(torch.long)
        row = layer * L.ring_capacity + positions % L.ring_capacity
        base = self.slot * L.slot_bytes
        return base + row * D, base + L.ring_scales_offset + row * (D // 32)

    @property
    def ring_layer_stride(self) -> tuple[int, int]:
        """Bytes between a position's codes (and its scales) in one ring layer and the next: the
        offsets of layer l are those of layer 0 plus l strides, so a forward computes them once."""
        L, D = self.layout, self.layout.head_dim
        return L.ring_capacity * D, L.ring_capacity * (D // 32)

    def entry_offsets(self, source: int, entry_ids: torch.Tensor, kind: str = "kv"
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Byte offsets in pool.pages_buffer of the codes and scales of entries (kind kv | key)."""
        return page_offsets(self.layout, self.device_table(source).to(entry_ids.device), entry_ids, kind)

    # ------------------------------------------------------------ open groups

    def _tail_region(self, source: int) -> torch.Tensor:
        """The open group's kv and gate [2, ratio - 1, D] fp32 in the slot, viewed once (a decode
        step rebuilds every open group, and views cost the host time)."""
        region = self._tail_regions.get(source)
        if region is None:
            D, r = self.layout.head_dim, self.layout.max_tail_tokens(source)
            off = self.layout.tail_offsets()[source]
            region = self.pool.slots[self.slot][off: off + 2 * r * D * 4].view(torch.float32).view(2, r, D)
            self._tail_regions[source] = region
        return region

    def tail(self, source):
        if source not in self.tail_lengths:
            return None
        region = self._tail_region(source)
        n = self.tail_lengths[source]
        return region[0, :n].clone(), region[1, :n].clone()

    @classmethod
    def _set_tails(cls, tails):
        targets, values = [], []
        for cache, source, rows in tails:
            n = rows.shape[1]
            if n > cache.layout.max_tail_tokens(source):
                raise ValueError(f"open group of {n} tokens exceeds ratio - 1")
            cache.tail_lengths[source] = n
            if not n:
                continue
            targets.append(cache._tail_region(source)[:, :n])
            values.append(rows)
            if cache.pool.writes is not None:  # a rollback rebuilds it outside a forward
                base = cache.pool.slots_buffer.data_ptr()
                cache.pool.note_written([(cache.pool.slots_segment, row.data_ptr() - base, row.nbytes)
                                         for row in targets[-1]])
        if targets:
            torch._foreach_copy_(targets, values)  # one launch on the GPU for the whole step

    # ------------------------------------------------------------ life cycle and transfer

    def release(self) -> None:
        """Give the pages and the slot back (idempotent)."""
        with self._staging:
            if self.released:
                return
            for source, table in self.page_table.items():
                self.pool.free_pages(table)  # drops their seals
                table.clear()
                self._sealed[source] = 0
            self._tables.clear()
            self.pool.free_slot(self.slot)
            self.released = True

    def stage_out(self) -> int:
        """Before this cache is sent: its bytes device -> host storage (pool.stage_out)."""
        return self._stage(self.pool.stage_out)

    def stage_in(self) -> int:
        """After this cache's bytes landed in the host storage (apply() done): host -> device."""
        return self._stage(self.pool.stage_in)

    def _stage(self, copy) -> int:
        # Under the lock, and not once released: a copy that a cancelled handoff left queued
        # must not touch pages that another cache may own by the time it runs.
        with self._staging:
            return 0 if self.released else copy(self.byte_ranges())

    def descriptor(self) -> CacheDescriptor:
        used = {s: -(-self.counts[s] // self.layout.page_entries) for s in self.layout.sources}
        return CacheDescriptor(
            layout_fingerprint=self.layout.fingerprint(), num_tokens=self.num_tokens, entry_counts=dict(self.counts),
            tail_lengths=dict(self.tail_lengths), ring_spans=[(s.valid_from, s.valid_to) for s in self.ring_spans],
            history=list(self.history), page_counts=used)

    def byte_ranges(self, num_tokens: int | None = None) -> list[tuple[str, int, int]]:
        """(segment, byte offset, length) of every byte this request owns, in payload order:
        the slot, then each source's used pages in entry order. With num_tokens: the ranges a
        cache of that length occupies (where an incoming payload lands)."""
        L, pool = self.layout, self.pool
        counts = self.counts if num_tokens is None else L.entries_for(num_tokens)
        ranges = [(pool.slots_segment, self.slot * L.slot_bytes, L.slot_bytes)]
        for source in L.sources:
            used = -(-counts[source] // L.page_entries)
            if used > len(self.page_table[source]):
                raise ValueError(f"a {num_tokens}-token cache needs more pages than this one holds")
            ranges += [(pool.pages_segment, page * L.page_bytes, L.page_bytes) for page in self.page_table[source][:used]]
        return ranges

    def serialize(self) -> tuple[CacheDescriptor, torch.Tensor]:
        """A flat uint8 copy of the payload (slot, then pages) and its descriptor."""
        parts = [self.pool.buffer(seg)[off: off + n] for seg, off, n in self.byte_ranges()]
        return self.descriptor(), torch.cat(parts).cpu()

    @classmethod
    def reserve_for(cls, pool: CachePool, config: ModelConfig, num_tokens: int) -> "PagedCache":
        """An empty cache with the slot and the pages a `num_tokens` cache occupies: the landing
        place for a transfer (byte_ranges() after apply() are where the payload goes)."""
        cache = cls(pool, config)
        try:
            for source, count in pool.layout.entries_for(num_tokens).items():
                cache._ensure_pages(source, count)
        except Exception:
            cache.release()
            raise
        return cache

    def apply(self, desc: CacheDescriptor) -> None:
        """Take the metadata of a cache whose bytes land (or landed) in this one's pages."""
        if desc.layout_fingerprint != self.layout.fingerprint():
            raise ValueError(f"incompatible cache layout {desc.layout_fingerprint} "
                             f"(this pool: {self.layout.fingerprint()})")
        for source in self.layout.sources:
            if desc.page_counts.get(source, 0) > len(self.page_table[source]):
                raise ValueError("the descriptor needs more pages than were reserved")
        self.counts = {int(k): int(v) for k, v in desc.entry_counts.items()}
        self.tail_lengths = {int(k): int(v) for k, v in desc.tail_lengths.items()}
        self.num_tokens = int(desc.num_tokens)
        self.history = list(desc.history)
        self.ring_spans = [RingSpan(int(a), int(b)) for a, b in desc.ring_spans]
        self.bytes_changed()

    @classmethod
    def allocate_for(cls, pool: CachePool, config: ModelConfig, desc: CacheDescriptor) -> "PagedCache":
        """An empty cache shaped like `desc`, metadata set: load_payload() fills its bytes."""
        if desc.layout_fingerprint != pool.layout.fingerprint():
            raise ValueError(f"incompatible cache layout {desc.layout_fingerprint} (this pool: {pool.layout.fingerprint()})")
        cache = cls.reserve_for(pool, config, int(desc.num_tokens))
        try:
            cache.apply(desc)
        except Exception:
            cache.release()
            raise
        return cache

    def load_payload(self, payload: torch.Tensor) -> None:
        """Copy a serialized payload into this cache's own bytes (after allocate_for)."""
        offset = 0
        for seg, off, n in self.byte_ranges():
            self.pool.buffer(seg)[off: off + n].copy_(payload[offset: offset + n])
            offset += n
        if offset != payload.numel():
            raise ValueError(f"payload has {payload.numel()} bytes, the descriptor needs {offset}")
        self.bytes_changed()

    def bytes_changed(self) -> None:
        """The pool bytes were written from outside (a transfer): drop derived copies and seals."""
        if self.pool.writes is not None:
            self.pool.note_written(self.byte_ranges())
        self._keys.clear()
        for source in self.layout.sources:
            self._unseal_from(source, 0)

    @classmethod
    def deserialize(cls, pool: CachePool, config: ModelConfig, desc: CacheDescriptor,
                    payload: torch.Tensor) -> "PagedCache":
        cache = cls.allocate_for(pool, config, desc)
        try:
            cache.load_payload(payload)
        except Exception:
            cache.release()
            raise
        return cache

    def copy_to(self, pool: CachePool) -> "PagedCache":
        """The same cache in another pool, or this one (e.g. device -> pinned host, or a kept
        copy of a prompt), byte for byte: page to page, with no flat payload in between."""
        copy = PagedCache.allocate_for(pool, self.config, self.descriptor())
        try:
            for (src_seg, src_off, n), (dst_seg, dst_off, _) in zip(self.byte_ranges(), copy.byte_ranges()):
                pool.buffer(dst_seg)[dst_off: dst_off + n].copy_(self.pool.buffer(src_seg)[src_off: src_off + n])
        except Exception:
            copy.release()
            raise
        copy.bytes_changed()
        return copy


def _pool_rings(pool: CachePool) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 codes [slots, layers, capacity, D] and scales [.., D/32] of every slot's rings."""
    L, D = pool.layout, pool.layout.head_dim
    rows = L.num_ring_layers * L.ring_capacity
    codes = pool.slots[:, : rows * D].view(-1, L.num_ring_layers, L.ring_capacity, D)
    scales = pool.slots[:, L.ring_scales_offset: L.ring_scales_offset + rows * (D // 32)]
    return codes, scales.view(-1, L.num_ring_layers, L.ring_capacity, D // 32)


def tables_end_to_end(tables: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """Several caches' page tables as one (one page_offsets lookup for a batch) and where each
    starts in it (0 for an empty table)."""
    firsts, total = [], 0
    for table in tables:
        firsts.append(total if table.numel() else 0)
        total += table.numel()
    return torch.cat(tables), firsts


def page_offsets(layout: CacheLayout, table: torch.Tensor, entry_ids: torch.Tensor, kind: str = "kv",
                 first_page: torch.Tensor | None = None, mask: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets in the pool's pages_buffer of the codes and scales of entries (kind kv | key)
    through a page table on the device; a negative id reads entry 0. first_page [rows, 1]: where
    each row's own table starts when `table` is several caches' tables end to end (one lookup
    for a batch). mask: the codes offset of an id below 0 is -1 (no entry) and the scales
    offset of one below -1 too (past a run's own list: sparse_attention's masks). One launch
    on the GPU (model/kernels/page_offsets.py), torch elsewhere (the interpreter would take
    milliseconds a call in every CPU forward; the kernel's own test runs it there)."""
    sections = layout.page_sections()
    codes = sections[f"{kind}_codes"]
    scales = sections["kv_scales" if kind == "kv" else "key_scales"]
    if entry_ids.is_cuda:
        return page_offsets_kernel(table, entry_ids, first_page, layout.page_entries, layout.page_bytes, codes,
                                   scales, mask)
    ids = entry_ids.to(torch.long).clamp_min(0)
    index = ids // layout.page_entries
    page = table[index if first_page is None else index + first_page] * layout.page_bytes
    row = ids % layout.page_entries
    off, soff = page + codes[0] + row * codes[1], page + scales[0] + row * scales[1]
    if mask:
        off, soff = torch.where(entry_ids >= 0, off, -1), torch.where(entry_ids >= -1, soff, -1)
    return off, soff
