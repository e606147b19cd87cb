"""blocksum64: the checksum every transfer carries, computed chunk by chunk while data is hot.

Definition (over a region's bytes, independent of where they sit in memory):
- cut the bytes into 4 KiB blocks j = 0, 1, ...; the last block may be short;
- S_j = sum of the block's little-endian 64-bit words mod 2^64 (a short block's last word is
  zero-padded);
- checksum = sum_j S_j * W_j mod 2^64, with the odd weight W_j = (2j + 1) * 0x9E3779B97F4A7C15.

Why this and not crc32: measured on this 2-core VM (AMD EPYC, AVX-512), zlib.crc32 runs at
6.4 GiB/s; numpy's per-block uint64 sums at 45-55 GiB/s on a chunk that sits in L2/L3 (torch
was no faster once its per-call cost is counted, and it spreads large reductions over
threads the other process needs), against ~15-20 GiB/s for memcpy and ~3.5 GiB/s for
loopback TCP. Summed right after a chunk is received or copied, while it is still in cache,
the checksum costs a fraction of the copy; crc32 would cost 3x the copy.
What it catches: any corruption confined to one 8-byte word (a flipped bit or byte, always,
because an odd weight times a nonzero delta is nonzero mod 2^64), blocks that land in the
wrong place (the weights differ per position), truncation (lengths travel in the header).
What it does not promise: errors that cancel in a sum (+d in one word, -d in another of the
same block), which random corruption hits with probability ~2^-64 but a malicious peer can
construct; this is an integrity check against bugs and faults, not an authenticator.
"""

from __future__ import annotations

import threading
from typing import Iterable, NamedTuple

import numpy as np

from .errors import ChecksumMismatch

ALGORITHM = "blocksum64-v1"
BLOCK_BYTES = 4096
_WORDS_PER_BLOCK = BLOCK_BYTES // 8
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# Blocks summed per numpy call: enough to amortise the call, few enough to keep the tables
# small. numpy never spreads a reduction over threads, which matters on a 2-core host where
# the other core runs the peer. np.add.reduceat sums 4 KiB segments at ~75 GiB/s from L2,
# twice as fast as reshape(-1, 512).sum(axis=1), and takes a short last block as it comes.
_SUB_BLOCKS = 1024
_STARTS = np.arange(0, _SUB_BLOCKS * _WORDS_PER_BLOCK, _WORDS_PER_BLOCK)
# Columns [1, j]: one small dot product gives both sum_j S_j and sum_j j*S_j of a piece.
_MOMENTS = np.stack([np.ones(_SUB_BLOCKS, np.uint64), np.arange(_SUB_BLOCKS, dtype=np.uint64)], axis=1)


