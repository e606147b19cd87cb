"""Conversation caches a decode worker keeps after a turn, least recently used first out.

An entry holds the cache of every token the model processed for the conversation (the
prompt and all outputs but the last), so the next turn, whose prompt extends those tokens,
only needs its new tokens computed. Entries being read by a peer are pinned and never
evicted. The byte budget counts the pool pages and the slot an entry occupies. Thread-safe:
the engine thread adds entries, RPC handlers read and evict them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .paged import PagedCache


@dataclass
class ConversationEntry:
    conversation_id: str
    cache: PagedCache
    tokens: list[int]  # the tokens whose KV the cache holds
    epoch: int | None = None  # ownership epoch in the directory, once claimed
    pins: int = 0
    last_used_s: float = field(default_factory=time.monotonic)

    @property
    def nbytes(self) -> int:
        return self.cache.pool_bytes


class HostCache:
    def __init__(self, budget_bytes: int, on_evict: Callable[[ConversationEntry], None] | None = None):
        self.budget_bytes = budget_bytes
        self.on_evict = on_evict
        self._entries: OrderedDict[str, ConversationEntry] = OrderedDict()
        self._lock = threading.RLock()
        self.evictions = 0

    # ------------------------------------------------------------ reading

    def match(self, conversation_id: str, tokens: list[int]) -> ConversationEntry | None:
        """The entry if its tokens are a strict prefix of `tokens` (pinned: unpin when done)."""
        with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is None:
                return None
            n = len(entry.tokens)
            if n >= len(tokens) or tokens[:n] != entry.tokens:
                return None
            self._entries.move_to_end(conversation_id)
            entry.last_used_s = time.monotonic()
            entry.pins += 1
            return entry

    def pin(self, conversation_id: str) -> ConversationEntry | None:
        with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is not None:
                entry.pins += 1
            return entry

    def unpin(self, entry: ConversationEntry) -> None:
        with self._lock:
            entry.pins = max(0, entry.pins - 1)
            if entry.pins == 0 and self._entries.get(entry.conversation_id) is not entry:
                entry.cache.release()  # replaced while a peer read it
            self._trim()

    # ------------------------------------------------------------ writing

    def put(self, entry: ConversationEntry) -> None:
        """Keep a finished turn's cache (replacing the conversation's older one)."""
        with self._lock:
            old = self._entries.pop(entry.conversation_id, None)
            if old is not None and old.pins == 0:
                old.cache.release()
            self._entries[entry.conversation_id] = entry
            self._trim()

    def remove(self, conversation_id: str) -> ConversationEntry | None:
        with self._lock:
            entry = self._entries.pop(conversation_id, None)
            if entry is not None and entry.pins == 0:
                entry.cache.release()
            return entry

    def evict(self, needed_bytes: int) -> int:
        """Evict unpinned entries, oldest first, until needed_bytes are freed; returns bytes freed."""
        with self._lock:
            freed = 0
            for entry in list(self._entries.values()):
                if freed >= needed_bytes:
                    break
                if entry.pins == 0:
                    freed += self._evict(entry)
            return freed

    def _trim(self) -> None:
        for entry in list(self._entries.values()):
            if self.nbytes <= self.budget_bytes:
                break
            if entry.pins == 0:
                self._evict(entry)

    def _evict(self, entry: ConversationEntry) -> int:
        nbytes = entry.nbytes
        del self._entries[entry.conversation_id]
        entry.cache.release()
        self.evictions += 1
        if self.on_evict is not None:
            self.on_evict(entry)
        return nbytes

    def clear(self) -> None:
        with self._lock:
            for entry in list(self._entries.values()):
                if entry.pins == 0:
                    self._entries.pop(entry.conversation_id)
                    entry.cache.release()

    # ------------------------------------------------------------ accounting

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[ConversationEntry]:
        with self._lock:
            return list(self._entries.values())
