"""A pool on the model's device, staged through its host transfer segments (mirror.py).

On CPU the "device" buffers are ordinary tensors apart from the segments, so everything the
model writes is missing from the host copy until it is staged: a send that skipped the
device -> host copy would carry zeros (with checksums of those zeros, so the transport could
not tell), and a receive that skipped host -> device would leave the model reading zeros."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch

from dsflash.kvcache import handoff
from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.mirror import coalesce
from dsflash.kvcache.paged import PagedCache
from dsflash.kvcache.pool import CachePool
from dsflash.kvcache.transport import TransportConfig, open_engines
from dsflash.kvcache.transport.checksum import checksum
from dsflash.model.runner import step

CONFIG = TransportConfig(compatibility_hash="mirror-test", connect_timeout_s=2.0, stall_timeout_s=5.0)
PROMPT = 77


def _layout(model) -> CacheLayout:
    return CacheLayout.for_model(model.config, page_entries=8)


def _built(model, pool, ids, n=PROMPT) -> PagedCache:
    cache = PagedCache(pool, model.config)
    with torch.inference_mode():
        step(model, [cache], [ids[:n]])
    return cache


def _bytes(pool: CachePool, ranges, host: bool = False) -> list[torch.Tensor]:
    buffer = pool.host_buffer if host else pool.buffer
    return [buffer(seg)[off: off + n].clone() for seg, off, n in ranges]


def _send(sender, receiver, cache: PagedCache, into: CachePool, **push_kw) -> PagedCache:
    """The handoff as the workers do it: reserve, push into the reservation, install."""
    landing = handoff.reserve(into, cache.config, cache.num_tokens)
    dest = handoff.destination(receiver.endpoint(), landing, cache.num_tokens)

    async def move():
        await handoff.push(sender, cache, dest, **push_kw)
        desc = handoff.descriptor_from_proto(handoff.descriptor_to_proto(cache.descriptor()))
        await handoff.install(landing, desc)

    asyncio.run(move())
    return landing


def _continue(model, caches, ids) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [step(model, [c], [ids[PROMPT:PROMPT + 12]], logits="all").logits[0] for c in caches]


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_a_device_pool_cache_arrives_byte_for_byte_in_the_peers_device_buffers(golden_model, golden, kind):
    layout, ids = _layout(golden_model), golden[2]["input_ids"]
    with open_engines(CONFIG, (kind,)) as sender, open_engines(CONFIG, (kind,)) as receiver:
        send_pool = CachePool(layout, 64, 2, sender.allocate_segment, name="prefill-kv", device="cpu")
        recv_pool = CachePool(layout, 64, 2, receiver.allocate_segment, name="decode-kv", device="cpu")
        local_pool = CachePool(layout, 64, 2)
        cache, local = _built(golden_model, send_pool, ids), _built(golden_model, local_pool, ids)
        # the model wrote the device buffers only: the transports' copy is still empty
        assert not any(t.any() for t in _bytes(send_pool, cache.byte_ranges(), host=True))

        landing = _send(sender, receiver, cache, recv_pool)
        sent, arrived = _bytes(send_pool, cache.byte_ranges()), _bytes(recv_pool, landing.byte_ranges())
        assert all(torch.equal(a, b) for a, b in zip(arrived, sent))
        assert all(torch.equal(a, b) for a, b in zip(arrived, _bytes(local_pool, local.byte_ranges())))
        assert all(t.any() for t in arrived[:1])  # the slot: not trivially equal zeros
        # the model reads the received cache where it lies and continues it as the local one
        a, b = _continue(golden_model, [landing, local], ids)
        assert torch.equal(a, b)
        for c in (cache, landing, local):
            c.release()
        assert send_pool.is_empty() and recv_pool.is_empty() and local_pool.is_empty()


def test_sealed_pages_of_a_device_pool_are_summed_from_its_device_bytes(golden_model, golden):
    """A seal is the checksum of the bytes a send will read; a wrong one fails the receiver's check."""
    layout, ids = _layout(golden_model), golden[2]["input_ids"]
    with open_engines(CONFIG, ("tcp",)) as sender, open_engines(CONFIG, ("tcp",)) as receiver:
        pool = CachePool(layout, 64, 1, sender.allocate_segment, name="prefill-kv", sealed=sender.sealed,
                         device="cpu")
        cache = _built(golden_model, pool, ids)
        cache.seal_full_pages()
        size, device_pages = layout.page_bytes, pool.buffer(pool.pages_segment).numpy()
        full = [p for s, t in cache.page_table.items() for p in t[:cache.counts[s] // layout.page_entries]]
        assert full and len(pool.sealed) == len(full)
        for page in full:
            assert pool.sealed.lookup(pool.pages_segment, page * size, size) == checksum(
                device_pages[page * size:(page + 1) * size])
        landing = _send(sender, receiver, cache, CachePool(layout, 64, 1, receiver.allocate_segment,
                                                           name="decode-kv", device="cpu"))
        assert all(torch.equal(a, b) for a, b in zip(_bytes(landing.pool, landing.byte_ranges()),
                                                      _bytes(pool, cache.byte_ranges())))
        cache.release()
        assert len(pool.sealed) == 0


def test_snapshots_and_payloads_of_a_device_pool_carry_its_device_bytes(golden_model, golden):
    """copy_to (the decode engine's snapshot) and serialize stay on the device buffers; a
    snapshot reaches the host copy, and a peer, only through the push's staging."""
    layout, ids = _layout(golden_model), golden[2]["input_ids"]
    with open_engines(CONFIG, ("tcp",)) as sender, open_engines(CONFIG, ("tcp",)) as receiver:
        pool = CachePool(layout, 96, 3, sender.allocate_segment, name="decode-a-kv", device="cpu")
        other = CachePool(layout, 64, 2, receiver.allocate_segment, name="decode-b-kv", device="cpu")
        cache = _built(golden_model, pool, ids)
        snapshot = cache.copy_to(pool)
        desc, payload = cache.serialize()
        restored = PagedCache.deserialize(other, golden_model.config, desc, payload)
        assert torch.equal(payload, torch.cat(_bytes(pool, cache.byte_ranges())))
        assert not any(t.any() for t in _bytes(pool, snapshot.byte_ranges(), host=True))
        landing = _send(sender, receiver, snapshot, other)
        outs = _continue(golden_model, [cache, snapshot, restored, landing], ids)
        assert all(torch.equal(outs[0], o) for o in outs[1:])
        for c in (cache, snapshot, restored, landing):
            c.release()
        assert pool.is_empty() and other.is_empty()


def test_a_staging_copy_a_cancelled_push_left_queued_never_touches_released_pages(golden_model, golden):
    """A busy engine thread runs a push's copy later; if the push was cancelled and the cache
    released by then, its pages may already hold another cache's incoming bytes."""
    layout, ids = _layout(golden_model), golden[2]["input_ids"]
    queued = []

    async def busy_engine(fn):
        queued.append(fn)
        await asyncio.Event().wait()  # never done: the caller gives up first

    with open_engines(CONFIG, ("tcp",)) as sender, open_engines(CONFIG, ("tcp",)) as receiver:
        pool = CachePool(layout, 64, 1, sender.allocate_segment, name="prefill-kv", device="cpu")
        recv_pool = CachePool(layout, 64, 1, receiver.allocate_segment, name="decode-kv", device="cpu")
        cache = _built(golden_model, pool, ids)
        ranges = cache.byte_ranges()
        landing = handoff.reserve(recv_pool, cache.config, cache.num_tokens)
        dest = handoff.destination(receiver.endpoint(), landing, cache.num_tokens)

        async def cancelled_push():
            task = asyncio.ensure_future(handoff.push(sender, cache, dest, run=busy_engine))
            while not queued:
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run(cancelled_push())
        cache.release()
        assert queued[0]() == 0  # the engine thread gets to it now: nothing is copied
        assert not any(t.any() for t in _bytes(pool, ranges, host=True))
        landing.release()


def test_a_host_pool_is_its_segments_and_never_stages(golden_model, golden):
    """CPU workers: the model reads and writes the transfer segments, as before."""
    layout, ids = _layout(golden_model), golden[2]["input_ids"]

    async def no_staging(fn):
        raise AssertionError("a host pool has nothing to stage")

    with open_engines(CONFIG, ("tcp",)) as sender, open_engines(CONFIG, ("tcp",)) as receiver:
        pool = CachePool(layout, 64, 1, sender.allocate_segment, name="prefill-kv")
        recv_pool = CachePool(layout, 64, 1, receiver.allocate_segment, name="decode-kv")
        assert not pool.is_mirrored and pool.device.type == "cpu"
        for segment in (pool.pages_segment, pool.slots_segment):
            assert pool.buffer(segment).data_ptr() == pool.host_buffer(segment).data_ptr() \
                == sender.segment(segment).data_ptr()
        cache = _built(golden_model, pool, ids)
        assert pool.stage_out(cache.byte_ranges()) == 0
        landing = handoff.reserve(recv_pool, cache.config, cache.num_tokens)
        dest = handoff.destination(receiver.endpoint(), landing, cache.num_tokens)

        async def move():
            await handoff.push(sender, cache, dest, run=no_staging)
            await handoff.install(landing, cache.descriptor(), run=no_staging)

        asyncio.run(move())
        assert all(torch.equal(a, b) for a, b in zip(_bytes(recv_pool, landing.byte_ranges()),
                                                      _bytes(pool, cache.byte_ranges())))
        cache.release()
        landing.release()


def test_staging_copies_coalesced_runs_within_the_segments():
    assert coalesce([("p", 30, 10), ("s", 0, 5), ("p", 0, 10), ("p", 10, 10), ("p", 35, 10), ("p", 60, 0)]) == [
        ("p", 0, 20), ("p", 30, 45), ("s", 0, 5)]
    layout = CacheLayout(head_dim=64, index_dim=32, sliding_window=4, ring_capacity=8, num_ring_layers=1,
                         sources=(0,), ratios=(2,), page_entries=4, model_fingerprint="x")
    pool = CachePool(layout, 4, 1, device="cpu")
    pool.pages_buffer[: 2 * layout.page_bytes] = 7
    assert pool.stage_out([(pool.pages_segment, 0, layout.page_bytes),
                           (pool.pages_segment, layout.page_bytes, layout.page_bytes)]) == 2 * layout.page_bytes
    host = pool.host_buffer(pool.pages_segment)
    assert bool((host[: 2 * layout.page_bytes] == 7).all()) and not host[2 * layout.page_bytes:].any()
    with pytest.raises(ValueError, match="outside segment"):
        pool.stage_in([(pool.pages_segment, 3 * layout.page_bytes, 2 * layout.page_bytes)])


@pytest.mark.gpu
def test_a_gpu_mirror_page_locks_its_host_copy_and_round_trips_bytes():
    from dsflash.kvcache.mirror import DeviceMirror

    host = {"pages": torch.zeros(1 << 20, dtype=torch.uint8)}
    mirror = DeviceMirror(host, "cuda")
    assert mirror.pinned
    data = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    host["pages"].copy_(data)
    assert mirror.to_device([("pages", 4096, 65536), ("pages", 0, 4096)]) == 69632
    mirror.buffer("pages")[4096:8192] = 7
    assert mirror.to_host([("pages", 4096, 4096)]) == 4096
    assert torch.equal(mirror.buffer("pages")[:4096].cpu(), data[:4096])
    assert (host["pages"][4096:8192] == 7).all() and torch.equal(host["pages"][8192:], data[8192:])
