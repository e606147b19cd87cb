"""The token ids of recent replies, by the exact text they decode to.

A client sends a reply back as text in the next turn's history. Tokenizing that text again
can give other ids than the ones the model generated (BPE has many spellings of one string,
and a sampled reply often takes an unusual one). The decode worker cached the generated ids,
and reuse needs the new prompt to start with exactly those ids: without this memory such a
turn is recomputed. The chat renderer asks here for each assistant body it writes and
splices in the generated ids when the text is the same (chat_encoding.render_chat).

Keys are digests of the text, so a lookup costs one hash of the body. Any client that sends
the same text gets the same ids: that gives away nothing, because the text decodes to itself.
The memory is per gateway process and bounded by a token budget, least recently used first
out. With Redis (the gateway's --redis-url) every reply is also written there, and a lookup
this process misses reads it, so a turn that reaches another gateway replica still quotes the
reply with its generated ids. A Redis that fails is skipped for a while: a lookup then costs
nothing, and the turn, at worst, is recomputed.
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import logging
import threading
import time
from collections import OrderedDict

from ..kvcache.directory.keys import KeyLayout

log = logging.getLogger("dsflash.gateway")

DEFAULT_MAX_TOKENS = 4 << 20  # ~4M ids held, about 40 MB of Python ints in tuples
SHARED_TTL_S = 24 * 3600  # a day: a conversation idle longer has likely left the workers' caches too
SHARED_TIMEOUT_S = 0.5  # one read or write
SHARED_BACKOFF_S = 10.0  # after a failure, Redis is not asked for this long


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class ReplyMemory:
    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, shared: SharedReplies | None = None):
        self.max_tokens = max_tokens
        self.shared = shared
        self._ids: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()  # remember() runs on the event loop, lookup() in encoders

    def remember(self, text: str, ids) -> bytes | None:
        """In this process (its key, or None where nothing was kept)."""
        ids = tuple(ids)
        if not text or not ids or len(ids) > self.max_tokens:
            return None
        key = _key(text)
        self._keep(key, ids)
        return key

    async def publish(self, text: str, ids) -> None:
        """Remember, and write it to Redis before returning: an agent's next turn may follow
        within milliseconds, on another replica."""
        key = self.remember(text, ids)
        if key is not None and self.shared is not None:
            await self.shared.put(key, ids)

    def _keep(self, key: bytes, ids: tuple[int, ...]) -> None:
        with self._lock:
            old = self._ids.pop(key, None)
            if old is not None:
                self._held -= len(old)
            self._ids[key] = ids
            self._held += len(ids)
            while self._held > self.max_tokens:
                _, dropped = self._ids.popitem(last=False)
                self._held -= len(dropped)

    def lookup(self, text: str) -> tuple[int, ...] | None:
        key = _key(text)
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                return ids
        ids = self.shared.get(key) if self.shared is not None else None
        if ids is not None and len(ids) <= self.max_tokens:
            self._keep(key, ids)
        return ids

    async def close(self) -> None:
        if self.shared is not None:
            await self.shared.close()

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def held_tokens(self) -> int:
        return self._held


class SharedReplies:
    """The replies in Redis, under `dsflash:reply:<digest>` as packed 32-bit ids. Writes come
    from the event loop, reads from the encoders' threads (a blocking client), each bounded
    by SHARED_TIMEOUT_S. Any failure is logged once and switches Redis off for
    SHARED_BACKOFF_S."""

    def __init__(self, url: str, keys: KeyLayout = KeyLayout(), ttl_s: float = SHARED_TTL_S):
        import redis
        import redis.asyncio

        options = dict(socket_timeout=SHARED_TIMEOUT_S, socket_connect_timeout=SHARED_TIMEOUT_S)
        self._reader = redis.Redis.from_url(url, **options)
        self._writer = redis.asyncio.Redis.from_url(url, **options)
        self._keys, self._ttl_s = keys, int(ttl_s)
        self._off_until = 0.0

    def _key(self, key: bytes) -> str:
        return self._keys.reply(key.hex())

    def _available(self) -> bool:
        return time.monotonic() >= self._off_until

    def _failed(self, what: str, exc: Exception) -> None:
        if self._available():
            log.warning("reply_memory_redis_unavailable op=%s error=%s: %s (skipped for %.0f s)",
                        what, type(exc).__name__, exc, SHARED_BACKOFF_S)
        self._off_until = time.monotonic() + SHARED_BACKOFF_S

    async def put(self, key: bytes, ids) -> None:
        if not self._available():
            return
        data = array.array("I", ids).tobytes()
        try:
            await asyncio.wait_for(self._writer.set(self._key(key), data, ex=self._ttl_s), SHARED_TIMEOUT_S)
        except Exception as exc:  # a lost write costs a recompute at most
            self._failed("write", exc)

    def get(self, key: bytes) -> tuple[int, ...] | None:
        if not self._available():
            return None
        try:
            data = self._reader.get(self._key(key))
        except Exception as exc:
            self._failed("read", exc)
            return None
        if data is None or len(data) % 4:
            return None
        return tuple(array.array("I", data))

    async def close(self) -> None:
        self._reader.close()
        await self._writer.aclose()
