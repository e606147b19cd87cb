"""Attention of V4.1 queries over window keys plus selected compressed entries, with a sink.

Shapes: n queries, h heads, D latent (K = V), W window keys, k selected entries per query.
Per head: s = q.k / sqrt(D); o = sum e^(s-m) v / (sum e^(s-m) + e^(sink-m)). The sink only
grows the denominator, so a query with nothing visible returns zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import dot_exact_rhs, e2m1_to_float, e4m3_to_float, interpreting


def sparse_attention_ref(q: torch.Tensor, window_kv: torch.Tensor, window_mask: torch.Tensor,
                         selected_kv: torch.Tensor | None, selected_valid: torch.Tensor | None,
                         sink: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, h, D]; window_kv [W, D] shared by all queries, window_mask [n, W] bool;
    selected_kv [n, k, D] per query, selected_valid [n, k] bool; sink [h]. Returns [n, h, D] fp32."""
    q = q.float()
    logits = torch.einsum("nhd,wd->nhw", q, window_kv.float()) * scale
    logits = logits.masked_fill(~window_mask.unsqueeze(1), float("-inf"))
    parts = [logits]
    if selected_kv is not None and selected_kv.shape[1] > 0:
        picked = torch.einsum("nhd,nkd->nhk", q, selected_kv.float()) * scale
        parts.append(picked.masked_fill(~selected_valid.unsqueeze(1), float("-inf")))
    sinks = sink.float().view(1, -1, 1).expand(q.shape[0], -1, 1)
    combined = torch.cat(parts + [sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)
    width = logits.shape[-1]
    out = torch.einsum("nhw,wd->nhd", probs[..., :width], window_kv.float())
    if len(parts) > 1:
        out = out + torch.einsum("nhk,nkd->nhd", probs[..., width:-1], selected_kv.float())
    return out


@triton.jit
def _online(q, keys, valid, m_i, l_i, acc, scale):
    """One tile of keys (K = V) into the running softmax of one query's head block."""
    logits = dot_exact_rhs(q, tl.trans(keys), tl.zeros((q.shape[0], keys.shape[0]), tl.float32)) * scale
    logits = tl.where(valid[None, :], logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(logits - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = dot_exact_rhs(p, keys, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _sparse_attention_kernel(q_ptr, ring_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, sink_ptr, o_ptr,
                             part_ml, part_acc, H, W, K, K_PER_SPLIT, scale, sqn, sqh, swn, sen, son, soh,
                             D: tl.constexpr, HB: tl.constexpr, KT: tl.constexpr, HW_FP8: tl.constexpr,
                             SPLITS: tl.constexpr):
    """Program (query i, head block, split s). With one split it reads every key and writes the
    output. With more (decode: few queries, so few programs otherwise), split 0 reads the
    window, split s >= 1 the s-th slice of the entries, and each writes its running max, sum
    and accumulator for _combine_kernel."""
    i = tl.program_id(0)
    h0 = tl.program_id(1) * HB
    split = tl.program_id(2)
    heads = h0 + tl.arange(0, HB)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + i * sqn + heads[:, None] * sqh + d[None, :], mask=heads[:, None] < H, other=0.0).to(tl.float32)
    m_i = tl.full((HB,), float("-inf"), tl.float32)
    l_i = tl.zeros((HB,), tl.float32)
    acc = tl.zeros((HB, D), tl.float32)
    kt = tl.arange(0, KT)
    # window: FP8 e4m3 rows, one e8m0 scale per 32 values
    if split == 0:
        for t0 in range(0, W, KT):
            j = t0 + kt
            off = tl.load(win_off + i * swn + j, mask=j < W, other=-1)
            soff = tl.load(win_soff + i * swn + j, mask=j < W, other=0)
            valid = off >= 0
            codes = tl.load(ring_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0)
            sbytes = tl.load(ring_ptr + soff[:, None] + (d // 32)[None, :], mask=valid[:, None], other=127)
            keys = e4m3_to_float(codes, HW_FP8) * tl.exp2(sbytes.to(tl.float32) - 127.0)
            m_i, l_i, acc = _online(q, keys, valid, m_i, l_i, acc, scale)
    # selected compressed entries: packed e2m1 (low nibble first), one e4m3 scale per 16 values
    # Each value's nibble is picked from its byte by a shift: a join + reshape (as fp4_moe did),
    # feeding both dots of the online softmax, compiled to wrong values on H200 (Triton 3.6).
    if SPLITS == 1:
        first = 0
        last = K
    else:  # split 0 had the window: an empty range here
        first = tl.maximum(split - 1, 0) * K_PER_SPLIT
        last = tl.where(split == 0, first, tl.minimum(first + K_PER_SPLIT, K))
    shift = (d % 2) * 4
    for t0 in range(first, last, KT):
        j = t0 + kt
        off = tl.load(ent_off + i * sen + j, mask=j < last, other=-1)
        soff = tl.load(ent_soff + i * sen + j, mask=j < last, other=0)
        valid = off >= 0
        packed = tl.load(page_ptr + off[:, None] + (d // 2)[None, :], mask=valid[:, None], other=0).to(tl.int32)
        values = e2m1_to_float((packed >> shift[None, :]) & 0xF)
        sbytes = tl.load(page_ptr + soff[:, None] + (d // 16)[None, :], mask=valid[:, None], other=0)
        keys = values * e4m3_to_float(sbytes, HW_FP8)
        m_i, l_i, acc = _online(q, keys, valid, m_i, l_i, acc, scale)
    if SPLITS == 1:
        _finish(sink_ptr, heads, H, m_i, l_i, acc, o_ptr + i * son + heads[:, None] * soh + d[None, :])
    else:
        base = (i * SPLITS + split) * H + heads
        tl.store(part_ml + 2 * base, m_i, mask=heads < H)
        tl.store(part_ml + 2 * base + 1, l_i, mask=heads < H)
        tl.store(part_acc + base[:, None] * D + d[None, :], acc, mask=heads[:, None] < H)


@triton.jit
def _finish(sink_ptr, heads, H, m_i, l_i, acc, out_ptrs):
    """The sink joins the denominator only; a query that saw nothing returns zeros."""
    sink = tl.load(sink_ptr + heads, mask=heads < H, other=0.0)
    m_fin = tl.maximum(m_i, sink)
    l_i = l_i * tl.exp(m_i - m_fin) + tl.exp(sink - m_fin)
    out = acc * tl.exp(m_i - m_fin)[:, None] / l_i[:, None]
    tl.store(out_ptrs, out, mask=(heads < H)[:, None])


@triton.jit
def _combine_kernel(part_ml, part_acc, sink_ptr, o_ptr, H, son, soh,
                    D: tl.constexpr, HB: tl.constexpr, SPLITS: tl.constexpr):
    """Merge the splits' partial softmaxes of one (query, head block)."""
    i = tl.program_id(0)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    d = tl.arange(0, D)
    m_i = tl.full((HB,), float("-inf"), tl.float32)
    l_i = tl.zeros((HB,), tl.float32)
    acc = tl.zeros((HB, D), tl.float32)
    for split in range(SPLITS):
        base = (i * SPLITS + split) * H + heads
        m_s = tl.load(part_ml + 2 * base, mask=heads < H, other=float("-inf"))
        l_s = tl.load(part_ml + 2 * base + 1, mask=heads < H, other=0.0)
        acc_s = tl.load(part_acc + base[:, None] * D + d[None, :], mask=heads[:, None] < H, other=0.0)
        m_new = tl.maximum(m_i, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha, beta = tl.exp(m_i - m_safe), tl.exp(m_s - m_safe)
        l_i = l_i * alpha + l_s * beta
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
        m_i = m_new
    _finish(sink_ptr, heads, H, m_i, l_i, acc, o_ptr + i * son + heads[:, None] * soh + d[None, :])


# (heads per program, warps): decode sizes, and prefill from PREFILL_QUERIES queries on.
# H200, 2026-11-30, 2,048 queries: 17.9 ms with 32 heads per program, 23.2 ms with 16; 64 do
# not fit in registers and shared memory.
HEAD_BLOCKS = {"decode": (16, 4), "prefill": (32, 4)}
PREFILL_QUERIES = 256
KEY_TILE = 16  # keys per step of the online softmax


def launch_plan(n: int, num_entries: int, heads: int, head_block: int | None = None,
                entry_splits: int | None = None) -> tuple[int, int, int, int]:
    """(heads per program, warps, entry splits, entries per split) for n queries over
    num_entries selected entries each. The splits set the order of the sums, so callers that
    batch requests launch together only requests with the same plan (layers/attention_kernel.py).
    Tensor-core dots need M >= 16: fewer heads are padded by the mask, not a smaller block.
    Many queries (prefill) fill the GPU anyway, and a taller head block decodes each key for
    more heads at once. Few queries (decode) leave most SMs idle: the entries are split over
    more programs (flash decoding), aiming at ~2 programs per SM."""
    hb, warps = HEAD_BLOCKS["prefill" if n >= PREFILL_QUERIES else "decode"]
    hb = head_block or hb
    if entry_splits is None:
        entry_splits = min(triton.cdiv(num_entries, 64), max(0, 264 // (n * triton.cdiv(heads, hb)) - 1))
    per_split = triton.cdiv(triton.cdiv(num_entries, max(entry_splits, 1)), KEY_TILE) * KEY_TILE
    return hb, warps, entry_splits, per_split


def sparse_attention(q: torch.Tensor, ring: torch.Tensor, window_offsets: torch.Tensor,
                     window_scale_offsets: torch.Tensor, pages: torch.Tensor, entry_offsets: torch.Tensor,
                     entry_scale_offsets: torch.Tensor, sink: torch.Tensor, scale: float,
                     num_warps: int | None = None, entry_splits: int | None = None,
                     head_block: int | None = None) -> torch.Tensor:
    """q [n, h, D]; `ring`/`pages`: the pool's byte buffers; *_offsets [n, W] / [n, k] byte offsets of
    each key's codes and scales in them (-1: masked). Returns [n, h, D] fp32. `entry_splits`
    (programs over the entries besides the window's; 0: one program reads all), `head_block`
    (heads per program: each decodes the keys once for all of them) and `num_warps` are
    chosen from the shape unless given."""
    n, heads, dim = q.shape
    assert window_offsets.shape == window_scale_offsets.shape and entry_offsets.shape == entry_scale_offsets.shape
    assert ring.dtype == torch.uint8 and pages.dtype == torch.uint8 and dim % 32 == 0
    q = q.contiguous()
    out = torch.empty(n, heads, dim, dtype=torch.float32, device=q.device)
    w_off, w_soff = window_offsets.contiguous(), window_scale_offsets.contiguous()
    e_off, e_soff = entry_offsets.contiguous(), entry_scale_offsets.contiguous()
    K = e_off.shape[1]
    hb, warps, entry_splits, per_split = launch_plan(n, K, heads, head_block, entry_splits)
    num_warps = num_warps or warps
    head_blocks = triton.cdiv(heads, hb)
    splits = 1 if entry_splits == 0 else entry_splits + 1
    part_ml = part_acc = out  # unused with one split
    if splits > 1:
        part_ml = torch.empty(n, splits, heads, 2, dtype=torch.float32, device=q.device)
        part_acc = torch.empty(n, splits, heads, dim, dtype=torch.float32, device=q.device)
    grid = (n, head_blocks, splits)
    _sparse_attention_kernel[grid](q, ring, w_off, w_soff, pages, e_off, e_soff, sink.float().contiguous(), out,
                                   part_ml, part_acc, heads, w_off.shape[1], K, per_split, scale, q.stride(0),
                                   q.stride(1), w_off.stride(0), e_off.stride(0), out.stride(0), out.stride(1),
                                   D=dim, HB=hb, KT=KEY_TILE, HW_FP8=not interpreting(), SPLITS=splits,
                                   num_warps=num_warps)
    if splits > 1:
        _combine_kernel[(n, head_blocks)](part_ml, part_acc, sink.float().contiguous(), out, heads, out.stride(0),
                                          out.stride(1), D=dim, HB=hb, SPLITS=splits, num_warps=num_warps)
    return out
