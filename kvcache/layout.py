"""Byte layout of a request's cache in the real storage formats.

Global (persistent, grows with the context), per KV-source entry:
  KV latent  D FP4 codes (D/2 B) + D/16 e4m3 scales       (512-d: 256 + 32 B)
  index key  Di FP4 codes (Di/2 B) + Di/32 e8m0 scales     (128-d:  64 +  4 B)
  = 356 B per entry; 2.5 entries per token in the release = 890 B/token.
Entries live in fixed-size pages. Inside a page the four arrays are stored one after the
other (struct of arrays), so gathering selected entries reads whole KV rows and scoring all
index keys reads only the key array.

Per request (fixed size, one "slot"): a window ring per layer and DSpark stage of FP8 codes
+ e8m0 scales per 32, and the open ratio-2 groups (fp32 kv and gate of up to ratio-1 tokens).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass

from ..model.config import ModelConfig

LAYOUT_VERSION = 1


@dataclass(frozen=True)
class CacheLayout:
    head_dim: int
    index_dim: int
    sliding_window: int
    ring_capacity: int
    num_ring_layers: int
    sources: tuple[int, ...]  # KV-source layers
    ratios: tuple[int, ...]  # their compress ratios
    page_entries: int
    model_fingerprint: str  # what the bytes mean: the model's config

    # ---------------------------------------------------------------- entries and pages

    @property
    def kv_codes_bytes(self) -> int:
        return self.head_dim // 2

    @property
    def kv_scale_bytes(self) -> int:
        return self.head_dim // 16

    @property
    def key_codes_bytes(self) -> int:
        return self.index_dim // 2

    @property
    def key_scale_bytes(self) -> int:
        return self.index_dim // 32

    @property
    def entry_bytes(self) -> int:
        return self.kv_codes_bytes + self.kv_scale_bytes + self.key_codes_bytes + self.key_scale_bytes

    @property
    def page_bytes(self) -> int:
        return self.page_entries * self.entry_bytes

    def page_sections(self) -> dict[str, tuple[int, int]]:
        """name -> (byte offset in the page, bytes per entry)."""
        out, offset = {}, 0
        for name, width in (("kv_codes", self.kv_codes_bytes), ("kv_scales", self.kv_scale_bytes),
                            ("key_codes", self.key_codes_bytes), ("key_scales", self.key_scale_bytes)):
            out[name] = (offset, width)
            offset += width * self.page_entries
        return out

    @functools.cached_property  # asked by every indexer layer of every step
    def keys_aligned(self) -> bool:
        """Whether every entry's index-key codes start on 16 bytes and its key scales on 4 in
        the pages buffer (whose base torch aligns): kernels may then load them as wide words."""
        sections = self.page_sections()
        codes, scales = sections["key_codes"], sections["key_scales"]
        return (self.page_bytes % 16 == 0 and codes[0] % 16 == 0 and codes[1] % 16 == 0
                and scales[0] % 4 == 0 and scales[1] % 4 == 0)

    @property
    def entries_per_token(self) -> float:
        return sum(1.0 / r for r in self.ratios)

    @property
    def global_bytes_per_token(self) -> float:
        return self.entries_per_token * self.entry_bytes

    def entries_for(self, num_tokens: int) -> dict[int, int]:
        return {s: num_tokens // r for s, r in zip(self.sources, self.ratios)}

    def pages_for(self, num_tokens: int) -> int:
        return sum(-(-n // self.page_entries) for n in self.entries_for(num_tokens).values())

    # ---------------------------------------------------------------- the fixed slot

    @property
    def ring_row_bytes(self) -> int:
        return self.head_dim + self.head_dim // 32

    @property
    def ring_codes_offset(self) -> int:
        return 0

    @property
    def ring_scales_offset(self) -> int:
        return self.num_ring_layers * self.ring_capacity * self.head_dim

    @property
    def ring_bytes(self) -> int:
        return self.num_ring_layers * self.ring_capacity * self.ring_row_bytes

    def tail_offsets(self) -> dict[int, int]:
        """Byte offset of each ratio>1 source's open group (kv then gate, fp32) in the slot."""
        out, offset = {}, -(-self.ring_bytes // 16) * 16  # fp32 views need aligned offsets
        for s, r in zip(self.sources, self.ratios):
            if r > 1:
                out[s] = offset
                offset += 2 * (r - 1) * self.head_dim * 4
        return out

    def max_tail_tokens(self, source: int) -> int:
        return self.ratios[self.sources.index(source)] - 1

    @property
    def slot_bytes(self) -> int:
        total = -(-self.ring_bytes // 16) * 16
        for r in self.ratios:
            if r > 1:
                total += 2 * (r - 1) * self.head_dim * 4
        return -(-total // 64) * 64  # 64-byte aligned slots

    # ---------------------------------------------------------------- identity

    def fingerprint(self) -> str:
        """Compatibility hash exchanged in every handoff: two sides may share bytes only if equal."""
        blob = json.dumps({"version": LAYOUT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def for_model(cls, config: ModelConfig, page_entries: int = 256, ring_capacity: int | None = None) -> "CacheLayout":
        cap = ring_capacity or default_ring_capacity(config)
        return cls(
            head_dim=config.head_dim, index_dim=config.index_head_dim, sliding_window=config.sliding_window,
            ring_capacity=cap, num_ring_layers=config.num_all_layers, sources=tuple(config.kv_source_layers),
            ratios=tuple(config.compress_ratios[s] for s in config.kv_source_layers), page_entries=page_entries,
            model_fingerprint=model_fingerprint(config),
        )


def default_ring_capacity(config: ModelConfig) -> int:
    """One window plus room for two speculative blocks: writing a verification block never
    overwrites a position a later query still needs, so rejecting drafts needs no ring restore."""
    return config.sliding_window + 2 * config.dspark_block_size + 2


def model_fingerprint(config: ModelConfig) -> str:
    blob = json.dumps(asdict(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
