"""A decode worker's conversation caches and their ownership records.

After a turn the request's cache stays in the host cache (LRU under a byte budget) and the
worker claims the conversation in the directory (epoch-fenced) with its cached token count
and prefix hash. On the next turn any worker finds the best prefix: its own entry if it is
still the owner, else the live owner's (pulled host-to-host by the prefill worker), else
none (recompute). Eviction releases the record.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ..kvcache.directory import DirectoryUnavailable, OwnershipDirectory
from ..kvcache.host_cache import ConversationEntry, HostCache
from ..kvcache.prefix_hash import block_hashes, prefix_hash
from ..v1 import worker_pb2

log = logging.getLogger(__name__)

PREFIX_BLOCK_TOKENS = 64  # granularity of the gateway's prefix index


@dataclass
class PrefixSource:
    ref: worker_pb2.CacheRef | None
    kind: str  # none | local | peer
    num_tokens: int = 0
    entry: ConversationEntry | None = None  # pinned local entry: unpin after use


class Conversations:
    def __init__(self, host_cache_bytes: int, directory: OwnershipDirectory, lease_s: float, fingerprint: str,
                 on_evicted=None):
        self.directory, self.lease_s, self.fingerprint = directory, lease_s, fingerprint
        self.on_evicted = on_evicted
        self.cache = HostCache(host_cache_bytes, on_evict=self._evicted)
        self.worker_id = self.incarnation = self.address = ""
        self._aio: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    def bind(self, worker_id: str, incarnation: str, address: str, loop: asyncio.AbstractEventLoop) -> None:
        self.worker_id, self.incarnation, self.address, self._aio = worker_id, incarnation, address, loop

    # ------------------------------------------------------------ finding a prefix

    async def find_prefix(self, conversation_id: str, tokens: list[int]) -> PrefixSource:
        if not conversation_id:
            return PrefixSource(None, "none")
        try:
            owner = await self.directory.find_owner(conversation_id)
        except DirectoryUnavailable:
            owner = None
        if owner is not None and owner.worker.worker_id != self.worker_id:
            self.cache.remove(conversation_id)  # ours is older than the live owner's
            n = owner.record.num_cached_tokens
            if 0 < n < len(tokens) and prefix_hash(tokens[:n]) == owner.record.prefix_hash:
                return PrefixSource(self._ref(owner.worker.address, conversation_id, n), "peer", n)
            return PrefixSource(None, "none")
        entry = self.cache.match(conversation_id, tokens)
        if entry is None:
            return PrefixSource(None, "none")
        n = len(entry.tokens)
        return PrefixSource(self._ref(self.address, conversation_id, n), "local", n, entry)

    def _ref(self, address: str, handle: str, num_tokens: int) -> worker_pb2.CacheRef:
        return worker_pb2.CacheRef(worker_address=address, handle=handle, descriptor=worker_pb2.CacheDescriptor(
            layout_fingerprint=self.fingerprint, num_tokens=num_tokens))

    def done_with(self, source: PrefixSource) -> None:
        if source.entry is not None:
            self.cache.unpin(source.entry)

    # ------------------------------------------------------------ keeping a turn

    def keep(self, conversation_id: str, cache, tokens: list[int]) -> None:
        """Engine thread: a turn finished; its cache now belongs to the conversation."""
        cache.seal_full_pages()  # the next turn may fetch it from another worker: sums ready
        entry = ConversationEntry(conversation_id, cache, list(tokens))
        self.cache.put(entry)
        self._spawn(self._claim(entry))

    async def _claim(self, entry: ConversationEntry) -> None:
        cid = entry.conversation_id
        try:
            # one write: a record without its token count would send the next turn to recompute
            entry.epoch = await self.directory.claim(cid, self.worker_id, self.incarnation, self.lease_s,
                                                     len(entry.tokens), prefix_hash(entry.tokens))
            await self.directory.record_prefix(cid, block_hashes(entry.tokens, PREFIX_BLOCK_TOKENS), self.lease_s)
        except DirectoryUnavailable as exc:
            log.warning("could not record conversation ownership: %s", exc)

    def _evicted(self, entry: ConversationEntry) -> None:
        if self.on_evicted is not None:
            self.on_evicted(entry)
        if entry.epoch is not None:
            self._spawn(self._release(entry))

    async def _release(self, entry: ConversationEntry) -> None:
        try:
            await self.directory.release(entry.conversation_id, self.worker_id, entry.epoch)
        except DirectoryUnavailable:
            pass  # the lease expires by itself

    def _spawn(self, coro) -> None:
        def start():
            task = asyncio.ensure_future(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._aio.call_soon_threadsafe(start)
