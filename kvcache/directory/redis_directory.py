"""`RedisDirectory`: the ownership directory shared through Redis (key layout in `keys.py`,
the atomic writes in `scripts.py`).

Every public call is bounded by `op_timeout_s` and turns any connection trouble into
`DirectoryUnavailable`: a frozen or unreachable Redis costs a caller at most that long, never
a hang. redis-py's own retries (10, with backoff, by default) are cut to one immediate
reconnect, which heals a pooled connection that a Redis restart closed and adds nothing when
Redis is really down. Riding out an outage is `ResilientDirectory`'s job, not this class's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import scripts
from .base import DirectoryUnavailable, OwnershipDirectory, Subscription, SubscriptionLost
from .keys import KeyLayout
from .records import (
    DEFAULT_EPOCH_RETENTION_S,
    OwnershipEvent,
    OwnershipRecord,
    PrefixEntry,
    PrefixMatch,
    WorkerInfo,
    WorkerLoad,
    WorkerRole,
    check_conversation_id,
    lease_ms,
    load_json,
)

log = logging.getLogger(__name__)

DEFAULT_OP_TIMEOUT_S = 1.0

# Besides a dead or silent connection, two answers mean "no usable Redis" for a while:
# ReadOnlyError (we reached a replica mid-failover) and OutOfMemoryError (maxmemory reached
# under noeviction: every write is refused).
_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OutOfMemoryError, OSError, asyncio.TimeoutError)


def _bounded(method):
    @functools.wraps(method)
    async def wrapper(self: RedisDirectory, *args, **kwargs):
        try:
            return await asyncio.wait_for(method(self, *args, **kwargs), self._op_timeout_s)
        except _UNAVAILABLE as exc:
            raise DirectoryUnavailable(f"redis did not answer: {type(exc).__name__}: {exc}") from exc

    return wrapper


def _worker_from_hash(values: list[str | None]) -> WorkerInfo | None:
    static_json, load = values
    return WorkerInfo.from_json(static_json, load) if static_json else None


class RedisSubscription(Subscription):
    def __init__(self, pubsub: PubSub):
        self._pubsub = pubsub
        self._is_closed = False

    async def __anext__(self) -> OwnershipEvent:
        while not self._is_closed:
            try:
                # Blocks without a timeout: an idle channel is normal. A dropped connection
                # raises; a frozen server is noticed by the next bounded call instead.
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            except Exception as exc:
                if self._is_closed:
                    break
                raise SubscriptionLost(f"redis subscription dropped: {type(exc).__name__}: {exc}") from exc
            if message is not None and message["type"] == "message":
                try:
                    return OwnershipEvent.from_json(message["data"])
                except (ValueError, KeyError, TypeError):  # not ours (a stray PUBLISH, a newer format)
                    log.debug("skipped an undecodable ownership event")
        raise StopAsyncIteration

    async def aclose(self) -> None:
        if not self._is_closed:
            self._is_closed = True
            await self._pubsub.aclose()


class RedisDirectory(OwnershipDirectory):
    def __init__(
        self,
        client: Redis,
        *,
        keys: KeyLayout = KeyLayout(),
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
        epoch_retention_s: float = DEFAULT_EPOCH_RETENTION_S,
    ):
        """`client` must decode responses (decode_responses=True); see `from_url`."""
        self._client = client
        self._keys = keys
        self._op_timeout_s = op_timeout_s
        self._epoch_retention_ms = lease_ms(epoch_retention_s)
        self._scripts = {name: client.register_script(scripts.PRELUDE + body) for name, body in scripts.ALL.items()}

    @classmethod
    def from_url(cls, url: str, *, op_timeout_s: float = DEFAULT_OP_TIMEOUT_S, **options) -> RedisDirectory:
        """A client for `url` with socket timeouts of `op_timeout_s`; `options` as __init__."""
        client = Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=op_timeout_s,
            socket_connect_timeout=op_timeout_s,
            retry=Retry(NoBackoff(), retries=1),
        )
        return cls(client, op_timeout_s=op_timeout_s, **options)

    async def _run(self, script: str, keys: list[str], args: list) -> object:
        return await self._scripts[script](keys=keys, args=args)

    # ------------------------------------------------------------------ worker registry

    @_bounded
    async def register_worker(self, info: WorkerInfo, ttl_s: float) -> WorkerInfo | None:
        previous = await self._run(
            "register",
            [self._keys.worker(info.worker_id), self._keys.workers],
            [info.worker_id, info.static_json(), info.incarnation, load_json(info.load), lease_ms(ttl_s)],
        )
        return _worker_from_hash(previous)

    @_bounded
    async def heartbeat(
        self, worker_id: str, load: WorkerLoad | None = None, *, incarnation: str | None = None
    ) -> bool:
        is_renewed = await self._run(
            "heartbeat",
            [self._keys.worker(worker_id), self._keys.workers],
            [worker_id, incarnation or "", load_json(load) if load is not None else ""],
        )
        return bool(is_renewed)

    @_bounded
    async def unregister_worker(self, worker_id: str, incarnation: str) -> bool:
        is_removed = await self._run(
            "unregister", [self._keys.worker(worker_id), self._keys.workers], [worker_id, incarnation]
        )
        return bool(is_removed)

    @_bounded
    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        return _worker_from_hash(await self._client.hmget(self._keys.worker(worker_id), ["info", "load"]))

    @_bounded
    async def list_workers(self, role: WorkerRole | None = None) -> list[WorkerInfo]:
        worker_ids = await self._run("live_worker_ids", [self._keys.workers], [])
        pipe = self._client.pipeline(transaction=False)
        for worker_id in worker_ids:
            pipe.hmget(self._keys.worker(worker_id), ["info", "load"])
        # A worker can expire between the two round trips; it is simply left out.
        workers = [w for w in map(_worker_from_hash, await pipe.execute()) if w is not None]
        return sorted((w for w in workers if role is None or w.role == role), key=lambda w: w.worker_id)

    # ------------------------------------------------------------------ ownership

    def _record_keys(self, conversation_id: str) -> list[str]:
        return [self._keys.conversation(conversation_id), self._keys.epoch(conversation_id)]

    @_bounded
    async def claim(self, conversation_id: str, worker_id: str, incarnation: str, lease_s: float,
                    num_cached_tokens: int = 0, prefix_hash: str = "") -> int:
        check_conversation_id(conversation_id)
        epoch = await self._run(
            "claim",
            self._record_keys(conversation_id),
            [
                self._keys.events_channel,
                conversation_id,
                worker_id,
                incarnation,
                lease_ms(lease_s),
                self._epoch_retention_ms,
                num_cached_tokens,
                prefix_hash,
            ],
        )
        return int(epoch)

    @_bounded
    async def update(
        self,
        conversation_id: str,
        worker_id: str,
        epoch: int,
        num_cached_tokens: int,
        prefix_hash: str,
        lease_s: float,
    ) -> bool:
        is_updated = await self._run(
            "update",
            [self._keys.conversation(conversation_id)],
            [
                self._keys.events_channel,
                conversation_id,
                worker_id,
                int(epoch),
                int(num_cached_tokens),
                prefix_hash,
                lease_ms(lease_s),
            ],
        )
        return bool(is_updated)

    @_bounded
    async def renew(self, conversation_id: str, worker_id: str, epoch: int, lease_s: float) -> bool:
        is_renewed = await self._run(
            "renew", [self._keys.conversation(conversation_id)], [worker_id, int(epoch), lease_ms(lease_s)]
        )
        return bool(is_renewed)

    @_bounded
    async def release(self, conversation_id: str, worker_id: str, epoch: int) -> bool:
        is_released = await self._run(
            "release",
            [self._keys.conversation(conversation_id)],
            [self._keys.events_channel, conversation_id, worker_id, int(epoch)],
        )
        return bool(is_released)

    @_bounded
    async def lookup(self, conversation_id: str) -> OwnershipRecord | None:
        fields = await self._client.hgetall(self._keys.conversation(conversation_id))
        return OwnershipRecord.from_fields(conversation_id, fields) if fields else None

    @_bounded
    async def restore_ownership(self, record: OwnershipRecord) -> bool:
        check_conversation_id(record.conversation_id)
        # The lease travels as "ms left", so a client clock that differs from Redis' shifts
        # the expiry by the skew only, not by the whole offset between the clocks.
        remaining_ms = round(record.lease_expires_at * 1000) - round(time.time() * 1000)
        if remaining_ms <= 0:
            return False
        is_restored = await self._run(
            "restore",
            self._record_keys(record.conversation_id),
            [
                self._keys.events_channel,
                record.conversation_id,
                record.owner_id,
                record.owner_incarnation,
                record.epoch,
                record.num_cached_tokens,
                record.prefix_hash,
                remaining_ms,
                self._epoch_retention_ms,
            ],
        )
        return bool(is_restored)

    # ------------------------------------------------------------------ announcements

    @_bounded
    async def subscribe(self) -> Subscription:
        pubsub = self._client.pubsub()
        try:
            await pubsub.subscribe(self._keys.events_channel)
            # SUBSCRIBE is only in force once Redis confirms it; waiting for that is what
            # makes "every change after subscribe() returned" hold.
            while True:
                message = await pubsub.get_message(timeout=self._op_timeout_s)
                if message is not None and message["type"] == "subscribe":
                    return RedisSubscription(pubsub)
        except BaseException:
            await pubsub.aclose()
            raise

    # ------------------------------------------------------------------ prefix index

    @_bounded
    async def record_prefix(self, conversation_id: str, block_hashes: Sequence[str], ttl_s: float) -> None:
        check_conversation_id(conversation_id)
        ttl_ms = lease_ms(ttl_s)
        pipe = self._client.pipeline(transaction=False)
        for block_hash in block_hashes:
            pipe.set(self._keys.prefix_block(block_hash), conversation_id, px=ttl_ms)
        await pipe.execute()

    @_bounded
    async def match_prefix(self, block_hashes: Sequence[str]) -> PrefixMatch | None:
        # One pipelined pass over the whole chain (one round trip, ~4k keys for a 1M-token
        # prompt): cheaper than a binary search's log2(n) round trips, and it does not assume
        # that the recorded hashes form an unbroken chain.
        pipe = self._client.pipeline(transaction=False)
        for block_hash in block_hashes:
            pipe.get(self._keys.prefix_block(block_hash))
        owners = await pipe.execute()
        for index in range(len(owners) - 1, -1, -1):
            if owners[index] is not None:
                return PrefixMatch(owners[index], index + 1)
        return None

    @_bounded
    async def restore_prefixes(self, entries: Sequence[PrefixEntry]) -> None:
        now_ms = round(time.time() * 1000)
        pipe = self._client.pipeline(transaction=False)
        for entry in entries:
            remaining_ms = round(entry.expires_at * 1000) - now_ms
            if remaining_ms > 0:
                pipe.set(self._keys.prefix_block(entry.block_hash), entry.conversation_id, px=remaining_ms, nx=True)
        await pipe.execute()

    # ------------------------------------------------------------------ lifecycle

    @_bounded
    async def ping(self) -> None:
        await self._client.ping()

    async def close(self) -> None:
        await self._client.aclose()
