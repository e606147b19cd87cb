"""Moving a request's cache between workers: descriptors on the wire, reservations, pushes.

The receiver reserves pool pages for the cache it expects (`reserve`) and sends their byte
ranges (`destination`); the holder writes its payload there over the transfer engine
(`push`), which returns only after the receiver verified every region's checksum; the
receiver then takes the metadata (`install`). Either side releases its pages as soon as the
handoff fails, so a dead peer strands nothing.

A pool on the model's device (pool.is_mirrored) is sent from, and received into, its host
staging copy: `push` copies the cache's ranges device -> host before the transport reads
them, `install` copies them host -> device before the model can. These two, and the seal of
full pages (pool.seal_pages), are the only places pool bytes are read or written on the host.
The copies run through `run`: a worker passes its engine loop's `call`, so that they queue
behind the model's work on the engine thread (another thread's device copies could break a
CUDA graph capture there); by default they run inline.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..model.config import ModelConfig
from ..v1 import kvcache_pb2, worker_pb2
from .paged import CacheDescriptor, PagedCache
from .pool import CachePool
from .transport.base import TransferEngine
from .transport.batch import TransferRequest

Runner = Callable[[Callable[[], object]], Awaitable[object]]


async def run_inline(fn: Callable[[], object]) -> object:
    return fn()


def descriptor_to_proto(desc: CacheDescriptor, payload_bytes: int = 0) -> worker_pb2.CacheDescriptor:
    return worker_pb2.CacheDescriptor(
        layout_fingerprint=desc.layout_fingerprint, num_tokens=desc.num_tokens,
        entry_counts={int(k): int(v) for k, v in desc.entry_counts.items()},
        tail_lengths={int(k): int(v) for k, v in desc.tail_lengths.items()},
        page_counts={int(k): int(v) for k, v in desc.page_counts.items()},
        ring_spans=[worker_pb2.RingSpan(valid_from=a, valid_to=b) for a, b in desc.ring_spans],
        history=list(desc.history), payload_bytes=payload_bytes)


def descriptor_from_proto(msg: worker_pb2.CacheDescriptor) -> CacheDescriptor:
    return CacheDescriptor(
        layout_fingerprint=msg.layout_fingerprint, num_tokens=msg.num_tokens,
        entry_counts=dict(msg.entry_counts), tail_lengths=dict(msg.tail_lengths),
        ring_spans=[(s.valid_from, s.valid_to) for s in msg.ring_spans], history=list(msg.history),
        page_counts=dict(msg.page_counts))


def reserve(pool: CachePool, config: ModelConfig, num_tokens: int) -> PagedCache:
    """Pages and a slot for an incoming cache of num_tokens (raises PoolExhausted)."""
    return PagedCache.reserve_for(pool, config, num_tokens)


def destination(endpoint: kvcache_pb2.TransportEndpoint, cache: PagedCache,
                num_tokens: int) -> worker_pb2.CacheDestination:
    """The byte ranges a num_tokens cache lands in, inside a reservation made by reserve()."""
    return worker_pb2.CacheDestination(endpoint=endpoint, ranges=[
        worker_pb2.ByteRange(segment=seg, offset=off, length=n) for seg, off, n in cache.byte_ranges(num_tokens)])


async def install(cache: PagedCache, desc: CacheDescriptor, run: Runner = run_inline) -> None:
    """Take the metadata of a cache whose bytes landed in the reservation, and put the bytes
    where the model reads them."""
    cache.apply(desc)
    if cache.pool.is_mirrored:
        await run(cache.stage_in)


@dataclass
class PushResult:
    bytes: int
    seconds: float
    transport: str


async def push(engine: TransferEngine, cache: PagedCache, dest: worker_pb2.CacheDestination,
               timeout_s: float | None = None, run: Runner = run_inline) -> PushResult:
    """Write the cache's payload into a peer's reserved ranges; returns once verified there.
    The caller keeps the cache unchanged until this returns."""
    local = cache.byte_ranges()
    remote = list(dest.ranges)
    if len(remote) < len(local):
        raise ValueError(f"destination has {len(remote)} ranges, the cache needs {len(local)}")
    requests = []
    for (seg, off, n), r in zip(local, remote):
        if r.length != n:
            raise ValueError(f"destination range of {r.length} bytes for a {n}-byte region")
        requests.append(TransferRequest(seg, off, r.segment, r.offset, n))
    started = time.perf_counter()
    if cache.pool.is_mirrored:
        await run(cache.stage_out)  # finished before any transport reads the host copy
    peer = await engine.connect(dest.endpoint)
    try:
        await engine.write_batch(peer, requests, timeout_s)
    finally:
        peer.close()
    total = sum(r.length for r in requests)
    kind = kvcache_pb2.TransportKind.Name(peer.kind).removeprefix("TRANSPORT_KIND_").lower()
    return PushResult(total, time.perf_counter() - started, kind)
