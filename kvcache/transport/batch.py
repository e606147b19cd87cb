"""What one write_batch/read_batch call moves, and the state it is in.

A caller gives `TransferRequest`s; `plan_batch` checks them against both engines' segments,
rejects overlapping destinations (their final bytes would depend on order) and merges requests
that are contiguous on both sides (a KV pool hands out runs of adjacent blocks; one region
per run keeps per-region overhead off the data path). Order within a batch does not matter.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import InvalidRequest, TransferError
from .memory import SegmentTable, reject_overlaps
from ...v1 import kvcache_pb2 as pb


@dataclass(frozen=True, slots=True)
class TransferRequest:
    """Move `length` bytes between (local_segment, local_offset) and the peer's
    (peer_segment, peer_offset); the direction is the call's (write: local -> peer)."""

    local_segment: str
    local_offset: int
    peer_segment: str
    peer_offset: int
    length: int


class TransferOp(enum.IntEnum):
    WRITE = pb.TRANSFER_OP_WRITE  # push local bytes into the peer's segments
    READ = pb.TRANSFER_OP_READ  # pull the peer's bytes into local segments


class TransferState(enum.Enum):
    """Life of a batch. Moves forward only; FAILED is terminal and separate from the happy
    path, so no ordering trick can mistake a failure for progress."""

    PENDING = "pending"
    TRANSFERRING = "transferring"
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"


_ORDER = [TransferState.PENDING, TransferState.TRANSFERRING, TransferState.VERIFYING,
          TransferState.DONE]
_batch_ids = itertools.count(1)
_CUT_ALIGN = 4096  # where stripes may cut a piece, counted from its start


@dataclass
class BatchRecord:
    op: TransferOp
    num_bytes: int
    num_regions: int
    batch_id: int = field(default_factory=lambda: next(_batch_ids))
    state: TransferState = TransferState.PENDING
    error: TransferError | None = None
    started_at: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def advance(self, state: TransferState) -> None:
        with self._lock:
            if self.state in (TransferState.DONE, TransferState.FAILED):
                raise RuntimeError(f"batch {self.batch_id} is already {self.state.value}")
            if _ORDER.index(state) < _ORDER.index(self.state):
                raise RuntimeError(f"batch {self.batch_id}: {self.state.value} -> {state.value}")
            self.state = state

    def fail(self, error: TransferError) -> None:
        with self._lock:
            if self.state is not TransferState.DONE:
                self.state, self.error = TransferState.FAILED, error


@dataclass(frozen=True)
class TransferReceipt:
    """Returned only when every byte arrived and the receiving side verified its checksum."""

    batch_id: int
    op: TransferOp
    state: TransferState
    num_bytes: int
    num_regions: int
    elapsed_s: float


