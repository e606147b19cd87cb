"""The transfer-engine seam: one ABC, one handle per peer, typed errors, bounded waits.

Who calls what:
- The KV pool's owner calls `allocate_segment` once per pool at start-up and uses the returned
  tensor as the pool's storage; the engine keeps it registered (shared, pinned, MR) until
  `close()`.
- The control plane publishes `endpoint()` (over gRPC / Redis) and hands a peer's endpoint to
  `connect()`; select.py picks which engine connects.
- The prefill side calls `write_batch` to push a request's cache into a decode worker's
  segments; a decode worker calls `read_batch` to pull a conversation's cache from its owner.
  Both return a receipt only after every region was verified where it landed (a checksum
  the receiving side compares; shm compares the bytes themselves), and raise a
  `TransferError` otherwise; after an error the destination bytes are unspecified and the
  caller recomputes. Neither frees or reuses blocks: the caller owns both ends' blocks and
  must keep them untouched until the call returns.
Every wait is bounded: `connect_timeout_s` for connects, and per batch a deadline (argument,
or `batch_timeout_s(bytes)`) plus `stall_timeout_s` without progress. A dead peer therefore
surfaces as PeerUnreachable or TransferTimeout within seconds, never as a hang.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, ClassVar, TypeVar

import torch

from .batch import (BatchPlan, BatchRecord, TransferOp, TransferReceipt, TransferRequest,
                    TransferState, plan_batch)
from .checksum import SealedSums
from .errors import (ChecksumMismatch, EngineClosed, IncompatiblePeer, InvalidRequest, PeerUnreachable,
                     TransferError, TransferTimeout, TransportUnavailable)
from .faults import BatchFaults, FaultInjector, FaultPlan
from .identity import host_id, new_engine_id
from .memory import Segment, SegmentTable
from .wire import PROTOCOL_VERSION, Deadline
from ...v1 import kvcache_pb2 as pb

T = TypeVar("T")
# Slack the event loop grants a worker thread beyond the batch deadline before it gives up on
# it; the thread's own socket timeouts normally fire first.
_ASYNC_GRACE_S = 1.0


@dataclass(frozen=True)
class TransportConfig:
    compatibility_hash: str  # identity.make_compatibility_hash(...)
    connect_timeout_s: float = 2.0
    stall_timeout_s: float = 5.0  # no byte moved for this long: TransferTimeout
    # Default batch deadline: stall_timeout_s + bytes / this rate (~10x below loopback TCP).
    min_rate_bytes_per_s: float = 256e6
    max_concurrent_batches: int = 4
    # A batch of at least 2 x min_stripe_bytes moves as up to `streams` stripes side by side
    # (tcp: one connection each, shm: one copying thread each). Measured on a 2-vCPU VM: two
    # threads copy and compare at 17-19 GiB/s against 13-15 for one. Raw loopback TCP nearly
    # doubles with two streams (9.8 vs 5.3 GiB/s), but there the checksum passes fill both
    # vCPUs and tcp gains only a few percent; hosts with more cores gain more.
    streams: int = 2
    min_stripe_bytes: int = 8 << 20

    def __post_init__(self):
        if min(self.connect_timeout_s, self.stall_timeout_s, self.min_rate_bytes_per_s) <= 0:
            raise ValueError("timeouts and rates must be positive")
        if self.streams < 1 or self.min_stripe_bytes < 1:
            raise ValueError("streams and min_stripe_bytes must be >= 1")

    @property
    def max_connections(self) -> int:
        """Connections (and threads) one peer's batches can use at once."""
        return self.max_concurrent_batches * self.streams

    def batch_timeout_s(self, num_bytes: int) -> float:
        return self.stall_timeout_s + num_bytes / self.min_rate_bytes_per_s


class PeerHandle:
    """A connected peer. Transports subclass it to hold connections or mappings."""

    def __init__(self, endpoint: pb.TransportEndpoint, kind: int):
        self.endpoint = endpoint
        self.kind = kind
        self.engine_id = endpoint.engine_id
        self.segment_sizes = {s.name: s.size_bytes for s in endpoint.segments}
        self.is_closed = False

    def update_segments(self, infos) -> None:
        self.segment_sizes = {s.name: s.size_bytes for s in infos}

    def close(self) -> None:
        self.is_closed = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {pb.TransportKind.Name(self.kind)} {self.engine_id[:8]}>"


def check_endpoint(local_hash: str, kind: int, peer: pb.TransportEndpoint) -> None:
    """Refuse before dialing what the handshake would refuse after."""
    if peer.protocol_version != PROTOCOL_VERSION:
        raise IncompatiblePeer(f"peer speaks protocol {peer.protocol_version}, "
                               f"this engine {PROTOCOL_VERSION}")
    if peer.compatibility_hash != local_hash:
        raise IncompatiblePeer("compatibility hash differs (model, KV layout or checksum)")
    if kind not in peer.kinds:
        raise TransportUnavailable(f"peer does not offer {pb.TransportKind.Name(kind)}")


