"""RDMA transport (pyverbs): one-sided WRITE into, or READ from, the peer's registered segments.

Never run against hardware: neither this sandbox (no RDMA subsystem in the kernel) nor the
lent GPU host (no /sys/class/infiniband, no uverbs device) has an RDMA device. The contract
suite runs it wherever pyverbs imports and a device is listed; test_transport_rdma_sim.py
runs this module's logic against a simulated verbs layer everywhere.

- Memory: every segment is registered once, at allocation, as a memory region (MR). The
  endpoint publishes each segment's address and rkey, which only this module reads.
- Connection: one reliable-connected (RC) queue pair per peer handle. The caller creates its
  QP and sends an RdmaConnectRequest (Hello + QP number, PSN, GID, LID, MTU) through the
  `handshake` coroutine the project supplies (its gRPC control plane); the peer's servicer
  passes it to `accept()`, which creates and connects the answering QP and returns its info.
- Batch: the caller posts RDMA WRITEs (or READs) directly between its MR and the peer's,
  then exchanges small control frames (the TCP protocol's BatchHeader / BatchTrailer /
  BatchAck) as RDMA SENDs. The peer's poller thread receives them; a responder thread
  checksums the peer's side and answers. So even one-sided transfers are verified by the
  receiving side, and a write is never reported done before the peer has checked it.
- Deadlines: completions are polled against the batch deadline; while waiting for a reply the
  caller probes the peer with a zero-byte WRITE every 0.5 s, so a peer that died turns into a
  failed completion (PeerUnreachable) within about a second instead of a silent wait.
"""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np

from . import rdma_verbs as verbs
from .base import PeerHandle, TransferEngine, TransportConfig, check_endpoint
from .batch import BatchPlan, BatchRecord, TransferOp, TransferState
from .checksum import StreamChecksums, check_verdict
from .errors import (ChecksumMismatch, InvalidRequest, PeerUnreachable, TransferError,
                     TransferTimeout, TransportUnavailable)
from .faults import BatchFaults, FaultPlan
from .memory import Segment, SegmentTable
from .wire import Deadline, check_hello, make_hello, raise_for_status, status_of
from ...v1 import kvcache_pb2 as pb

Handshake = Callable[[pb.TransportEndpoint, pb.RdmaConnectRequest], Awaitable[pb.RdmaConnectResponse]]
list_devices = verbs.list_devices

_MESSAGE_BYTES = 64 << 10  # one control frame per SEND
_MAX_REGIONS = 1024  # regions per control frame, so a header stays under _MESSAGE_BYTES
_RECV_SLOTS = 8  # receives posted per connection
_WR_BYTES = 8 << 20  # bytes per RDMA work request: few posts, still fine-grained progress
_SEND_DEPTH = 128  # outstanding work requests per queue pair
_PROBE_INTERVAL_S = 0.5


