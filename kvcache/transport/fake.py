"""In-process fake transport, for unit tests of the engine's callers (schedulers, workers).

Engines meet through a `FakeFabric` passed to their constructors (no module-level registry).
A batch is a numpy copy between the two engines' segments, with the same validation,
checksums, deadlines and typed errors as the real transports, so a caller tested against the
fake sees the failures it will see in production: `FaultPlan` injects them, and closing the
peer engine (`close()`) plays a dead peer, also in the middle of an injected delay.
"""

from __future__ import annotations

import asyncio
import threading

from .base import PeerHandle, TransferEngine, TransportConfig
from .batch import BatchPlan, BatchRecord, TransferOp, TransferState
from .checksum import checksum, check_verdict
from .errors import PeerUnreachable, TransferTimeout
from .faults import BatchFaults, FaultPlan
from .memory import SegmentTable
from .wire import Deadline
from ...v1 import kvcache_pb2 as pb

_POLL_S = 0.05


class FakeFabric:
    """The 'network' of fake engines: who is alive, by engine id."""

    def __init__(self) -> None:
        self._engines: dict[str, FakeTransferEngine] = {}
        self._lock = threading.Lock()

    def attach(self, engine: FakeTransferEngine) -> None:
        with self._lock:
            self._engines[engine.engine_id] = engine

    def detach(self, engine: FakeTransferEngine) -> None:
        with self._lock:
            self._engines.pop(engine.engine_id, None)

    def reach(self, engine_id: str) -> FakeTransferEngine:
        engine = self._engines.get(engine_id)
        if engine is None:
            raise PeerUnreachable(f"no fake engine {engine_id[:8]} on this fabric")
        return engine


class FakeTransferEngine(TransferEngine):
    kind = pb.TRANSPORT_KIND_FAKE

    def __init__(self, config: TransportConfig, fabric: FakeFabric, faults: FaultPlan | None = None,
                 segments: SegmentTable | None = None, engine_id: str | None = None):
        super().__init__(config, faults, segments=segments, engine_id=engine_id)
        self._fabric = fabric
        fabric.attach(self)

    def _describe(self, endpoint: pb.TransportEndpoint) -> None:
        pass  # the engine id is the address

    def _close_transport(self) -> None:
        self._fabric.detach(self)

    def _connect_blocking(self, endpoint: pb.TransportEndpoint, deadline: Deadline) -> PeerHandle:
        target = self._fabric.reach(endpoint.engine_id)
        peer = PeerHandle(endpoint, self.kind)
        peer.update_segments(target._segments.infos())
        return peer

    def _refresh_blocking(self, peer: PeerHandle, deadline: Deadline) -> None:
        peer.update_segments(self._fabric.reach(peer.engine_id)._segments.infos())

    async def _stall(self, peer: PeerHandle, delay_s: float, deadline: Deadline) -> None:
        """An injected delay that notices, as a real connection would, the peer dying (it
        raises PeerUnreachable at once) or the deadline passing (TransferTimeout)."""
        until = asyncio.get_running_loop().time() + delay_s
        while (left := until - asyncio.get_running_loop().time()) > 0:
            self._fabric.reach(peer.engine_id)
            if deadline.remaining() < min(left, _POLL_S):
                await asyncio.sleep(deadline.remaining())
                raise TransferTimeout("batch deadline passed during an injected delay")
            await asyncio.sleep(min(left, _POLL_S))

    async def _transfer(self, peer: PeerHandle, plan: BatchPlan, record: BatchRecord,
                        faults: BatchFaults, deadline: Deadline) -> None:
        await self._stall(peer, faults.delay_s, deadline)
        target = self._fabric.reach(peer.engine_id)
        remote = target._segments.views_for(plan.regions(), reject_overlap=plan.op is TransferOp.WRITE)
        pairs = [(mine, theirs) if plan.op is TransferOp.WRITE else (theirs, mine)
                 for mine, theirs in zip(plan.local_views(), remote)]
        expected = [checksum(src) for src, _ in pairs]  # the sender's, before anything moves
        pos = 0
        for src, dst in pairs:
            keep = faults.drop_within(pos, len(src))
            if keep is not None:
                dst[:keep] = src[:keep]
                raise PeerUnreachable("connection dropped mid-transfer (injected fault)")
            dst[:] = src
            flip = faults.corrupt_offset(pos, len(src))
            if flip is not None:
                dst[flip] ^= 0xFF
            pos += len(src)
        record.advance(TransferState.VERIFYING)
        check_verdict(expected, [checksum(dst) for _, dst in pairs])
