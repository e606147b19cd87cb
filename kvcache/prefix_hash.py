"""Deterministic hashes of token sequences, shared by every process that routes or caches.

Two uses:
- `block_hashes(token_ids, block_size)`: one hash per *full* block of `block_size` tokens,
  chained, so hash i covers tokens [0, (i + 1) * block_size). Two prompts share hash i exactly
  when they share that whole prefix, which lets the prefix index (see `directory`) answer
  "longest cached prefix" with one key per block and no tree. The partial tail block is left
  out: the next turn extends it, so it could never match.
- `prefix_hash(token_ids)`: one hash of a whole sequence, stored in an ownership record so a
  reader can check that the owner's cache holds exactly the tokens it expects.

Python's `hash()` is salted per process (PYTHONHASHSEED), and LMCache has to ask every process
for the same seed to make its chunk hashes agree; blake2b over little-endian uint32 token ids is
the same on every host. The block size is mixed into the seed so chains built with different
block sizes never collide.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

DIGEST_BYTES = 16  # 128-bit: collisions are out of reach for any realistic number of blocks
_BLOCK_DOMAIN = b"dsflash/prefix-blocks/v1"
_SEQUENCE_DOMAIN = b"dsflash/token-sequence/v1"


def _pack(token_ids: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(token_ids)}I", *token_ids)
    except struct.error as exc:
        raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[str]:
    """Hex chain hashes of the full blocks of `token_ids`; hash i covers blocks 0..i."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    chain = hashlib.blake2b(_BLOCK_DOMAIN + block_size.to_bytes(4, "little"), digest_size=DIGEST_BYTES).digest()
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        chain = hashlib.blake2b(chain + _pack(token_ids[start : start + block_size]), digest_size=DIGEST_BYTES).digest()
        hashes.append(chain.hex())
    return hashes


def prefix_hash(token_ids: Sequence[int]) -> str:
    """Hex hash of the whole sequence (length included), for ownership records."""
    digest = hashlib.blake2b(_SEQUENCE_DOMAIN + len(token_ids).to_bytes(8, "little"), digest_size=DIGEST_BYTES)
    digest.update(_pack(token_ids))
    return digest.hexdigest()
