"""The ownership directory contract: one interface, three implementations.

- `LocalDirectory`: in-process; `dsflash serve` without --redis-url, and the fallback below.
- `RedisDirectory`: shared by every process of a deployment through Redis.
- `ResilientDirectory`: a RedisDirectory that falls back to a LocalDirectory while Redis is
  unreachable and re-publishes what it holds when Redis returns.

Who calls what:
- workers: `register_worker` once, `heartbeat` every few seconds (with their load),
  `unregister_worker` on shutdown;
- a decode worker: `claim` when it takes a conversation's cache, `update` after each turn,
  `renew` while it keeps the cache, `release` when it evicts it; `record_prefix` after a turn;
- the gateway: `list_workers`, `find_owner` / `lookup`, `match_prefix`, `subscribe`.

Fencing: `claim` returns an epoch that only grows per conversation; `update`, `renew` and
`release` succeed only for the current owner *and* epoch, so a worker that lost a conversation
(its lease lapsed, or a later turn was given to another worker) can never overwrite the record
of the newer owner. A record whose lease has lapsed reads as absent.

Everything here is advisory for routing: a missing or wrong record costs a recompute, never a
wrong answer, because the reader checks `prefix_hash` against the tokens it has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from .records import (
    LiveOwner,
    OwnershipEvent,
    OwnershipRecord,
    PrefixEntry,
    PrefixMatch,
    WorkerInfo,
    WorkerLoad,
    WorkerRole,
)


class DirectoryUnavailable(Exception):
    """The shared directory did not answer within its timeout (Redis down, frozen, unreachable)."""


class SubscriptionLost(DirectoryUnavailable):
    """A subscription stopped delivering: its connection dropped or it fell too far behind.
    Events in between are lost; `lookup` remains the truth."""


class Subscription(ABC):
    """An async iterator of `OwnershipEvent`s, in the order the changes happened. Delivers
    every change made after `subscribe()` returned; ends (StopAsyncIteration) after `aclose()`."""

    def __aiter__(self) -> Subscription:
        return self

    @abstractmethod
    async def __anext__(self) -> OwnershipEvent: ...

    @abstractmethod
    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


class OwnershipDirectory(ABC):
    # ------------------------------------------------------------------ worker registry

    @abstractmethod
    async def register_worker(self, info: WorkerInfo, ttl_s: float) -> WorkerInfo | None:
        """Registers (or replaces) `info.worker_id` for `ttl_s`; returns the registration it
        replaced if that one was still live, so a caller can see a restart (new incarnation)."""

    @abstractmethod
    async def heartbeat(
        self, worker_id: str, load: WorkerLoad | None = None, *, incarnation: str | None = None
    ) -> bool:
        """Renews the registration for its original TTL and stores `load` if given. False when
        the worker is not registered (expired: register again) or, with `incarnation`, when a
        different incarnation holds the id (this process was replaced)."""

    @abstractmethod
    async def unregister_worker(self, worker_id: str, incarnation: str) -> bool:
        """Removes the registration if it is still this incarnation's (a late shutdown of an
        old process must not remove its replacement)."""

    @abstractmethod
    async def get_worker(self, worker_id: str) -> WorkerInfo | None: ...

    @abstractmethod
    async def list_workers(self, role: WorkerRole | None = None) -> list[WorkerInfo]:
        """Live registrations only, sorted by worker id."""

    # ------------------------------------------------------------------ ownership

    @abstractmethod
    async def claim(self, conversation_id: str, worker_id: str, incarnation: str, lease_s: float,
                    num_cached_tokens: int = 0, prefix_hash: str = "") -> int:
        """Makes `worker_id` the owner, whoever held it before; returns the new epoch (larger
        than any earlier epoch of this conversation). The record holds what the owner caches
        from its first appearance, so no reader sees an owner with nothing to fetch."""

    @abstractmethod
    async def update(
        self,
        conversation_id: str,
        worker_id: str,
        epoch: int,
        num_cached_tokens: int,
        prefix_hash: str,
        lease_s: float,
    ) -> bool:
        """Stores what the owner now caches and extends the lease to now + lease_s. False
        (and nothing written) unless `worker_id` holds the live record at `epoch`."""

    @abstractmethod
    async def renew(self, conversation_id: str, worker_id: str, epoch: int, lease_s: float) -> bool:
        """Extends the lease to now + lease_s; same fencing as `update`. Not announced."""

    @abstractmethod
    async def release(self, conversation_id: str, worker_id: str, epoch: int) -> bool:
        """Drops the record (the owner evicted the cache); same fencing as `update`."""

    @abstractmethod
    async def lookup(self, conversation_id: str) -> OwnershipRecord | None:
        """The live record, or None (never claimed, released, or lease lapsed)."""

    @abstractmethod
    async def restore_ownership(self, record: OwnershipRecord) -> bool:
        """Installs a record kept elsewhere (re-publishing after an outage), with its epoch and
        remaining lease, unless the directory knows a newer claim: a live record with a larger
        epoch, or the same epoch held by someone else, or a larger epoch issued since. A record
        whose lease already lapsed is not installed. Announced as RESTORED."""

    async def find_owner(self, conversation_id: str) -> LiveOwner | None:
        """The record, only if its owner is registered now under the incarnation that made it:
        a worker that died or restarted at the same address lost the cache with its memory."""
        record = await self.lookup(conversation_id)
        if record is None:
            return None
        worker = await self.get_worker(record.owner_id)
        if worker is None or worker.incarnation != record.owner_incarnation:
            return None
        return LiveOwner(record, worker)

    # ------------------------------------------------------------------ announcements

    @abstractmethod
    async def subscribe(self) -> Subscription:
        """Every ownership change (claimed, updated, released, restored) from now on."""

    # ------------------------------------------------------------------ prefix index

    @abstractmethod
    async def record_prefix(self, conversation_id: str, block_hashes: Sequence[str], ttl_s: float) -> None:
        """Points each block hash (see prefix_hash.block_hashes) at `conversation_id` for
        `ttl_s`; a later record of the same hash by another conversation wins."""

    @abstractmethod
    async def match_prefix(self, block_hashes: Sequence[str]) -> PrefixMatch | None:
        """The conversation recorded under the deepest of `block_hashes` and how many blocks
        that covers (hashes are chained, so hash i stands for all of blocks 0..i)."""

    @abstractmethod
    async def restore_prefixes(self, entries: Sequence[PrefixEntry]) -> None:
        """Re-publishes entries with their remaining TTL, without replacing any entry that is
        live now (someone recorded it meanwhile; theirs is newer)."""

    # ------------------------------------------------------------------ lifecycle

    @abstractmethod
    async def ping(self) -> None:
        """Raises DirectoryUnavailable if the directory cannot answer now."""

    @abstractmethod
    async def close(self) -> None: ...
