"""Choosing a transport per peer, and serving one set of segments over several transports.

Preference: RDMA (one-sided, no CPU copy) > shm (one memcpy, same host only) > TCP (anywhere).
A worker normally opens all it can with `open_engines` and publishes the one endpoint; every
peer then reaches the same segments by the best kind both sides have.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable, Sequence

import torch

from .base import PeerHandle, TransferEngine, TransportConfig
from .batch import TransferReceipt, TransferRequest
from .errors import TransportUnavailable
from .faults import FaultPlan
from .identity import new_engine_id
from .memory import SegmentTable
from .shm import ShmTransferEngine
from .tcp import TcpTransferEngine

if TYPE_CHECKING:
    from .rdma import Handshake
from ...v1 import kvcache_pb2 as pb

log = logging.getLogger(__name__)

PREFERENCE = (pb.TRANSPORT_KIND_RDMA, pb.TRANSPORT_KIND_SHM, pb.TRANSPORT_KIND_TCP,
              pb.TRANSPORT_KIND_FAKE)


def choose_kind(local_kinds: Iterable[int], local_host_id: str, peer: pb.TransportEndpoint) -> int:
    """The best kind both sides offer; shm only when the peer is on this host."""
    common = set(local_kinds) & set(peer.kinds)
    for kind in PREFERENCE:
        if kind in common and (kind != pb.TRANSPORT_KIND_SHM or peer.host_id == local_host_id):
            return kind
    names = sorted(pb.TransportKind.Name(k) for k in peer.kinds)
    raise TransportUnavailable(f"no common transport with peer offering {names}")


def select_engine(engines: Sequence[TransferEngine], peer: pb.TransportEndpoint) -> TransferEngine:
    by_kind = {engine.kind: engine for engine in engines}
    if not by_kind:
        raise TransportUnavailable("no local engines")
    return by_kind[choose_kind(by_kind, engines[0].host_id, peer)]


def _candidates(engines: Sequence[TransferEngine], peer: pb.TransportEndpoint) -> list[TransferEngine]:
    """Every usable local engine for this peer, best first."""
    ranked, remaining = [], list(engines)
    while remaining:
        try:
            best = select_engine(remaining, peer)
        except TransportUnavailable:
            break
        ranked.append(best)
        remaining.remove(best)
    return ranked


class MultiTransferEngine(TransferEngine):
    """Several transports, one identity and one segment table. `connect` picks the kind."""

    kind = pb.TRANSPORT_KIND_UNSPECIFIED

    def __init__(self, config: TransportConfig, segments: SegmentTable, engine_id: str,
                 engines: Sequence[TransferEngine]):
        super().__init__(config, segments=segments, engine_id=engine_id)
        self._owns_segments = True  # the children share it; this engine frees it
        self.engines = list(engines)

    def allocate_segment(self, name: str, nbytes: int) -> torch.Tensor:
        tensor = super().allocate_segment(name, nbytes)
        segment = self._segments.get(name)
        for engine in self.engines:
            engine._register_segment(segment)
        return tensor

    def endpoint(self) -> pb.TransportEndpoint:
        merged = self.engines[0].endpoint()
        for engine in self.engines[1:]:
            merged.MergeFrom(engine.endpoint())  # repeated fields append: rebuild them below
        del merged.kinds[:]
        merged.kinds.extend(engine.kind for engine in self.engines)
        del merged.segments[:]
        merged.segments.extend(self._segments.infos())
        return merged

    def _describe(self, endpoint: pb.TransportEndpoint) -> None:
        raise NotImplementedError  # endpoint() is overridden

    async def connect(self, peer_endpoint: pb.TransportEndpoint,
                      timeout_s: float | None = None) -> PeerHandle:
        """Connect by the best kind both sides offer; a kind that cannot serve this pair
        (TransportUnavailable: say RDMA without a handshake channel) yields to the next."""
        self._check_open()
        candidates = _candidates(self.engines, peer_endpoint)
        if not candidates:
            select_engine(self.engines, peer_endpoint)  # raises, naming what the peer offers
        for engine in candidates[:-1]:
            try:
                return await engine.connect(peer_endpoint, timeout_s)
            except TransportUnavailable as exc:
                log.info("kv transport %s unavailable for %s: %s",
                         pb.TransportKind.Name(engine.kind), peer_endpoint.engine_id[:8], exc)
        return await candidates[-1].connect(peer_endpoint, timeout_s)

    def accept(self, request: pb.RdmaConnectRequest) -> pb.RdmaConnectResponse:
        """The RDMA engine's accept() (for the gRPC servicer that carries the handshake)."""
        for engine in self.engines:
            if engine.kind == pb.TRANSPORT_KIND_RDMA:
                return engine.accept(request)
        return pb.RdmaConnectResponse(ack=pb.HelloAck(
            status=pb.TRANSFER_STATUS_INCOMPATIBLE, message="RDMA is not open here",
            engine_id=self.engine_id))

    def _connect_blocking(self, endpoint, deadline):
        raise NotImplementedError  # connect() delegates

    def _engine_for(self, peer: PeerHandle) -> TransferEngine:
        for engine in self.engines:
            if engine.kind == peer.kind:
                return engine
        raise TransportUnavailable(f"{peer!r} was not connected by this engine")

    async def write_batch(self, peer: PeerHandle, requests: list[TransferRequest],
                          timeout_s: float | None = None) -> TransferReceipt:
        return await self._engine_for(peer).write_batch(peer, requests, timeout_s)

    async def read_batch(self, peer: PeerHandle, requests: list[TransferRequest],
                         timeout_s: float | None = None) -> TransferReceipt:
        return await self._engine_for(peer).read_batch(peer, requests, timeout_s)

    async def _transfer(self, peer, plan, record, faults, deadline):
        raise NotImplementedError  # batches go to the child engines

    def _close_transport(self) -> None:
        for engine in self.engines:
            engine.close()


def open_engines(config: TransportConfig, kinds: Sequence[str] = ("shm", "tcp"), *,
                 tcp_host: str = "127.0.0.1", tcp_port: int = 0, advertise_host: str | None = None,
                 rdma_device: str | None = None, rdma_handshake: Handshake | None = None,
                 faults: FaultPlan | None = None) -> MultiTransferEngine:
    """The entry point for workers: every requested transport over shared segments.

    `kinds` are offers, not demands: RDMA where it cannot run (no pyverbs, no device) is
    left out with a warning, so one configuration serves hosts with and without NICs; only
    when nothing at all can be opened does this raise TransportUnavailable.
    """
    segments = SegmentTable(shared="shm" in kinds)
    engine_id = new_engine_id()
    shared = dict(segments=segments, engine_id=engine_id)
    engines: list[TransferEngine] = []
    try:
        for kind in kinds:
            if kind == "shm":
                engines.append(ShmTransferEngine(config, faults, **shared))
            elif kind == "tcp":
                engines.append(TcpTransferEngine(config, tcp_host, tcp_port, advertise_host, faults,
                                                 **shared))
            elif kind == "rdma":
                try:
                    from .rdma import RdmaTransferEngine

                    engines.append(RdmaTransferEngine(config, rdma_handshake, device=rdma_device,
                                                      faults=faults, **shared))
                except TransportUnavailable as exc:
                    log.warning("kv transport rdma left out: %s", exc)
            else:
                raise ValueError(f"unknown transport {kind!r}")
        if not engines:
            raise TransportUnavailable(f"none of the transports {list(kinds)} can run here")
    except BaseException:
        for engine in engines:
            engine.close()
        segments.close()
        raise
    return MultiTransferEngine(config, segments, engine_id, engines)