@dataclass
class BatchPlan:
    """A validated batch: `pieces` are the merged requests. Views and wire regions are built
    on demand, only by the transports that need them (shm uses neither: it copies by address)."""

    op: TransferOp
    pieces: list[TransferRequest]
    num_bytes: int
    local: SegmentTable
    # A stripe (see stripes()): the batch's piece each of ours came from, and where our bytes
    # start in the batch's byte stream (fault positions count in that stream).
    origins: list[int] | None = None
    stream_offset: int = 0

    def regions(self, pieces: list[TransferRequest] | None = None) -> list[pb.Region]:
        """The peer's side of each piece, as the wire names it."""
        return [pb.Region(segment=p.peer_segment, offset=p.peer_offset, length=p.length)
                for p in (self.pieces if pieces is None else pieces)]

    def local_views(self, pieces: list[TransferRequest] | None = None) -> list[np.ndarray]:
        return [self.local.view(p.local_segment, p.local_offset, p.length)
                for p in (self.pieces if pieces is None else pieces)]

    def local_sums(self, pieces: list[TransferRequest] | None = None) -> list[int | None]:
        """Sealed checksums of our side of each piece (what a sender need not compute)."""
        return self.local.sealed_sums([(p.local_segment, p.local_offset, p.length)
                                       for p in (self.pieces if pieces is None else pieces)])

    def stripes(self, parts: int, min_bytes: int) -> list[BatchPlan]:
        """The batch as up to `parts` sub-batches of near-equal size (none under `min_bytes`)
        that move side by side, each on its own connection or thread: one loopback TCP stream
        or one copying thread is CPU-bound well below what the host can move. The pieces are
        laid end to end and cut at 4 KiB steps from a piece's start, so sub-pieces keep the
        alignment of their piece."""
        parts = max(1, min(parts, self.num_bytes // max(min_bytes, 2 * _CUT_ALIGN)))
        if parts == 1:
            return [self]
        bounds = [self.num_bytes * k // parts for k in range(1, parts)]
        stripes: list[BatchPlan] = []
        pieces: list[TransferRequest] = []
        origins: list[int] = []
        pos = start = 0

        def close() -> None:
            nonlocal pieces, origins, start
            if pieces:
                stripes.append(BatchPlan(self.op, pieces, pos - start, self.local, origins, start))
            pieces, origins, start = [], [], pos

        for index, p in enumerate(self.pieces):
            taken = 0
            while taken < p.length:
                take, cut = p.length - taken, False
                if len(stripes) < len(bounds) and pos + take >= bounds[len(stripes)]:
                    room = bounds[len(stripes)] - pos
                    end = max((taken + room) // _CUT_ALIGN * _CUT_ALIGN, taken + _CUT_ALIGN)
                    take, cut = min(end, p.length) - taken, True
                pieces.append(p if take == p.length else TransferRequest(
                    p.local_segment, p.local_offset + taken, p.peer_segment, p.peer_offset + taken, take))
                origins.append(index)
                taken, pos = taken + take, pos + take
                if cut:
                    close()
        close()
        return stripes


def _check_range(sizes: dict[str, int], segment: str, offset: int, length: int, side: str) -> None:
    size = sizes.get(segment)
    if size is None:
        raise InvalidRequest(f"{side} has no segment {segment!r}")
    if offset < 0 or offset + length > size:
        raise InvalidRequest(f"[{offset}, {offset + length}) is outside {side} segment "
                             f"{segment!r} of {size} bytes")


def _merge(requests: list[TransferRequest]) -> list[TransferRequest]:
    """Fuse requests contiguous on both sides (sorted by the peer's address first)."""
    ordered = sorted(requests, key=lambda r: (r.peer_segment, r.peer_offset))
    merged: list[TransferRequest] = []
    for r in ordered:
        last = merged[-1] if merged else None
        if (last is not None and last.peer_segment == r.peer_segment
                and last.local_segment == r.local_segment
                and last.peer_offset + last.length == r.peer_offset
                and last.local_offset + last.length == r.local_offset):
            merged[-1] = TransferRequest(last.local_segment, last.local_offset, last.peer_segment,
                                         last.peer_offset, last.length + r.length)
        else:
            merged.append(r)
    return merged


def plan_batch(op: TransferOp, requests: list[TransferRequest], local: SegmentTable,
               peer_sizes: dict[str, int]) -> BatchPlan:
    if not requests:
        raise InvalidRequest("empty batch")
    local_sizes = local.sizes()
    for r in requests:
        if r.length <= 0:
            raise InvalidRequest(f"length must be positive: {r}")
        _check_range(peer_sizes, r.peer_segment, r.peer_offset, r.length, "peer")
        _check_range(local_sizes, r.local_segment, r.local_offset, r.length, "local")
    if op is TransferOp.WRITE:
        reject_overlaps([(r.peer_segment, r.peer_offset, r.peer_offset + r.length)
                         for r in requests], "peer")
    else:
        reject_overlaps([(r.local_segment, r.local_offset, r.local_offset + r.length)
                         for r in requests], "local")
    return BatchPlan(op, _merge(requests), sum(r.length for r in requests), local)
