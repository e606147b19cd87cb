"""The RDMA engine's logic against a simulated verbs layer (no device can exist here).

`SimVerbs` imitates the slice of pyverbs that rdma_verbs.py calls: memory regions over real
addresses, completion queues, RC queue pairs whose RDMA WRITE/READ are memmoves between the
two engines' registered memory (both engines live in this process, so addresses are valid)
and whose SENDs land in the peer's posted receives. It checks the engine's control flow:
handshake, MR bookkeeping, windowed posting, control frames, verification, faults and
failure handling. It cannot check that the real pyverbs signatures match; the contract suite
in test_transport.py does that wherever a device exists.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dsflash.kvcache.transport import (ChecksumMismatch, FaultPlan, PeerRestarted, PeerUnreachable,
                                       TransferRequest, TransferTimeout, open_engines, rdma_verbs)
from dsflash.v1 import kvcache_pb2 as pb
from test_transport_peer import SEGMENT_BYTES, make_config, pattern

E = SimpleNamespace(
    IBV_QPT_RC=2, IBV_ACCESS_LOCAL_WRITE=1, IBV_ACCESS_REMOTE_WRITE=2, IBV_ACCESS_REMOTE_READ=4,
    IBV_WR_RDMA_WRITE=0, IBV_WR_SEND=2, IBV_WR_RDMA_READ=4, IBV_SEND_SIGNALED=2,
    IBV_WC_SUCCESS=0, IBV_WC_WR_FLUSH_ERR=5, IBV_WC_REM_ACCESS_ERR=10, IBV_WC_RETRY_EXC_ERR=12,
    IBV_WC_RNR_RETRY_EXC_ERR=13, IBV_WC_REM_OP_ERR=11, IBV_QPS_ERR=6, IBV_QP_STATE=1)


class SimFabric:
    def __init__(self):
        self.qps: dict[int, "QP"] = {}
        self.mrs: dict[int, "MR"] = {}
        self.numbers = itertools.count(100)
        self.lock = threading.Lock()


FABRIC = SimFabric()


class WC(SimpleNamespace):
    pass


class CQ:
    def __init__(self, ctx, depth, *_):
        self.entries: list[WC] = []
        self.lock = threading.Lock()

    def push(self, **fields):
        with self.lock:
            self.entries.append(WC(**fields))

    def poll(self, n=1):
        with self.lock:
            taken, self.entries = self.entries[:n], self.entries[n:]
        return len(taken), taken

    def close(self):
        pass


class MR:
    def __init__(self, pd, length, access, address=None):
        self.owned = None if address else ctypes.create_string_buffer(length)
        self.buf = address or ctypes.addressof(self.owned)
        self.length = length
        self.lkey = self.rkey = next(FABRIC.numbers)
        FABRIC.mrs[self.rkey] = self

    def read(self, length, offset):
        return ctypes.string_at(self.buf + offset, length)

    def write(self, data, length, offset):
        ctypes.memmove(self.buf + offset, data, length)

    def covers(self, addr, length):
        return self.buf <= addr and addr + length <= self.buf + self.length

    def close(self):
        FABRIC.mrs.pop(self.rkey, None)


class QP:
    def __init__(self, pd, init):
        self.qp_num = next(FABRIC.numbers)
        self.send_cq, self.recv_cq = init.scq, init.rcq
        self.receives: list = []
        self.remote: int | None = None
        self.failed = False
        FABRIC.qps[self.qp_num] = self

    def to_rts(self, attr):
        self.remote = attr.dest_qp_num

    def modify(self, attr, mask):
        self.failed = True
        for wr in self.receives:
            self.recv_cq.push(wr_id=wr.wr_id, status=E.IBV_WC_WR_FLUSH_ERR, qp_num=self.qp_num, byte_len=0)
        self.receives = []

    def post_recv(self, wr):
        self.receives.append(wr)

    def close(self):
        self.failed = True
        FABRIC.qps.pop(self.qp_num, None)

    def post_send(self, wr):
        peer = FABRIC.qps.get(self.remote)
        status = E.IBV_WC_SUCCESS
        if self.failed:
            status = E.IBV_WC_WR_FLUSH_ERR
        elif peer is None or peer.failed:
            status = E.IBV_WC_RETRY_EXC_ERR
        elif wr.opcode == E.IBV_WR_SEND:
            if not peer.receives:
                status = E.IBV_WC_RNR_RETRY_EXC_ERR
            else:
                recv = peer.receives.pop(0)
                ctypes.memmove(recv.sg[0].addr, wr.sg[0].addr, wr.sg[0].length)
                peer.recv_cq.push(wr_id=recv.wr_id, status=E.IBV_WC_SUCCESS, qp_num=peer.qp_num,
                                  byte_len=wr.sg[0].length)
        else:
            mr = FABRIC.mrs.get(wr.rkey)
            if mr is None or not mr.covers(wr.remote_addr, wr.sg[0].length):
                status = E.IBV_WC_REM_ACCESS_ERR
            elif wr.opcode == E.IBV_WR_RDMA_WRITE:
                ctypes.memmove(wr.remote_addr, wr.sg[0].addr, wr.sg[0].length)
            else:
                ctypes.memmove(wr.sg[0].addr, wr.remote_addr, wr.sg[0].length)
        self.send_cq.push(wr_id=wr.wr_id, status=status, qp_num=self.qp_num, byte_len=0)


class SendWR(SimpleNamespace):
    def __init__(self, wr_id=0, opcode=0, num_sge=1, sg=(), send_flags=0):
        super().__init__(wr_id=wr_id, opcode=opcode, sg=list(sg), rkey=0, remote_addr=0)

    def set_wr_rdma(self, rkey, addr):
        self.rkey, self.remote_addr = rkey, addr


class Context:
    def __init__(self, name):
        self.name = name

    def query_port(self, port):
        return SimpleNamespace(lid=7, active_mtu=5)

    def query_gid(self, port, index):
        return SimpleNamespace(gid="fe80:0000:0000:0000:0000:0000:0000:0001")

    def close(self):
        pass


SIM_VERBS = SimpleNamespace(
    e=E,
    device=SimpleNamespace(Context=Context, get_device_list=lambda: [SimpleNamespace(name=b"sim0")]),
    pd=SimpleNamespace(PD=lambda ctx: SimpleNamespace(ctx=ctx)),
    mr=SimpleNamespace(MR=MR),
    cq=SimpleNamespace(CQ=CQ),
    qp=SimpleNamespace(QP=QP, QPCap=SimpleNamespace,
                       QPInitAttr=lambda qp_type, scq, rcq, cap, sq_sig_all: SimpleNamespace(scq=scq, rcq=rcq),
                       QPAttr=lambda **kw: SimpleNamespace(**kw)),
    wr=SimpleNamespace(SGE=lambda addr, length, lkey: SimpleNamespace(addr=addr, length=length, lkey=lkey),
                       SendWR=SendWR, RecvWR=lambda wr_id, num_sge, sg: SimpleNamespace(wr_id=wr_id, sg=list(sg))),
    addr=SimpleNamespace(GID=lambda text: text, GlobalRoute=lambda **kw: kw, AHAttr=lambda **kw: kw),
)


@pytest.fixture
def pair(monkeypatch):
    """Two RDMA engines wired by a handshake that calls the other's accept()."""
    monkeypatch.setattr(rdma_verbs, "load", lambda: SIM_VERBS)
    from dsflash.kvcache.transport.rdma import RdmaTransferEngine

    made = []

    def make(faults=None, answer=None):
        async def handshake(endpoint, request):
            return answer.accept(request)

        engine = RdmaTransferEngine(make_config(), handshake if answer else None, faults=faults)
        engine.allocate_segment("kv", SEGMENT_BYTES).numpy()[:] = pattern(len(made) + 1)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def requests(count=64, length=200_000):
    rng = np.random.default_rng(3)
    slots = SEGMENT_BYTES // count
    a, b = rng.permutation(count), rng.permutation(count)
    return [TransferRequest("kv", int(x) * slots + 5, "kv", int(y) * slots + 11, length) for x, y in zip(a, b)]


