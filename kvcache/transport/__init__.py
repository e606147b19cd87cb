"""dsflash.kvcache.transport: the KV transfer engine (see base.py for the contract).

    engines = open_engines(TransportConfig(compatibility_hash=make_compatibility_hash(...)))
    pool_storage = engines.allocate_segment("kv", nbytes)      # torch.uint8 CPU tensor
    publish(engines.endpoint())                                # protobuf TransportEndpoint
    peer = await engines.connect(peer_endpoint)                # rdma > same-host shm > tcp
    await engines.write_batch(peer, [TransferRequest("kv", 0, "kv", 4096, 65536), ...])

One transport alone: TcpTransferEngine, ShmTransferEngine, rdma.RdmaTransferEngine (not
imported here: it needs pyverbs, which rdma_verbs imports on first use), FakeTransferEngine
for tests of callers.
"""

from . import rdma_verbs
from .base import PeerHandle, TransferEngine, TransportConfig
from .batch import TransferOp, TransferReceipt, TransferRequest, TransferState
from .errors import (ChecksumMismatch, EngineClosed, IncompatiblePeer, InvalidRequest,
                     PeerRestarted, PeerUnreachable, TransferError, TransferTimeout,
                     TransportUnavailable)
from .fake import FakeFabric, FakeTransferEngine
from .faults import FaultPlan
from .identity import make_compatibility_hash
from .select import MultiTransferEngine, choose_kind, open_engines, select_engine
from .shm import ShmTransferEngine
from .tcp import TcpTransferEngine

__all__ = [
    "ChecksumMismatch", "EngineClosed", "FakeFabric", "FakeTransferEngine", "FaultPlan",
    "IncompatiblePeer", "InvalidRequest", "MultiTransferEngine", "PeerHandle", "PeerRestarted",
    "PeerUnreachable", "ShmTransferEngine", "TcpTransferEngine", "TransferEngine",
    "TransferError", "TransferOp", "TransferReceipt", "TransferRequest", "TransferState",
    "TransferTimeout", "TransportConfig", "TransportUnavailable", "choose_kind",
    "make_compatibility_hash", "open_engines", "rdma_verbs", "select_engine",
]
