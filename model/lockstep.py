"""One worker, several ranks: rank 0 serves, the other ranks follow its forwards.

Tensor-parallel attention and expert-parallel MoE (parallel.py) need every rank in every
forward: each computes its heads and experts, and the partial sums meet in all-reduces.
Rank 0 runs the whole worker (gRPC, engine, pool, transfers); before each call that holds
collectives (a target forward, a CED encoder or decoder pass, the drafter's stage blocks) it
announces the call to the other ranks (`Leader.announce`), which run the same call on their
own weights and their own copy of the KV pool (`follow`).

An announcement carries, over a pipe to each rank:
- what to call, with each run's tokens, positions and its cache's bookkeeping (CacheView);
- the pool writes rank 0 made since the last one outside any forward (kvcache/replica.py),
  whose bytes then follow over the process group (NCCL between GPUs), with the call's
  tensor arguments.
The other ranks' results are dropped: the all-reduces hand every rank the same sums, so
rank 0's are theirs. With DSFLASH_LOCKSTEP_CHECK=1 each call also carries a digest of its
caches' bytes, and a rank whose copy differs stops with an error (tests turn it on).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..kvcache.replica import CacheView, CacheViews, PoolWrites
from .batch import SeqRun

CALLS = ("forward", "encode", "decode_rows", "draft_streams")


@dataclass
class _Call:
    kind: str  # one of CALLS, or "stop"
    views: list[CacheView] = field(default_factory=list)
    runs: list[tuple[int, list[int], int, list[int]]] = field(default_factory=list)  # (view, tokens, start, history)
    options: dict = field(default_factory=dict)
    tensors: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)  # broadcast after the message
    zeroed: list[tuple[str, int, int]] = field(default_factory=list)
    written: list[tuple[str, int, int]] = field(default_factory=list)  # bytes broadcast after the message
    digests: list[str] | None = None  # DSFLASH_LOCKSTEP_CHECK: each view's bytes as rank 0 holds them


class Leader:
    """Rank 0's side: `conns` are pipes to ranks 1..W-1, `device` where this rank's
    collectives run (its GPU, or the CPU over gloo)."""

    def __init__(self, conns, device: torch.device, on_failure=None):
        """`on_failure()` runs when a call fails here: the other ranks may be waiting in a
        collective this rank will never reach, so the worker cannot go on (ranks.py ends it)."""
        self.conns, self.device = list(conns), torch.device(device)
        self.on_failure = on_failure
        self.pool = None  # the worker's KV pool: attach() before the first call
        self.views = CacheViews()
        self.check = os.environ.get("DSFLASH_LOCKSTEP_CHECK", "0") == "1"

    def attach(self, pool) -> None:
        """Follow this pool's writes from now on (the ranks allocated a pool of the same shape)."""
        pool.writes = PoolWrites()
        self.pool = pool

    @contextmanager
    def announce(self, kind: str, runs: list[SeqRun], tensors: tuple[torch.Tensor, ...] = (), **options):
        """Send the call to the other ranks, then compute it here (the context's body)."""
        if any(getattr(run.cache, "pool", None) is not self.pool for run in runs):
            raise ValueError("tensor-parallel ranks follow caches in the worker's KV pool only")
        views, index, specs = [], {}, []
        for run in runs:
            cache = run.cache
            if id(cache) not in index:
                index[id(cache)] = len(views)
                views.append(self.views.view(cache))
            specs.append((index[id(cache)], run.host_tokens().tolist(), run.start, list(run.history)))
        zeroed, written = self.pool.writes.take()
        call = _Call(kind, views, specs, options, [(tuple(t.shape), t.dtype) for t in tensors], zeroed, written)
        if self.check:
            call.digests = [_digest(run.cache) for run in {id(run.cache): run for run in runs}.values()]
        self._send(call)
        if written:
            buffers = self.pool.buffer
            packed = torch.cat([buffers(segment)[start:end] for segment, start, end in written])
            dist.broadcast(packed.to(self.device), src=0)
        for t in tensors:
            dist.broadcast(t.to(self.device).contiguous(), src=0)
        try:
            with self.pool.writes.computing():
                yield
        except Exception:
            if self.on_failure is not None:
                self.on_failure()
            raise

    def stop(self) -> None:
        try:
            self._send(_Call("stop"))
        except (BrokenPipeError, OSError):
            pass  # a rank that is gone already

    def _send(self, call: _Call) -> None:
        message = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
        for conn in self.conns:
            conn.send_bytes(message)


def follow(model, pool, conn) -> None:
    """Ranks 1..W-1: run rank 0's announced calls until it says stop (or is gone)."""
    device = model.device
    views = CacheViews(pool, model.config)
    comm = device if device.type == "cuda" else torch.device("cpu")
    while True:
        try:
            call: _Call = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if call.kind == "stop":
            return
        if call.kind not in CALLS:
            raise ValueError(f"unknown call {call.kind!r} from rank 0")
        _apply_writes(pool, call.zeroed, call.written, comm)
        tensors = []
        for shape, dtype in call.tensors:
            t = torch.empty(shape, dtype=dtype, device=comm)
            dist.broadcast(t, src=0)
            tensors.append(t.to(device))
        caches = [views.open(view) for view in call.views]
        if call.digests is not None and [_digest(cache) for cache in caches] != call.digests:
            raise RuntimeError(f"a cache's bytes differ from rank 0's before a {call.kind} call: "
                               f"a pool write was not replicated")
        runs = [SeqRun(cache=caches[i], tokens=torch.tensor(tokens, dtype=torch.long), start=start, history=history)
                for i, tokens, start, history in call.runs]
        with torch.inference_mode():
            getattr(model, call.kind)(runs, *tensors, **call.options)


def _digest(cache) -> str:
    """The bytes a cache owns (slot, then its used pages), hashed."""
    h = hashlib.blake2b(digest_size=16)
    for segment, start, length in cache.byte_ranges():
        h.update(cache.pool.buffer(segment)[start:start + length].cpu().numpy().tobytes())
    return h.hexdigest()


def _apply_writes(pool, zeroed, written, comm: torch.device) -> None:
    for segment, start, end in zeroed:
        pool.buffer(segment)[start:end].zero_()
    if not written:
        return
    packed = torch.empty(sum(end - start for _, start, end in written), dtype=torch.uint8, device=comm)
    dist.broadcast(packed, src=0)
    offset = 0
    for segment, start, end in written:
        pool.buffer(segment)[start:end].copy_(packed[offset: offset + end - start])
        offset += end - start