def connected(pair, faults=None):
    """(answering engine, calling engine, the caller's handle on the answering one)."""
    peer_engine = pair()
    local = pair(faults=faults, answer=peer_engine)
    return peer_engine, local, asyncio.run(local.connect(peer_engine.endpoint()))


def fails_within(seconds: float, error: type, coro) -> None:
    start = time.monotonic()
    with pytest.raises(error):
        asyncio.run(coro)
    assert time.monotonic() - start < seconds


def test_rdma_write_and_read_are_exact_and_verified(pair):
    peer_engine, local, peer = connected(pair)
    batch = requests()
    asyncio.run(local.write_batch(peer, batch))
    mine, theirs = local.segment("kv").numpy(), peer_engine.segment("kv").numpy()
    for r in batch:
        np.testing.assert_array_equal(theirs[r.peer_offset:r.peer_offset + r.length],
                                      mine[r.local_offset:r.local_offset + r.length])
    theirs[:] = pattern(9)
    asyncio.run(local.read_batch(peer, batch))
    for r in batch:
        np.testing.assert_array_equal(mine[r.local_offset:r.local_offset + r.length],
                                      theirs[r.peer_offset:r.peer_offset + r.length])


def test_rdma_batches_larger_than_one_control_frame(pair):
    _, local, peer = connected(pair)
    many = requests(count=3000, length=3000)  # three control frames' worth of regions
    asyncio.run(local.write_batch(peer, many))
    asyncio.run(local.read_batch(peer, many))


