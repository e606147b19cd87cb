"""Framing and handshake shared by the socket-based transports (tcp.py, shm.py).

A frame is a `TransportFrame` protobuf preceded by its length (4 bytes, little endian); the
payload of a batch travels between frames as raw bytes whose lengths the header announced.
Socket failures are translated here, once, into the typed errors of errors.py.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

from . import errors
from ...v1 import kvcache_pb2 as pb

PROTOCOL_VERSION = 1
_LENGTH = struct.Struct("<I")
MAX_FRAME_BYTES = 64 << 20  # a batch of ~10^6 regions; anything larger is a corrupt stream

_STATUS_ERRORS: dict[int, type[errors.TransferError]] = {
    pb.TRANSFER_STATUS_CHECKSUM_MISMATCH: errors.ChecksumMismatch,
    pb.TRANSFER_STATUS_INVALID_REQUEST: errors.InvalidRequest,
    pb.TRANSFER_STATUS_INCOMPATIBLE: errors.IncompatiblePeer,
    pb.TRANSFER_STATUS_PEER_RESTARTED: errors.PeerRestarted,
}


class Deadline:
    """A point in time; socket operations wait at most min(stall, time left) for progress."""

    def __init__(self, seconds: float):
        self.expires_at = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self.expires_at - time.monotonic()
        if left <= 0:
            raise errors.TransferTimeout("batch deadline passed")
        return left

    def wait_s(self, stall_s: float) -> float:
        return min(stall_s, self.remaining())


@contextlib.contextmanager
def socket_errors(what: str, on_timeout: type[errors.TransferError] = errors.TransferTimeout):
    """Map socket failures to typed errors: a dead or resetting peer is PeerUnreachable, a
    silent one TransferTimeout (PeerUnreachable while connecting: nothing answered)."""
    try:
        yield
    except TimeoutError as exc:  # socket.timeout is TimeoutError since 3.10
        raise on_timeout(f"{what}: no answer in time ({exc})") from exc
    except (ConnectionError, OSError) as exc:
        raise errors.PeerUnreachable(f"{what}: {exc}") from exc


def send_frame(sock: socket.socket, **body) -> None:
    data = pb.TransportFrame(**body).SerializeToString()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def recv_exact(sock: socket.socket, nbytes: int) -> bytearray:
    buf = bytearray(nbytes)
    recv_exact_into(sock, memoryview(buf))
    return buf


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise errors.PeerUnreachable("peer closed the connection")
        got += n


def recv_frame(sock: socket.socket, *expected: str):
    """The next frame's body, which must be one of the `expected` fields of TransportFrame."""
    (length,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise errors.TransferError(f"frame of {length} bytes: stream out of sync")
    frame = pb.TransportFrame.FromString(bytes(recv_exact(sock, length)))
    kind = frame.WhichOneof("body")
    if kind not in expected:
        raise errors.TransferError(f"protocol error: expected {'/'.join(expected)}, got {kind}")
    return getattr(frame, kind)


def raise_for_status(status: int, message: str, region: int = -1) -> None:
    if status == pb.TRANSFER_STATUS_OK:
        return
    error = _STATUS_ERRORS.get(status, errors.TransferError)
    if error is errors.ChecksumMismatch:
        raise errors.ChecksumMismatch(message, region)
    raise error(message or pb.TransferStatus.Name(status))


def status_of(exc: errors.TransferError) -> int:
    for status, error in _STATUS_ERRORS.items():
        if type(exc) is error:
            return status
    return pb.TRANSFER_STATUS_INTERNAL


# ---------------------------------------------------------------- handshake


def make_hello(kind: int, compatibility_hash: str, engine_id: str,
               peer: pb.TransportEndpoint) -> pb.Hello:
    return pb.Hello(protocol_version=PROTOCOL_VERSION, compatibility_hash=compatibility_hash,
                    engine_id=engine_id, expected_peer_engine_id=peer.engine_id, kind=kind)


def check_hello(hello: pb.Hello, compatibility_hash: str, engine_id: str) -> tuple[int, str]:
    """(status, message) for a peer's Hello, as the answering engine sees it."""
    if hello.protocol_version != PROTOCOL_VERSION:
        return pb.TRANSFER_STATUS_INCOMPATIBLE, (
            f"protocol version {hello.protocol_version} != {PROTOCOL_VERSION}")
    if hello.compatibility_hash != compatibility_hash:
        return pb.TRANSFER_STATUS_INCOMPATIBLE, (
            f"compatibility hash {hello.compatibility_hash} != {compatibility_hash}")
    if hello.expected_peer_engine_id != engine_id:
        return pb.TRANSFER_STATUS_PEER_RESTARTED, (
            f"engine {hello.expected_peer_engine_id} is gone; this is {engine_id}")
    return pb.TRANSFER_STATUS_OK, ""
