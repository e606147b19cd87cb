"""The handful of verbs the RDMA transport needs, over pyverbs, imported on first use.

pyverbs comes from rdma-core's distribution package (Debian/Ubuntu: python3-pyverbs). The pip
sdist builds its own rdma-core and then fails to load against an older system libibverbs, so
in a virtualenv expose the system one instead (PYTHONPATH=/usr/lib/python3/dist-packages, or
a symlink into site-packages). Nothing here runs without an RDMA device: this sandbox's kernel
has no RDMA subsystem at all (research/environment.md §5); see rdma.py for what was checked.
"""

from __future__ import annotations

import functools
import importlib
import time
from types import SimpleNamespace

from .errors import PeerUnreachable, TransferError, TransportUnavailable
from .wire import Deadline
from ...v1 import kvcache_pb2 as pb

_IDLE_POLL_S = 20e-6  # sleep between empty CQ polls: ~microseconds of latency, no spinning core


@functools.cache
def load() -> SimpleNamespace:
    """pyverbs' modules, or TransportUnavailable saying how to get them."""
    try:
        modules = {name: importlib.import_module(f"pyverbs.{name}")
                   for name in ("device", "pd", "mr", "cq", "qp", "wr", "addr")}
        try:
            modules["e"] = importlib.import_module("pyverbs.enums")
        except ImportError:  # later rdma-core releases renamed it
            modules["e"] = importlib.import_module("pyverbs.libibverbs_enums")
    except ImportError as exc:
        raise TransportUnavailable(
            f"pyverbs is not importable ({exc}); install rdma-core's python3-pyverbs and put "
            "/usr/lib/python3/dist-packages on PYTHONPATH") from exc
    return SimpleNamespace(**modules)


def list_devices() -> list[str]:
    v = load()
    try:
        return [d.name.decode() if isinstance(d.name, bytes) else d.name
                for d in v.device.get_device_list()]
    except Exception:  # PyverbsRDMAError: no RDMA subsystem in this kernel
        return []


def gid_bytes(gid) -> bytes:
    return bytes.fromhex(gid.gid.replace(":", ""))


def gid_text(raw: bytes) -> str:
    text = raw.hex()
    return ":".join(text[i:i + 4] for i in range(0, 32, 4))


class Device:
    """An opened RDMA device port: context, protection domain and the port's addressing."""

    ACCESS = ("IBV_ACCESS_LOCAL_WRITE", "IBV_ACCESS_REMOTE_WRITE", "IBV_ACCESS_REMOTE_READ")

    def __init__(self, name: str | None, port_num: int = 1, gid_index: int = 0):
        self.v = v = load()
        names = list_devices()
        if not names:
            raise TransportUnavailable("no RDMA device is listed (ibv_devices)")
        self.name = name or names[0]
        if self.name not in names:
            raise TransportUnavailable(f"RDMA device {self.name!r} not in {names}")
        self.port_num, self.gid_index = port_num, gid_index
        self.context = v.device.Context(name=self.name)
        self.pd = v.pd.PD(self.context)
        port = self.context.query_port(port_num)
        self.lid, self.mtu = port.lid, port.active_mtu
        self.gid = gid_bytes(self.context.query_gid(port_num, gid_index))
        self.access = 0
        for flag in self.ACCESS:
            self.access |= getattr(v.e, flag)

    def register(self, address: int, nbytes: int):
        """A memory region over memory we own (a segment): registered once, at allocation."""
        return self.v.mr.MR(self.pd, nbytes, self.access, address=address)

    def buffer(self, nbytes: int):
        """A memory region pyverbs allocates itself (small message buffers)."""
        return self.v.mr.MR(self.pd, nbytes, self.access)

    def cq(self, depth: int):
        return self.v.cq.CQ(self.context, depth, None, None, 0)

    def qp(self, send_cq, recv_cq, max_send_wr: int, max_recv_wr: int):
        v = self.v
        cap = v.qp.QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=1,
                         max_recv_sge=1)
        init = v.qp.QPInitAttr(qp_type=v.e.IBV_QPT_RC, scq=send_cq, rcq=recv_cq, cap=cap,
                               sq_sig_all=0)
        return v.qp.QP(self.pd, init)

    def qp_info(self, qp, psn: int) -> pb.RdmaQpInfo:
        return pb.RdmaQpInfo(qp_num=qp.qp_num, psn=psn, gid=self.gid, lid=self.lid, mtu=self.mtu)

    def connect(self, qp, psn: int, remote: pb.RdmaQpInfo) -> None:
        """RESET -> INIT -> RTR -> RTS against the remote queue pair. Retry settings bound how
        long a dead peer can hold a work request: timeout 14 (4.096 us * 2^14 = 67 ms) times
        retry_cnt 7 is about half a second before the completion reports an error."""
        v = self.v
        attr = v.qp.QPAttr(port_num=self.port_num, path_mtu=min(self.mtu, remote.mtu))
        attr.qp_access_flags = self.access
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn, attr.sq_psn = remote.psn, psn
        attr.max_rd_atomic = attr.max_dest_rd_atomic = 16  # outstanding RDMA READs
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        route = v.addr.GlobalRoute(dgid=v.addr.GID(gid_text(remote.gid)), sgid_index=self.gid_index)
        attr.ah_attr = v.addr.AHAttr(port_num=self.port_num, is_global=1, gr=route, dlid=remote.lid)
        qp.to_rts(attr)

    def close(self) -> None:
        self.context.close()  # pyverbs closes the PD, MRs, CQs and QPs made from it


