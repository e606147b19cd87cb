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
out. A turn that reaches another gateway replica falls back to tokenizing the text.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

DEFAULT_MAX_TOKENS = 4 << 20  # ~4M ids held, about 40 MB of Python ints in tuples


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class ReplyMemory:
    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.max_tokens = max_tokens
        self._ids: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()  # remember() runs on the event loop, lookup() in encoders

    def remember(self, text: str, ids) -> None:
        ids = tuple(ids)
        if not text or not ids or len(ids) > self.max_tokens:
            return
        key = _key(text)
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

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def held_tokens(self) -> int:
        return self._held
