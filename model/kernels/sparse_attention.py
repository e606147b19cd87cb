"""Attention of V4.1 queries over window keys plus selected compressed entries, with a sink.

Shapes: n queries, h heads, D latent (K = V), W window keys, k selected entries per query.
Per head: s = q.k / sqrt(D); o = sum e^(s-m) v / (sum e^(s-m) + e^(sink-m)). The sink only
grows the denominator, so a query with nothing visible returns zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import DOT, e2m1_to_float, e4m3_to_float, interpreting


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
    logits = tl.dot(q, tl.trans(keys), input_precision=DOT) * scale  # [HB, KT]
    logits = tl.where(valid[None, :], logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(logits - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p, keys, input_precision=DOT)
    return m_new, l_i, acc


@triton.jit
def _sparse_attention_kernel(q_ptr, ring_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, sink_ptr, o_ptr,
                             H, W, K, scale, sqn, sqh, swn, sen, son, soh,
                             D: tl.constexpr, HB: tl.constexpr, KT: tl.constexpr, HW_FP8: tl.constexpr):
    i = tl.program_id(0)
    h0 = tl.program_id(1) * HB
    heads = h0 + tl.arange(0, HB)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + i * sqn + heads[:, None] * sqh + d[None, :], mask=heads[:, None] < H, other=0.0).to(tl.float32)
    m_i = tl.full((HB,), float("-inf"), tl.float32)
    l_i = tl.zeros((HB,), tl.float32)
    acc = tl.zeros((HB, D), tl.float32)
    kt = tl.arange(0, KT)
    # window: FP8 e4m3 rows, one e8m0 scale per 32 values
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
    # Each value's nibble is picked from its byte by a shift: a join + reshape (as fp4_moe does),
    # feeding both dots of the online softmax, compiled to wrong values on H200 (Triton 3.6).
    shift = (d % 2) * 4
    for t0 in range(0, K, KT):
        j = t0 + kt
        off = tl.load(ent_off + i * sen + j, mask=j < K, other=-1)
        soff = tl.load(ent_soff + i * sen + j, mask=j < K, other=0)
        valid = off >= 0
        packed = tl.load(page_ptr + off[:, None] + (d // 2)[None, :], mask=valid[:, None], other=0).to(tl.int32)
        values = e2m1_to_float((packed >> shift[None, :]) & 0xF)
        sbytes = tl.load(page_ptr + soff[:, None] + (d // 16)[None, :], mask=valid[:, None], other=0)
        keys = values * e4m3_to_float(sbytes, HW_FP8)
        m_i, l_i, acc = _online(q, keys, valid, m_i, l_i, acc, scale)
    sink = tl.load(sink_ptr + heads, mask=heads < H, other=0.0)
    m_fin = tl.maximum(m_i, sink)
    l_i = l_i * tl.exp(m_i - m_fin) + tl.exp(sink - m_fin)
    out = acc * tl.exp(m_i - m_fin)[:, None] / l_i[:, None]
    tl.store(o_ptr + i * son + heads[:, None] * soh + d[None, :], out, mask=heads[:, None] < H)


def sparse_attention(q: torch.Tensor, ring: torch.Tensor, window_offsets: torch.Tensor,
                     window_scale_offsets: torch.Tensor, pages: torch.Tensor, entry_offsets: torch.Tensor,
                     entry_scale_offsets: torch.Tensor, sink: torch.Tensor, scale: float,
                     num_warps: int = 4) -> torch.Tensor:
    """q [n, h, D]; `ring`/`pages`: the pool's byte buffers; *_offsets [n, W] / [n, k] byte offsets of
    each key's codes and scales in them (-1: masked). Returns [n, h, D] fp32."""
    n, heads, dim = q.shape
    assert window_offsets.shape == window_scale_offsets.shape and entry_offsets.shape == entry_scale_offsets.shape
    assert ring.dtype == torch.uint8 and pages.dtype == torch.uint8 and dim % 32 == 0
    q = q.contiguous()
    out = torch.empty(n, heads, dim, dtype=torch.float32, device=q.device)
    hb = 16  # tensor-core dots need M >= 16: fewer heads are padded by the mask, not a smaller block
    kt = 16
    w_off, w_soff = window_offsets.contiguous(), window_scale_offsets.contiguous()
    e_off, e_soff = entry_offsets.contiguous(), entry_scale_offsets.contiguous()
    grid = (n, triton.cdiv(heads, hb))
    _sparse_attention_kernel[grid](q, ring, w_off, w_soff, pages, e_off, e_soff, sink.float().contiguous(), out,
                                   heads, w_off.shape[1], e_off.shape[1], scale, q.stride(0), q.stride(1),
                                   w_off.stride(0), e_off.stride(0), out.stride(0), out.stride(1),
                                   D=dim, HB=hb, KT=kt, HW_FP8=not interpreting(), num_warps=num_warps)
    return out