@pytest.mark.parametrize("op", ["write_batch", "read_batch"])
def test_rdma_corruption_is_detected(pair, op):
    _, local, peer = connected(pair, FaultPlan(corrupt_at_byte=77_777))
    with pytest.raises(ChecksumMismatch):
        asyncio.run(getattr(local, op)(peer, requests()))
    asyncio.run(getattr(local, op)(peer, requests()))


def test_rdma_dead_peer_and_dropped_connection(pair):
    peer_engine, local, peer = connected(pair, FaultPlan(drop_after_bytes=1 << 20))
    fails_within(2.0, PeerUnreachable, local.write_batch(peer, requests()))
    deadline = time.monotonic() + 2.0
    while local._connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not local._connections  # the failed queue pair was destroyed, not kept
    peer = asyncio.run(local.connect(peer_engine.endpoint()))
    peer_engine.close()  # its queue pairs go to the error state
    fails_within(2.0, PeerUnreachable, local.write_batch(peer, requests()))


def test_rdma_silent_peer_times_out_then_a_fresh_queue_pair_works(pair, monkeypatch):
    peer_engine, local, peer = connected(pair)
    answer, calls = peer_engine._answer, []

    def slow_once(*args):  # the first answer comes after the caller gave up
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.5)
        answer(*args)

    monkeypatch.setattr(peer_engine, "_answer", slow_once)
    first_qp = peer.conn.qp.qp_num
    fails_within(3.0, TransferTimeout, local.write_batch(peer, requests()))
    asyncio.run(local.write_batch(peer, requests()))  # not confused by the late ack
    assert peer.conn.qp.qp_num != first_qp


def test_rdma_handshake_refuses_stale_incarnation(pair):
    peer_engine = pair()
    local = pair(answer=peer_engine)
    stale = peer_engine.endpoint()
    stale.engine_id = "0" * 32
    with pytest.raises(PeerRestarted):
        asyncio.run(local.connect(stale))


def test_open_engines_prefers_rdma_and_falls_back_without_a_handshake(monkeypatch):
    monkeypatch.setattr(rdma_verbs, "load", lambda: SIM_VERBS)
    far = open_engines(make_config(), ("rdma", "tcp"))
    plain = open_engines(make_config(), ("rdma", "tcp"))  # no handshake channel: RDMA unusable

    async def carry(endpoint, request):  # what the project's gRPC call does
        return far.accept(request)

    wired = open_engines(make_config(), ("rdma", "tcp"), rdma_handshake=carry)
    try:
        far.allocate_segment("kv", 1 << 20)
        for near in (plain, wired):
            near.allocate_segment("kv", 1 << 20).numpy()[:] = pattern(4, 1 << 20)

        async def push(near):
            peer = await near.connect(far.endpoint())
            await near.write_batch(peer, [TransferRequest("kv", 0, "kv", 0, 1 << 20)])
            return peer.kind

        assert asyncio.run(push(plain)) == pb.TRANSPORT_KIND_TCP
        assert asyncio.run(push(wired)) == pb.TRANSPORT_KIND_RDMA
        np.testing.assert_array_equal(far.segment("kv").numpy(), pattern(4, 1 << 20))
    finally:
        for engines in (far, plain, wired):
            engines.close()