# ---------------------------------------------------------------- work requests


def post_rdma(v, qp, write: bool, wr_id: int, local_addr: int, length: int, lkey: int,
              remote_addr: int, rkey: int) -> None:
    opcode = v.e.IBV_WR_RDMA_WRITE if write else v.e.IBV_WR_RDMA_READ
    wr = v.wr.SendWR(wr_id=wr_id, opcode=opcode, num_sge=1,
                     sg=[v.wr.SGE(local_addr, length, lkey)], send_flags=v.e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(rkey, remote_addr)
    qp.post_send(wr)


def post_message(v, qp, wr_id: int, addr: int, length: int, lkey: int) -> None:
    qp.post_send(v.wr.SendWR(wr_id=wr_id, opcode=v.e.IBV_WR_SEND, num_sge=1,
                             sg=[v.wr.SGE(addr, length, lkey)], send_flags=v.e.IBV_SEND_SIGNALED))


def post_receive(v, qp, wr_id: int, addr: int, length: int, lkey: int) -> None:
    qp.post_recv(v.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[v.wr.SGE(addr, length, lkey)]))


def wait_completions(v, cq, count: int, deadline: Deadline) -> None:
    """Poll a send CQ until `count` signalled work requests completed. An error completion
    (retry exceeded: the peer is gone; flush: the QP already failed) raises at once."""
    done = 0
    while done < count:
        npolled, wcs = cq.poll(count - done)
        for wc in wcs:
            check_completion(v, wc)
        done += npolled
        if not npolled:
            deadline.remaining()  # raises TransferTimeout once the deadline has passed
            time.sleep(_IDLE_POLL_S)


def check_completion(v, wc) -> None:
    if wc.status == v.e.IBV_WC_SUCCESS:
        return
    peer_gone = (v.e.IBV_WC_RETRY_EXC_ERR, v.e.IBV_WC_RNR_RETRY_EXC_ERR, v.e.IBV_WC_WR_FLUSH_ERR,
                 v.e.IBV_WC_REM_ACCESS_ERR, v.e.IBV_WC_REM_OP_ERR)
    kind = PeerUnreachable if wc.status in peer_gone else TransferError
    raise kind(f"RDMA work request {wc.wr_id} failed with completion status {wc.status}")