class TransferEngine(ABC):
    kind: ClassVar[int]
    shares_memory: ClassVar[bool] = False  # segments are memfd-backed (shm.py)
    striped: ClassVar[bool] = False  # large batches move as parallel stripes (config.streams)

    def __init__(self, config: TransportConfig, faults: FaultPlan | None = None, *,
                 segments: SegmentTable | None = None, engine_id: str | None = None):
        """`segments` and `engine_id` let several transports serve one set of segments under
        one identity (select.open_engines); by default the engine owns its own."""
        self.config = config
        self.engine_id = engine_id or new_engine_id()
        self.host_id = host_id()
        if segments is not None and self.shares_memory and not segments.is_shared:
            raise ValueError(f"{type(self).__name__} needs memfd-backed (shared) segments")
        self._owns_segments = segments is None
        self._segments = segments if segments is not None else SegmentTable(shared=self.shares_memory)
        self._faults = FaultInjector(faults)
        name = pb.TransportKind.Name(self.kind).removeprefix("TRANSPORT_KIND_").lower()
        self._executor = ThreadPoolExecutor(config.max_connections,
                                            thread_name_prefix=f"kv-{name}")
        self._peers: weakref.WeakSet[PeerHandle] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.is_closed = False

    # ------------------------------------------------------------ memory

    def allocate_segment(self, name: str, nbytes: int) -> torch.Tensor:
        """Registered, pre-faulted memory (uint8, CPU) for a KV pool to use as storage."""
        self._check_open()
        segment = self._segments.allocate(name, nbytes)
        self._register_segment(segment)
        return segment.tensor

    def segment(self, name: str) -> torch.Tensor:
        return self._segments.get(name).tensor

    @property
    def sealed(self) -> SealedSums:
        """Checksums of final bytes in our segments: sending those regions reads them once."""
        return self._segments.sealed

    def _register_segment(self, segment: Segment) -> None:
        """Transports that must register memory with hardware do it here (rdma.py)."""

    # ------------------------------------------------------------ identity

    def endpoint(self) -> pb.TransportEndpoint:
        endpoint = pb.TransportEndpoint(
            protocol_version=PROTOCOL_VERSION, compatibility_hash=self.config.compatibility_hash,
            engine_id=self.engine_id, host_id=self.host_id, kinds=[self.kind],
            segments=self._segments.infos())
        self._describe(endpoint)
        return endpoint

    @abstractmethod
    def _describe(self, endpoint: pb.TransportEndpoint) -> None:
        """Fill in this transport's address fields."""

    # ------------------------------------------------------------ peers

    async def connect(self, peer_endpoint: pb.TransportEndpoint,
                      timeout_s: float | None = None) -> PeerHandle:
        """Handshake with a peer (version, compatibility hash, incarnation). Raises
        PeerUnreachable within `connect_timeout_s` if nothing answers."""
        self._check_open()
        check_endpoint(self.config.compatibility_hash, self.kind, peer_endpoint)
        deadline = Deadline(timeout_s if timeout_s is not None else self.config.connect_timeout_s)
        peer = await self._in_thread(lambda: self._connect_blocking(peer_endpoint, deadline), deadline)
        return self._adopt_peer(peer)

    def _adopt_peer(self, peer: PeerHandle) -> PeerHandle:
        """Track a new handle so close() closes it; refuse it if close() won the race."""
        with self._lock:
            if self.is_closed:
                peer.close()
                raise EngineClosed("engine closed during connect")
            self._peers.add(peer)
        return peer

    @abstractmethod
    def _connect_blocking(self, endpoint: pb.TransportEndpoint, deadline: Deadline) -> PeerHandle:
        ...

    def _refresh_blocking(self, peer: PeerHandle, deadline: Deadline) -> None:
        """Learn segments the peer allocated after connect (default: cannot)."""
        raise InvalidRequest("peer segments cannot be refreshed by this transport; reconnect")

    # ------------------------------------------------------------ batches

    async def write_batch(self, peer: PeerHandle, requests: list[TransferRequest],
                          timeout_s: float | None = None) -> TransferReceipt:
        """Push local bytes into the peer's segments; returns once the peer verified them."""
        return await self._execute(peer, TransferOp.WRITE, requests, timeout_s)

    async def read_batch(self, peer: PeerHandle, requests: list[TransferRequest],
                         timeout_s: float | None = None) -> TransferReceipt:
        """Pull the peer's bytes into local segments; returns once they are verified."""
        return await self._execute(peer, TransferOp.READ, requests, timeout_s)

    async def _plan(self, peer: PeerHandle, op: TransferOp, requests: list[TransferRequest],
                    deadline: Deadline) -> BatchPlan:
        unknown = {r.peer_segment for r in requests} - peer.segment_sizes.keys()
        if unknown:
            await self._in_thread(lambda: self._refresh_blocking(peer, deadline), deadline)
        return plan_batch(op, requests, self._segments, peer.segment_sizes)

    async def _execute(self, peer: PeerHandle, op: TransferOp, requests: list[TransferRequest],
                       timeout_s: float | None) -> TransferReceipt:
        self._check_open()
        if peer.is_closed:
            raise PeerUnreachable(f"{peer!r} is closed")
        total = sum(r.length for r in requests)
        deadline = Deadline(timeout_s if timeout_s is not None else self.config.batch_timeout_s(total))
        plan = await self._plan(peer, op, requests, deadline)
        record = BatchRecord(op, plan.num_bytes, len(plan.pieces))
        faults = self._faults.next_batch()
        try:
            if faults.fail_with is not None:
                raise faults.fail_with("injected fault")
            record.advance(TransferState.TRANSFERRING)
            await self._transfer_stripes(peer, plan, record, faults, deadline)
            record.advance(TransferState.DONE)
        except TransferError as exc:
            record.fail(exc)
            if self.is_closed and not isinstance(exc, EngineClosed):
                raise EngineClosed("engine closed during the batch") from exc
            raise
        except BaseException as exc:  # cancelled, or a bug: the batch did not happen
            record.fail(TransferError(repr(exc)))
            raise
        return TransferReceipt(record.batch_id, op, record.state, plan.num_bytes,
                               len(plan.pieces), time.monotonic() - record.started_at)

    @abstractmethod
    async def _transfer(self, peer: PeerHandle, plan: BatchPlan, record: BatchRecord,
                        faults: BatchFaults, deadline: Deadline) -> None:
        """Move and verify the bytes, or raise a TransferError."""

    async def _transfer_stripes(self, peer: PeerHandle, plan: BatchPlan, record: BatchRecord,
                                faults: BatchFaults, deadline: Deadline) -> None:
        """`_transfer` once per stripe, concurrently. The first failure stops the others (their
        sockets are shut by the cancelled waits) and is raised with the batch's region index."""
        stripes = plan.stripes(self.config.streams, self.config.min_stripe_bytes) if self.striped else [plan]
        if len(stripes) == 1:
            return await self._transfer(peer, plan, record, faults, deadline)
        tasks = [asyncio.ensure_future(self._transfer(peer, s, record, faults.shifted(s.stream_offset), deadline))
                 for s in stripes]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()  # a no-op on finished ones
            await asyncio.gather(*tasks, return_exceptions=True)
        for stripe, task in zip(stripes, tasks):
            # Only stripes that ended before the others were stopped: a stopped stripe's
            # error (its socket shut under it) is a consequence, not the cause.
            error = task.exception() if task in done else None
            if error is not None:
                if isinstance(error, ChecksumMismatch) and 0 <= error.region_index < len(stripe.origins):
                    error.region_index = stripe.origins[error.region_index]
                raise error

    async def _in_thread(self, fn: Callable[[], T], deadline: Deadline,
                         abort: Callable[[], None] | None = None) -> T:
        """Run blocking I/O on the engine's threads. If the caller is cancelled, or the thread
        overstays the deadline, `abort` wakes it (by shutting its socket) and the call ends."""
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        # If we stop waiting, the thread's late error must not be logged as never retrieved.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            return await asyncio.wait_for(asyncio.shield(future),
                                          timeout=_remaining_or_zero(deadline) + _ASYNC_GRACE_S)
        except asyncio.TimeoutError:
            if abort is not None:
                abort()
            raise TransferTimeout("worker thread overran the batch deadline") from None
        except asyncio.CancelledError:
            if abort is not None:
                abort()
            raise

    # ------------------------------------------------------------ teardown

    def _check_open(self) -> None:
        if self.is_closed:
            raise EngineClosed("engine is closed")

    def _close_transport(self) -> None:
        """Stop listeners and servers (subclasses)."""

    def _release_resources(self) -> None:
        """Free what no thread uses any more, before the segments go (rdma.py: the device)."""

    def close(self) -> None:
        """Stop serving, fail in-flight batches, close peers, free segments. Idempotent."""
        with self._lock:
            if self.is_closed:
                return
            self.is_closed = True
            peers = list(self._peers)
        self._close_transport()
        for peer in peers:
            peer.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._release_resources()
        if self._owns_segments:
            self._segments.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remaining_or_zero(deadline: Deadline) -> float:
    try:
        return deadline.remaining()
    except TransferTimeout:
        return 0.0
