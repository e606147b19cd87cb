"""Contract suite of the KV transfer engine, run against every transport.

fake: in-process engines on one FakeFabric. tcp and shm: the peer is a separate process
(test_transport_peer.py), so sockets, shared memory and deaths are real: SIGSTOP plays a hung
peer, SIGKILL a crashed one. rdma runs only where pyverbs imports and a device is listed.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import numpy as np
import pytest

from dsflash.kvcache.transport import (ChecksumMismatch, EngineClosed, FakeFabric, FaultPlan,
                                       IncompatiblePeer, InvalidRequest, PeerRestarted,
                                       PeerUnreachable, TransferRequest,
                                       TransferState, TransferTimeout)
from test_transport_peer import (SEGMENT_BYTES, InProcessPeer, ProcessPeer, digest, leak_report,
                                 make_config, make_engine, pattern)


def rdma_available() -> bool:
    try:
        from dsflash.kvcache.transport.rdma import list_devices

        return bool(list_devices())
    except Exception:
        return False


KINDS = ["fake", "shm", "tcp",
         pytest.param("rdma", marks=pytest.mark.skipif(not rdma_available(),
                                                        reason="no pyverbs or no RDMA device"))]
LOCAL_SEED, PEER_SEED = 2, 1


def run(coro):
    return asyncio.run(coro)


def start_peer(kind: str, fabric: FakeFabric):
    return InProcessPeer(fabric) if kind == "fake" else ProcessPeer(kind)


class Side:
    """The engine under test, in this process, and its connection to a peer."""

    def __init__(self, kind: str, peer, fabric: FakeFabric, **kwargs):
        self.kind, self.peer = kind, peer
        handshake = None
        if kind == "rdma":
            async def handshake(endpoint, request):
                return peer.rdma_accept(request)
        self.engine = make_engine(kind, fabric, rdma_handshake=handshake, **kwargs)
        self.data = self.engine.allocate_segment("kv", SEGMENT_BYTES).numpy()
        self.data[:] = pattern(LOCAL_SEED)
        self.handle = None

    def connect(self, endpoint=None):
        self.handle = run(self.engine.connect(endpoint or self.peer.endpoint))
        return self.handle

    def write(self, requests, **kw):
        return run(self.engine.write_batch(self.handle, requests, **kw))

    def read(self, requests, **kw):
        return run(self.engine.read_batch(self.handle, requests, **kw))


def random_requests(seed: int, count: int, max_len: int = 300_000) -> list[TransferRequest]:
    """`count` requests at random offsets and lengths, destinations disjoint on both sides."""
    rng = np.random.default_rng(seed)
    slot = SEGMENT_BYTES // count
    local_slots, peer_slots = rng.permutation(count), rng.permutation(count)
    requests = []
    for a, b in zip(local_slots, peer_slots):
        length = int(rng.integers(1, min(slot, max_len)))
        local_off = int(a) * slot + int(rng.integers(0, slot - length + 1))
        peer_off = int(b) * slot + int(rng.integers(0, slot - length + 1))
        requests.append(TransferRequest("kv", local_off, "kv", peer_off, length))
    return requests


def peer_regions(requests):
    return [(r.peer_segment, r.peer_offset, r.length) for r in requests]


@pytest.fixture(scope="module")
def fabric():
    return FakeFabric()


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def shared_peer(kind, fabric):
    """One long-lived peer per kind, for tests that leave it healthy."""
    peer = start_peer(kind, fabric)
    yield peer
    peer.close()


@pytest.fixture
def side(kind, shared_peer, fabric):
    sides = []

    def make(**kwargs) -> Side:
        s = Side(kind, shared_peer, fabric, **kwargs)
        s.connect()
        sides.append(s)
        return s

    yield make
    for s in sides:
        s.engine.close()


# ---------------------------------------------------------------- data moves exactly


def test_write_batch_many_random_requests_is_exact(side, shared_peer):
    local = side()
    requests = random_requests(seed=10, count=200)
    receipt = local.write(requests)
    assert receipt.state is TransferState.DONE
    assert receipt.num_bytes == sum(r.length for r in requests)
    expected = [digest(local.data[r.local_offset:r.local_offset + r.length]) for r in requests]
    assert shared_peer.digests(peer_regions(requests)) == expected


def test_read_batch_many_random_requests_is_exact(side, shared_peer):
    local = side()
    shared_peer.fill(PEER_SEED)
    source = pattern(PEER_SEED)
    requests = random_requests(seed=11, count=200)
    local.read(requests)
    for r in requests:
        np.testing.assert_array_equal(local.data[r.local_offset:r.local_offset + r.length],
                                      source[r.peer_offset:r.peer_offset + r.length])


def test_large_contiguous_round_trip(side, shared_peer):
    local = side()
    whole = [TransferRequest("kv", 0, "kv", 0, SEGMENT_BYTES)]
    local.write(whole)
    local.data[:] = 0
    local.read(whole)
    np.testing.assert_array_equal(local.data, pattern(LOCAL_SEED))


def test_concurrent_batches_on_one_peer(side, shared_peer):
    local = side()
    requests = random_requests(seed=20, count=200)
    batches = [requests[i::4] for i in range(4)]  # disjoint destinations

    async def all_at_once():
        return await asyncio.gather(*(local.engine.write_batch(local.handle, b) for b in batches))

    assert all(r.state is TransferState.DONE for r in run(all_at_once()))
    for batch in batches:
        expected = [digest(local.data[r.local_offset:r.local_offset + r.length]) for r in batch]
        assert shared_peer.digests(peer_regions(batch)) == expected


def test_segment_allocated_after_connect_is_reachable(side, shared_peer, kind):
    local = side()
    name = f"late-{time.monotonic_ns()}"
    shared_peer.allocate(name, 1 << 20, seed=5)
    if kind == "rdma":  # RDMA learns rkeys from the endpoint: reconnect with a fresh one
        local.connect(shared_peer.refresh_endpoint())
    local.read([TransferRequest("kv", 0, name, 4096, 65536)])
    np.testing.assert_array_equal(local.data[:65536], pattern(5, 1 << 20)[4096:4096 + 65536])


# ---------------------------------------------------------------- bad data is never success


@pytest.mark.parametrize("op", ["write", "read"])
def test_corruption_in_flight_raises_checksum_mismatch(side, shared_peer, op):
    local = side(faults=FaultPlan(corrupt_at_byte=123_457))
    requests = random_requests(seed=30, count=40)
    with pytest.raises(ChecksumMismatch):
        getattr(local, op)(requests)
    getattr(local, op)(requests)  # the plan is spent: the retry is clean and verified
    if op == "write":
        expected = [digest(local.data[r.local_offset:r.local_offset + r.length]) for r in requests]
        assert shared_peer.digests(peer_regions(requests)) == expected


def page_runs(first_offset: int) -> list[TransferRequest]:
    """Pool-like requests: a run of 3 pages of 3 x 4 KiB, contiguous on both sides (one merged
    piece whose sum joins the pages' seals), and 4 pages of an odd size, scattered."""
    run = [TransferRequest("kv", first_offset + k * 12288, "kv", 3_000_000 + k * 12288, 12288)
           for k in range(3)]
    odd = [TransferRequest("kv", first_offset + 100_000 + k * 60_000, "kv", 4_000_000 - k * 70_000, 22_784)
           for k in range(4)]
    return run + odd


def sealed_side(kind):
    if kind not in ("tcp", "rdma"):
        pytest.skip(f"{kind} does not send checksums (shm compares bytes; fake sums both ends)")


@pytest.mark.parametrize("op", ["write", "read"])
def test_sealed_sums_are_sent_and_a_stale_one_is_caught(side, shared_peer, kind, op):
    """A sender with sealed sums sends them without re-reading: the bytes arrive exactly; if
    the bytes changed under a seal (a bug), the receiver's check fails, it never accepts them."""
    sealed_side(kind)
    local = side()
    requests = page_runs(first_offset=500_000)
    ours = [(r.local_segment, r.local_offset, r.length) for r in requests]
    if op == "write":
        for spans in ours:
            local.engine.sealed.seal(spans[0], spans[1], local.data[spans[1]:spans[1] + spans[2]])
        local.write(requests)
        assert shared_peer.digests(peer_regions(requests)) == [digest(local.data[o:o + n]) for _, o, n in ours]
        local.data[500_000 + 12288 + 5] ^= 0x40  # the second page of the merged run, seal kept
        with pytest.raises(ChecksumMismatch):
            local.write(requests)
        local.engine.sealed.drop("kv", [500_000 + 12288])
        local.write(requests)  # summed as it is sent again
        assert shared_peer.digests(peer_regions(requests)) == [digest(local.data[o:o + n]) for _, o, n in ours]
    else:
        shared_peer.fill(PEER_SEED)
        shared_peer.seal(peer_regions(requests))
        local.read(requests)
        assert [digest(local.data[o:o + n]) for _, o, n in ours] == shared_peer.digests(peer_regions(requests))
        shared_peer.fill(PEER_SEED + 7)  # new bytes under the old seals
        with pytest.raises(ChecksumMismatch):
            local.read(requests)
        shared_peer.seal(peer_regions(requests))
        local.read(requests)
        assert [digest(local.data[o:o + n]) for _, o, n in ours] == shared_peer.digests(peer_regions(requests))
        shared_peer.unseal(peer_regions(requests))
        shared_peer.fill(PEER_SEED)


@pytest.mark.parametrize("op", ["write", "read"])
def test_connection_dropped_mid_transfer(side, op):
    local = side(faults=FaultPlan(drop_after_bytes=1_000_000))
    requests = random_requests(seed=40, count=40)
    with pytest.raises(PeerUnreachable):
        getattr(local, op)(requests)
    local.connect()  # the peer survived the broken connection and still serves
    getattr(local, op)(requests)


def test_injected_failure_and_delay(side):
    local = side(faults=FaultPlan(fail_with=TransferTimeout))
    requests = random_requests(seed=50, count=10)
    with pytest.raises(TransferTimeout):
        local.write(requests)
    local.write(requests)
    slow = side(faults=FaultPlan(delay_s=5.0))
    start = time.monotonic()
    with pytest.raises(TransferTimeout):
        slow.write(requests, timeout_s=0.5)
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize("bad", [
    TransferRequest("kv", 0, "kv", SEGMENT_BYTES - 10, 11),  # past the peer's end
    TransferRequest("kv", SEGMENT_BYTES - 10, "kv", 0, 11),  # past the local end
    TransferRequest("kv", 0, "no-such-segment", 0, 10),
    TransferRequest("kv", 0, "kv", 0, 0),
])
def test_invalid_requests_are_refused_and_connection_survives(side, bad):
    local = side()
    with pytest.raises(InvalidRequest):
        local.write([bad])
    local.write([TransferRequest("kv", 0, "kv", 0, 4096)])


def test_overlapping_destinations_are_refused(side):
    local = side()
    with pytest.raises(InvalidRequest):
        local.write([TransferRequest("kv", 0, "kv", 0, 100), TransferRequest("kv", 1000, "kv", 50, 100)])
    with pytest.raises(InvalidRequest):
        local.read([TransferRequest("kv", 0, "kv", 0, 100), TransferRequest("kv", 50, "kv", 1000, 100)])


# ---------------------------------------------------------------- handshake


def test_incompatible_peer_is_refused(side, kind, shared_peer, fabric):
    other = Side(kind, shared_peer, fabric, config=make_config("another-model-hash"))
    try:
        with pytest.raises(IncompatiblePeer):
            other.connect()
    finally:
        other.engine.close()


def test_stale_incarnation_is_refused(side, kind, shared_peer):
    local = side()
    stale = type(shared_peer.endpoint)()
    stale.CopyFrom(shared_peer.endpoint)
    stale.engine_id = "0" * 32  # same address, an engine that no longer exists
    with pytest.raises(PeerUnreachable) as info:
        local.connect(stale)
    if kind != "fake":
        assert isinstance(info.value, PeerRestarted)


# ---------------------------------------------------------------- dead and hung peers


def test_hung_then_killed_peer_fails_fast_and_never_hangs(kind, fabric):
    """A stopped peer gives TransferTimeout within the stall timeout and serves again once
    resumed; killed mid-transfer it gives PeerUnreachable within seconds; its endpoint then
    refuses connects at once. (fake: a delay plays the hang, close() the death.)"""
    peer = start_peer(kind, fabric)
    local = Side(kind, peer, fabric)
    big = [TransferRequest("kv", 0, "kv", 0, SEGMENT_BYTES)]
    try:
        local.connect()
        if kind == "fake":
            local.engine._faults.plan = FaultPlan(delay_s=10.0, max_faults=2)
        else:
            peer.pause()
        start = time.monotonic()
        with pytest.raises(TransferTimeout):
            local.write(big, timeout_s=1.0 if kind == "fake" else 30.0)  # tcp/shm: the 1 s stall
        assert time.monotonic() - start < 3.0
        if kind != "fake":
            peer.resume()
            local.write(big)  # recovered: the timed-out connection was replaced
            peer.pause()

        async def killed_mid_transfer():
            transfer = asyncio.ensure_future(local.engine.write_batch(local.handle, big, timeout_s=30.0))
            await asyncio.sleep(0.3)
            assert not transfer.done(), transfer.exception()  # in flight, blocked on the peer
            killed_at = time.monotonic()
            peer.kill()
            with pytest.raises(PeerUnreachable):
                await transfer
            return time.monotonic() - killed_at

        assert run(killed_mid_transfer()) < 3.0
        start = time.monotonic()
        with pytest.raises(PeerUnreachable):
            local.connect()
        assert time.monotonic() - start < 1.5
    finally:
        local.engine.close()
        if kind != "fake":
            peer.kill()


def test_cancelled_batch_releases_its_connection(side, shared_peer, kind):
    if kind == "fake":
        pytest.skip("the fake's delay is an asyncio sleep: cancellation is trivial")
    local = side()
    big = [TransferRequest("kv", 0, "kv", 0, SEGMENT_BYTES)]

    async def cancel_while_blocked():
        shared_peer.pause()
        try:
            transfer = asyncio.ensure_future(local.engine.write_batch(local.handle, big))
            await asyncio.sleep(0.2)
            transfer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await transfer
        finally:
            shared_peer.resume()

    run(cancel_while_blocked())
    local.write(big)  # a fresh connection; the peer is healthy


# ---------------------------------------------------------------- teardown


def _local_resources() -> dict:
    report = leak_report()
    report["threads"] = sorted(t.name for t in threading.enumerate() if t.name.startswith("kv-"))
    return report


def test_close_leaves_nothing_behind(kind, fabric):
    gc.collect()
    before = _local_resources()
    peer = start_peer(kind, fabric)
    local = Side(kind, peer, fabric)
    local.connect()
    local.write(random_requests(seed=60, count=20))
    local.read(random_requests(seed=61, count=20))
    local.engine.close()
    with pytest.raises(EngineClosed):
        local.write(random_requests(seed=62, count=2))
    del local
    gc.collect()
    assert _local_resources() == before
    peer_report = peer.close()
    assert peer_report == {"threads": [], "memfds": [], "sockets": 0, "mapped": [], "shm_files": []}
