"""Reusable connections to one peer: a batch takes one, gives it back only if the exchange
ended cleanly (a connection that failed mid-batch is out of sync and is closed)."""

from __future__ import annotations

import socket
import threading
from typing import Callable, TypeVar

from .errors import PeerUnreachable
from .server import shutdown_quietly
from .wire import Deadline

T = TypeVar("T")


class ConnectionPool:
    def __init__(self, dial: Callable[[Deadline], socket.socket], max_idle: int = 4):
        self._dial = dial
        self._max_idle = max_idle
        self._idle: list[socket.socket] = []
        self._all: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self, deadline: Deadline) -> socket.socket:
        with self._lock:
            if self._closed:
                raise PeerUnreachable("peer handle is closed")
            if self._idle:
                return self._idle.pop()
        sock = self._dial(deadline)
        with self._lock:
            if self._closed:
                sock.close()
                raise PeerUnreachable("peer handle is closed")
            self._all.add(sock)
        return sock

    def adopt(self, sock: socket.socket) -> socket.socket:
        """Take charge of a socket dialed outside the pool (the connect-time handshake)."""
        with self._lock:
            self._all.add(sock)
        return sock

    def release(self, sock: socket.socket, healthy: bool) -> None:
        with self._lock:
            if healthy and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(sock)
                return
            self._all.discard(sock)
        shutdown_quietly(sock)
        sock.close()

    def close(self) -> None:
        """Close idle connections and wake any in use; their batches fail PeerUnreachable."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._all -= set(idle)
            busy = list(self._all)  # a snapshot: releases from other threads change the set
        for sock in idle:
            shutdown_quietly(sock)
            sock.close()
        for sock in busy:
            shutdown_quietly(sock)


class Lease:
    """One batch's use of a pooled connection, driven by a worker thread and abortable from
    the event loop. The worker acquires, exchanges and releases; `abort` only shuts the
    socket down, so the socket is never closed under a thread still using it."""

    def __init__(self, pool: ConnectionPool):
        self._pool = pool
        self._sock: socket.socket | None = None
        self._aborted = False
        self._lock = threading.Lock()

    def run(self, deadline: Deadline, exchange: Callable[[socket.socket], T],
            clean_errors: tuple[type[BaseException], ...] = ()) -> T:
        """`exchange(sock)` on a pooled connection; it goes back to the pool if the exchange
        returned or raised one of `clean_errors` (failures that leave the stream in sync)."""
        sock = self._pool.acquire(deadline)
        with self._lock:
            self._sock = sock
            aborted = self._aborted
        healthy = False
        try:
            if aborted:
                raise PeerUnreachable("batch aborted")
            result = exchange(sock)
            healthy = True
            return result
        except clean_errors:
            healthy = True
            raise
        finally:
            with self._lock:
                self._sock = None
                healthy = healthy and not self._aborted
            self._pool.release(sock, healthy)

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._sock is not None:
                shutdown_quietly(self._sock)
