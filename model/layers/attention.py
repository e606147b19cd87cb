"""V4.1 attention sublayer: one shared 512-d latent as K and V, a window ring plus sparse
compressed entries, a per-head sink, inverse RoPE on the output, grouped low-rank output.

Shapes: T rows, n rows of one request, h heads, D latent, W window.
  qr = RMSNorm(x @ wq_a^T, q_norm)            [T, q_lora]
  q  = RoPE(qr @ wq_b^T)                       [T, h, D]
  kv = FP8q(RoPE(RMSNorm(x @ wkv^T, kv_norm))) [T, D]     K = V, written to the ring
  o  = attention over window [i-W+1, i] + selected entries, with sink
  out = wo_b(group-wise wo_a(RoPE^-1(o)))     [T, H]
A DSpark stage attends non-causally: every block row sees the stage ring up to the
anchor position and all block rows.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..batch import SeqRun
from ..config import LayerRole, ModelConfig
from ..kernels import attention_queries
from ..kernels.attention_queries import QueryHalves, whole_queries
from ..kernels.fp8_blockwise import Operand
from ..kernels.sparse_attention import sparse_attention_ref
from ..ops import ReferenceOps
from ..rope import Rope
from .attention_kernel import attend_block_in_place, attend_in_place, update_entries


# `project`'s side work (an index source's queries, a KV source's compressor projections)
# enqueued before wq_b, which the fast path then runs beside it on a side stream (False: after
# the projections, on the main stream, as before the thirty-fifth session). H200, 2026-12-04
# (bench/decode_ab.py, 4K, two rounds alternated, ms a step): batch 1 21.92, 23.57 -> 21.85,
# 22.04; batch 8 47.73, 47.19 -> 47.42, 46.92.
SIDE_BESIDE_WQ_B = True


def input_weights(prefix: str) -> tuple[str, str]:
    """The FP8 weights that read a block's attention input first (project's one product)."""
    return f"{prefix}.attn.wq_a", f"{prefix}.attn.wkv"


def project(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor | Operand,
            side: Callable[[torch.Tensor], tuple] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | QueryHalves, torch.Tensor, tuple]:
    """xa [T, H] (or its site's FP8 operand alone, where nothing else reads it: the site's
    keep_input) -> q_res [T, q_lora], q [T, h, D] (faithful prefill rows may have it in halves:
    attention_queries.SPLIT_QUERIES), kv [T, D]: before RoPE and quantization,
    and side(q_res) (or ()), which the fast path runs beside wq_b, the largest GEMM here
    (ops.beside). This and `grouped_output` have shapes set by T alone, so a CUDA graph can
    replay them (model/graphs.py); `attend` between them follows each request's cache."""
    p, eps, hd = role.prefix, cfg.rms_norm_eps, cfg.head_dim
    heads = cfg.num_heads // ops.parallel.world  # this rank's heads (model/parallel.py)
    # (the site's pass may have encoded xa for them: input_weights)
    encoded = xa if isinstance(xa, Operand) else ops.encoded_input(xa)
    q_lora, kv = ops.linear_many(xa if encoded is None else encoded, input_weights(p))
    q_res = ops.rms_norm(q_lora, ops.w(f"{p}.attn.q_norm.weight"), eps)
    work = (lambda: side(q_res)) if side is not None else (lambda: ())
    joined = ops.beside(work, xa.shape[0]) if side is not None and SIDE_BESIDE_WQ_B else None
    q_all = ops.attention_queries(q_res, f"{p}.attn.wq_b", heads, hd, _plain_channels(cfg))
    kv_all = ops.rms_norm(kv, ops.w(f"{p}.attn.kv_norm.weight"), eps)
    return q_res, q_all, kv_all, joined() if joined is not None else work()


def _plain_channels(cfg: ModelConfig) -> int:
    """attention_queries.PLAIN where SPLIT_QUERIES is on and a head's rotated channels lie past
    them, else 0 (the queries come whole)."""
    plain = attention_queries.PLAIN
    return plain if attention_queries.SPLIT_QUERIES and plain <= cfg.head_dim - cfg.rope_head_dim else 0