class _Connection:
    """One RC queue pair with its message buffers: the caller's or the answering side."""

    def __init__(self, device: verbs.Device, recv_cq, is_caller: bool):
        self.device, self.v, self.is_caller = device, device.v, is_caller
        self.send_cq = device.cq(_SEND_DEPTH + 8)
        self.qp = device.qp(self.send_cq, recv_cq, _SEND_DEPTH + 8, _RECV_SLOTS)
        self.psn = random.getrandbits(24)
        self.recv_mr = device.buffer(_RECV_SLOTS * _MESSAGE_BYTES)
        self.send_mr = device.buffer(_MESSAGE_BYTES)
        self.replies: queue.Queue = queue.Queue()  # caller side: frames (or errors) from the peer
        self.pending_write: pb.BatchHeader | None = None  # answering side
        self.lock = threading.Lock()  # one batch at a time per queue pair
        self.is_failed = False

    def info(self) -> pb.RdmaQpInfo:
        return self.device.qp_info(self.qp, self.psn)

    def start(self, remote: pb.RdmaQpInfo) -> None:
        self.device.connect(self.qp, self.psn, remote)
        for slot in range(_RECV_SLOTS):
            self.repost(slot)

    def repost(self, slot: int) -> None:
        verbs.post_receive(self.v, self.qp, slot, self.recv_mr.buf + slot * _MESSAGE_BYTES,
                           _MESSAGE_BYTES, self.recv_mr.lkey)

    def message(self, slot: int, nbytes: int):
        frame = pb.TransportFrame.FromString(self.recv_mr.read(nbytes, slot * _MESSAGE_BYTES))
        return getattr(frame, frame.WhichOneof("body"))

    def send(self, deadline: Deadline, **body) -> None:
        data = pb.TransportFrame(**body).SerializeToString()
        if len(data) > _MESSAGE_BYTES:
            raise TransferError(f"control frame of {len(data)} bytes exceeds {_MESSAGE_BYTES}")
        self.send_mr.write(data, len(data), 0)
        verbs.post_message(self.v, self.qp, 0, self.send_mr.buf, len(data), self.send_mr.lkey)
        verbs.wait_completions(self.v, self.send_cq, 1, deadline)

    def probe(self, remote_addr: int, rkey: int, deadline: Deadline) -> None:
        """A zero-byte RDMA WRITE: completes if the peer's QP is alive, fails if it is gone."""
        verbs.post_rdma(self.v, self.qp, True, 0, self.send_mr.buf, 0, self.send_mr.lkey,
                        remote_addr, rkey)
        verbs.wait_completions(self.v, self.send_cq, 1, deadline)

    def destroy(self) -> None:
        for resource in (self.qp, self.send_cq, self.recv_mr, self.send_mr):
            try:
                resource.close()
            except Exception:
                pass  # the context may already have closed it

    def fail(self) -> None:
        """Move the QP to the error state: posted work flushes, blocked waits end."""
        self.is_failed = True
        try:
            attr = self.v.qp.QPAttr(qp_state=self.v.e.IBV_QPS_ERR)
            self.qp.modify(attr, self.v.e.IBV_QP_STATE)
        except Exception:
            pass  # already destroyed


@dataclass
class _Part:
    """Up to _MAX_REGIONS pieces of a batch: one control frame's worth."""

    views: list[np.ndarray]  # local side
    regions: list[pb.Region]  # peer side
    pos: int  # stream offset of the first byte within the whole batch (for faults)
    known: list[int | None]  # sealed checksums of the local side (a writer need not sum those)

    @property
    def num_bytes(self) -> int:
        return sum(len(v) for v in self.views)


class RdmaPeer(PeerHandle):
    def __init__(self, endpoint: pb.TransportEndpoint, conn: _Connection):
        super().__init__(endpoint, pb.TRANSPORT_KIND_RDMA)
        self.conn = conn
        self.remote = {s.name: s for s in endpoint.rdma.segments}

    def remote_address(self, region: pb.Region) -> tuple[int, int]:
        segment = self.remote.get(region.segment)
        if segment is None or region.offset + region.length > segment.size_bytes:
            raise InvalidRequest(f"peer region {region.segment!r}+{region.offset} is not registered")
        return segment.addr + region.offset, segment.rkey

    def close(self) -> None:
        super().close()
        self.conn.fail()


