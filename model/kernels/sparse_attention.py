"""Attention of V4.1 queries over window keys plus selected compressed entries, with a sink.

Shapes: n queries, h heads, D latent (K = V), W window keys, k selected entries per query.
Per head: s = q.k / sqrt(D); o = sum e^(s-m) v / (sum e^(s-m) + e^(sink-m)). The sink only
grows the denominator, so a query with nothing visible returns zeros.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .common import (bf16_parts, bf16_rne, dot_exact_rhs, e2m1_to_float, e4m3_to_float, group_columns,
                     interpreting, pow2)
from . import attention_queries, fp8_blockwise, pdl, sparse_attention_gluon, sparse_attention_pingpong
from .attention_queries import Queries, query_parts


def sparse_attention_ref(q: torch.Tensor, window_kv: torch.Tensor, window_mask: torch.Tensor,
                         selected_kv: torch.Tensor | None, selected_valid: torch.Tensor | None,
                         sink: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, h, D]; window_kv [W, D] shared by all queries, window_mask [n, W] bool;
    selected_kv [n, k, D] per query, selected_valid [n, k] bool; sink [h]. Returns [n, h, D] fp32.
    A bf16 q (faithful mode) attends as the reference's own kernel does: logits, the keys' max
    m and the denominator in fp32, e^(s-m) rounded to bf16 for the weighted sum of the values."""
    bf16 = q.dtype == torch.bfloat16
    q = q.float()
    logits = torch.einsum("nhd,wd->nhw", q, window_kv.float()) * scale
    logits = logits.masked_fill(~window_mask.unsqueeze(1), float("-inf"))
    parts = [logits]
    if selected_kv is not None and selected_kv.shape[1] > 0:
        picked = torch.einsum("nhd,nkd->nhk", q, selected_kv.float()) * scale
        parts.append(picked.masked_fill(~selected_valid.unsqueeze(1), float("-inf")))
    sinks = sink.float().view(1, -1, 1).expand(q.shape[0], -1, 1)
    if bf16:
        keys = torch.cat(parts, dim=-1)
        top = keys.amax(dim=-1, keepdim=True).clamp_min(-1e30)  # nothing visible: zeros
        weights = torch.exp(keys - top)
        denominator = weights.sum(dim=-1, keepdim=True) + torch.exp(sinks - top)
        probs = weights.bfloat16().float()
    else:
        combined = torch.cat(parts + [sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)
    width = logits.shape[-1]
    out = torch.einsum("nhw,wd->nhd", probs[..., :width], window_kv.float())
    if len(parts) > 1:
        out = out + torch.einsum("nhk,nkd->nhd", probs[..., width:width + parts[1].shape[-1]], selected_kv.float())
    return out / denominator if bf16 else out


@triton.jit
def _online(q, keys, valid, m_i, l_i, acc, scale, BF16_P: tl.constexpr):
    """One tile of keys (K = V) into the running softmax of one query's head block; BF16_P:
    the weighted sum takes the probabilities rounded to bf16 (a bf16 query's attention)."""
    logits = dot_exact_rhs(q, tl.trans(keys), tl.zeros((q.shape[0], keys.shape[0]), tl.float32)) * scale
    logits = tl.where(valid[None, :], logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(logits - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if BF16_P:
        p = bf16_rne(p)
    acc = dot_exact_rhs(p, keys, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _window_keys(ring_ptr, win_off, win_soff, row, j, W, d, HW_FP8: tl.constexpr):
    """Window keys j of the query whose offsets start at `row`: FP8 e4m3 rows, one e8m0 scale
    per 32 values -> (fp32 keys [KT, D], which are valid)."""
    off = tl.load(win_off + row + j, mask=j < W, other=-1)
    soff = tl.load(win_soff + row + j, mask=j < W, other=0)
    valid = off >= 0
    codes = tl.load(ring_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0)
    sbytes = tl.load(ring_ptr + soff[:, None] + (d // 32)[None, :], mask=valid[:, None], other=127)
    return e4m3_to_float(codes, HW_FP8) * tl.exp2(sbytes.to(tl.float32) - 127.0), valid


@triton.jit
def _entry_keys(page_ptr, ent_off, ent_soff, row, j, last, d, HW_FP8: tl.constexpr):
    """Selected compressed entries j (< last): packed e2m1 (low nibble first), one e4m3 scale
    per 16 values -> (fp32 keys [KT, D], which are valid). Each value's nibble is picked from
    its byte by a shift: a join + reshape (as fp4_moe did), feeding both dots of the online
    softmax, compiled to wrong values on H200 (Triton 3.6)."""
    off = tl.load(ent_off + row + j, mask=j < last, other=-1)
    soff = tl.load(ent_soff + row + j, mask=j < last, other=0)
    valid = off >= 0
    packed = tl.load(page_ptr + off[:, None] + (d // 2)[None, :], mask=valid[:, None], other=0).to(tl.int32)
    values = e2m1_to_float((packed >> ((d % 2) * 4)[None, :]) & 0xF)
    sbytes = tl.load(page_ptr + soff[:, None] + (d // 16)[None, :], mask=valid[:, None], other=0)
    return values * e4m3_to_float(sbytes, HW_FP8), valid


@triton.jit
def _sparse_attention_kernel(q_ptr, ring_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, sink_ptr, o_ptr,
                             part_ml, part_acc, H, W, K, K_PER_SPLIT, scale, sqn, sqh, swn, sen, son, soh,
                             D: tl.constexpr, HB: tl.constexpr, KT: tl.constexpr, HW_FP8: tl.constexpr,
                             SPLITS: tl.constexpr, BF16_P: tl.constexpr, PDL: tl.constexpr):
    """Program (query i, head block, split s). With one split it reads every key and writes the
    output. With more (decode: few queries, so few programs otherwise), split 0 reads the
    window, split s >= 1 the s-th slice of the entries, and each writes its running max, sum
    and accumulator for _combine_kernel."""
    pdl.wait_for_inputs(PDL)
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
    if split == 0:
        for t0 in range(0, W, KT):
            keys, valid = _window_keys(ring_ptr, win_off, win_soff, i * swn, t0 + kt, W, d, HW_FP8)
            m_i, l_i, acc = _online(q, keys, valid, m_i, l_i, acc, scale, BF16_P)
    if SPLITS == 1:
        first = 0
        last = K
    else:  # split 0 had the window: an empty range here
        first = tl.maximum(split - 1, 0) * K_PER_SPLIT
        last = tl.where(split == 0, first, tl.minimum(first + K_PER_SPLIT, K))
    for t0 in range(first, last, KT):
        keys, valid = _entry_keys(page_ptr, ent_off, ent_soff, i * sen, t0 + kt, last, d, HW_FP8)
        m_i, l_i, acc = _online(q, keys, valid, m_i, l_i, acc, scale, BF16_P)
    if SPLITS == 1:
        _finish(sink_ptr, heads, H, m_i, l_i, acc, o_ptr + i * son + heads[:, None] * soh + d[None, :])
    else:
        base = (i * SPLITS + split) * H + heads
        tl.store(part_ml + 2 * base, m_i, mask=heads < H)
        tl.store(part_ml + 2 * base + 1, l_i, mask=heads < H)
        tl.store(part_acc + base[:, None] * D + d[None, :], acc, mask=heads[:, None] < H)


@triton.jit
def _window_bytes(ring16_ptr, win_off, win_soff, row, j, W, KT: tl.constexpr, C: tl.constexpr,
                  GATHERED: tl.constexpr):
    """Window keys j of the query whose offsets start at `row`, as stored: 16-bit words of two
    neighbouring e4m3 codes [KT, C] and the e8m0 scale exponents [KT, C / 16] (one per 32
    columns), and which keys are valid. GATHERED: the bytes were copied key after key (codes,
    then scales) in the offsets' order (gather_keys), so their addresses follow from j."""
    off = tl.load(win_off + row + j, mask=j < W, other=-1)
    valid = off >= 0
    if GATHERED:
        code_at = (row + j).to(tl.int64) * (2 * C + C // 16)
        scale_at = code_at + 2 * C
    else:
        code_at = off
        scale_at = tl.load(win_soff + row + j, mask=j < W, other=0)
    words = tl.load(ring16_ptr + (code_at // 2)[:, None] + tl.arange(0, C)[None, :], mask=valid[:, None], other=0)
    exps = tl.load(ring16_ptr.to(tl.pointer_type(tl.uint8)) + scale_at[:, None] + tl.arange(0, C // 16)[None, :],
                   mask=valid[:, None], other=127)
    return words, exps, valid


@triton.jit
def _window_halves(words, exps, parity, KT: tl.constexpr, C: tl.constexpr, PTX: tl.constexpr):
    """_window_bytes decoded and split by column parity: own [KT, C] = columns 2c + parity,
    other = columns 2c + 1 - parity."""
    words = words.to(tl.int32)
    scale = pow2(exps.to(tl.int32))[:, :, None]
    own = e4m3_to_float(((words >> (8 * parity)) & 0xFF).to(tl.uint8), PTX)
    other = e4m3_to_float(((words >> (8 - 8 * parity)) & 0xFF).to(tl.uint8), PTX)
    own = tl.reshape(tl.reshape(own, (KT, C // 16, 16)) * scale, (KT, C))
    other = tl.reshape(tl.reshape(other, (KT, C // 16, 16)) * scale, (KT, C))
    return own, other


@triton.jit
def _entry_bytes(page_ptr, ent_off, ent_soff, row, j, last, KT: tl.constexpr, C: tl.constexpr,
                 GATHERED: tl.constexpr):
    """Selected entries j (< last) as stored: packed bytes [KT, C] (columns 2c in the low
    nibble, 2c + 1 in the high one), e4m3 scale bytes [KT, C / 8] (one per 16 columns), and
    which entries are valid; GATHERED as in _window_bytes."""
    off = tl.load(ent_off + row + j, mask=j < last, other=-1)
    valid = off >= 0
    if GATHERED:
        code_at = (row + j).to(tl.int64) * (C + C // 8)
        scale_at = code_at + C
    else:
        code_at = off
        scale_at = tl.load(ent_soff + row + j, mask=j < last, other=0)
    packed = tl.load(page_ptr + code_at[:, None] + tl.arange(0, C)[None, :], mask=valid[:, None], other=0)
    sbytes = tl.load(page_ptr + scale_at[:, None] + tl.arange(0, C // 8)[None, :], mask=valid[:, None], other=0)
    return packed, sbytes, valid


@triton.jit
def _entry_halves(packed, sbytes, parity, KT: tl.constexpr, C: tl.constexpr, PTX: tl.constexpr):
    """_entry_bytes decoded and split by column parity, as _window_halves."""
    packed = packed.to(tl.int32)
    scale = e4m3_to_float(sbytes, PTX)[:, :, None]
    own = e2m1_to_float((packed >> (4 * parity)) & 0xF)
    other = e2m1_to_float((packed >> (4 - 4 * parity)) & 0xF)
    own = tl.reshape(tl.reshape(own, (KT, C // 8, 8)) * scale, (KT, C))
    other = tl.reshape(tl.reshape(other, (KT, C // 8, 8)) * scale, (KT, C))
    return own, other


@triton.jit
def _decoded_half(keys_ptr, rows_ptr, row, j, last, half, C: tl.constexpr):
    """Keys j (< last) of the query whose rows start at `row`, from decode_keys' bf16 rows [*, 2C]:
    their columns half * C .. half * C + C as fp32 [KT, C], and which keys are valid (rows >= 0)."""
    r = tl.load(rows_ptr + row + j, mask=j < last, other=-1)
    valid = r >= 0
    keys = tl.load(keys_ptr + r.to(tl.int64)[:, None] * (2 * C) + half * C + tl.arange(0, C)[None, :],
                   mask=valid[:, None], other=0.0)
    return keys.to(tl.float32), valid


@triton.jit
def _tile_halves(ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, row, j, last, parity,
                 KT: tl.constexpr, C: tl.constexpr, PTX: tl.constexpr, GATHERED: tl.constexpr, DECODED: tl.constexpr,
                 ENTRIES: tl.constexpr, OTHER: tl.constexpr):
    """Key tile j (< last) of the query whose offsets start at `row`, window keys or with ENTRIES
    selected entries, as its column halves: (own, other, valid), own the columns of `parity`.
    Halves are even and odd columns as stored; DECODED (decode_keys' rows, the offsets rows of
    them), the first and last C columns, `other` loaded only where OTHER asks (else own again)."""
    if DECODED:
        keys_ptr = page_ptr if ENTRIES else ring16_ptr
        rows_ptr = ent_off if ENTRIES else win_off
        own, valid = _decoded_half(keys_ptr, rows_ptr, row, j, last, parity, C)
        other = own
        if OTHER:
            other, _ = _decoded_half(keys_ptr, rows_ptr, row, j, last, 1 - parity, C)
    elif ENTRIES:
        packed, sbytes, valid = _entry_bytes(page_ptr, ent_off, ent_soff, row, j, last, KT, C, GATHERED)
        own, other = _entry_halves(packed, sbytes, parity, KT, C, PTX)
    else:
        words, exps, valid = _window_bytes(ring16_ptr, win_off, win_soff, row, j, last, KT, C, GATHERED)
        own, other = _window_halves(words, exps, parity, KT, C, PTX)
    return own, other, valid


@triton.jit
def _gather_keys_kernel(src_ptr, off_ptr, soff_ptr, dst_ptr, total, base, sbase, CB: tl.constexpr,
                        SB: tl.constexpr, R: tl.constexpr, PDL: tl.constexpr):
    """Keys k of a flattened offset table: their CB code bytes, then SB scale bytes, copied to
    row k of dst (zeros for a masked key); valid offsets are base (sbase) bytes short."""
    pdl.wait_for_inputs(PDL)
    k = tl.program_id(0) * R + tl.arange(0, R)
    live = k < total
    off = tl.load(off_ptr + k, mask=live, other=-1)
    valid = (off >= 0)[:, None]
    off += base
    soff = tl.load(soff_ptr + k, mask=live, other=0) + sbase
    row = dst_ptr + k.to(tl.int64)[:, None] * (CB + SB)
    cb, sb = tl.arange(0, CB), tl.arange(0, SB)
    tl.store(row + cb[None, :], tl.load(src_ptr + off[:, None] + cb[None, :], mask=valid, other=0),
             mask=live[:, None])
    tl.store(row + CB + sb[None, :], tl.load(src_ptr + soff[:, None] + sb[None, :], mask=valid, other=0),
             mask=live[:, None])


def gather_keys(src: torch.Tensor, offsets: torch.Tensor, scale_offsets: torch.Tensor, code_bytes: int,
                scale_bytes: int, base: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """The bytes of every key of an offset table [n, k] (-1: masked; base: bytes added to the
    valid offsets, codes and scales), key after key: [n * k * (code_bytes + scale_bytes)]
    uint8. The prefill kernel then reads them at addresses that follow from the key's place,
    which its loops can prefetch (GATHERED)."""
    total = offsets.numel()
    size = total * (code_bytes + scale_bytes)
    out = torch.empty(size + 2 - size % 2, dtype=torch.uint8, device=src.device)  # read as 16-bit words
    if total:
        r = 16
        _gather_keys_kernel[(triton.cdiv(total, r),)](src, offsets, scale_offsets, out, total, int(base[0]),
                                                      int(base[1]), CB=code_bytes, SB=scale_bytes, R=r,
                                                      **pdl.options(src.device))
    return out


@triton.jit
def _decode_keys_kernel(src_ptr, off_ptr, soff_ptr, out_ptr, total, D: tl.constexpr, FP4: tl.constexpr,
                        R: tl.constexpr, HW_FP8: tl.constexpr, PDL: tl.constexpr):
    """Keys k of an offset list, decoded into rows of out [total, D] bf16 (zeros where masked)."""
    pdl.wait_for_inputs(PDL)
    k = tl.program_id(0) * R + tl.arange(0, R)
    d = tl.arange(0, D)
    if FP4:
        keys, _ = _entry_keys(src_ptr, off_ptr, soff_ptr, 0, k, total, d, HW_FP8)
    else:
        keys, _ = _window_keys(src_ptr, off_ptr, soff_ptr, 0, k, total, d, HW_FP8)
    tl.store(out_ptr + k.to(tl.int64)[:, None] * D + d[None, :], keys.to(tl.bfloat16), mask=(k < total)[:, None])


def decode_keys(src: torch.Tensor, offsets: torch.Tensor, scale_offsets: torch.Tensor, dim: int,
                fp4: bool) -> torch.Tensor:
    """The keys at byte offsets [R] of src (-1: masked, decoded as zeros), decoded: [R, dim]
    bf16. FP8 window keys (e4m3, an e8m0 scale a 32 columns) or, with fp4, FP4 entries (e2m1
    pairs, an e4m3 scale a 16). Exact: a value times its scale has at most 6 significant bits."""
    offsets, scale_offsets = offsets.reshape(-1).contiguous(), scale_offsets.reshape(-1).contiguous()
    out = torch.empty(offsets.numel(), dim, dtype=torch.bfloat16, device=src.device)
    if offsets.numel():
        r = 8
        _decode_keys_kernel[(triton.cdiv(offsets.numel(), r),)](src, offsets, scale_offsets, out, offsets.numel(),
                                                               D=dim, FP4=fp4, R=r, HW_FP8=not interpreting(),
                                                               **pdl.options(src.device))
    return out


@triton.jit
def _query_half(at, live, sqp, QP: tl.constexpr):
    """The QP bf16 parts of one column half of a query's heads, loaded once per program: in the
    loop they were reloaded at every key tile and held registers the accumulator needed (the
    compiled kernel spilled 4 KB a thread at one part, 0.9 KB loaded once; sm_90, Triton 3.9)."""
    first = tl.load(at, mask=live, other=0.0)
    if QP == 1:  # a pair still (Triton 3.6 did not compile the one-element tuple); _logits reads [0] only
        return first, first
    return first, tl.load(at + sqp, mask=live, other=0.0)


@triton.jit
def _logits(q_own, q_other, k_own, k_other, valid, scale, HB: tl.constexpr, KT: tl.constexpr, QP: tl.constexpr,
            PTX: tl.constexpr):
    """The scaled logits [HB, KT] of a key tile (-inf where not valid) on bf16 tensor cores: the
    query's QP bf16 parts against the keys' two column halves. The keys are exact in bf16 (an
    e4m3 or e2m1 value times its scale has at most 6 significant bits), so every product is
    exact in the fp32 accumulator. In the interpreter (no PTX) the one fp32 part dots in fp32."""
    if PTX:
        k_own = k_own.to(tl.bfloat16)
        k_other = k_other.to(tl.bfloat16)
    logits = tl.zeros((HB, KT), tl.float32)
    for p in tl.static_range(QP):
        if PTX:
            logits = tl.dot(q_other[p], tl.trans(k_other), tl.dot(q_own[p], tl.trans(k_own), logits))
        else:
            logits = tl.dot(q_own[p].to(tl.float32), tl.trans(k_own), logits, input_precision="ieee")
            logits = tl.dot(q_other[p].to(tl.float32), tl.trans(k_other), logits, input_precision="ieee")
    return tl.where(valid[None, :], logits * scale, float("-inf"))


@triton.jit
def _add_weighted(prob, k_own, acc, PP: tl.constexpr, PTX: tl.constexpr):
    """acc + prob . k_own, the probabilities cut into PP bf16 parts (every product exact in
    the fp32 accumulator); PP = 1 rounds them to bf16, in the interpreter too."""
    if PTX:
        k_own = k_own.to(tl.bfloat16)
        head = prob.to(tl.bfloat16)
        acc = tl.dot(head, k_own, acc)
        if PP > 1:
            rest = prob - head.to(tl.float32)
            middle = rest.to(tl.bfloat16)
            acc = tl.dot(middle, k_own, acc)
            if PP > 2:
                acc = tl.dot((rest - middle.to(tl.float32)).to(tl.bfloat16), k_own, acc)
    elif PP == 1:  # the probabilities as one bf16 part, as the GPU's cast rounds them
        acc = tl.dot(bf16_rne(prob), k_own, acc, input_precision="ieee")
    else:
        acc = tl.dot(prob, k_own, acc, input_precision="ieee")
    return acc


@triton.jit
def _softmax_step(logits, m_i, l_i):
    """A tile's logits into a running max and sum -> (max, sum, e^(logits - max), the factor
    the sums so far are scaled by)."""
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    prob = tl.exp(logits - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    return m_new, l_i * alpha + tl.sum(prob, axis=1), prob, alpha


@triton.jit
def _online_parts(q_own, q_other, k_own, k_other, valid, m_i, l_i, acc, scale,
                  HB: tl.constexpr, KT: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, PTX: tl.constexpr):
    """_online on bf16 tensor cores (_logits, _add_weighted), for the columns of k_own (the
    logits take k_other's too)."""
    logits = _logits(q_own, q_other, k_own, k_other, valid, scale, HB, KT, QP, PTX)
    m_new, l_i, prob, alpha = _softmax_step(logits, m_i, l_i)
    return m_new, l_i, _add_weighted(prob, k_own, acc * alpha[:, None], PP, PTX)


@triton.jit
def _online_halves(q_own, q_other, k_own, k_other, valid, m_i, l_i, acc, acc_other, scale,
                   HB: tl.constexpr, KT: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, PTX: tl.constexpr,
                   BOTH: tl.constexpr):
    """_online_parts for the own column half (acc_other as it was), or with BOTH for both
    halves: the logits once, two weighted sums."""
    if BOTH:
        logits = _logits(q_own, q_other, k_own, k_other, valid, scale, HB, KT, QP, PTX)
        m_new, l_i, prob, alpha = _softmax_step(logits, m_i, l_i)
        acc = _add_weighted(prob, k_own, acc * alpha[:, None], PP, PTX)
        acc_other = _add_weighted(prob, k_other, acc_other * alpha[:, None], PP, PTX)
    else:
        m_new, l_i, acc = _online_parts(q_own, q_other, k_own, k_other, valid, m_i, l_i, acc, scale, HB, KT, QP, PP,
                                        PTX)
    return m_new, l_i, acc, acc_other


@triton.jit
def _split_keys(split, TILES_PER_SPLIT, W, K, KT: tl.constexpr, SPLITS: tl.constexpr):
    """The key ranges of split `split` of a query, TILES_PER_SPLIT tiles of KT keys counted over
    the window's tiles, then the entries': (window lo, hi, entries lo, hi); one split reads
    them all. A split's keys follow from its number alone, not from the split count or the
    launch's other queries."""
    if SPLITS == 1:
        return 0, W, 0, K
    window_tiles = tl.cdiv(W, KT)
    lo = split * TILES_PER_SPLIT
    hi = lo + TILES_PER_SPLIT
    w_lo, w_hi = tl.minimum(lo, window_tiles) * KT, tl.minimum(hi, window_tiles) * KT
    e_lo = tl.maximum(lo - window_tiles, 0) * KT
    e_hi = tl.minimum(tl.maximum(hi - window_tiles, 0), tl.cdiv(K, KT)) * KT
    return w_lo, w_hi, e_lo, e_hi


@triton.jit
def _prefill_attention_kernel(q_ptr, ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, sink_ptr, o_ptr,
                              part_ml, part_acc, H, W, K, TILES_PER_SPLIT, scale, sqp, sqn, sqh, swn, sen, son, soh,
                              D: tl.constexpr, HB: tl.constexpr, KT: tl.constexpr, QP: tl.constexpr,
                              PP: tl.constexpr, PTX: tl.constexpr, GATHERED: tl.constexpr, SPLITS: tl.constexpr,
                              BOTH: tl.constexpr, PDL: tl.constexpr):
    """Program (query i, head block, column parity) over all the query's keys, on tensor cores
    (_online_parts): the prefill form, where every query has its own entries and the heads are
    the dots' rows. Two programs share a query's head block, one accumulating its even
    columns, one its odd ones (a [64, 512] fp32 accumulator does not fit one warpgroup's
    registers, and Triton lays chained dots out with every warp along the rows); both compute
    the whole logits. The query parts come with their columns ordered even ones first. With
    GATHERED, ring16_ptr and page_ptr are gather_keys' copies of the keys, not the pool.
    SPLITS > 1 (decode: few queries): program (query, head block, 2 * split + parity) reads
    TILES_PER_SPLIT key tiles of the window's tiles followed by the entries' ones, and leaves
    its running max, sum and accumulator for _combine_kernel. BOTH: one program holds both
    column halves (even in acc, odd in acc_other) and computes each logit once (program
    (query, head block, split); meant for 8 warps, whose registers hold the two halves)."""
    pdl.wait_for_inputs(PDL)
    i = tl.program_id(0)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    if BOTH:
        parity = 0
        split = tl.program_id(2)
    else:
        parity = tl.program_id(2) % 2
        split = tl.program_id(2) // 2
    c = tl.arange(0, D // 2)
    q_live = heads[:, None] < H
    q_own = _query_half(q_ptr + i * sqn + heads[:, None] * sqh + (parity * (D // 2) + c)[None, :], q_live, sqp, QP)
    q_other = _query_half(q_ptr + i * sqn + heads[:, None] * sqh + ((1 - parity) * (D // 2) + c)[None, :], q_live,
                          sqp, QP)
    m_i = tl.full((HB,), float("-inf"), tl.float32)
    l_i = tl.zeros((HB,), tl.float32)
    acc = tl.zeros((HB, D // 2), tl.float32)
    acc_other = tl.zeros((HB, D // 2), tl.float32)  # BOTH: the odd columns
    kt = tl.arange(0, KT)
    w_lo, w_hi, e_lo, e_hi = _split_keys(split, TILES_PER_SPLIT, W, K, KT, SPLITS)
    for t0 in range(w_lo, w_hi, KT):
        words, exps, valid = _window_bytes(ring16_ptr, win_off, win_soff, i * swn, t0 + kt, W, KT, D // 2, GATHERED)
        k_own, k_other = _window_halves(words, exps, parity, KT, D // 2, PTX)
        m_i, l_i, acc, acc_other = _online_halves(q_own, q_other, k_own, k_other, valid, m_i, l_i, acc, acc_other,
                                                  scale, HB, KT, QP, PP, PTX, BOTH)
    for t0 in range(e_lo, e_hi, KT):
        packed, sbytes, valid = _entry_bytes(page_ptr, ent_off, ent_soff, i * sen, t0 + kt, K, KT, D // 2, GATHERED)
        k_own, k_other = _entry_halves(packed, sbytes, parity, KT, D // 2, PTX)
        m_i, l_i, acc, acc_other = _online_halves(q_own, q_other, k_own, k_other, valid, m_i, l_i, acc, acc_other,
                                                  scale, HB, KT, QP, PP, PTX, BOTH)
    if SPLITS == 1:
        rows = o_ptr + i * son + heads[:, None] * soh
        _finish(sink_ptr, heads, H, m_i, l_i, acc, rows + (2 * c + parity)[None, :])
        if BOTH:
            _finish(sink_ptr, heads, H, m_i, l_i, acc_other, rows + (2 * c + 1)[None, :])
    else:  # both parities hold the same max and sum: the even one writes them
        base = (i * SPLITS + split) * H + heads
        even = heads < H * (1 - parity)  # the live heads of the even program, none of the odd one
        tl.store(part_ml + 2 * base, m_i, mask=even)
        tl.store(part_ml + 2 * base + 1, l_i, mask=even)
        tl.store(part_acc + base[:, None] * D + (2 * c + parity)[None, :], acc, mask=q_live)
        if BOTH:
            tl.store(part_acc + base[:, None] * D + (2 * c + 1)[None, :], acc_other, mask=q_live)


@triton.jit
def _prefill_logits_kernel(q_ptr, ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, s_ptr, ml_ptr,
                           H, W, K, TILES_PER_SPLIT, scale, sqp, sqn, sqh, swn, sen, ssn, ssh,
                           D: tl.constexpr, HB: tl.constexpr, KT: tl.constexpr, QP: tl.constexpr, PTX: tl.constexpr,
                           GATHERED: tl.constexpr, DECODED: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Two-pass prefill form, pass 1, program (query i, head block, split): the logits of every
    key, window tiles then entry tiles (columns from tile t at t * KT), stored to s, and their max
    and sum of e^(logit - max) per head to ml [n, SPLITS, H, 2]. No [heads, D] accumulator here:
    the keys are decoded once per query, and the logits computed once (the one-pass form's two
    programs of a query each compute them all). DECODED: ring16_ptr and page_ptr are decode_keys'
    bf16 rows and win_off and ent_off each query's rows of them; the query's halves are its first
    and last D / 2 columns (not its even and odd ones). SPLITS > 1 (a decode batch): split s
    takes TILES_PER_SPLIT of the query's key tiles (_split_keys), the max and sum its own."""
    pdl.wait_for_inputs(PDL)
    i = tl.program_id(0)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    split = tl.program_id(2)
    c = tl.arange(0, D // 2)
    live = heads < H
    q_at = q_ptr + i * sqn + heads[:, None] * sqh
    q_even = _query_half(q_at + c[None, :], live[:, None], sqp, QP)
    q_odd = _query_half(q_at + (D // 2 + c)[None, :], live[:, None], sqp, QP)
    m_i = tl.full((HB,), float("-inf"), tl.float32)
    l_i = tl.zeros((HB,), tl.float32)
    kt = tl.arange(0, KT)
    row = s_ptr + i * ssn + heads[:, None] * ssh
    w_lo, w_hi, e_lo, e_hi = _split_keys(split, TILES_PER_SPLIT, W, K, KT, SPLITS)
    for t0 in range(w_lo, w_hi, KT):
        k_even, k_odd, valid = _tile_halves(ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff,
                                            i * swn, t0 + kt, W, 0,
                                            KT, D // 2, PTX, GATHERED, DECODED, False, True)
        logits = _logits(q_even, q_odd, k_even, k_odd, valid, scale, HB, KT, QP, PTX)
        tl.store(row + (t0 + kt)[None, :], logits, mask=live[:, None])
        m_i, l_i, _, _ = _softmax_step(logits, m_i, l_i)
    first = tl.cdiv(W, KT) * KT
    for t0 in range(e_lo, e_hi, KT):
        k_even, k_odd, valid = _tile_halves(ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff,
                                            i * sen, t0 + kt, K, 0,
                                            KT, D // 2, PTX, GATHERED, DECODED, True, True)
        logits = _logits(q_even, q_odd, k_even, k_odd, valid, scale, HB, KT, QP, PTX)
        tl.store(row + (first + t0 + kt)[None, :], logits, mask=live[:, None])
        m_i, l_i, _, _ = _softmax_step(logits, m_i, l_i)
    base = (i * SPLITS + split) * H + heads
    tl.store(ml_ptr + 2 * base, m_i, mask=live)
    tl.store(ml_ptr + 2 * base + 1, l_i, mask=live)


@triton.jit
def _prefill_values_kernel(ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, s_ptr, ml_ptr, sink_ptr, o_ptr,
                           H, W, K, swn, sen, ssn, ssh, son, soh,
                           D: tl.constexpr, HB: tl.constexpr, KT: tl.constexpr, PP: tl.constexpr, PTX: tl.constexpr,
                           GATHERED: tl.constexpr, DECODED: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Two-pass prefill form, pass 2, program (query i, head block, column parity): e^(logit -
    max) of pass 1's logits, weighted sum of the keys' columns 2c + parity, and the sink.
    DECODED (as pass 1): the program's columns are half `parity` of the row, parity * D / 2 + c.
    The max and sum are pass 1's SPLITS splits' merged in split order (one split: its own)."""
    pdl.wait_for_inputs(PDL)
    i = tl.program_id(0)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    parity = tl.program_id(2)
    c = tl.arange(0, D // 2)
    live = heads < H
    m_i = tl.full((HB,), float("-inf"), tl.float32)
    l_i = tl.zeros((HB,), tl.float32)
    for split in tl.static_range(SPLITS):  # one split: its own, bit for bit (_merged_max_sum)
        base = (i * SPLITS + split) * H + heads
        m_s = tl.load(ml_ptr + 2 * base, mask=live, other=float("-inf"))
        l_s = tl.load(ml_ptr + 2 * base + 1, mask=live, other=0.0)
        merged = _merged_max_sum(m_i, l_i, m_s, l_s)  # (not `_`: the key loops below assign it)
        m_i, l_i = merged[0], merged[1]
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)[:, None]
    acc = tl.zeros((HB, D // 2), tl.float32)
    kt = tl.arange(0, KT)
    row = s_ptr + i * ssn + heads[:, None] * ssh
    for t0 in range(0, W, KT):
        k_own, _, _ = _tile_halves(ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff,
                                   i * swn, t0 + kt, W, parity,
                                   KT, D // 2, PTX, GATHERED, DECODED, False, False)
        logits = tl.load(row + (t0 + kt)[None, :], mask=live[:, None], other=float("-inf"))
        acc = _add_weighted(tl.exp(logits - m_safe), k_own, acc, PP, PTX)
    first = tl.cdiv(W, KT) * KT
    for t0 in range(0, K, KT):
        k_own, _, _ = _tile_halves(ring16_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff,
                                   i * sen, t0 + kt, K, parity,
                                   KT, D // 2, PTX, GATHERED, DECODED, True, False)
        logits = tl.load(row + (first + t0 + kt)[None, :], mask=live[:, None], other=float("-inf"))
        acc = _add_weighted(tl.exp(logits - m_safe), k_own, acc, PP, PTX)
    columns = parity * (D // 2) + c if DECODED else 2 * c + parity
    _finish(sink_ptr, heads, H, m_i, l_i, acc, o_ptr + i * son + heads[:, None] * soh + columns[None, :])


@triton.jit
def _merged_max_sum(m_i, l_i, m_s, l_s):
    """Running (max, sum of e^(x - max)) joined by a part's: -> (max, sum, the factors that
    rescale the running part and the new one). A part that saw nothing (-inf, 0) leaves every
    bit as it was; the first real part's come through unchanged."""
    m_new = tl.maximum(m_i, m_s)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha, beta = tl.exp(m_i - m_safe), tl.exp(m_s - m_safe)
    return m_new, l_i * alpha + l_s * beta, alpha, beta


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
                    D: tl.constexpr, HB: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Merge the splits' partial softmaxes of one (query, head block)."""
    pdl.wait_for_inputs(PDL)
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
        m_i, l_i, alpha, beta = _merged_max_sum(m_i, l_i, m_s, l_s)
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
    _finish(sink_ptr, heads, H, m_i, l_i, acc, o_ptr + i * son + heads[:, None] * soh + d[None, :])


# (heads per program, warps) of the decode form (flash decoding on fp32-accurate TF32 dots),
# which takes the head dims the tensor-core form does not.
HEAD_BLOCKS = {"decode": (16, 4)}
PREFILL_QUERIES = 256
# Fewer queries than PREFILL_QUERIES (decode) take the tensor-core form with each query's keys
# split over this many programs, merged by _combine_kernel: one program per query leaves most
# SMs idle. H200, 2026-12-01, the release's shapes (640 keys a query), in CUDA graphs: 6 queries
# 70.0 us (the decode form 92.9, 7 splits 67.2, 10 72.9), 12 queries 76.0 (160.7; one program
# per query 134.6), 24 queries 139.2 (363.5; 141.3). The split count does not follow the
# number of queries, so a request's attention is the same in any decode batch. 0: the decode
# form instead (as before 2026-12-01; bench A/B).
# With 32 heads a program (DECODE_HEAD_BLOCK), H200, 2026-12-04, batch 1: 5 splits 2,067 us a
# step against 2,096 + 66 at 4, their merge 337 against 285 (bench/decode_kernel_diff.py).
DECODE_KEY_SPLITS = 4
# Heads a program of the tensor-core form where each query's keys are split over programs
# (PREFILL_TILES' HB elsewhere). Compiled for sm_90 (Triton 3.6, bench/kernel_resources.py),
# exact mode's two parts: 64 heads on 4 warps 255 registers and 640 stack bytes, on 8 warps
# 816; 32 heads on 4 warps 255 and none, in twice the programs. H200, 2026-12-04, 4K batch 1
# (bench/decode_kernel_diff.py, PDL off): the attention 2,238 -> 2,122 us a step (38 launches),
# a step's kernels 20.56 -> 20.40 ms; 22.40 -> 21.75 ms a step in one bench/decode_ab.py round.
# The batch form's two passes at 32 (batch 8): values 2,876 -> 3,555 us, logits 2,463 -> 2,492.
DECODE_HEAD_BLOCK = 32
# The interpreter runs each program in Python, its time going by programs and their steps, not
# by the SMs they fill: there decode-sized launches take one program a query, both column
# halves and every key (CI's golden-model tests on the kernel path: 85 -> 64 s for a 37-token
# prompt). Tests of the GPU's forms ask for them (entry_splits, tiles, or INTERPRETER_DECODE off).
INTERPRETER_DECODE = True
INTERPRETER_DECODE_TILES = {"BOTH": 1, "TWO_PASS": 0}
KEY_TILE = 16  # keys per step of the online softmax (decode form)
# The prefill form (tensor cores): heads per program, keys per step, bf16 parts of the queries
# and of the probabilities, keys gathered first (gather_keys), warps. H200, 2026-11-30, 8,192
# queries of the release's shapes: 19.4 ms (the decode form 95.0); 26.1 with 16 keys per step;
# read in place (no gather) 31.5 and 36.1 (16 and 32 keys: the loads of a step wait on its
# offsets, and Triton's pipeliner prefetches only loads whose addresses follow from the loop);
# 54.5 with 8 warps. Two query parts keep the logits to ~2^-17 of their terms. Pipeline depth
# (2026-12-01, windows shared by neighbouring queries): 2 stages 19.2 ms, 3 19.6, 4 19.6, 1 19.9.
# The query parts loaded once per program (_query_half): 18.6-18.7 ms against 19.2-19.4 (seventh
# session); 8 warps 28.8 ms. One query part and one probability part (bf16 attention, as the
# reference's own kernel rounds P for P.V): 11.5-11.7 ms, 1.0-1.3e-2 of the largest output off.
# TWO_PASS: the logits once per query through a buffer, then the weighted sums (_two_pass),
# KT2 keys per step. H200, eighth session, same shapes: 15.5 ms against 18.6 one-pass (two
# query parts); 13.8 with 64 keys a step (16: 17.7; 128 needs more shared memory than an SM
# has; 3 stages 15.0; 8 warps 19.2). With one bf16 part (faithful mode) 12.3-12.7 against
# 11.4-11.6 one-pass, so bf16 queries keep the one-pass form (BF16_TILES).
# BOTH (one-pass form): one program per query holds both column halves and computes each
# logit once, where the two parity programs each compute them all and decode every key.
# H200, sixteenth session, same shapes, one bf16 part: 8 warps 11.9 ms (11.5-11.7 the parity
# programs), with 64 keys a step **10.1** (1 stage 10.1-10.2; 16 keys 14.5-15.2; 16 warps
# 19.7-27.3; the parity programs on 8 warps with 64 keys 15.5); a faithful 32K prefill
# 2.34-2.37 -> 2.17-2.18 s in one process. Exact mode's two parts on 8 warps: 30.2 ms (the
# two-pass form 13.9). So faithful prefill rows take it (BF16_PREFILL_TILES, from
# PREFILL_QUERIES queries); decode-sized launches keep the parity programs.
# GLUON: those faithful prefill rows go to sparse_attention_gluon on a Hopper GPU at the
# release's head dim (the BOTH form's math with our own layouts: no spills; H200, nineteenth
# session, 8,192 queries: 10.0 -> 4.52 ms). GLUON_GATHER=0: it reads the keys in place where
# the pool's offsets allow (`in_place`), without gather_keys' copies (H200, twentieth session,
# 8,192 queries: 4.16 -> 3.15 ms; a faithful 32K prefill 1.63-1.69 -> 1.54-1.55 s alternated).
# GLUON_SKIP: a bench's ablation (sparse_attention_gluon's SKIP). DECODED: a prefill chunk's
# attention (layers/attention_kernel.scratch_attention) decodes its window and its entries
# once each into bf16 rows, and the Gluon form (faithful mode) or the two-pass form (exact
# mode) reads those (attend_decoded, decoded_form): no decode per query (H200, twentieth
# session, 8,192 queries: the Gluon form 3.12 -> 2.42 ms, decode included). DECODED_EXACT:
# exact mode's two-pass form too (H200, twenty-first session, 8,192 queries: 13.83 -> 6.07 ms,
# decode included; an exact 32K prefill 4.43 -> 3.87 s alternated; every layer of both chunks
# within 4.3e-6 of the byte form, which sums the columns in another order).
PREFILL_TILES = {"HB": 64, "KT": 32, "QP": 2, "PP": 2, "GATHER": 1, "num_warps": 4, "num_stages": 2,
                 "TWO_PASS": 1, "KT2": 64, "BOTH": 0, "GLUON": 0, "GLUON_GATHER": 0, "DECODED": 1, "DECODED_EXACT": 1}
BF16_TILES = {"TWO_PASS": 0}
# A decode batch of BATCH_FORM_ROWS (layers/attention_kernel.py) to PREFILL_QUERIES rows in the
# two-pass form: one program a query (and head block) leaves most SMs idle at batch 8's 48 rows
# (H200, 2026-12-04, PDL off: the logits 98.4 us a layer, the weighted sums 72.7). SPLIT2: the
# logits pass takes each query's ~10 key tiles of 64 that many to a program (splits counted from
# a query's first tile: its sums do not depend on the launch's other queries). Measured with the
# weighted sums split alike and merged by _combine_kernel (bench/decode_kernel_diff.py, batch 8,
# SPLIT2 2): the logits 98.4 -> 64.1 us a layer, but the weighted sums 72.7 -> 142.6 and the merge
# 12.2 (a step's kernels 50.84 -> 52.64 ms), so only the logits pass splits. H200, 2026-12-04,
# batch 8 (PDL off): the logits 3,961 -> 2,526 us a step, the weighted sums 2,783 -> 2,885, a
# step's kernels 50.54 -> 49.39 ms; batch 32 128.7 against 129.4 ms a step (bench/decode_ab.py).
BATCH_TILES = {"SPLIT2": 2}
BF16_PREFILL_TILES = {"BOTH": 1, "KT": 64, "num_warps": 8, "GLUON": 1}


class LaunchPlan(NamedTuple):
    head_block: int
    warps: int  # decode form; 0 for the tensor-core form, whose tiles set them (PREFILL_TILES)
    # decode form: programs over the entries besides the window's (0: one reads every key);
    # tensor-core form: programs each query's keys are split over (0: one reads them all)
    entry_splits: int
    per_split: int  # decode form: entries per split
    prefill: bool  # the tensor-core form


def prefill_form_fits(dim: int) -> bool:
    """The prefill form splits a row into power-of-two halves of whole 32-column scale blocks,
    and a gathered window row (dim + dim / 32 bytes) must stay 16-bit aligned."""
    return dim >= 64 and dim & (dim - 1) == 0


def launch_plan(n: int, num_entries: int, heads: int, dim: int, head_block: int | None = None,
                entry_splits: int | None = None, prefill: bool | None = None) -> LaunchPlan:
    """How n queries over num_entries selected entries each are laid out. The plan sets the
    order of the sums, so callers that batch requests launch together only requests with the
    same plan (layers/attention_kernel.py). At a head_dim the tensor-core form fits, every head
    is in one block, one program per query and column parity; many queries (prefill, from
    PREFILL_QUERIES on) fill the GPU so, and fewer (decode) split each query's keys over
    DECODE_KEY_SPLITS programs (`entry_splits` with prefill=True sets another count).
    Other head dims take the decode form: the entries are split over more programs (flash
    decoding), aiming at ~2 programs per SM. Tensor-core dots need M >= 16: fewer heads are
    padded by the mask, not a smaller block."""
    fits = prefill_form_fits(dim)
    if prefill is None:
        prefill = fits and (not entry_splits if n >= PREFILL_QUERIES
                            else entry_splits is None and DECODE_KEY_SPLITS > 0)
        if prefill and n < PREFILL_QUERIES:
            entry_splits = 1 if INTERPRETER_DECODE and interpreting() else DECODE_KEY_SPLITS
    if prefill:
        most = DECODE_HEAD_BLOCK if entry_splits else PREFILL_TILES["HB"]
        hb = head_block or max(16, min(most, triton.next_power_of_2(heads)))
        return LaunchPlan(hb, 0, entry_splits or 0, num_entries, True)
    hb, warps = HEAD_BLOCKS["decode"]
    hb = head_block or hb
    if entry_splits is None:
        entry_splits = min(triton.cdiv(num_entries, 64), max(0, 264 // (n * triton.cdiv(heads, hb)) - 1))
    per_split = triton.cdiv(triton.cdiv(num_entries, max(entry_splits, 1)), KEY_TILE) * KEY_TILE
    return LaunchPlan(hb, warps, entry_splits, per_split, False)


def sparse_attention(q: torch.Tensor | Queries, ring: torch.Tensor, window_offsets: torch.Tensor,
                     window_scale_offsets: torch.Tensor, pages: torch.Tensor, entry_offsets: torch.Tensor,
                     entry_scale_offsets: torch.Tensor, sink: torch.Tensor, scale: float,
                     num_warps: int | None = None, entry_splits: int | None = None,
                     head_block: int | None = None, prefill: bool | None = None,
                     tiles: dict | None = None, window_base: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """q [n, h, D]; `ring`/`pages`: the pool's byte buffers; *_offsets [n, W] / [n, k] byte offsets of
    each key's codes and scales in them (-1: masked). Returns [n, h, D] fp32. `prefill` (the
    tensor-core form; `tiles` overrides PREFILL_TILES there), `entry_splits` (decode form:
    programs over the entries besides the window's; tensor-core form: programs each query's
    keys are split over; 0: one program reads all), `head_block` (heads per program: each
    decodes the keys once for all of them) and `num_warps` are chosen from the shape unless
    given (launch_plan). A bf16 q attends as sparse_attention_ref says (faithful mode): one
    bf16 part of the queries and of the probabilities in the tensor-core form. `window_base`:
    bytes added to every valid window offset (codes, scales): a layer's ring read through
    layer 0's offsets, added where the keys are gathered (else to a copy of the offsets: _shifted).
    q may come as Queries, not yet rotated: the prefill form rotates them as it cuts their parts."""
    if isinstance(q, Queries):
        q = q.joined()
    first = q.raw if isinstance(q, Queries) else q
    n, heads, dim = first.shape
    assert window_offsets.shape == window_scale_offsets.shape and entry_offsets.shape == entry_scale_offsets.shape
    assert ring.dtype == torch.uint8 and pages.dtype == torch.uint8 and dim % 32 == 0
    out = torch.empty(n, heads, dim, dtype=torch.float32, device=first.device)
    w_off, w_soff = window_offsets.contiguous(), window_scale_offsets.contiguous()
    e_off, e_soff = entry_offsets.contiguous(), entry_scale_offsets.contiguous()
    K = e_off.shape[1]
    plan = launch_plan(n, K, heads, dim, head_block, entry_splits, prefill)
    assert not plan.prefill or prefill_form_fits(dim), f"the prefill form cannot take head_dim {dim}"
    sink = sink.float().contiguous()
    # one part of the query and of the probabilities (sparse_attention_ref)
    bf16 = q.bf16 if isinstance(q, Queries) else q.dtype == torch.bfloat16
    if isinstance(q, Queries) and not (plan.prefill and not interpreting() and attention_queries.ONE_PASS):
        q = q.rotated()  # only the GPU's prefill form takes them unrotated
    if plan.prefill:
        if n == 0:
            return out
        # one program for both halves where the queries fill the GPU many times over (a decode
        # batch's 48-255 rows keep the parity programs: twice the programs on the SMs)
        whole = not plan.entry_splits and n >= PREFILL_QUERIES
        bf16_tiles = {**BF16_TILES, **(BF16_PREFILL_TILES if whole else {})} if bf16 else {}
        batch_tiles = BATCH_TILES if not plan.entry_splits and not whole else {}
        ptx = not interpreting()
        decode_tiles = INTERPRETER_DECODE_TILES if INTERPRETER_DECODE and not (ptx or whole or tiles) else {}
        t = {**PREFILL_TILES, **batch_tiles, **bf16_tiles, **decode_tiles, **(tiles or {}),
             **(dict(QP=1, PP=1) if bf16 else {})}
        if bf16 and whole and t["GLUON"] and ptx and sparse_attention_gluon.usable(first, dim):
            queries = query_parts(q, 1, interleave=1)[0] if isinstance(q, Queries) else q.contiguous()
            rows = t.get("GLUON_ROWS", sparse_attention_gluon.DECODE_ROWS)
            gather = t["GLUON_GATHER"] or not sparse_attention_gluon.in_place(ring, pages, w_off, w_soff, e_off,
                                                                                e_soff, window_base)
            if gather:
                ring, pages = _gathered(ring, pages, w_off, w_soff, e_off, e_soff, dim, window_base)
            return sparse_attention_gluon.prefill_attention(queries, ring, w_off, w_soff, pages, e_off, e_soff, sink,
                                                            scale, out, rows, bool(gather), window_base,
                                                            t.get("GLUON_SKIP", 0))
        # even columns first, then odd: each program reads its own half and the other one
        parts = _query_parts(q, t["QP"], ptx, interleave=2)
        if t["GATHER"]:
            ring, pages = _gathered(ring, pages, w_off, w_soff, e_off, e_soff, dim, window_base)
        else:
            w_off, w_soff = _shifted(w_off, w_soff, window_base)
            if ring.numel() % 2:  # read as 16-bit words (a pool's slots are 64-byte aligned)
                ring = torch.cat([ring, ring.new_zeros(1)])
        W = w_off.shape[1]
        key_tiles = triton.cdiv(W, t["KT"]) + triton.cdiv(K, t["KT"])
        per_split = triton.cdiv(key_tiles, max(plan.entry_splits, 1))
        splits = triton.cdiv(key_tiles, per_split) if key_tiles else 1
        head_blocks = triton.cdiv(heads, plan.head_block)
        if t["TWO_PASS"] and splits == 1:
            return _two_pass(parts, ring, w_off, w_soff, pages, e_off, e_soff, sink, out, scale, plan.head_block, t,
                             ptx, num_warps)
        part_ml, part_acc = _split_parts(n, splits, heads, dim, out)
        both = bool(t["BOTH"])
        _prefill_attention_kernel[(n, head_blocks, (1 if both else 2) * splits)](
            parts, ring.view(torch.int16), w_off, w_soff, pages, e_off, e_soff, sink, out, part_ml, part_acc, heads,
            W, K, per_split, scale, parts.stride(0), parts.stride(1), parts.stride(2), w_off.stride(0),
            e_off.stride(0), out.stride(0), out.stride(1), D=dim, HB=plan.head_block, KT=t["KT"],
            QP=parts.shape[0], PP=t["PP"], PTX=ptx, GATHERED=bool(t["GATHER"]), SPLITS=splits, BOTH=both,
            num_warps=num_warps or t["num_warps"], num_stages=t["num_stages"], **pdl.options(parts.device))
        return _merge_splits(part_ml, part_acc, sink, out, splits, *HEAD_BLOCKS["decode"])
    q = q.contiguous()
    w_off, w_soff = _shifted(w_off, w_soff, window_base)
    hb, entry_splits, per_split = plan.head_block, plan.entry_splits, plan.per_split
    num_warps = num_warps or plan.warps
    head_blocks = triton.cdiv(heads, hb)
    splits = 1 if entry_splits == 0 else entry_splits + 1
    part_ml, part_acc = _split_parts(n, splits, heads, dim, out)
    grid = (n, head_blocks, splits)
    _sparse_attention_kernel[grid](q, ring, w_off, w_soff, pages, e_off, e_soff, sink, out,
                                   part_ml, part_acc, heads, w_off.shape[1], K, per_split, scale, q.stride(0),
                                   q.stride(1), w_off.stride(0), e_off.stride(0), out.stride(0), out.stride(1),
                                   D=dim, HB=hb, KT=KEY_TILE, HW_FP8=not interpreting(), SPLITS=splits,
                                   BF16_P=bf16, num_warps=num_warps, **pdl.options(q.device))
    return _merge_splits(part_ml, part_acc, sink, out, splits, hb, num_warps)


def decoded_form(q: torch.Tensor | Queries, dim: int) -> bool:
    """Whether a prefill chunk's launch over these queries takes keys decoded once
    (attend_decoded) where DECODED is set: from PREFILL_QUERIES queries, faithful mode's bf16
    ones on a Hopper GPU at the head dim the Gluon form is laid out for (GLUON set), exact
    mode's fp32 ones in the two-pass form where DECODED_EXACT is set too (the interpreter too)."""
    first = q.raw if isinstance(q, Queries) else q
    bf16 = q.bf16 if isinstance(q, Queries) else q.dtype == torch.bfloat16
    t = {**PREFILL_TILES, **BF16_PREFILL_TILES} if bf16 else PREFILL_TILES
    if first.shape[0] < PREFILL_QUERIES or not t["DECODED"] or not prefill_form_fits(dim):
        return False
    if bf16:
        return bool(t["GLUON"]) and not interpreting() and sparse_attention_gluon.usable(first, dim)
    return bool(t["TWO_PASS"] and t["DECODED_EXACT"])


# Faithful prefill's queries go to the decoded Gluon form before RoPE, which rotates and rounds
# them as it reads them (sparse_attention_gluon._rotated_queries), not rotated into a bf16 copy
# by a launch first (attention_queries.query_parts, at a 16,384-query chunk reading 2.1 GB and
# writing 1.1: 0.76 ms a layer at its bytes). The kernel then reads the fp32 queries, 2.1 GB
# where it read the 1.1 GB copy: ~2.1 GB a layer fewer. The same bits (GPU test); sm_90: 255
# registers and no spills either way. H100, forty-sixth session (bench/rope_in_rows.py, 16,384
# queries x 64 heads, 128 window keys and 512 entries, alternated three times): 5,501 -> 5,074
# us a layer, RoPE launch included (~8.5 ms of a CED chunk's 20 layers).
ROPE_IN_ROWS = True
# ... and, where its queries come so, it writes its outputs as wo_a's FP8 operand itself
# (sparse_attention_gluon._finish_encoded: the inverse RoPE, faithful mode's 1 x 32 rounding
# and the 128-column encode in its epilogue), not as fp32 rows that the inverse RoPE's launch
# reads and writes and the operand's encode reads again: at a 16,384-query chunk 2.1 GB
# written, 0.5 GB read and written, 2.1 GB read, against the operand's 0.5 GB written, ~4.5 GB
# a layer fewer by the bytes. The same bits (GPU test; a faithful prefill's last logits). H100,
# forty-seventh session, faithful prefills in 16K chunks alternated in one process: 32K 1.326 /
# 1.327 -> 1.304 / 1.309 s; 1M 51.98 -> 51.06 s (peak memory 62.95 -> 61.47 GiB).
ENCODE_IN_ROWS = True
# PINGPONG_ROWS: those rows go to the warp-specialized form instead (sparse_attention_pingpong:
# a loader warpgroup, two compute warpgroups on alternate key tiles, out of phase), the same
# work summed in another order (its GPU test: as near the float64 attention as the rows
# kernel). Slower so far, so off: 16,384 queries 8.8 against 5.0 ms (H100), 8.1 against 5.1
# (H200); a 32K prefill 1.46 against 1.31 s (H100; forty-eighth session). Without the key
# copies 6.66 against 4.42 ms (H200, forty-ninth session): its compute schedule, not its loads.
PINGPONG_ROWS = False


def attend_decoded(q: torch.Tensor | Queries, window_keys: torch.Tensor, window_rows: torch.Tensor,
                   entry_keys: torch.Tensor, entry_rows: torch.Tensor, sink: torch.Tensor, scale: float,
                   operand_groups: int = 0) -> torch.Tensor | fp8_blockwise.Operand:
    """sparse_attention over keys decoded once (decode_keys): window_keys / entry_keys [*, D]
    bf16, and each query's rows of them, window_rows [n, W] and entry_rows [n, k] (< 0:
    masked), where decoded_form says. bf16 queries: the Gluon form, what sparse_attention
    computes over the same keys in their FP8 and FP4 bytes bit for bit; fp32 ones: the two-pass
    form with the queries' halves as their first and last columns (the same products, summed
    in another order than the byte form's even and odd columns). operand_groups > 0: where the
    Gluon form can (ENCODE_IN_ROWS), it returns the outputs after the inverse RoPE as an
    FP8 product's operand of that many groups (fp8_blockwise.Operand), not the fp32 rows. Queries
    in halves (a tail: attention_queries.SPLIT_QUERIES) go to the Gluon form as they are."""
    if isinstance(q, Queries) and not (q.bf16 and ROPE_IN_ROWS and not PINGPONG_ROWS):
        q = q.joined()
    first = q.raw if isinstance(q, Queries) else q
    n, heads, dim = q.shape
    window_rows, entry_rows, sink = window_rows.contiguous(), entry_rows.contiguous(), sink.float().contiguous()
    bf16 = q.bf16 if isinstance(q, Queries) else q.dtype == torch.bfloat16
    rope = operand = tail = None
    if bf16 and isinstance(q, Queries) and ROPE_IN_ROWS and (q.raw.dtype == torch.float32 or q.tail is not None):
        queries, cos, sin = q.for_kernel()
        rope, tail = (cos, sin), q.tail
        if ENCODE_IN_ROWS and operand_groups:
            operand = fp8_blockwise.empty_operand(n, heads * dim, operand_groups, first.device)
    elif bf16:
        queries = query_parts(q, 1, interleave=1)[0] if isinstance(q, Queries) else q.contiguous()
    out = operand if operand is not None else torch.empty(n, heads, dim, dtype=torch.float32, device=first.device)
    if bf16:
        skip = BF16_PREFILL_TILES.get("GLUON_SKIP", 0)
        if PINGPONG_ROWS and not skip:
            return sparse_attention_pingpong.prefill_attention_pingpong(queries, window_keys, window_rows, entry_keys,
                                                                        entry_rows, sink, scale, out, 0, rope)
        return sparse_attention_gluon.prefill_attention_decoded(queries, window_keys, window_rows, entry_keys,
                                                                entry_rows, sink, scale, out, skip, rope, tail)
    t, ptx = PREFILL_TILES, not interpreting()
    parts = _query_parts(q, t["QP"], ptx, interleave=1)
    plan = launch_plan(n, entry_rows.shape[1], heads, dim, prefill=True)
    return _two_pass(parts, window_keys, window_rows, window_rows, entry_keys, entry_rows, entry_rows, sink, out,
                     scale, plan.head_block, t, ptx, None, decoded=True)


def _query_parts(q: torch.Tensor | Queries, parts: int, ptx: bool, interleave: int) -> torch.Tensor:
    """The prefill forms' fp32 queries as `parts` bf16 parts [parts, n, h, D], each row's
    columns grouped by their remainder mod `interleave` (bf16_parts); RoPE and the parts in
    one launch where the queries come before RoPE. The interpreter dots in fp32: the rotated
    queries are the one part."""
    if isinstance(q, Queries) and ptx and attention_queries.ONE_PASS:
        return query_parts(q, parts, interleave=interleave)
    rotated = q.rotated() if isinstance(q, Queries) else q
    if ptx:
        return bf16_parts(rotated, parts, interleave=interleave)
    return group_columns(rotated.float(), interleave)[None]


def _gathered(ring: torch.Tensor, pages: torch.Tensor, w_off: torch.Tensor, w_soff: torch.Tensor,
              e_off: torch.Tensor, e_soff: torch.Tensor, dim: int, window_base: tuple[int, int]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """gather_keys' copies of the window's FP8 keys (base added) and of the entries' FP4 ones,
    for the forms that read keys at addresses that follow from their place."""
    return (gather_keys(ring, w_off, w_soff, dim, dim // 32, window_base),
            gather_keys(pages, e_off, e_soff, dim // 2, dim // 16))


def _shifted(w_off: torch.Tensor, w_soff: torch.Tensor, base: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Window offsets with `base` added where valid, for the forms that read the ring in place
    (gather_keys adds it as it copies)."""
    if not any(base):
        return w_off, w_soff
    return torch.where(w_off >= 0, w_off + base[0], -1), w_soff + base[1]


def _two_pass(parts, ring, w_off, w_soff, pages, e_off, e_soff, sink, out, scale: float, head_block: int, t: dict,
              ptx: bool, num_warps: int | None, decoded: bool = False) -> torch.Tensor:
    """The prefill form in two launches (_prefill_logits_kernel, _prefill_values_kernel): the
    logits once per query, through a [n, heads, keys] fp32 buffer, then the weighted sums.
    `decoded`: ring and pages are decode_keys' rows, w_off and e_off each query's rows of them.
    t["SPLIT2"] > 0: pass 1 takes each query's keys in splits of that many tiles, each with its
    own max and sum, which pass 2 merges before its one pass over the keys."""
    n, heads, dim = out.shape
    W, K, KT = w_off.shape[1], e_off.shape[1], t["KT2"]
    key_tiles = triton.cdiv(W, KT) + triton.cdiv(K, KT)
    per_split = t.get("SPLIT2", 0) or max(key_tiles, 1)
    splits = max(triton.cdiv(key_tiles, per_split), 1)
    logits = torch.empty(n, heads, key_tiles * KT, dtype=torch.float32, device=out.device)
    ml = torch.empty(n, splits, heads, 2, dtype=torch.float32, device=out.device)
    grid = (n, triton.cdiv(heads, head_block))
    # decoded: one stage, as two would stage both bf16 halves of a 64-key tile twice (278 KB of
    # shared memory at the release's shapes; one 196 KB, and fewer spills than the byte form's)
    common = dict(D=dim, HB=head_block, KT=KT, PTX=ptx, GATHERED=bool(t["GATHER"]) and not decoded, DECODED=decoded,
                  num_warps=num_warps or t["num_warps"], num_stages=1 if decoded else t["num_stages"])
    ring16 = ring if decoded else ring.view(torch.int16)
    _prefill_logits_kernel[grid + (splits,)](
        parts, ring16, w_off, w_soff, pages, e_off, e_soff, logits, ml, heads, W, K, per_split, scale,
        parts.stride(0), parts.stride(1), parts.stride(2), w_off.stride(0), e_off.stride(0), logits.stride(0),
        logits.stride(1), QP=parts.shape[0], SPLITS=splits, **common, **pdl.options(parts.device))
    _prefill_values_kernel[grid + (2,)](ring16, w_off, w_soff, pages, e_off, e_soff, logits, ml, sink, out, heads, W, K,
                                        w_off.stride(0), e_off.stride(0), logits.stride(0), logits.stride(1),
                                        out.stride(0), out.stride(1), PP=t["PP"], SPLITS=splits, **common,
                                        **pdl.options(ring16.device))
    return out


def _split_parts(n: int, splits: int, heads: int, dim: int, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where split programs leave their running max and sum [n, splits, heads, 2] and their
    accumulators [n, splits, heads, dim] for _combine_kernel (`out` itself, unread, for one)."""
    if splits == 1:
        return out, out
    return (torch.empty(n, splits, heads, 2, dtype=torch.float32, device=out.device),
            torch.empty(n, splits, heads, dim, dtype=torch.float32, device=out.device))


def _merge_splits(part_ml, part_acc, sink: torch.Tensor, out: torch.Tensor, splits: int, head_block: int,
                  warps: int) -> torch.Tensor:
    """out, with the splits' partial softmaxes merged into it (_combine_kernel) when there are
    several (one split wrote out itself)."""
    if splits > 1:
        n, heads, dim = out.shape
        _combine_kernel[(n, triton.cdiv(heads, head_block))](part_ml, part_acc, sink, out, heads, out.stride(0),
                                                             out.stride(1), D=dim, HB=head_block, SPLITS=splits,
                                                             num_warps=warps, **pdl.options(part_ml.device))
    return out
