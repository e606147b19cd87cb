"""Preallocated cache memory: pages for the global entries, fixed slots for per-request state.

Like vLLM's block manager: all memory is allocated once (no per-request allocation, no
fragmentation), requests hold page ids and a slot id, and a full pool is a normal condition
the scheduler handles (wait or preempt), never a crash. The same pool type serves device
memory and (pinned) host memory; its storage may come from a transfer engine, so peers can
read and write it directly. A GPU worker's pool keeps the model's buffers on the device and
that storage as their host staging copy (mirror.py): `stage_out` / `stage_in` move a cache's
ranges between the two, and do nothing for a pool whose model reads the storage itself.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

import torch

from .layout import CacheLayout
from .mirror import DeviceMirror, Range
from .transport.checksum import SealedSums


class PoolExhausted(RuntimeError):
    """Not enough free pages or slots right now."""


class _FreeList:
    """Thread-safe: the engine thread and the RPC handlers both allocate and free."""

    def __init__(self, count: int):
        self.free = deque(range(count))
        self.count = count
        self._lock = threading.Lock()

    def take(self, n: int) -> list[int]:
        with self._lock:
            if n > len(self.free):
                raise PoolExhausted(f"need {n}, {len(self.free)} free of {self.count}")
            return [self.free.popleft() for _ in range(n)]

    def give(self, ids: list[int]) -> None:
        with self._lock:
            self.free.extend(ids)
            if len(self.free) > self.count:
                raise RuntimeError("double free in the cache pool")


Allocator = Callable[[str, int], torch.Tensor]  # (name, nbytes) -> uint8 tensor

_SERIALS = itertools.count()


def plain_allocator(device: str | torch.device = "cpu", pin: bool = False) -> Allocator:
    def allocate(_name: str, nbytes: int) -> torch.Tensor:
        t = torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=pin)
        t.zero_()  # pre-touch: first-touch page faults are slow, pay them at start-up
        return t

    return allocate


class CachePool:
    def __init__(self, layout: CacheLayout, num_pages: int, num_slots: int, allocate: Allocator | None = None,
                 name: str = "kv", sealed: SealedSums | None = None, device: str | torch.device | None = None):
        """`allocate` gives the storage peers address (a transfer engine's segments). With
        `device`, the model's buffers are allocated there and the storage becomes their host
        staging copy (a GPU worker; "cpu" gives tests the same arrangement); without, the
        model reads and writes the storage itself."""
        self.layout = layout
        # What CUDA graphs that write this pool's buffers are keyed by: never reused, where id()
        # can be once a pool is freed, and a graph captured against a freed pool's buffers
        # would replay its writes into whatever took their memory.
        self.serial = next(_SERIALS)
        # Checksums of full pages, taken as they fill (a transfer then sends them without a
        # second read): only for host memory that a transfer engine sends from.
        self.sealed = sealed
        allocate = allocate or plain_allocator()
        # Segment names: peers address this memory as (segment, offset) through a transfer engine.
        self.pages_segment, self.slots_segment = f"{name}-pages", f"{name}-slots"
        self._storage = {self.pages_segment: allocate(self.pages_segment, num_pages * layout.page_bytes),
                         self.slots_segment: allocate(self.slots_segment, num_slots * layout.slot_bytes)}
        self.mirror = None if device is None else DeviceMirror(self._storage, device)
        self.pages_buffer, self.slots_buffer = (self.buffer(s) for s in (self.pages_segment, self.slots_segment))
        self.pages = self.pages_buffer.view(num_pages, layout.page_bytes)
        self.slots = self.slots_buffer.view(num_slots, layout.slot_bytes)
        self.device = self.pages_buffer.device
        self._pages, self._slots = _FreeList(num_pages), _FreeList(num_slots)
        self.name = name
        # With tensor-parallel ranks: the writes the other ranks' pools must copy (replica.py),
        # and on those ranks, that rank 0 allocates every page.
        self.writes = None
        self.follows_rank0 = False

    @classmethod
    def sized(cls, layout: CacheLayout, nbytes: int, max_requests: int, allocate: Allocator | None = None,
              name: str = "kv", sealed: SealedSums | None = None,
              device: str | torch.device | None = None) -> "CachePool":
        """A pool using about `nbytes`: slots for `max_requests`, the rest as pages (with a
        `device`, `nbytes` there and as many again in the host staging copy)."""
        pages = max(1, (nbytes - max_requests * layout.slot_bytes) // layout.page_bytes)
        return cls(layout, int(pages), max_requests, allocate, name, sealed, device)

    # ------------------------------------------------------------ allocation

    def allocate_pages(self, n: int) -> list[int]:
        if self.follows_rank0:
            raise RuntimeError("a forward allocated pages on a rank that follows rank 0, whose engine "
                               "reserves every page before it announces a call")
        return self._pages.take(n)

    def free_pages(self, ids: list[int]) -> None:
        self.unseal_pages(ids)
        self._pages.give(ids)

    def seal_pages(self, ids: list[int]) -> None:
        """Record the checksums of pages whose bytes are final (see transport.SealedSums)."""
        if self.sealed is None or not ids:
            return
        size = self.layout.page_bytes
        spans = [(self.pages_segment, page * size, size) for page in ids]
        self.stage_out(spans)  # a send reads the host copy: that is what the sums must be of
        pages = self.host_buffer(self.pages_segment).numpy()
        for _, offset, length in spans:
            self.sealed.seal(self.pages_segment, offset, pages[offset: offset + length])

    def unseal_pages(self, ids: list[int]) -> None:
        """Before sealed pages are written again (freed, or a cache cut back into them)."""
        if self.sealed is not None and ids:
            self.sealed.drop(self.pages_segment, (page * self.layout.page_bytes for page in ids))

    def allocate_slot(self) -> int:
        slot = self._slots.take(1)[0]
        self.slots[slot].zero_()
        if self.writes is not None:
            self.writes.zeroed([(self.slots_segment, slot * self.layout.slot_bytes, self.layout.slot_bytes)])
        return slot

    def free_slot(self, slot: int) -> None:
        self._slots.give([slot])

    # ------------------------------------------------------------ accounting

    @property
    def num_pages(self) -> int:
        return self._pages.count

    @property
    def free_page_count(self) -> int:
        return len(self._pages.free)

    @property
    def num_slots(self) -> int:
        return self._slots.count

    @property
    def free_slot_count(self) -> int:
        return len(self._slots.free)

    @property
    def capacity_bytes(self) -> int:
        return self.pages_buffer.numel() + self.slots_buffer.numel()

    @property
    def used_bytes(self) -> int:
        used_pages = self.num_pages - self.free_page_count
        used_slots = self.num_slots - self.free_slot_count
        return used_pages * self.layout.page_bytes + used_slots * self.layout.slot_bytes

    def can_hold(self, num_tokens: int) -> bool:
        """Could one request of this length ever fit (an empty pool)?"""
        return self.layout.pages_for(num_tokens) <= self.num_pages and self.num_slots > 0

    def longest_request(self, limit: int) -> int:
        """The most tokens, up to `limit`, one request can hold here (0: none)."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.can_hold(mid) else (lo, mid - 1)
        return lo

    def buffer(self, segment: str) -> torch.Tensor:
        """The bytes the model reads and writes."""
        return self._storage[segment] if self.mirror is None else self.mirror.buffer(segment)

    def host_buffer(self, segment: str) -> torch.Tensor:
        """The bytes peers read and write (the same as buffer() without a device mirror)."""
        return self._storage[segment]

    # ------------------------------------------------------------ host staging

    @property
    def is_mirrored(self) -> bool:
        """The model's buffers are not the transfer storage: bytes are staged between them."""
        return self.mirror is not None

    def stage_out(self, ranges: list[Range]) -> int:
        """Before ranges are read from the host storage (sent, summed): copy them there from
        the device. Returns the bytes copied (0 without a mirror)."""
        return 0 if self.mirror is None else self.mirror.to_host(ranges)

    def stage_in(self, ranges: list[Range]) -> int:
        """After bytes landed in the host storage: copy them to the device, before the model
        reads them. Returns the bytes copied (0 without a mirror)."""
        self.note_written(ranges)
        return 0 if self.mirror is None else self.mirror.to_device(ranges)

    def note_written(self, ranges: list[Range]) -> None:
        """Bytes the model reads were written outside a forward (see replica.py)."""
        if self.writes is not None:
            self.writes.written(ranges)

    def is_empty(self) -> bool:
        return self.free_page_count == self.num_pages and self.free_slot_count == self.num_slots