class RdmaTransferEngine(TransferEngine):
    kind = pb.TRANSPORT_KIND_RDMA

    def __init__(self, config: TransportConfig, handshake: Handshake | None, device: str | None = None,
                 port_num: int = 1, gid_index: int = 0, faults: FaultPlan | None = None,
                 segments: SegmentTable | None = None, engine_id: str | None = None):
        self._device = verbs.Device(device, port_num, gid_index)  # TransportUnavailable if none
        self._mrs: dict[str, tuple[Segment, object]] = {}
        super().__init__(config, faults, segments=segments, engine_id=engine_id)
        self._handshake = handshake
        for segment in self._segments.segments():
            self._register_segment(segment)
        self._recv_cq = self._device.cq(1024 * _RECV_SLOTS)
        self._connections: dict[int, _Connection] = {}
        self._responders = ThreadPoolExecutor(2, thread_name_prefix="kv-rdma-respond")
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="kv-rdma-poll", daemon=True)
        self._poller.start()

    # ------------------------------------------------------------ memory and identity

    def _register_segment(self, segment: Segment) -> None:
        self._mrs[segment.name] = (segment, self._device.register(segment.data_ptr(), segment.nbytes))

    def _lkey(self, view: np.ndarray) -> tuple[int, int]:
        addr = view.ctypes.data
        for segment, mr in self._mrs.values():
            base = segment.data_ptr()
            if base <= addr and addr + len(view) <= base + segment.nbytes:
                return addr, mr.lkey
        raise InvalidRequest("local memory is not inside a registered segment")

    def _describe(self, endpoint: pb.TransportEndpoint) -> None:
        endpoint.rdma.device, endpoint.rdma.port_num = self._device.name, self._device.port_num
        endpoint.rdma.segments.extend(
            pb.RdmaSegment(name=s.name, addr=s.data_ptr(), rkey=mr.rkey, size_bytes=s.nbytes)
            for s, mr in self._mrs.values())

    # ------------------------------------------------------------ connections

    def _open_connection(self, is_caller: bool) -> _Connection:
        conn = _Connection(self._device, self._recv_cq, is_caller)
        with self._lock:
            self._connections[conn.qp.qp_num] = conn
        return conn

    async def connect(self, peer_endpoint: pb.TransportEndpoint,
                      timeout_s: float | None = None) -> RdmaPeer:
        self._check_open()
        check_endpoint(self.config.compatibility_hash, self.kind, peer_endpoint)
        if self._handshake is None:
            raise TransportUnavailable("this RDMA engine was given no handshake channel")
        deadline = Deadline(timeout_s if timeout_s is not None else self.config.connect_timeout_s)
        conn = await self._handshake_connection(peer_endpoint, deadline)
        return self._adopt_peer(RdmaPeer(peer_endpoint, conn))

    async def _handshake_connection(self, endpoint: pb.TransportEndpoint, deadline: Deadline) -> _Connection:
        """A new queue pair, connected to one the peer creates in accept()."""
        conn = self._open_connection(is_caller=True)
        request = pb.RdmaConnectRequest(
            hello=make_hello(self.kind, self.config.compatibility_hash, self.engine_id, endpoint),
            qp=conn.info())
        try:
            response = await asyncio.wait_for(self._handshake(endpoint, request), deadline.remaining())
            raise_for_status(response.ack.status, response.ack.message)
            conn.start(response.qp)
        except BaseException as exc:
            conn.fail()
            if isinstance(exc, asyncio.TimeoutError):
                raise PeerUnreachable("RDMA handshake: no answer in time") from None
            if isinstance(exc, Exception) and not isinstance(exc, TransferError):
                raise PeerUnreachable(f"RDMA handshake failed: {exc!r}") from exc
            raise
        return conn

    def _connect_blocking(self, endpoint, deadline):
        raise NotImplementedError  # connect() is asynchronous: the handshake is the project's

    def accept(self, request: pb.RdmaConnectRequest) -> pb.RdmaConnectResponse:
        """The answering side of connect(); the project's gRPC servicer calls this."""
        status, message = check_hello(request.hello, self.config.compatibility_hash, self.engine_id)
        ack = pb.HelloAck(status=status, message=message, engine_id=self.engine_id)
        if status != pb.TRANSFER_STATUS_OK or self.is_closed:
            return pb.RdmaConnectResponse(ack=ack)
        conn = self._open_connection(is_caller=False)
        conn.start(request.qp)
        ack.segments.extend(self._segments.infos())
        return pb.RdmaConnectResponse(ack=ack, qp=conn.info())

    # ------------------------------------------------------------ caller side

    async def _transfer(self, peer: RdmaPeer, plan: BatchPlan, record: BatchRecord,
                        faults: BatchFaults, deadline: Deadline) -> None:
        if peer.conn.is_failed:  # an earlier batch left it out of step: start a fresh one
            peer.conn = await self._handshake_connection(peer.endpoint, deadline)
        conn = peer.conn
        try:
            await self._in_thread(lambda: self._exchange(peer, plan, record, faults, deadline),
                                  deadline, abort=conn.fail)
        except PeerUnreachable:
            peer.close()  # its queue pair failed a completion: the peer is gone
            raise
        except (ChecksumMismatch, InvalidRequest):
            raise  # the exchange finished in step; the connection stays usable
        except BaseException:
            conn.fail()  # a late reply would be mistaken for the next batch's: never reuse
            raise

    def _exchange(self, peer: RdmaPeer, plan: BatchPlan, record: BatchRecord, faults: BatchFaults,
                  deadline: Deadline) -> None:
        with peer.conn.lock:
            if peer.conn.is_failed:
                raise PeerUnreachable("RDMA connection already failed")
            faults.stall(deadline)
            pos = 0
            for first in range(0, len(plan.pieces), _MAX_REGIONS):
                pieces = plan.pieces[first:first + _MAX_REGIONS]
                part = _Part(plan.local_views(pieces), plan.regions(pieces), pos, plan.local_sums(pieces))
                header = pb.BatchHeader(batch_id=record.batch_id, op=plan.op, regions=part.regions,
                                        total_bytes=part.num_bytes)
                if plan.op is TransferOp.WRITE:
                    self._write(peer, header, part, faults, deadline)
                else:
                    self._read(peer, header, part, faults, deadline)
                pos += part.num_bytes
            record.advance(TransferState.VERIFYING)

    def _post(self, peer: RdmaPeer, part: _Part, write: bool, faults: BatchFaults,
              deadline: Deadline, sums: StreamChecksums | None) -> None:
        """Post one RDMA op per _WR_BYTES, at most _SEND_DEPTH outstanding; a writer sums
        each source chunk right after posting it (the CPU reads while the NIC does)."""
        conn, outstanding, done = peer.conn, 0, 0
        for view, region in zip(part.views, part.regions):
            addr, lkey = self._lkey(view)
            remote, rkey = peer.remote_address(region)
            for start in range(0, len(view), _WR_BYTES):
                length = min(_WR_BYTES, len(view) - start)
                if faults.drop_within(part.pos + done, length) is not None:
                    conn.fail()
                    raise PeerUnreachable("RDMA connection dropped mid-transfer (injected fault)")
                if outstanding == _SEND_DEPTH:
                    verbs.wait_completions(conn.v, conn.send_cq, 1, deadline)
                    outstanding -= 1
                verbs.post_rdma(conn.v, conn.qp, write, 0, addr + start, length, lkey,
                                remote + start, rkey)
                outstanding += 1
                done += length
                if sums is not None:
                    sums.advance(done)
        verbs.wait_completions(conn.v, conn.send_cq, outstanding, deadline)

    def _corrupt(self, peer: RdmaPeer, part: _Part, write: bool, faults: BatchFaults,
                 deadline: Deadline) -> None:
        """Flip one byte where it landed: in the peer's segment (write) or ours (read)."""
        offset = part.pos
        for view, region in zip(part.views, part.regions):
            flip = faults.corrupt_offset(offset, len(view))
            offset += len(view)
            if flip is None:
                continue
            if not write:
                view[flip] ^= 0xFF
                return
            conn = peer.conn
            conn.send_mr.write(bytes([int(view[flip]) ^ 0xFF]), 1, 0)
            remote, rkey = peer.remote_address(region)
            verbs.post_rdma(conn.v, conn.qp, True, 0, conn.send_mr.buf, 1, conn.send_mr.lkey,
                            remote + flip, rkey)
            verbs.wait_completions(conn.v, conn.send_cq, 1, deadline)
            return

    def _write(self, peer: RdmaPeer, header: pb.BatchHeader, part: _Part, faults: BatchFaults,
               deadline: Deadline) -> None:
        sums = StreamChecksums(part.views, part.known)
        self._post(peer, part, True, faults, deadline, sums)
        self._corrupt(peer, part, True, faults, deadline)
        peer.conn.send(deadline, header=header)
        peer.conn.send(deadline, trailer=pb.BatchTrailer(checksums=sums.finish()))
        ack = self._reply(peer, pb.BatchAck, deadline)
        raise_for_status(ack.status, ack.message, ack.failed_region)

    def _read(self, peer: RdmaPeer, header: pb.BatchHeader, part: _Part, faults: BatchFaults,
              deadline: Deadline) -> None:
        peer.conn.send(deadline, header=header)  # the peer sums its side meanwhile
        self._post(peer, part, False, faults, deadline, None)
        self._corrupt(peer, part, False, faults, deadline)
        local = StreamChecksums(part.views).finish()
        ack = self._reply(peer, pb.BatchAck, deadline)
        raise_for_status(ack.status, ack.message, ack.failed_region)
        check_verdict(list(self._reply(peer, pb.BatchTrailer, deadline).checksums), local)

    def _reply(self, peer: RdmaPeer, expected: type, deadline: Deadline):
        """The peer's next control frame; probes its liveness while waiting."""
        stall_until = time.monotonic() + self.config.stall_timeout_s
        while True:
            try:
                body = peer.conn.replies.get(timeout=min(_PROBE_INTERVAL_S, deadline.remaining()))
            except queue.Empty:
                if time.monotonic() > stall_until:
                    raise TransferTimeout("the RDMA peer did not answer in time") from None
                any_segment = next(iter(peer.remote.values()))
                peer.conn.probe(any_segment.addr, any_segment.rkey, deadline)
                continue
            if isinstance(body, Exception):
                raise body
            if not isinstance(body, expected):
                raise TransferError(f"protocol error: expected {expected.__name__}, got {type(body).__name__}")
            return body

    # ------------------------------------------------------------ answering side

    def _poll_loop(self) -> None:
        """Receive completions of every connection: replies go to the waiting caller, requests
        to a responder thread. It is also the only thread that destroys failed connections,
        so no completion it handles can refer to freed buffers."""
        while not self._stop.is_set():
            self._retire_failed()
            npolled, wcs = self._recv_cq.poll(16)
            if not npolled:
                time.sleep(verbs._IDLE_POLL_S)
                continue
            for wc in wcs:
                conn = self._connections.get(wc.qp_num)
                if conn is not None:
                    try:
                        self._dispatch(conn, wc)
                    except Exception as exc:  # a garbled frame fails its connection only
                        conn.fail()
                        conn.replies.put(TransferError(f"RDMA control message: {exc!r}"))

    def _dispatch(self, conn: _Connection, wc) -> None:
        if wc.status != self._device.v.e.IBV_WC_SUCCESS:  # flushed: the connection failed
            conn.is_failed = True
            conn.replies.put(PeerUnreachable(f"RDMA receive failed (status {wc.status})"))
            return
        body = conn.message(wc.wr_id, wc.byte_len)
        conn.repost(wc.wr_id)
        if conn.is_caller:
            conn.replies.put(body)
        elif isinstance(body, pb.BatchHeader) and body.op == pb.TRANSFER_OP_WRITE:
            conn.pending_write = body  # its trailer follows on this QP, in order
        else:
            self._responders.submit(self._answer, conn, body)

    def _retire_failed(self) -> None:
        """Destroy failed connections that no batch holds (a caller's lock is free)."""
        with self._lock:
            failed = [c for c in self._connections.values() if c.is_failed]
        for conn in failed:
            if conn.lock.acquire(blocking=False):
                with self._lock:
                    self._connections.pop(conn.qp.qp_num, None)
                conn.destroy()

    def _answer(self, conn: _Connection, body) -> None:
        deadline = Deadline(self.config.stall_timeout_s)
        is_read = isinstance(body, pb.BatchHeader)
        header = body if is_read else conn.pending_write
        ack = pb.BatchAck(batch_id=header.batch_id if header else 0, status=pb.TRANSFER_STATUS_OK)
        sums: list[int] = []
        conn.pending_write = None
        try:
            if header is None:
                raise InvalidRequest("trailer without a write header")
            views = self._segments.views_for(header.regions, reject_overlap=not is_read)
            known = (self._segments.sealed_sums_for(header.regions)
                     if is_read else None)  # what we send may be sealed; what landed must be summed
            sums = StreamChecksums(views, known).finish()
            if not is_read:
                check_verdict(list(body.checksums), sums)
        except TransferError as exc:
            ack.status, ack.message = status_of(exc), str(exc)
            ack.failed_region = max(getattr(exc, "region_index", 0), 0)
        try:
            conn.send(deadline, ack=ack)
            if is_read and ack.status == pb.TRANSFER_STATUS_OK:
                conn.send(deadline, trailer=pb.BatchTrailer(checksums=sums))
        except TransferError:
            conn.fail()  # the caller will see its own timeout or failed completion

    # ------------------------------------------------------------ teardown

    def _close_transport(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
        for conn in connections:
            conn.fail()
        self._stop.set()
        self._poller.join(5.0)
        self._responders.shutdown(wait=True, cancel_futures=True)

    def _release_resources(self) -> None:
        self._connections.clear()
        self._mrs.clear()
        self._device.close()  # deregisters MRs before the segments are unmapped
