"""The ownership directory contract, run against every implementation:
LocalDirectory, RedisDirectory on a real redis-server, and a healthy ResilientDirectory.

`d` is the directory under test; `peer` is another process's view of the same directory (a
second Redis client on the same key prefix; for LocalDirectory the same object), so the Redis
runs prove that state and events cross clients. TTLs are short (0.3 s) to keep the suite fast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import replace

import pytest

from dsflash.kvcache.directory import (
    EventKind,
    KeyLayout,
    LocalDirectory,
    OwnershipRecord,
    PrefixEntry,
    RedisDirectory,
    ResilientDirectory,
    WorkerInfo,
    WorkerLoad,
    WorkerRole,
    new_incarnation,
)
from dsflash.kvcache.prefix_hash import block_hashes

pytestmark = pytest.mark.anyio

TTL_S = 0.3
PAST_TTL_S = 0.45
LEASE_S = 30.0


class Views:
    """Hands out views of one shared directory and closes them all at the end."""

    def __init__(self, kind: str, url: str | None):
        self.kind = kind
        self.keys = KeyLayout(f"test-{uuid.uuid4().hex[:8]}:")
        self._url = url
        self._local = LocalDirectory() if kind == "local" else None
        self._opened = []

    def new(self, *, is_peer: bool = False):
        """The directory under test, or (is_peer) a plain Redis client of the same keys."""
        if self._local is not None:
            return self._local
        directory = RedisDirectory.from_url(self._url, keys=self.keys, op_timeout_s=1.0)
        if self.kind == "resilient" and not is_peer:
            directory = ResilientDirectory(directory)
        self._opened.append(directory)
        return directory

    async def close(self):
        for directory in self._opened or [self._local]:
            await directory.close()


@pytest.fixture(params=["local", "redis", "resilient"])
async def views(request):
    url = None if request.param == "local" else request.getfixturevalue("redis_server").url
    views = Views(request.param, url)
    yield views
    await views.close()


@pytest.fixture
def d(views):
    return views.new()


@pytest.fixture
def peer(views, d):
    return views.new(is_peer=True)


def decode_worker(worker_id="decode-0", port=7001, incarnation=None, **kwargs) -> WorkerInfo:
    return WorkerInfo(
        worker_id, WorkerRole.DECODE, f"10.0.0.1:{port}", incarnation or new_incarnation(), **kwargs
    )


async def next_events(subscription, count: int, timeout_s: float = 2.0):
    async def read():
        return [await subscription.__anext__() for _ in range(count)]

    return await asyncio.wait_for(read(), timeout_s)


# ---------------------------------------------------------------------- worker registry


async def test_register_list_and_get(d, peer):
    load = WorkerLoad(num_queued_prefill_tokens=5, num_running_requests=2, free_kv_bytes=1 << 40)
    decode = decode_worker(transports=("rdma", "tcp"), load=load)
    prefill = WorkerInfo("prefill-0", "prefill", "10.0.0.2:7000", new_incarnation())
    assert await d.register_worker(decode, 10) is None
    assert await d.register_worker(prefill, 10) is None

    assert await peer.list_workers() == [decode, prefill]
    assert await peer.list_workers(WorkerRole.PREFILL) == [prefill]
    assert await peer.get_worker("decode-0") == decode
    assert await peer.get_worker("nobody") is None

    new_load = WorkerLoad(num_running_requests=7)
    assert await d.heartbeat("decode-0", new_load)
    assert (await peer.get_worker("decode-0")).load == new_load
    assert await d.heartbeat("decode-0")  # without load: keeps the last one
    assert (await peer.get_worker("decode-0")).load == new_load


async def test_registration_expires_unless_renewed(d, peer):
    await d.register_worker(decode_worker("a"), TTL_S)
    await d.register_worker(decode_worker("b", port=7002), TTL_S)
    for _ in range(3):  # heartbeats keep "a" alive well past its TTL
        await asyncio.sleep(TTL_S / 2)
        assert await d.heartbeat("a")
    assert [w.worker_id for w in await peer.list_workers()] == ["a"]
    assert await peer.get_worker("b") is None
    assert not await d.heartbeat("b")  # expired: the worker must register again

    await asyncio.sleep(PAST_TTL_S)
    assert await peer.list_workers() == []
    assert await peer.get_worker("a") is None


async def test_restart_at_same_address_is_detected(d, peer):
    old = decode_worker(incarnation="old-process")
    await d.register_worker(old, 10)
    epoch = await d.claim("conv", old.worker_id, old.incarnation, LEASE_S)
    assert (await peer.find_owner("conv")).worker == old

    new = decode_worker(incarnation="new-process")  # same id and address, new process
    assert await d.register_worker(new, 10) == old
    assert await peer.get_worker(new.worker_id) == new
    # The record names the old incarnation: its cache died with that process.
    assert (await peer.lookup("conv")).owner_incarnation == "old-process"
    assert await peer.find_owner("conv") is None

    # The old process, late, can neither renew nor remove its replacement's registration.
    assert not await d.heartbeat(old.worker_id, incarnation="old-process")
    assert not await d.unregister_worker(old.worker_id, "old-process")
    assert await d.heartbeat(new.worker_id, incarnation="new-process")

    epoch = await d.claim("conv", new.worker_id, new.incarnation, LEASE_S)
    assert (await peer.find_owner("conv")).record.epoch == epoch
    assert await d.unregister_worker(new.worker_id, "new-process")
    assert await peer.list_workers() == []
    assert await peer.find_owner("conv") is None


# ---------------------------------------------------------------------- ownership


async def test_claim_creates_a_record(d, peer):
    assert await peer.lookup("conv") is None
    before = time.time()
    epoch = await d.claim("conv", "decode-0", "inc-0", LEASE_S)
    record = await peer.lookup("conv")
    assert record == OwnershipRecord("conv", "decode-0", "inc-0", epoch, 0, "", record.lease_expires_at)
    assert before + LEASE_S - 1 < record.lease_expires_at < time.time() + LEASE_S + 1

    assert await d.update("conv", "decode-0", epoch, 1234, "ab" * 16, LEASE_S)
    record = await peer.lookup("conv")
    assert (record.num_cached_tokens, record.prefix_hash, record.epoch) == (1234, "ab" * 16, epoch)


async def test_a_claim_can_carry_what_the_owner_caches(d, peer):
    """One write: a reader never sees the new owner with nothing cached (the next turn would
    recompute what the owner holds)."""
    async with await peer.subscribe() as events:
        epoch = await d.claim("conv", "decode-0", "inc-0", LEASE_S, 77, "cd" * 16)
        record = await peer.lookup("conv")
        assert (record.owner_id, record.epoch, record.num_cached_tokens, record.prefix_hash) == (
            "decode-0", epoch, 77, "cd" * 16)
        [event] = await next_events(events, 1)
        assert (event.kind, event.record.num_cached_tokens, event.record.prefix_hash) == (
            EventKind.CLAIMED, 77, "cd" * 16)


async def test_stale_owner_is_fenced_off_by_a_newer_claim(d, peer):
    old_epoch = await d.claim("conv", "decode-0", "inc-0", LEASE_S)
    assert await d.update("conv", "decode-0", old_epoch, 100, "h1", LEASE_S)
    new_epoch = await peer.claim("conv", "decode-1", "inc-1", LEASE_S)
    assert new_epoch > old_epoch

    # decode-0 still thinks it owns the conversation: every write it makes is refused.
    assert not await d.update("conv", "decode-0", old_epoch, 200, "h2", LEASE_S)
    assert not await d.renew("conv", "decode-0", old_epoch, LEASE_S)
    assert not await d.release("conv", "decode-0", old_epoch)
    record = await peer.lookup("conv")
    assert (record.owner_id, record.epoch, record.num_cached_tokens) == ("decode-1", new_epoch, 0)

    # The right epoch from the wrong worker, and a wrong epoch from the right worker, fail too.
    assert not await d.update("conv", "decode-0", new_epoch, 1, "x", LEASE_S)
    assert not await d.update("conv", "decode-1", new_epoch + 1, 1, "x", LEASE_S)
    assert await peer.update("conv", "decode-1", new_epoch, 300, "h3", LEASE_S)
    assert (await d.lookup("conv")).num_cached_tokens == 300


async def test_epochs_grow_across_release_and_rapid_claims(d):
    epochs = [await d.claim("conv", f"decode-{i % 2}", "inc", LEASE_S) for i in range(20)]
    assert epochs == sorted(set(epochs))  # strictly increasing, even within one millisecond
    assert await d.release("conv", "decode-1", epochs[-1])
    assert not await d.release("conv", "decode-1", epochs[-1])
    assert await d.lookup("conv") is None
    assert await d.claim("conv", "decode-0", "inc", LEASE_S) > epochs[-1]


async def test_lapsed_lease_reads_as_absent(d, peer):
    epoch = await d.claim("conv", "decode-0", "inc-0", TTL_S)
    kept = await d.claim("kept", "decode-0", "inc-0", TTL_S)
    await asyncio.sleep(TTL_S / 2)
    assert await d.renew("kept", "decode-0", kept, 1.0)
    await asyncio.sleep(PAST_TTL_S - TTL_S / 2)
    assert await peer.lookup("conv") is None
    assert not await d.update("conv", "decode-0", epoch, 1, "h", LEASE_S)  # the lease is lost
    assert (await peer.lookup("kept")).epoch == kept
    assert await d.claim("conv", "decode-1", "inc-1", LEASE_S) > epoch


async def test_restore_ownership_never_replaces_a_newer_claim(d, peer):
    in_a_minute = time.time() + 60

    def record(cid, owner, epoch, tokens=10):
        return OwnershipRecord(cid, owner, f"inc-{owner}", epoch, tokens, "h", in_a_minute)

    # Nothing known: installed with its own epoch and remaining lease.
    assert await d.restore_ownership(record("fresh", "decode-0", 5000))
    restored = await peer.lookup("fresh")
    assert restored == replace(record("fresh", "decode-0", 5000), lease_expires_at=restored.lease_expires_at)
    assert restored.lease_expires_at == pytest.approx(in_a_minute, abs=0.5)
    assert await peer.claim("fresh", "decode-1", "inc-decode-1", LEASE_S) > 5000

    # The same holder re-publishing its own epoch refreshes the record (e.g. more tokens).
    epoch = await peer.claim("mine", "decode-0", "inc-decode-0", LEASE_S)
    assert await d.restore_ownership(record("mine", "decode-0", epoch, tokens=99))
    assert (await peer.lookup("mine")).num_cached_tokens == 99

    # A newer live claim, the same epoch held by someone else, or a larger epoch issued since
    # (claimed, then released) all win over the restored record.
    newer = await peer.claim("taken", "decode-1", "inc-decode-1", LEASE_S)
    assert not await d.restore_ownership(record("taken", "decode-0", newer - 1))
    assert not await d.restore_ownership(record("taken", "decode-0", newer))
    released = await peer.claim("gone", "decode-1", "inc-decode-1", LEASE_S)
    assert await peer.release("gone", "decode-1", released)
    assert not await d.restore_ownership(record("gone", "decode-0", released - 1))
    assert (await peer.lookup("taken")).owner_id == "decode-1"
    assert await peer.lookup("gone") is None

    # A record whose lease already lapsed is not brought back.
    lapsed = OwnershipRecord("lapsed", "decode-0", "inc", 1, 0, "", time.time() - 1)
    assert not await d.restore_ownership(lapsed)
    assert await peer.lookup("lapsed") is None


# ---------------------------------------------------------------------- announcements


async def test_events_arrive_in_order_on_every_subscriber(d, peer):
    ours, theirs = await d.subscribe(), await peer.subscribe()
    epoch = await d.claim("conv", "decode-0", "inc-0", LEASE_S)
    assert not await d.update("conv", "decode-0", epoch + 1, 1, "x", LEASE_S)  # refused: silent
    assert await d.renew("conv", "decode-0", epoch, LEASE_S)  # not an ownership change: silent
    for tokens in (100, 200, 300):
        assert await d.update("conv", "decode-0", epoch, tokens, f"h{tokens}", LEASE_S)
    assert await d.release("conv", "decode-0", epoch)
    assert await d.restore_ownership(OwnershipRecord("conv", "decode-0", "inc-0", epoch, 300, "h300", time.time() + 60))

    expected = [(EventKind.CLAIMED, 0)] + [(EventKind.UPDATED, t) for t in (100, 200, 300)]
    expected += [(EventKind.RELEASED, 300), (EventKind.RESTORED, 300)]
    for subscription in (ours, theirs):
        events = await next_events(subscription, len(expected))
        assert [(e.kind, e.record.num_cached_tokens) for e in events] == expected
        holders = {(e.record.conversation_id, e.record.owner_id, e.record.epoch) for e in events}
        assert holders == {("conv", "decode-0", epoch)}
        assert events[1].record.prefix_hash == "h100"
        await subscription.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(subscription.__anext__(), 2.0)


async def test_redis_events_skip_foreign_messages_and_records_tolerate_new_fields(redis_server):
    from redis.asyncio import Redis

    keys = KeyLayout("wire:")
    directory = RedisDirectory.from_url(redis_server.url, keys=keys)
    client = Redis.from_url(redis_server.url, decode_responses=True)
    async with await directory.subscribe() as events:
        await client.publish(keys.events_channel, "not an event")
        await client.publish(keys.events_channel, '{"kind": "claimed"}')
        epoch = await directory.claim("conv", "decode-0", "inc", LEASE_S)
        assert [(e.kind, e.record.epoch) for e in await next_events(events, 1)] == [(EventKind.CLAIMED, epoch)]

    # A newer worker version that reports more fields still lists on this version.
    await directory.register_worker(decode_worker(), 5)
    key = keys.worker("decode-0")
    info = json.loads(await client.hget(key, "info"))
    newer_load = '{"num_running_requests": 4, "spec_accept_length": 3.1}'
    await client.hset(key, mapping={"info": json.dumps(info | {"gpu": "h200"}), "load": newer_load})
    assert (await directory.get_worker("decode-0")).load == WorkerLoad(num_running_requests=4)
    await client.aclose()
    await directory.close()


# ---------------------------------------------------------------------- prefix index


async def test_match_prefix_finds_the_longest_recorded_prefix(d, peer):
    system = list(range(64))
    chat_a = block_hashes(system + [1000 + i for i in range(64)], 16)  # 8 blocks, 4 shared
    chat_b = block_hashes(system + [2000 + i for i in range(32)], 16)  # 6 blocks, 4 shared
    assert chat_a[:4] == chat_b[:4] and chat_a[4] != chat_b[4]
    await d.record_prefix("a", chat_a, 10)
    await d.record_prefix("b", chat_b, 10)

    assert await peer.match_prefix(chat_a) == ("a", 8)
    assert await peer.match_prefix(chat_b) == ("b", 6)
    # The next turn of "a" extends the chain: the recorded part matches.
    next_turn = block_hashes(system + [1000 + i for i in range(64)] + [7] * 40, 16)
    assert await peer.match_prefix(next_turn) == ("a", 8)
    # Diverging after the shared system prompt: its blocks were last recorded by "b".
    other = block_hashes(system + [3000 + i for i in range(48)], 16)
    assert await peer.match_prefix(other) == ("b", 4)
    assert await peer.match_prefix(chat_a[:3]) == ("b", 3)
    assert await peer.match_prefix(block_hashes([9] * 64, 16)) is None
    assert await peer.match_prefix([]) is None


async def test_prefix_entries_expire_and_restore_keeps_live_ones(d, peer):
    chain = block_hashes(list(range(48)), 16)
    await d.record_prefix("short-lived", chain[:2], TTL_S)
    await d.record_prefix("long-lived", chain[2:], 10)
    assert await peer.match_prefix(chain[:2]) == ("short-lived", 2)
    await asyncio.sleep(PAST_TTL_S)
    assert await peer.match_prefix(chain[:2]) is None
    assert await peer.match_prefix(chain) == ("long-lived", 3)

    in_a_minute = time.time() + 60
    await d.restore_prefixes(
        [PrefixEntry(chain[0], "restored", in_a_minute), PrefixEntry(chain[2], "restored", in_a_minute)]
    )
    assert await peer.match_prefix(chain[:1]) == ("restored", 1)  # was gone: filled in
    assert await peer.match_prefix(chain) == ("long-lived", 3)  # was live: left alone


# ---------------------------------------------------------------------- degradation
# A ResilientDirectory against a redis-server that is stopped, frozen or wiped mid-run.


@pytest.fixture
async def outage(redis_server):
    """(resilient, peer): a worker's directory whose first reconnect attempt comes >= 0.8 s
    after an outage starts, and a plain client of the same Redis (another process)."""
    keys = KeyLayout("outage:")
    resilient = ResilientDirectory(
        RedisDirectory.from_url(redis_server.url, keys=keys, op_timeout_s=0.3), retry_initial_s=1.0, retry_max_s=1.0
    )
    peer = RedisDirectory.from_url(redis_server.url, keys=keys, op_timeout_s=0.3)
    yield resilient, peer
    await resilient.close()
    await peer.close()


async def wait_until_recovered(directory: ResilientDirectory, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while directory.is_degraded:
        assert time.monotonic() < deadline, "did not recover"
        await asyncio.sleep(0.05)


async def test_stopped_redis_degrades_to_local_and_recovery_respects_newer_epochs(
    redis_server, outage, caplog
):
    caplog.set_level(logging.INFO, logger="dsflash.kvcache.directory")
    resilient, peer = outage
    worker = decode_worker()
    chain = block_hashes(list(range(64)), 16)
    await resilient.register_worker(worker, 5)
    await resilient.register_worker(decode_worker("decode-1", incarnation="before"), 5)
    kept = await resilient.claim("kept", worker.worker_id, worker.incarnation, LEASE_S)
    lost = await resilient.claim("lost", worker.worker_id, worker.incarnation, LEASE_S)
    await resilient.record_prefix("kept", chain, 30)
    events = await resilient.subscribe()

    redis_server.stop()
    started = time.monotonic()
    # The worker keeps serving: every call answers from local state, quickly.
    assert await resilient.update("kept", worker.worker_id, kept, 500, "h500", LEASE_S)
    assert resilient.is_degraded
    fresh = await resilient.claim("fresh", worker.worker_id, worker.incarnation, LEASE_S)
    assert await resilient.heartbeat(worker.worker_id, WorkerLoad(num_running_requests=3))
    assert (await resilient.lookup("kept")).num_cached_tokens == 500
    assert (await resilient.find_owner("fresh")).record.epoch == fresh
    assert await resilient.match_prefix(chain) == ("kept", 4)
    assert [w.worker_id for w in await resilient.list_workers()] == [worker.worker_id, "decode-1"]
    assert time.monotonic() - started < 2.0
    assert [(e.kind, e.record.conversation_id) for e in await next_events(events, 2)] == [
        (EventKind.UPDATED, "kept"),
        (EventKind.CLAIMED, "fresh"),
    ]

    redis_server.start()  # same port, no data
    # Another worker claims "lost" in the new Redis before this one reconnects: a newer claim.
    theirs = await peer.claim("lost", "decode-9", "inc-9", LEASE_S)
    # And decode-1 restarted elsewhere under a new incarnation: not to be overwritten either.
    await peer.register_worker(decode_worker("decode-1", incarnation="after"), 5)
    assert resilient.is_degraded, "precondition: the recovery must not have run yet"
    await wait_until_recovered(resilient)

    registered = await peer.get_worker(worker.worker_id)
    assert registered.incarnation == worker.incarnation and registered.load.num_running_requests == 3
    assert (await peer.get_worker("decode-1")).incarnation == "after"
    kept_record = await peer.lookup("kept")
    assert (kept_record.epoch, kept_record.num_cached_tokens, kept_record.prefix_hash) == (kept, 500, "h500")
    assert (await peer.lookup("fresh")).epoch == fresh
    assert (await peer.lookup("lost")).epoch == theirs and theirs > lost
    assert (await peer.lookup("lost")).owner_id == "decode-9"
    assert await peer.match_prefix(chain) == ("kept", 4)
    # The worker that lost "lost" finds out on its next write; the others carry on.
    assert not await resilient.update("lost", worker.worker_id, lost, 1, "x", LEASE_S)
    assert await resilient.update("kept", worker.worker_id, kept, 600, "h600", LEASE_S)
    assert [(e.kind, e.record.conversation_id) for e in await next_events(events, 3)] == [
        (EventKind.RESTORED, "kept"),
        (EventKind.RESTORED, "fresh"),
        (EventKind.UPDATED, "kept"),
    ]
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()
    assert any("reachable again" in r.getMessage() for r in caplog.records if r.levelname == "INFO")
    assert not any("kept" in r.getMessage() for r in caplog.records)  # no conversation ids in logs


async def test_frozen_redis_costs_one_timeout_then_nothing(redis_server, outage):
    resilient, peer = outage
    worker = decode_worker()
    await resilient.register_worker(worker, 5)
    epoch = await resilient.claim("conv", worker.worker_id, worker.incarnation, LEASE_S)
    await resilient.subscribe()

    redis_server.pause()  # the port still accepts connections; nothing answers
    started = time.monotonic()
    assert (await resilient.lookup("conv")).epoch == epoch
    assert time.monotonic() - started < 1.0  # op_timeout_s = 0.3
    assert resilient.is_degraded
    started = time.monotonic()
    for i in range(20):
        await resilient.claim(f"frozen-{i}", worker.worker_id, worker.incarnation, LEASE_S)
    assert await resilient.heartbeat(worker.worker_id)
    assert time.monotonic() - started < 0.1  # degraded calls no longer touch Redis

    redis_server.resume()
    await wait_until_recovered(resilient)
    assert (await peer.lookup("frozen-19")).owner_id == worker.worker_id
    assert (await peer.lookup("conv")).epoch == epoch


async def test_redis_that_lost_its_data_between_calls_is_repopulated(redis_server, outage):
    resilient, peer = outage
    worker = decode_worker()
    await resilient.register_worker(worker, 5)
    epoch = await resilient.claim("conv", worker.worker_id, worker.incarnation, LEASE_S)

    redis_server.stop()
    redis_server.start()  # quick restart: no call saw the outage, but Redis forgot everything
    assert await resilient.heartbeat(worker.worker_id, incarnation=worker.incarnation)
    assert await resilient.update("conv", worker.worker_id, epoch, 42, "h42", LEASE_S)
    assert not resilient.is_degraded
    assert (await peer.get_worker(worker.worker_id)).incarnation == worker.incarnation
    record = await peer.lookup("conv")
    assert (record.epoch, record.num_cached_tokens) == (epoch, 42)


async def test_starting_while_redis_is_down(redis_server, outage):
    resilient, peer = outage
    redis_server.stop()
    worker = decode_worker()
    assert await resilient.register_worker(worker, 5) is None
    epoch = await resilient.claim("conv", worker.worker_id, worker.incarnation, LEASE_S)
    assert resilient.is_degraded

    redis_server.start()
    await wait_until_recovered(resilient)
    assert (await peer.find_owner("conv")).record.epoch == epoch


async def test_open_directory_picks_the_implementation(redis_server):
    from dsflash.kvcache.directory import DirectoryConfig, open_directory

    local = open_directory(DirectoryConfig())
    assert isinstance(local, LocalDirectory)
    shared = open_directory(DirectoryConfig(redis_url=redis_server.url, key_prefix="cfg:"))
    assert isinstance(shared, ResilientDirectory)
    await shared.register_worker(decode_worker(), 5)
    assert not shared.is_degraded
    assert await redis_server_keys(redis_server.url, "cfg:*") == ["cfg:{workers}", "cfg:{workers}:decode-0"]
    await shared.close()
    await local.close()
    with pytest.raises(ValueError):
        DirectoryConfig(op_timeout_s=60)


async def redis_server_keys(url: str, pattern: str) -> list[str]:
    from redis.asyncio import Redis

    client = Redis.from_url(url, decode_responses=True)
    try:
        return sorted(await client.keys(pattern))
    finally:
        await client.aclose()


# ---------------------------------------------------------------------- no leaks


async def exercise_every_key(directory) -> None:
    worker = decode_worker()
    await directory.register_worker(worker, TTL_S)
    assert await directory.heartbeat(worker.worker_id, WorkerLoad(num_running_requests=1))
    epoch = await directory.claim("conv", worker.worker_id, worker.incarnation, TTL_S)
    assert await directory.update("conv", worker.worker_id, epoch, 16, "h", TTL_S)
    released = await directory.claim("released", worker.worker_id, worker.incarnation, TTL_S)
    assert await directory.release("released", worker.worker_id, released)
    await directory.record_prefix("conv", block_hashes(list(range(32)), 16), TTL_S)


async def test_every_redis_key_has_a_ttl(redis_server):
    from redis.asyncio import Redis

    directory = RedisDirectory.from_url(redis_server.url, keys=KeyLayout("leak:"), epoch_retention_s=TTL_S)
    client = Redis.from_url(redis_server.url, decode_responses=True)
    await exercise_every_key(directory)
    keys = await client.keys("*")
    assert len(keys) == 7, keys  # 2 registry, record + epoch, epoch of "released", 2 prefix
    assert all(key.startswith("leak:") for key in keys)
    assert all([await client.pttl(key) > 0 for key in keys])
    await asyncio.sleep(PAST_TTL_S)
    assert await client.keys("*") == []
    await client.aclose()
    await directory.close()


async def test_local_directory_forgets_what_expired():
    directory = LocalDirectory(epoch_retention_s=TTL_S, sweep_interval_s=0.01)
    await exercise_every_key(directory)
    assert directory.num_entries() == 6  # as in Redis, less the worker zset
    await asyncio.sleep(PAST_TTL_S)
    await directory.lookup("anything")  # any call sweeps
    assert directory.num_entries() == 0