def _block_sums(words: np.ndarray) -> np.ndarray:
    """Sum of every 512 words (one 4 KiB block; the last may be short)."""
    if words.flags.aligned:
        return np.add.reduceat(words, _STARTS[:-(-len(words) // _WORDS_PER_BLOCK)])
    # Data at an odd byte offset: reduceat is slow on unaligned words, reshape-sum less so.
    full = len(words) // _WORDS_PER_BLOCK * _WORDS_PER_BLOCK
    sums = words[:full].reshape(-1, _WORDS_PER_BLOCK).sum(axis=1)
    return np.append(sums, words[full:].sum()) if full < len(words) else sums


class Checksum:
    """Running blocksum64 of one region; feed it the region's bytes in order.

    Every update but the last must be a multiple of BLOCK_BYTES long (transports move data
    in such steps); `digest()` may be called at any time.
    """

    __slots__ = ("_next_block", "_value", "_total", "_finished")

    def __init__(self) -> None:
        self._next_block = 0
        self._value = 0
        self._total = 0  # sum_j S_j: what placing these bytes later in a region adds (see Sealed)
        self._finished = False

    def _add(self, first_block: int, total: int, weighted: int) -> None:
        # sum_j S_j * (2(first+j) + 1) * G  ==  G * ((2 first + 1) * sum S_j + 2 * sum j S_j)
        self._value = (self._value + _GOLDEN * ((2 * first_block + 1) * total + 2 * weighted)) & _MASK64
        self._total = (self._total + total) & _MASK64

    def update(self, data: np.ndarray) -> None:
        if self._finished:
            raise ValueError("a short (final) block was already added")
        num_words = len(data) // 8
        words = np.frombuffer(data, dtype=np.uint64, count=num_words)
        for first in range(0, num_words, _SUB_BLOCKS * _WORDS_PER_BLOCK):
            sums = _block_sums(words[first:first + _SUB_BLOCKS * _WORDS_PER_BLOCK])
            total, weighted = np.dot(sums, _MOMENTS[:len(sums)]).tolist()
            self._add(self._next_block, total, weighted)
            self._next_block += len(sums)
        if len(data) % BLOCK_BYTES:  # a short last block: this region is complete
            if len(data) % 8:  # its last word, zero-padded, belongs to that same block
                last_word = int.from_bytes(data[num_words * 8:].tobytes(), "little")
                if num_words % _WORDS_PER_BLOCK == 0:
                    self._next_block += 1  # the padded word starts a block of its own
                self._add(self._next_block - 1, last_word, 0)
            self._finished = True

    def digest(self) -> int:
        return self._value

    def sealed(self, length: int) -> Sealed:
        return Sealed(length, self._value, self._total)


def checksum(data: np.ndarray) -> int:
    """blocksum64 of a whole region in one call (tests, callers caching source checksums)."""
    return seal(data).value


class Sealed(NamedTuple):
    """A region's checksum taken ahead of time, with what it needs to be joined to others."""

    length: int
    value: int
    total: int  # sum of its block sums

    def then(self, later: Sealed) -> Sealed:
        """The checksum of this region's bytes followed by `later`'s. Exact only when this
        region is whole 4 KiB blocks: `later`'s block j becomes block k + j, and its weight
        (2(k + j) + 1) G is its own plus 2 k G."""
        blocks = self.length // BLOCK_BYTES
        return Sealed(self.length + later.length,
                      (self.value + later.value + 2 * blocks * _GOLDEN * later.total) & _MASK64,
                      (self.total + later.total) & _MASK64)


def seal(data: np.ndarray) -> Sealed:
    """A whole region's checksum, in the form that joins to the next region's (Sealed.then)."""
    c = Checksum()
    c.update(data)
    return c.sealed(len(data))


class SealedSums:
    """Checksums of local regions whose bytes are final, taken when they became final (a KV
    page as prefill fills it), so that a transfer sending them reads no byte twice.

    A sender looks a piece up by (segment, offset, length): an exact seal, or seals laid end
    to end whose lengths (all but the last) are whole 4 KiB blocks. Anything else is summed
    while it is sent, as without seals. Whoever writes sealed bytes must drop the seal first
    (the KV pool does, when a page is freed or a cache is cut back); a seal left stale can
    only make the receiver's check fail, which means recompute, never accepted corruption.
    """

    def __init__(self) -> None:
        self._seals: dict[str, dict[int, Sealed]] = {}
        self._lock = threading.Lock()  # the pool seals on its thread, transfers look up on theirs

    def seal(self, segment: str, offset: int, data: np.ndarray) -> None:
        sealed = seal(data)
        with self._lock:
            self._seals.setdefault(segment, {})[offset] = sealed

    def drop(self, segment: str, offsets: Iterable[int]) -> None:
        with self._lock:
            seals = self._seals.get(segment)
            if seals:
                for offset in offsets:
                    seals.pop(offset, None)

    def lookup(self, segment: str, offset: int, length: int) -> int | None:
        """The checksum of [offset, offset + length) if seals cover it exactly, else None."""
        with self._lock:
            seals = self._seals.get(segment)
            if not seals:
                return None
            joined, end = None, offset + length
            while offset < end:
                part = seals.get(offset)
                if part is None or offset + part.length > end:
                    return None
                if joined is not None and joined.length % BLOCK_BYTES:
                    return None
                joined = part if joined is None else joined.then(part)
                offset += part.length
            return joined.value

    def __len__(self) -> int:
        with self._lock:
            return sum(len(seals) for seals in self._seals.values())


class StreamChecksums:
    """Checksums of a batch's regions laid end to end as one byte stream.

    `advance(pos)` sums every complete 4 KiB block (and every finished region's short tail)
    below stream position `pos` that is not summed yet. Transports call it right after a
    chunk lands (receiver) or right before it leaves (sender), while the chunk is in cache.
    A sender passes the sealed sums it has (`known`, None where it has none): those regions
    are not read again.
    """

    def __init__(self, views: list[np.ndarray], known: list[int | None] | None = None):
        self._views = views
        self._sums = [Checksum() for _ in views]
        self._known = known or [None] * len(views)  # sealed sums: those regions are not read
        self._region = 0
        self._region_start = 0  # stream position of the current region's first byte
        self._summed = 0  # bytes of the current region already summed
        self.total_bytes = sum(len(v) for v in views)

    def advance(self, pos: int) -> None:
        while self._region < len(self._views):
            view = self._views[self._region]
            available = min(pos - self._region_start, len(view))
            end = available if available == len(view) else available // BLOCK_BYTES * BLOCK_BYTES
            if end > self._summed and self._known[self._region] is None:
                self._sums[self._region].update(view[self._summed:end])
                self._summed = end
            if end < len(view):
                return
            self._region += 1
            self._region_start += len(view)
            self._summed = 0

    def finish(self) -> list[int]:
        self.advance(self.total_bytes)
        return [c.digest() if k is None else k for c, k in zip(self._sums, self._known)]


def check_verdict(expected: list[int], actual: list[int]) -> None:
    """Compare the sender's checksums with the receiver's, region by region."""
    if len(expected) != len(actual):
        raise ChecksumMismatch(f"{len(expected)} checksums for {len(actual)} regions")
    for index, (want, got) in enumerate(zip(expected, actual)):
        if want != got:
            raise ChecksumMismatch(f"region {index}: checksum {got:#018x} != sender's {want:#018x}",
                                   index)