def attend(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
           q_all: torch.Tensor | QueryHalves, kv_all: torch.Tensor, runs: list[SeqRun], rope: Rope, qat: bool,
           block_mode: bool = False, queries: tuple[torch.Tensor, torch.Tensor] | None = None
           ) -> torch.Tensor | Operand:
    """Each run's RoPE, cache writes, compressor, indexer and attention -> o [T, h, D], or on the
    kernel path's prefill wo_a's FP8 operand of it (attention_kernel.attend_updated).
    `queries`: the indexer's queries and weights of every row, where computed already."""
    if qat and all(ops.reads_cache_in_place(run.cache) for run in runs):  # all runs at once
        if not block_mode:
            return attend_in_place(ops, cfg, role, xa, q_res, q_all, kv_all, runs, rope, queries)
        o = attend_block_in_place(ops, cfg, role, q_all, kv_all, runs, rope)
        if o is not None:
            return o
    hd = cfg.head_dim
    sink = ops.w(f"{role.prefix}.attn.attn_sink")
    q_whole = whole_queries(q_all)
    outputs = []
    for run in runs:
        rows = run.rows
        cos, sin = rope.for_run(role.rope, run)
        q = ops.attention_query(q_whole[rows], cos, sin)
        kv = ops.rope(kv_all[rows], cos, sin)
        packed = None
        if qat:
            kv, packed = ops.fp8_round_trip(kv)
        selected = valid = None
        if role.ratio:
            update_entries(ops, cfg, role, xa, q_res, run, rope, qat)
            topk = run.shared.get("topk")
            if topk is not None and topk.shape[1] > 0:
                valid = topk >= 0
                selected = run.cache.entries_gather(role.kv_source, topk.clamp_min(0)).to(xa.device)
        if block_mode:
            window_kv, mask = _block_window(run, role, kv)
            o = sparse_attention_ref(q, window_kv, mask, selected, valid, sink, hd**-0.5)
        else:
            o = _causal_attention(cfg, run, role, q, kv, packed, selected, valid, sink)
        outputs.append(ops.rope(o, cos, sin, inverse=True))
    return torch.cat(outputs)  # [T, h, D]


def _causal_attention(cfg: ModelConfig, run: SeqRun, role: LayerRole, q, kv, packed, selected, valid, sink):
    """Queries in blocks: a block of B queries sees at most B + W - 1 window keys, so a chunk
    costs O(n * (B + W)), not O(n^2). Writes this run's latents into the ring."""
    cache, layer, window = run.cache, role.index, cfg.sliding_window
    q_pos = run.positions_on(q.device)
    cached_pos = cache.window_positions(layer, run.start - window + 1, run.start, device=q.device)
    keys = torch.cat([cache.ring_read(layer, cached_pos).to(kv.device, torch.float32), kv])
    key_pos = torch.cat([cached_pos, q_pos])
    cache.ring_store(layer, run.start, kv, packed)
    offset = cached_pos.shape[0]
    block = max(window, 64)
    out = []
    for lo in range(0, run.n, block):
        hi = min(lo + block, run.n)
        first = max(0, offset + lo - window + 1)
        k_pos = key_pos[first: offset + hi]
        qp = q_pos[lo:hi].unsqueeze(1)
        mask = (k_pos.unsqueeze(0) <= qp) & (k_pos.unsqueeze(0) > qp - window)
        out.append(sparse_attention_ref(q[lo:hi], keys[first: offset + hi], mask,
                                        None if selected is None else selected[lo:hi],
                                        None if valid is None else valid[lo:hi], sink, cfg.head_dim**-0.5))
    return torch.cat(out)


def _block_window(run: SeqRun, role: LayerRole, kv: torch.Tensor):
    """DSpark block: the stage ring up to the anchor (run.start - 1) and every block row."""
    cache, layer = run.cache, role.index
    window = cache.config.sliding_window
    cached_pos = cache.window_positions(layer, run.start - window, run.start, device=kv.device)
    keys = torch.cat([cache.ring_read(layer, cached_pos).to(kv.device, torch.float32), kv])
    mask = torch.ones(run.n, keys.shape[0], dtype=torch.bool, device=keys.device)
    return keys, mask


def grouped_output(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, o: torch.Tensor | Operand) -> torch.Tensor:
    """o [T, h, D] -> [T, H]: block-diagonal wo_a over o_groups, then wo_b (summed over ranks).
    o may come as wo_a's FP8 operand already (attention_kernel.attend_updated)."""
    p = role.prefix
    groups = cfg.o_groups // ops.parallel.world
    flat = o if isinstance(o, Operand) else o.reshape(o.shape[0], -1)
    u = ops.grouped_linear(flat, f"{p}.attn.wo_a", groups)  # [T, G*r]
    return ops.parallel.all_reduce(ops.linear(u, f"{p}.attn.wo_b"))
