"""`ResilientDirectory`: Redis when it answers, local state when it does not.

A Redis outage must not stop serving: the directory only saves recomputation. So every call
goes to the remote directory (a RedisDirectory, whose calls are bounded by a short timeout)
and, on `DirectoryUnavailable`, this class switches to *degraded* mode:
- it logs one warning and answers every call from a LocalDirectory, which already holds what
  this process registered, claimed and recorded (each successful remote write is mirrored
  there), so the worker keeps serving and keeps its ownership, known only locally;
- reads see only local ownership, plus the workers last listed from Redis, so a gateway keeps
  routing to the workers it knew;
- a background task retries Redis with jittered exponential backoff. When Redis answers, it
  re-registers the local workers, re-publishes the local ownership records with
  `restore_ownership` (which refuses to replace a newer epoch written meanwhile: those records
  are dropped locally, their conversations now belong to someone else), re-publishes prefix
  entries without replacing live ones, then switches back and logs once.

Epochs claimed while degraded are time-based like Redis' (see `records.next_epoch`), so on
recovery "newer" means "claimed later", up to the clock skew between this host and Redis.

Redis can also lose its data without this process noticing an outage (a quick restart without
persistence). Then a heartbeat or an update finds nothing: if the local mirror still holds the
registration or record, it is re-published and the call retried, instead of the worker
concluding it lost a conversation it still caches.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from .base import DirectoryUnavailable, OwnershipDirectory, Subscription
from .events import DEFAULT_MAX_QUEUED_EVENTS, EventHub
from .local import LocalDirectory, Registration
from .records import (
    EventKind,
    OwnershipEvent,
    OwnershipRecord,
    PrefixEntry,
    PrefixMatch,
    WorkerInfo,
    WorkerLoad,
    WorkerRole,
    lease_ms,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Call = Callable[[OwnershipDirectory], Awaitable[T]]

DEFAULT_RETRY_INITIAL_S = 0.2
DEFAULT_RETRY_MAX_S = 5.0


class ResilientDirectory(OwnershipDirectory):
    def __init__(
        self,
        remote: OwnershipDirectory,
        *,
        local: LocalDirectory | None = None,
        retry_initial_s: float = DEFAULT_RETRY_INITIAL_S,
        retry_max_s: float = DEFAULT_RETRY_MAX_S,
        max_queued_events: int = DEFAULT_MAX_QUEUED_EVENTS,
    ):
        self._remote = remote
        self._local = local if local is not None else LocalDirectory(max_queued_events=max_queued_events)
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._hub = EventHub(max_queued_events)  # Redis events when healthy, local ones when degraded
        self._is_degraded = False
        self._degraded_since = 0.0
        # Held across a resync, and by every degraded-mode write, so that no local write can
        # fall between the snapshot that is re-published and the switch back to Redis.
        self._resync_lock = asyncio.Lock()
        self._forwarder_lock = asyncio.Lock()
        self._forwarder: asyncio.Task | None = None
        self._recovery: asyncio.Task | None = None
        self._last_listed_workers: dict[str, WorkerInfo] = {}

    @property
    def is_degraded(self) -> bool:
        return self._is_degraded

    # ------------------------------------------------------------------ mode switching

    def _degrade(self, exc: BaseException) -> None:
        if self._is_degraded:
            return
        self._is_degraded = True
        self._degraded_since = time.monotonic()
        log.warning("ownership directory unreachable (%s); serving from local state until it returns", exc)
        if self._forwarder is not None and self._forwarder is not asyncio.current_task():
            self._forwarder.cancel()
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.create_task(self._recover(), name="directory-recovery")

    async def _recover(self) -> None:
        delay_s = self._retry_initial_s
        while True:
            # Jittered, so that all workers do not stampede a Redis that just came back.
            await asyncio.sleep(delay_s * random.uniform(0.8, 1.2))
            try:
                await self._resync()
                return
            except DirectoryUnavailable as exc:
                log.debug("ownership directory still unreachable: %s", exc)
                delay_s = min(delay_s * 2, self._retry_max_s)

    async def _resync(self) -> None:
        async with self._resync_lock:
            await self._remote.ping()
            if self._hub.num_subscribers:
                await self._ensure_forwarder()  # first, so subscribers see the re-published records
            snapshot = self._local.snapshot()
            num_workers = await self._republish_workers(snapshot.workers)
            num_records = await self._republish_records(snapshot.records)
            await self._remote.restore_prefixes(snapshot.prefixes)
            self._is_degraded = False
        log.info(
            "ownership directory reachable again after %.1f s: re-registered %d of %d workers, "
            "re-published %d of %d ownership records",
            time.monotonic() - self._degraded_since,
            num_workers,
            len(snapshot.workers),
            num_records,
            len(snapshot.records),
        )

    async def _republish_workers(self, registrations: list[Registration]) -> int:
        num_registered = 0
        for registration in registrations:
            info = registration.info
            current = await self._remote.get_worker(info.worker_id)
            if current is not None and current.incarnation != info.incarnation:
                # Another process registered this id meanwhile: it replaced this one.
                await self._local.unregister_worker(info.worker_id, info.incarnation)
                continue
            await self._remote.register_worker(info, registration.ttl_s)
            num_registered += 1
        return num_registered

    async def _republish_records(self, records: list[OwnershipRecord]) -> int:
        num_restored = 0
        for record in records:
            if await self._remote.restore_ownership(record):
                num_restored += 1
            else:  # a newer claim won meanwhile: the conversation is no longer ours
                await self._local.release(record.conversation_id, record.owner_id, record.epoch)
        return num_restored

    async def _remote_or_none(self, call: Call[T]) -> tuple[bool, T | None]:
        """(True, result) from the remote, or (False, None) when degraded (now or already)."""
        if self._is_degraded:
            return False, None
        try:
            return True, await call(self._remote)
        except DirectoryUnavailable as exc:
            self._degrade(exc)
            return False, None

    async def _read(self, call: Call[T]) -> T:
        is_remote, result = await self._remote_or_none(call)
        return result if is_remote else await call(self._local)

    async def _write(self, remote_then_mirror: Callable[[], Awaitable[T]], degraded: Callable[[], Awaitable[T]]) -> T:
        """Runs `remote_then_mirror` while healthy, else `degraded` under the resync lock. The
        loop covers a resync that finishes between the failure and taking the lock."""
        while True:
            if not self._is_degraded:
                try:
                    return await remote_then_mirror()
                except DirectoryUnavailable as exc:
                    self._degrade(exc)
            async with self._resync_lock:
                if self._is_degraded:
                    return await degraded()

    async def _announce_local(self, kind: EventKind, conversation_id: str, before: OwnershipRecord | None) -> None:
        """Degraded mode: Redis cannot announce a local change, so tell local subscribers."""
        record = before if kind == EventKind.RELEASED else await self._local.lookup(conversation_id)
        if record is not None:
            self._hub.publish(OwnershipEvent(kind, record))

    async def _local_ownership_write(self, kind: EventKind, conversation_id: str, call: Call[T]) -> T:
        before = await self._local.lookup(conversation_id)
        result = await call(self._local)
        if result:
            await self._announce_local(kind, conversation_id, before)
        return result

    # ------------------------------------------------------------------ worker registry

    async def register_worker(self, info: WorkerInfo, ttl_s: float) -> WorkerInfo | None:
        async def remote() -> WorkerInfo | None:
            previous = await self._remote.register_worker(info, ttl_s)
            await self._local.register_worker(info, ttl_s)
            return previous

        return await self._write(remote, lambda: self._local.register_worker(info, ttl_s))

    async def heartbeat(
        self, worker_id: str, load: WorkerLoad | None = None, *, incarnation: str | None = None
    ) -> bool:
        async def remote() -> bool:
            is_renewed = await self._remote.heartbeat(worker_id, load, incarnation=incarnation)
            is_mirrored = await self._local.heartbeat(worker_id, load, incarnation=incarnation)
            if is_renewed or not is_mirrored:
                return is_renewed
            # Redis forgot a worker this process still runs (it lost its data): register again,
            # unless another incarnation took the id, in which case this process was replaced.
            if await self._remote.get_worker(worker_id) is not None:
                return False
            registration = self._local.registration(worker_id)
            await self._remote.register_worker(registration.info, registration.ttl_s)
            return True

        return await self._write(remote, lambda: self._local.heartbeat(worker_id, load, incarnation=incarnation))

    async def unregister_worker(self, worker_id: str, incarnation: str) -> bool:
        async def remote() -> bool:
            is_removed = await self._remote.unregister_worker(worker_id, incarnation)
            await self._local.unregister_worker(worker_id, incarnation)
            return is_removed

        return await self._write(remote, lambda: self._local.unregister_worker(worker_id, incarnation))

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        is_remote, worker = await self._remote_or_none(lambda d: d.get_worker(worker_id))
        if is_remote:
            return worker
        return await self._local.get_worker(worker_id) or self._last_listed_workers.get(worker_id)

    async def list_workers(self, role: WorkerRole | None = None) -> list[WorkerInfo]:
        is_remote, workers = await self._remote_or_none(lambda d: d.list_workers(role))
        if is_remote:
            if role is None:
                self._last_listed_workers = {w.worker_id: w for w in workers}
            return workers
        # Degraded: the workers Redis listed last (stale, but better than routing nowhere),
        # overridden by this process's own registrations.
        merged = {w.worker_id: w for w in self._last_listed_workers.values() if role is None or w.role == role}
        merged.update((w.worker_id, w) for w in await self._local.list_workers(role))
        return [merged[worker_id] for worker_id in sorted(merged)]

    # ------------------------------------------------------------------ ownership

    async def claim(self, conversation_id: str, worker_id: str, incarnation: str, lease_s: float,
                    num_cached_tokens: int = 0, prefix_hash: str = "") -> int:
        def call(d: OwnershipDirectory) -> Awaitable[int]:
            return d.claim(conversation_id, worker_id, incarnation, lease_s, num_cached_tokens, prefix_hash)

        async def remote() -> int:
            epoch = await call(self._remote)
            lease_expires_at = time.time() + lease_ms(lease_s) / 1000
            await self._local.restore_ownership(OwnershipRecord(
                conversation_id, worker_id, incarnation, epoch, num_cached_tokens, prefix_hash, lease_expires_at))
            return epoch

        return await self._write(remote, lambda: self._local_ownership_write(EventKind.CLAIMED, conversation_id, call))

    async def _heal_fenced(self, conversation_id: str, worker_id: str, epoch: int, retry: Call[bool]) -> bool:
        """A remote update/renew was refused. If Redis simply lost the record while the local
        mirror still holds it for this (worker, epoch), re-publish it and retry; otherwise the
        conversation now belongs to a newer claim, so drop the mirror."""
        mirror = await self._local.lookup(conversation_id)
        if mirror is None or mirror.owner_id != worker_id or mirror.epoch != epoch:
            return False
        if await self._remote.lookup(conversation_id) is None and await self._remote.restore_ownership(mirror):
            return await retry(self._remote)
        await self._local.release(conversation_id, worker_id, epoch)
        return False

    async def _mirror_from_remote(self, conversation_id: str) -> None:
        """The local mirror lapsed or never saw the claim (it was made through another
        directory object); copy the record Redis has so a later outage can re-publish it."""
        record = await self._remote.lookup(conversation_id)
        if record is not None:
            await self._local.restore_ownership(record)

    async def _fenced_write(
        self, kind: EventKind | None, conversation_id: str, worker_id: str, epoch: int, call: Call[bool]
    ) -> bool:
        async def remote() -> bool:
            if not await call(self._remote):
                return await self._heal_fenced(conversation_id, worker_id, epoch, call)
            if not await call(self._local):
                await self._mirror_from_remote(conversation_id)
            return True

        async def degraded() -> bool:
            if kind is None:  # renew: not announced
                return await call(self._local)
            return await self._local_ownership_write(kind, conversation_id, call)

        return await self._write(remote, degraded)

    async def update(
        self,
        conversation_id: str,
        worker_id: str,
        epoch: int,
        num_cached_tokens: int,
        prefix_hash: str,
        lease_s: float,
    ) -> bool:
        return await self._fenced_write(
            EventKind.UPDATED,
            conversation_id,
            worker_id,
            epoch,
            lambda d: d.update(conversation_id, worker_id, epoch, num_cached_tokens, prefix_hash, lease_s),
        )

    async def renew(self, conversation_id: str, worker_id: str, epoch: int, lease_s: float) -> bool:
        return await self._fenced_write(
            None, conversation_id, worker_id, epoch, lambda d: d.renew(conversation_id, worker_id, epoch, lease_s)
        )

    async def release(self, conversation_id: str, worker_id: str, epoch: int) -> bool:
        async def remote() -> bool:
            is_released = await self._remote.release(conversation_id, worker_id, epoch)
            await self._local.release(conversation_id, worker_id, epoch)  # evicted here either way
            return is_released

        return await self._write(
            remote,
            lambda: self._local_ownership_write(
                EventKind.RELEASED, conversation_id, lambda d: d.release(conversation_id, worker_id, epoch)
            ),
        )

    async def lookup(self, conversation_id: str) -> OwnershipRecord | None:
        return await self._read(lambda d: d.lookup(conversation_id))

    async def restore_ownership(self, record: OwnershipRecord) -> bool:
        async def remote() -> bool:
            is_restored = await self._remote.restore_ownership(record)
            if is_restored:
                await self._local.restore_ownership(record)
            return is_restored

        return await self._write(
            remote,
            lambda: self._local_ownership_write(
                EventKind.RESTORED, record.conversation_id, lambda d: d.restore_ownership(record)
            ),
        )

    # ------------------------------------------------------------------ announcements

    async def _ensure_forwarder(self) -> None:
        """One task copies Redis events into the hub, however many local subscribers."""
        async with self._forwarder_lock:
            if self._forwarder is not None and not self._forwarder.done():
                return
            remote_subscription = await self._remote.subscribe()
            self._forwarder = asyncio.create_task(self._forward(remote_subscription), name="directory-events")

    async def _forward(self, remote_subscription: Subscription) -> None:
        try:
            async for event in remote_subscription:
                self._hub.publish(event)
        except DirectoryUnavailable as exc:
            self._degrade(exc)
        finally:
            await remote_subscription.aclose()

    async def subscribe(self) -> Subscription:
        subscription = self._hub.subscribe()
        if not self._is_degraded:
            try:
                await self._ensure_forwarder()
            except DirectoryUnavailable as exc:
                self._degrade(exc)
        return subscription

    # ------------------------------------------------------------------ prefix index

    async def record_prefix(self, conversation_id: str, block_hashes: Sequence[str], ttl_s: float) -> None:
        async def remote() -> None:
            await self._remote.record_prefix(conversation_id, block_hashes, ttl_s)
            await self._local.record_prefix(conversation_id, block_hashes, ttl_s)

        await self._write(remote, lambda: self._local.record_prefix(conversation_id, block_hashes, ttl_s))

    async def match_prefix(self, block_hashes: Sequence[str]) -> PrefixMatch | None:
        return await self._read(lambda d: d.match_prefix(block_hashes))

    async def restore_prefixes(self, entries: Sequence[PrefixEntry]) -> None:
        async def remote() -> None:
            await self._remote.restore_prefixes(entries)
            await self._local.restore_prefixes(entries)

        await self._write(remote, lambda: self._local.restore_prefixes(entries))

    # ------------------------------------------------------------------ lifecycle

    async def ping(self) -> None:
        """Never raises: degraded mode is still an answer. Probes Redis when healthy."""
        await self._remote_or_none(lambda d: d.ping())

    async def close(self) -> None:
        for task in (self._recovery, self._forwarder):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._hub.close()
        await self._remote.close()
        await self._local.close()
