"""dsflash.kvcache.transport: the KV transfer engine (see base.py for the contract).

    engine = TcpTransferEngine(TransportConfig(compatibility_hash=...))
    pool_storage = engine.allocate_segment("kv", nbytes)       # torch.uint8 CPU tensor
    publish(engine.endpoint())                                 # protobuf TransportEndpoint
    peer = await engine.connect(peer_endpoint)
    await engine.write_batch(peer, [TransferRequest("kv", 0, "kv", 4096, 65536), ...])

rdma.py is not imported here: it imports pyverbs lazily, on first use.
"""

from .base import PeerHandle, TransferEngine, TransportConfig
from .batch import TransferOp, TransferReceipt, TransferRequest, TransferState
from .errors import (ChecksumMismatch, EngineClosed, IncompatiblePeer, InvalidRequest,
                     PeerRestarted, PeerUnreachable, TransferError, TransferTimeout,
                     TransportUnavailable)
from .fake import FakeFabric, FakeTransferEngine
from .faults import FaultPlan
from . import rdma_verbs
from .identity import make_compatibility_hash
from .select import MultiTransferEngine, choose_kind, open_engines, select_engine
from .shm import ShmTransferEngine
from .tcp import TcpTransferEngine

__all__ = [
    "ChecksumMismatch", "EngineClosed", "FakeFabric", "FakeTransferEngine", "FaultPlan",
    "IncompatiblePeer", "InvalidRequest", "MultiTransferEngine", "PeerHandle", "PeerRestarted", "PeerUnreachable",
    "ShmTransferEngine", "TcpTransferEngine", "TransferEngine", "TransferError", "TransferOp",
    "TransferReceipt", "TransferRequest", "TransferState", "TransferTimeout", "TransportConfig",
    "TransportUnavailable", "choose_kind", "make_compatibility_hash", "open_engines",
    "select_engine",
]
