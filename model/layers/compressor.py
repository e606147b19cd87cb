"""CSA2 compressor of a KV-source layer: `ratio` tokens -> one global entry, plus its index key.

Shapes: n new tokens, H hidden, D latent, Di index dim, G completed groups.
ratio 2: entry j pools tokens {2j, 2j+1} with a per-channel softmax gate (fp32);
ratio 1: every token is its own entry (the CED decoder's full-resolution KV).
latent = RMSNorm(pooled, compressor.norm); both outputs are rotated at position j*ratio
with the YaRN table:
  entry     = FP4q16(RoPE(latent))                               [D]   (QAT: e2m1, e4m3 scale / 16)
  index key = FP4q32(RoPE(RMSNorm(latent @ wk^T, indexer.k_norm))) [Di]  (QAT: e2m1, pow2 scale / 32)
A group still open at the end of a forward is carried in the cache (kv and gate of its tokens).
"""

from __future__ import annotations

import torch

from ..batch import SeqRun
from ..config import LayerRole, ModelConfig
from ..ops import ReferenceOps
from ..rope import Rope, apply_rope
from .norm import rms_norm


def compress(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, run: SeqRun, rope: Rope,
             qat: bool) -> None:
    """xa [n, H]: this run's attention inputs. Appends the completed entries to run.cache."""
    p, src, ratio, cache = role.prefix, role.index, role.ratio, run.cache
    count = cache.num_entries(src)
    if ratio == 1:
        if count != run.start:
            raise RuntimeError(f"layer {src}: {count} entries before position {run.start}")
        latent = ops.linear(xa, f"{p}.attn.compressor.wkv.weight")  # [n, D]
        first_entry = count
    else:
        kv = ops.linear(xa, f"{p}.attn.compressor.wkv.weight")  # [n, D] fp32
        gate = ops.linear(xa, f"{p}.attn.compressor.wgate.weight")
        group_start = count * ratio
        tail = cache.tail(src)
        if tail is not None and tail[0].shape[0]:
            kv, gate = torch.cat([tail[0].to(kv.device), kv]), torch.cat([tail[1].to(kv.device), gate])
        if group_start + kv.shape[0] != run.start + run.n:
            raise RuntimeError(f"layer {src}: open group does not end at position {run.start}")
        done = ((run.start + run.n) // ratio) * ratio - group_start  # tokens in complete groups
        cache.set_tail(src, group_start, kv, gate, keep_from=group_start + done)
        groups = done // ratio
        if groups == 0:
            return
        weights = gate[:done].view(groups, ratio, -1).softmax(dim=1)
        latent = (kv[:done].view(groups, ratio, -1) * weights).sum(dim=1)  # [G, D]
        first_entry = count
    latent = rms_norm(latent, ops.w(f"{p}.attn.compressor.norm.weight"), cfg.rms_norm_eps)
    positions = torch.arange(first_entry, first_entry + latent.shape[0], device=latent.device) * ratio
    cos, sin = rope.cos_sin("yarn", positions)
    keys = rms_norm(ops.linear(latent, f"{p}.attn.indexer.wk.weight"), ops.w(f"{p}.attn.indexer.k_norm.weight"),
                    cfg.rms_norm_eps)
    keys = apply_rope(keys, cos, sin)
    entries = apply_rope(latent, cos, sin)
    packed = None
    if qat:
        keys, key_codes = ops.fp4_round_trip(keys, 32)
        entries, entry_codes = ops.fp4_round_trip(entries, 16, e4m3_scales=True)
        packed = (entry_codes, key_codes)
    cache.entries_append(src, entries, keys, packed)
