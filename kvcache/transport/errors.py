"""Typed failures of the transfer engine.

Every failure is a `TransferError`; callers that only need "did the bytes arrive intact" catch
that and recompute the cache. Subclasses say why, so the caller can decide whether to retry the
same peer (`TransferTimeout`), forget it (`PeerUnreachable`, `PeerRestarted`), or fix a bug
(`InvalidRequest`, `IncompatiblePeer`). A transfer that raised never counts as done.
"""

from __future__ import annotations


class TransferError(Exception):
    """Base class: the batch did not complete; destination bytes are unspecified."""


class PeerUnreachable(TransferError):
    """The peer refused, reset or closed the connection, or never answered the connect."""


class PeerRestarted(PeerUnreachable):
    """The endpoint names an older incarnation of the peer: its segments' contents are gone."""


class TransferTimeout(TransferError):
    """No progress before the deadline (a stalled or overloaded peer)."""


class ChecksumMismatch(TransferError):
    """The receiving side computed a different checksum than the sender: never use the bytes."""

    def __init__(self, message: str, region_index: int = -1):
        super().__init__(message)
        self.region_index = region_index


class InvalidRequest(TransferError):
    """A region names an unknown segment, leaves its bounds, or overlaps another destination."""


class IncompatiblePeer(TransferError):
    """Protocol version or compatibility hash (model, KV layout, checksum) differ."""


class TransportUnavailable(TransferError):
    """The transport cannot run here (no RDMA device, no pyverbs, not the same host)."""


class EngineClosed(TransferError):
    """The local engine was closed before or during the call."""
