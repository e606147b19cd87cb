"""`LocalDirectory`: the ownership directory in one process's memory.

Used by `dsflash serve` without --redis-url (every tier in one place, so nothing to share), as
the fallback of `ResilientDirectory`, and as the reference the Redis version is tested against.
It keeps the Redis semantics exactly, TTLs included: expired entries read as absent at once
and are swept at most once per `sweep_interval_s`, so memory stays bounded by what is live.
Every method finishes without awaiting, so each one is atomic on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .base import OwnershipDirectory, Subscription
from .events import DEFAULT_MAX_QUEUED_EVENTS, EventHub
from .records import (
    DEFAULT_EPOCH_RETENTION_S,
    EventKind,
    OwnershipEvent,
    OwnershipRecord,
    PrefixEntry,
    PrefixMatch,
    WorkerInfo,
    WorkerLoad,
    WorkerRole,
    check_conversation_id,
    lease_ms,
    next_epoch,
)


@dataclass(frozen=True)
class Registration:
    info: WorkerInfo
    ttl_s: float
    expires_at: float


@dataclass(frozen=True)
class _IssuedEpoch:
    epoch: int
    retain_until: float


@dataclass(frozen=True)
class LocalSnapshot:
    """What this directory holds now (live entries only): what a ResilientDirectory
    re-publishes when Redis comes back."""

    workers: list[Registration]
    records: list[OwnershipRecord]
    prefixes: list[PrefixEntry]


class LocalDirectory(OwnershipDirectory):
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        epoch_retention_s: float = DEFAULT_EPOCH_RETENTION_S,
        max_queued_events: int = DEFAULT_MAX_QUEUED_EVENTS,
        sweep_interval_s: float = 1.0,
    ):
        self._clock = clock
        self._epoch_retention_s = epoch_retention_s
        self._sweep_interval_s = sweep_interval_s
        self._next_sweep_at = 0.0
        self._hub = EventHub(max_queued_events)
        self._workers: dict[str, Registration] = {}
        self._records: dict[str, OwnershipRecord] = {}
        self._epochs: dict[str, _IssuedEpoch] = {}  # outlives the record, so epochs keep growing
        self._prefixes: dict[str, PrefixEntry] = {}

    # ------------------------------------------------------------------ time and expiry

    def _now(self) -> float:
        """Current time, truncated to the millisecond like Redis `TIME` in the scripts, with
        expired entries swept now and then."""
        now = round(self._clock() * 1000) / 1000
        if now >= self._next_sweep_at:
            self._next_sweep_at = now + self._sweep_interval_s
            self._workers = {k: v for k, v in self._workers.items() if v.expires_at > now}
            self._records = {k: v for k, v in self._records.items() if v.lease_expires_at > now}
            self._epochs = {k: v for k, v in self._epochs.items() if v.retain_until > now}
            self._prefixes = {k: v for k, v in self._prefixes.items() if v.expires_at > now}
        return now

    def _live_registration(self, worker_id: str, now: float) -> Registration | None:
        registration = self._workers.get(worker_id)
        return registration if registration is not None and registration.expires_at > now else None

    def _live_record(self, conversation_id: str, now: float) -> OwnershipRecord | None:
        record = self._records.get(conversation_id)
        return record if record is not None and record.lease_expires_at > now else None

    def _last_epoch(self, conversation_id: str, now: float) -> int:
        """The largest epoch issued so far: the remembered one or the live record's."""
        issued = self._epochs.get(conversation_id)
        record = self._live_record(conversation_id, now)
        return max(
            issued.epoch if issued is not None and issued.retain_until > now else 0,
            record.epoch if record is not None else 0,
        )

    def _remember_epoch(self, conversation_id: str, epoch: int, now: float) -> None:
        self._epochs[conversation_id] = _IssuedEpoch(epoch, now + self._epoch_retention_s)

    # ------------------------------------------------------------------ worker registry

    async def register_worker(self, info: WorkerInfo, ttl_s: float) -> WorkerInfo | None:
        ttl_s = lease_ms(ttl_s) / 1000
        now = self._now()
        previous = self._live_registration(info.worker_id, now)
        self._workers[info.worker_id] = Registration(info, ttl_s, now + ttl_s)
        return previous.info if previous is not None else None

    async def heartbeat(
        self, worker_id: str, load: WorkerLoad | None = None, *, incarnation: str | None = None
    ) -> bool:
        now = self._now()
        registration = self._live_registration(worker_id, now)
        if registration is None or (incarnation is not None and registration.info.incarnation != incarnation):
            return False
        info = registration.info if load is None else registration.info.with_load(load)
        self._workers[worker_id] = Registration(info, registration.ttl_s, now + registration.ttl_s)
        return True

    async def unregister_worker(self, worker_id: str, incarnation: str) -> bool:
        registration = self._live_registration(worker_id, self._now())
        if registration is None or registration.info.incarnation != incarnation:
            return False
        del self._workers[worker_id]
        return True

    def registration(self, worker_id: str) -> Registration | None:
        """The live registration with its TTL (what a heartbeat renews it for)."""
        return self._live_registration(worker_id, self._now())

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        registration = self._live_registration(worker_id, self._now())
        return registration.info if registration is not None else None

    async def list_workers(self, role: WorkerRole | None = None) -> list[WorkerInfo]:
        now = self._now()
        return [
            r.info
            for _, r in sorted(self._workers.items())
            if r.expires_at > now and (role is None or r.info.role == role)
        ]

    # ------------------------------------------------------------------ ownership

    def _install(self, kind: EventKind, record: OwnershipRecord, now: float) -> None:
        self._records[record.conversation_id] = record
        last_epoch = self._last_epoch(record.conversation_id, now)
        self._remember_epoch(record.conversation_id, max(record.epoch, last_epoch), now)
        self._hub.publish(OwnershipEvent(kind, record))

    def _held(self, conversation_id: str, worker_id: str, epoch: int, now: float) -> OwnershipRecord | None:
        record = self._live_record(conversation_id, now)
        if record is None or record.owner_id != worker_id or record.epoch != epoch:
            return None
        return record

    async def claim(self, conversation_id: str, worker_id: str, incarnation: str, lease_s: float,
                    num_cached_tokens: int = 0, prefix_hash: str = "") -> int:
        check_conversation_id(conversation_id)
        lease_s = lease_ms(lease_s) / 1000
        now = self._now()
        epoch = next_epoch(self._last_epoch(conversation_id, now), round(now * 1000))
        record = OwnershipRecord(conversation_id, worker_id, incarnation, epoch, num_cached_tokens, prefix_hash,
                                 now + lease_s)
        self._install(EventKind.CLAIMED, record, now)
        return epoch

    async def update(
        self,
        conversation_id: str,
        worker_id: str,
        epoch: int,
        num_cached_tokens: int,
        prefix_hash: str,
        lease_s: float,
    ) -> bool:
        lease_s = lease_ms(lease_s) / 1000
        now = self._now()
        record = self._held(conversation_id, worker_id, epoch, now)
        if record is None:
            return False
        record = replace(
            record, num_cached_tokens=num_cached_tokens, prefix_hash=prefix_hash, lease_expires_at=now + lease_s
        )
        self._install(EventKind.UPDATED, record, now)
        return True

    async def renew(self, conversation_id: str, worker_id: str, epoch: int, lease_s: float) -> bool:
        lease_s = lease_ms(lease_s) / 1000
        now = self._now()
        record = self._held(conversation_id, worker_id, epoch, now)
        if record is None:
            return False
        self._records[conversation_id] = replace(record, lease_expires_at=now + lease_s)
        return True

    async def release(self, conversation_id: str, worker_id: str, epoch: int) -> bool:
        record = self._held(conversation_id, worker_id, epoch, self._now())
        if record is None:
            return False
        del self._records[conversation_id]
        self._hub.publish(OwnershipEvent(EventKind.RELEASED, record))
        return True

    async def lookup(self, conversation_id: str) -> OwnershipRecord | None:
        return self._live_record(conversation_id, self._now())

    async def restore_ownership(self, record: OwnershipRecord) -> bool:
        check_conversation_id(record.conversation_id)
        now = self._now()
        lease_expires_at = round(record.lease_expires_at * 1000) / 1000
        if lease_expires_at <= now:
            return False
        current = self._live_record(record.conversation_id, now)
        if current is not None:
            is_same_holder = current.owner_id == record.owner_id and current.owner_incarnation == record.owner_incarnation
            if current.epoch > record.epoch or (current.epoch == record.epoch and not is_same_holder):
                return False
        elif self._last_epoch(record.conversation_id, now) > record.epoch:
            return False
        self._install(EventKind.RESTORED, replace(record, lease_expires_at=lease_expires_at), now)
        return True

    # ------------------------------------------------------------------ announcements

    async def subscribe(self) -> Subscription:
        return self._hub.subscribe()

    # ------------------------------------------------------------------ prefix index

    async def record_prefix(self, conversation_id: str, block_hashes: Sequence[str], ttl_s: float) -> None:
        check_conversation_id(conversation_id)
        expires_at = self._now() + lease_ms(ttl_s) / 1000
        for block_hash in block_hashes:
            self._prefixes[block_hash] = PrefixEntry(block_hash, conversation_id, expires_at)

    async def match_prefix(self, block_hashes: Sequence[str]) -> PrefixMatch | None:
        now = self._now()
        for index in range(len(block_hashes) - 1, -1, -1):
            entry = self._prefixes.get(block_hashes[index])
            if entry is not None and entry.expires_at > now:
                return PrefixMatch(entry.conversation_id, index + 1)
        return None

    async def restore_prefixes(self, entries: Sequence[PrefixEntry]) -> None:
        now = self._now()
        for entry in entries:
            current = self._prefixes.get(entry.block_hash)
            if entry.expires_at > now and (current is None or current.expires_at <= now):
                self._prefixes[entry.block_hash] = entry

    # ------------------------------------------------------------------ lifecycle

    def snapshot(self) -> LocalSnapshot:
        now = self._now()
        return LocalSnapshot(
            workers=[r for r in self._workers.values() if r.expires_at > now],
            records=[r for r in self._records.values() if r.lease_expires_at > now],
            prefixes=[p for p in self._prefixes.values() if p.expires_at > now],
        )

    def num_entries(self) -> int:
        """Entries held, live or not yet swept: for leak checks."""
        return len(self._workers) + len(self._records) + len(self._epochs) + len(self._prefixes)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        self._hub.close()
