"""CSA2 compressor of a KV-source layer: `ratio` tokens -> one global entry, plus its index key.

Shapes: n new tokens, H hidden, D latent, Di index dim, G completed groups.
ratio 2: entry j pools tokens {2j, 2j+1} with a per-channel softmax gate (fp32);
ratio 1: every token is its own entry (the CED decoder's full-resolution KV).
latent = RMSNorm(pooled, compressor.norm); both outputs are rotated at position j*ratio
with the YaRN table:
  entry     = FP4q16(RoPE(latent))                               [D]   (QAT: e2m1, e4m3 scale / 16)
  index key = FP4q32(RoPE(RMSNorm(latent @ wk^T, indexer.k_norm))) [Di]  (QAT: e2m1, pow2 scale / 32)
A group still open at the end of a forward is carried in the cache (kv and gate of its tokens).
Around the GEMMs the chain is two ops calls (ops.compress_pool_norm, ops.norm_rope_fp4), one
launch each on the fast path (model/kernels/compressor.py).
"""

from __future__ import annotations

import torch

from ..batch import SeqRun, cat, run_rows
from ..config import LayerRole, ModelConfig
from ..device import to_device
from ..ops import ReferenceOps
from ..rope import Rope
from .norm import rms_norm


def compressor_projections(ops: ReferenceOps, role: LayerRole, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(kv, gate) [n, D] fp32 of rows x (kv alone at ratio 1): dense work whose shapes the rows
    alone set, so at decode it runs in the attention site's CUDA graph (DeepseekV41) and
    reaches `compress` as `projected`. Eagerly the two GEMMs cost the host ~0.3 ms a layer (H200)."""
    p = role.prefix
    kv = ops.linear(x, f"{p}.attn.compressor.wkv.weight")
    return (kv,) if role.ratio == 1 else (kv, ops.linear(x, f"{p}.attn.compressor.wgate.weight"))


def compress(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, runs: list[SeqRun],
             rope: Rope, qat: bool, projected: tuple[torch.Tensor, ...] | None = None) -> None:
    """xa [T, H]: the forward's attention inputs, run.rows of each run. Appends each run's
    completed entries to its cache. Projections, pooling, norms, RoPE and quantizers run once
    over all runs' rows and groups (row by row as for a run alone); only the open groups and
    the page writes are per run. `projected`: compressor_projections of every row of xa, where
    computed already."""
    if not runs:
        return  # a CED decoder pass: the encoder pass built every entry
    p, src, ratio = role.prefix, role.index, role.ratio
    if projected is None:
        projected = compressor_projections(ops, role, run_rows(xa, runs))
    else:
        projected = tuple(run_rows(t, runs) for t in projected)
    kv, gate = projected if ratio != 1 else (projected[0], None)  # [rows, D] fp32
    done: list[tuple[SeqRun, int, int]] = []  # (run, first new entry, new entries)
    kv_parts, gate_parts, local = [], [], 0
    for run in runs:
        rows, local = slice(local, local + run.n), local + run.n
        first, new = _complete_groups(run, src, ratio, kv[rows], None if gate is None else gate[rows],
                                      kv_parts, gate_parts)
        if new:
            done.append((run, first, new))
    if not done:
        return
    latent = ops.compress_pool_norm(cat(kv_parts), None if ratio == 1 else cat(gate_parts),
                                    ops.w(f"{p}.attn.compressor.norm.weight"), ratio, cfg.rms_norm_eps)  # [G, D]
    positions = torch.cat([torch.arange(first, first + new) for _, first, new in done]) * ratio
    cos, sin = rope.cos_sin("yarn", to_device(positions, latent.device))
    keys = ops.linear(latent, f"{p}.attn.indexer.wk.weight")  # [G, Di]
    k_norm = ops.w(f"{p}.attn.indexer.k_norm.weight")
    packed = None
    if qat:
        entries, entry_codes = ops.norm_rope_fp4(latent, cos, sin, 16, e4m3_scales=True)
        keys, key_codes = ops.norm_rope_fp4(keys, cos, sin, 32, norm_weight=k_norm, eps=cfg.rms_norm_eps)
        packed = (entry_codes, key_codes)
    else:
        entries = ops.rope(latent, cos, sin)
        keys = ops.rope(rms_norm(keys, k_norm, cfg.rms_norm_eps), cos, sin)
    type(done[0][0].cache).entries_append_runs(src, [(run.cache, new) for run, _, new in done], entries, keys,
                                                packed)


def _complete_groups(run: SeqRun, src: int, ratio: int, kv: torch.Tensor, gate: torch.Tensor | None,
                     kv_parts: list, gate_parts: list) -> tuple[int, int]:
    """Adds the run's tokens of complete groups to kv_parts/gate_parts (the open group before
    them first), keeps the new open group in the cache; returns (first new entry, new entries)."""
    cache = run.cache
    count = cache.num_entries(src)
    if ratio == 1:
        if count != run.start:
            raise RuntimeError(f"layer {src}: {count} entries before position {run.start}")
        kv_parts.append(kv)
        return count, run.n
    group_start = count * ratio
    tail = cache.tail(src)
    if tail is not None and tail[0].shape[0]:
        kv, gate = torch.cat([tail[0].to(kv.device), kv]), torch.cat([tail[1].to(kv.device), gate])
    if group_start + kv.shape[0] != run.start + run.n:
        raise RuntimeError(f"layer {src}: open group does not end at position {run.start}")
    done = ((run.start + run.n) // ratio) * ratio - group_start  # tokens in complete groups
    cache.set_tail(src, group_start, kv, gate, keep_from=group_start + done)
    if done:
        kv_parts.append(kv[:done])
        gate_parts.append(gate[:done])
    return count, done // ratio
