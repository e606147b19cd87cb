"""Unit tests of the transfer engine's parts: checksum, batch planning, states, selection."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from dsflash.kvcache.transport import (InvalidRequest, TransferRequest, TransferState,
                                       TransportUnavailable, choose_kind, open_engines)
from dsflash.kvcache.transport.batch import BatchRecord, TransferOp, plan_batch
from dsflash.kvcache.transport.checksum import (BLOCK_BYTES, Checksum, SealedSums, StreamChecksums, checksum,
                                                seal)
from dsflash.kvcache.transport.errors import TransferError
from dsflash.kvcache.transport.faults import NO_FAULTS, BatchFaults
from dsflash.kvcache.transport.memory import SegmentTable
from dsflash.v1 import kvcache_pb2 as pb
from test_transport_peer import ProcessPeer, digest, make_config, pattern

# ---------------------------------------------------------------- checksum

DATA = pattern(7, 3 * BLOCK_BYTES * 1000 + 13)


@pytest.mark.parametrize("length", [1, 7, 8, 9, 4095, 4096, 4097, 100_003, len(DATA)])
def test_checksum_is_independent_of_alignment_and_chunking(length):
    data = DATA[:length]
    shifted = np.empty(length + 5, np.uint8)
    shifted[5:] = data
    running = Checksum()
    for start in range(0, length, 3 * BLOCK_BYTES):
        running.update(data[start:start + 3 * BLOCK_BYTES])
    assert checksum(data) == checksum(shifted[5:]) == running.digest()


def test_checksum_catches_every_single_byte_flip_and_block_swaps():
    data = DATA[: 4 * BLOCK_BYTES + 100].copy()
    reference = checksum(data)
    rng = np.random.default_rng(0)
    for index in rng.integers(0, len(data), 300):
        for mask in (0x01, 0x80, 0xFF):
            data[index] ^= mask
            assert checksum(data) != reference
            data[index] ^= mask
    swapped = data.copy()
    swapped[:BLOCK_BYTES], swapped[BLOCK_BYTES:2 * BLOCK_BYTES] = data[BLOCK_BYTES:2 * BLOCK_BYTES], data[:BLOCK_BYTES]
    assert checksum(swapped) != reference
    assert checksum(data[:-1]) != reference


def test_stream_checksums_match_per_region_sums_in_any_steps():
    regions = [DATA[:5000], DATA[10_000:10_001], DATA[20_000:120_000]]
    stream = StreamChecksums(regions)
    for pos in (0, 4096, 4999, 5000, 5001, 50_000, 99_999):
        stream.advance(pos)
    assert stream.finish() == [checksum(r) for r in regions]


@pytest.mark.parametrize("lengths", [[4096, 5], [8192, 4096 * 3, 100_003], [40_960, 1, ]])
def test_seals_of_whole_blocks_join_into_the_checksum_of_their_run(lengths):
    cuts = np.cumsum([0] + lengths)
    parts = [seal(DATA[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    joined = parts[0]
    for part in parts[1:]:
        joined = joined.then(part)
    assert joined.value == checksum(DATA[:cuts[-1]]) and joined.length == cuts[-1]


def test_sealed_sums_answer_exact_and_joined_spans_only():
    table = SealedSums()
    for offset, length in ((0, 8192), (8192, 4096), (12_288, 5000), (40_000, 22_784)):
        table.seal("kv", offset, DATA[offset:offset + length])
    assert table.lookup("kv", 40_000, 22_784) == checksum(DATA[40_000:62_784])
    assert table.lookup("kv", 0, 17_288) == checksum(DATA[:17_288])  # three seals end to end
    assert table.lookup("kv", 8192, 9096) == checksum(DATA[8192:17_288])
    assert table.lookup("kv", 0, 8192 + 100) is None  # ends inside a seal
    assert table.lookup("kv", 4096, 4096) is None  # starts inside one
    assert table.lookup("other", 0, 8192) is None
    table.drop("kv", [8192])
    assert table.lookup("kv", 0, 17_288) is None and table.lookup("kv", 0, 8192) is not None
    assert len(table) == 3
    stream = StreamChecksums([DATA[:8192], DATA[50:60]], known=[12345, None])
    assert stream.finish() == [12345, checksum(DATA[50:60])]  # a known sum is taken as given


def test_checksum_update_after_short_block_is_refused():
    running = Checksum()
    running.update(DATA[:100])
    with pytest.raises(ValueError):
        running.update(DATA[:4096])


# ---------------------------------------------------------------- batch planning and states


@pytest.fixture
def table():
    t = SegmentTable(shared=False)
    t.allocate("a", 1 << 20)
    yield t
    t.close()


def test_plan_merges_requests_contiguous_on_both_sides(table):
    requests = [TransferRequest("a", 100, "p", 1000, 50), TransferRequest("a", 0, "p", 900, 100),
                TransferRequest("a", 500, "p", 1150, 10)]
    plan = plan_batch(TransferOp.WRITE, requests, table, {"p": 4096})
    assert [(p.peer_offset, p.length) for p in plan.pieces] == [(900, 150), (1150, 10)]
    assert [r.offset for r in plan.regions()] == [900, 1150]
    assert [len(v) for v in plan.local_views()] == [150, 10]
    assert plan.num_bytes == 160


@pytest.mark.parametrize("requests", [
    [],
    [TransferRequest("a", 0, "p", 0, 0)],
    [TransferRequest("a", 0, "p", 4000, 100)],
    [TransferRequest("zz", 0, "p", 0, 10)],
    [TransferRequest("a", 0, "p", 0, 10), TransferRequest("a", 10, "p", 5, 10)],
])
def test_plan_rejects_bad_batches(table, requests):
    with pytest.raises(InvalidRequest):
        plan_batch(TransferOp.WRITE, requests, table, {"p": 4096})


def test_reads_may_share_sources_but_not_destinations(table):
    shared_source = [TransferRequest("a", 0, "p", 0, 10), TransferRequest("a", 100, "p", 0, 10)]
    assert len(plan_batch(TransferOp.READ, shared_source, table, {"p": 4096}).pieces) == 2
    with pytest.raises(InvalidRequest):
        plan_batch(TransferOp.READ, [TransferRequest("a", 0, "p", 0, 10), TransferRequest("a", 5, "p", 50, 10)],
                   table, {"p": 4096})


@pytest.mark.parametrize("parts", [2, 3, 5])
@pytest.mark.parametrize("lengths", [[1 << 20], [70_000, 300_001, 5, 123_456, 500_000], [4096] * 64])
def test_stripes_cover_the_batch_once_in_order(table, parts, lengths):
    requests, local, peer = [], 0, 7  # peer offsets with gaps: no two pieces merge
    for n in lengths:
        requests.append(TransferRequest("a", local, "p", peer, n))
        local, peer = local + n, peer + n + 1
    plan = plan_batch(TransferOp.WRITE, requests, table, {"p": 4 << 20})
    stripes = plan.stripes(parts, min_bytes=8192)
    assert 2 <= len(stripes) <= parts
    stream = [(s.stream_offset, p) for s in stripes for p in s.pieces]
    # laid end to end the stripes are the batch: same bytes, same order, nothing twice
    joined, pos = [], 0
    for s in stripes:
        assert s.stream_offset == pos and s.num_bytes == sum(p.length for p in s.pieces) > 0
        pos += s.num_bytes
        for origin, p in zip(s.origins, s.pieces):
            whole = plan.pieces[origin]
            within = p.local_offset - whole.local_offset
            assert p.peer_offset - whole.peer_offset == within and within % 4096 == 0
            joined.append((origin, within, p.length))
    assert pos == plan.num_bytes and len(stream) == len(joined)
    covered = {}
    for origin, within, n in joined:
        assert covered.get(origin, 0) == within  # each piece continues where it stopped
        covered[origin] = within + n
    assert covered == {i: p.length for i, p in enumerate(plan.pieces)}
    sizes = [s.num_bytes for s in stripes]
    assert max(sizes) - min(sizes) <= 2 * 4096 + max(0, plan.num_bytes // len(stripes) // 100)


def test_small_batches_stay_whole(table):
    plan = plan_batch(TransferOp.READ, [TransferRequest("a", 0, "p", 0, 100_000)], table, {"p": 1 << 20})
    assert plan.stripes(4, min_bytes=64_000) == [plan]  # two stripes would be under 64 KB
    assert plan.stripes(1, min_bytes=1) == [plan]


def test_faults_shift_into_a_stripe():
    faults = BatchFaults(corrupt_at_byte=1000, drop_after_bytes=5000)
    later = faults.shifted(4000)
    assert later.corrupt_offset(0, 10_000) is None  # the flip was in an earlier stripe
    assert later.drop_within(0, 10_000) == 1000
    assert faults.shifted(500).corrupt_offset(0, 1000) == 500
    assert NO_FAULTS.shifted(123) is NO_FAULTS


def test_batch_state_moves_forward_and_failure_is_terminal():
    record = BatchRecord(TransferOp.WRITE, 10, 1)
    record.advance(TransferState.TRANSFERRING)
    with pytest.raises(RuntimeError):
        record.advance(TransferState.PENDING)
    record.fail(TransferError("boom"))
    assert record.state is TransferState.FAILED
    with pytest.raises(RuntimeError):
        record.advance(TransferState.DONE)
    done = BatchRecord(TransferOp.READ, 10, 1)
    done.advance(TransferState.DONE)
    done.fail(TransferError("late"))  # a finished batch is not rewritten as failed
    assert done.state is TransferState.DONE


# ---------------------------------------------------------------- choosing a transport


def endpoint(kinds, host_id="h1"):
    return pb.TransportEndpoint(kinds=kinds, host_id=host_id)


@pytest.mark.parametrize("local, peer, host, expected", [
    ([pb.TRANSPORT_KIND_TCP, pb.TRANSPORT_KIND_SHM], [pb.TRANSPORT_KIND_SHM, pb.TRANSPORT_KIND_TCP], "h1",
     pb.TRANSPORT_KIND_SHM),
    ([pb.TRANSPORT_KIND_TCP, pb.TRANSPORT_KIND_SHM], [pb.TRANSPORT_KIND_SHM, pb.TRANSPORT_KIND_TCP], "h2",
     pb.TRANSPORT_KIND_TCP),
    ([pb.TRANSPORT_KIND_RDMA, pb.TRANSPORT_KIND_SHM, pb.TRANSPORT_KIND_TCP],
     [pb.TRANSPORT_KIND_TCP, pb.TRANSPORT_KIND_RDMA], "h1", pb.TRANSPORT_KIND_RDMA),
])
def test_choose_kind_prefers_rdma_then_same_host_shm_then_tcp(local, peer, host, expected):
    assert choose_kind(local, "h1", endpoint(peer, host)) == expected


def test_choose_kind_without_common_transport():
    with pytest.raises(TransportUnavailable):
        choose_kind([pb.TRANSPORT_KIND_SHM], "h1", endpoint([pb.TRANSPORT_KIND_SHM], "h2"))


def test_open_engines_serves_one_segment_over_shm_and_tcp():
    """A worker's engines: one endpoint, one memory. A same-host peer gets shm; a peer
    that looks remote gets tcp; both write into the same segment."""
    peer = ProcessPeer("shm")
    try:
        with open_engines(make_config(), ("shm", "tcp")) as engines:
            local = engines.allocate_segment("kv", 1 << 20).numpy()
            local[:] = pattern(3, 1 << 20)
            endpoint_ = engines.endpoint()
            assert set(endpoint_.kinds) == {pb.TRANSPORT_KIND_SHM, pb.TRANSPORT_KIND_TCP}
            assert endpoint_.tcp.port and endpoint_.shm.socket_name

            async def both():
                near = await engines.connect(peer.endpoint)
                assert near.kind == pb.TRANSPORT_KIND_SHM
                await engines.write_batch(near, [TransferRequest("kv", 0, "kv", 0, 1 << 20)])

            asyncio.run(both())
            assert peer.digests([("kv", 0, 1 << 20)]) == [digest(local)]
    finally:
        peer.close()


def test_open_engines_far_peer_uses_tcp():
    near, far = open_engines(make_config(), ("shm", "tcp")), open_engines(make_config(), ("shm", "tcp"))
    try:
        far.allocate_segment("kv", 1 << 16)
        near.allocate_segment("kv", 1 << 16)[:] = 5
        remote = far.endpoint()
        remote.host_id = "another-host"  # as if it ran elsewhere

        async def go():
            peer = await near.connect(remote)
            assert peer.kind == pb.TRANSPORT_KIND_TCP
            await near.write_batch(peer, [TransferRequest("kv", 0, "kv", 0, 1 << 16)])

        asyncio.run(go())
        assert bool((far.segment("kv") == 5).all())
    finally:
        near.close()
        far.close()
