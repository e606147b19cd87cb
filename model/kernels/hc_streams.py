"""The mHC stream updates of a site in one launch each (layers/mhc.py has the math).

Shapes: T tokens, S streams (a power of two), H hidden. Each reads the streams X [T, S, H]
once: torch's forms write and read [T, S, H] intermediates (a batched matmul, a product, a
sum), which at a prefill chunk's 8,192 rows is 670 MB per tensor.
- hc_expand: stream k <- post_k * y + sum_j comb[j, k] X_j;
- hc_collapse_norm: RMSNorm(sum_j pre_j X_j) * weight, as rms_norm(hc_collapse(X, pre), ...);
- hc_mixes: the site's mixes (flat(X) @ fn^T) * rsqrt(mean(flat(X)^2) + eps), the spec's order:
  the normalized streams are never written (at prefill rows they were, and read back by an
  fp32 GEMM: 0.49 ms a site at 8,192 rows);
- hc_expand_mix_parts (decode rows): hc_expand, and the next site's mixes in parts per column
  block, summed and scaled by hc_gates.hc_gates_from_parts;
- hc_site (prefill rows): a whole site in one read of its streams: the expand before it or
  not, its mixes and its input (hc_collapse_norm by the previous site's `pre`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layers.mhc import STREAM_DTYPES
from . import common, pdl
from .common import DOT, as_stored, dot_fp32, dot_fp32_raw, interpreting
from .fp8_blockwise import BLOCK as ENCODE_BLOCK
from .fp8_blockwise import Operand, encode_blocks


@triton.jit
def _project(x, w, acc, TF32_HEADS: tl.constexpr, RAW_HEADS: tl.constexpr):
    """acc + x @ w^T to fp32's accuracy: RAW_HEADS (common.RAW_HEADS unless the tiles say),
    common.dot_fp32_raw's heads as the operands lie; TF32_HEADS, common.dot_fp32's masked
    heads; else Triton's tf32x3 (exact fp32 in the interpreter)."""
    if RAW_HEADS:
        return dot_fp32_raw(x, tl.trans(w), acc)
    if TF32_HEADS:
        return dot_fp32(x, tl.trans(w), acc)
    return tl.dot(x, tl.trans(w), acc, input_precision=DOT)


@triton.jit
def _project_parts(x, fnp_ptr, n, cols, N, K, live, acc, HW_DOTS: tl.constexpr):
    """acc + x @ fn^T where x is exact in bf16 (bf16 streams) and fn is given as its three bf16
    parts [3, N, K] (fn_parts): three bf16 MMAs, each product exact, the smallest part first.
    The interpreter computes a bf16 dot wrong: there the same exact values in an fp32 dot."""
    xb = x.to(tl.bfloat16) if HW_DOTS else x
    for i in tl.static_range(3):
        w = tl.load(fnp_ptr + (2 - i) * N * K + n[:, None] * K + cols[None, :], mask=(n < N)[:, None] & live[None, :],
                    other=0.0)
        acc = tl.dot(xb, tl.trans(w if HW_DOTS else w.to(tl.float32)), acc)
    return acc


@triton.jit
def _hc_expand_kernel(y_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, H, syt, sxt, sxs, sot, sos,
                      S: tl.constexpr, BLOCK: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr):
    """Program (token t, column block): all S output streams of those columns (BF16: bf16
    streams, read into fp32, the new ones rounded once as stored)."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)  # (t * sxt passes 2^31 from ~105K tokens of 4 x 5120 streams)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    s = tl.arange(0, S)
    live = d < H
    x = tl.load(x_ptr + t * sxt + s[:, None] * sxs + d[None, :], mask=live[None, :], other=0.0).to(tl.float32)
    y = tl.load(y_ptr + t * syt + d, mask=live, other=0.0).to(tl.float32)
    comb = tl.load(comb_ptr + t * S * S + s[:, None] * S + s[None, :])  # [j, k]
    post = tl.load(post_ptr + t * S + s)
    mixed = tl.sum(comb[:, :, None] * x[:, None, :], axis=0)  # [k, d]
    out = as_stored(post[:, None] * y[None, :] + mixed, BF16)
    tl.store(out_ptr + t * sot + s[:, None] * sos + d[None, :], out, mask=live[None, :])


@triton.jit
def _hc_expand_mix_parts_kernel(y_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, fn_ptr, part_ptr, sq_ptr, T, H, N,
                                syt, sxt, sxs, sot, sos, sfn, S: tl.constexpr, TB: tl.constexpr,
                                BLOCK: tl.constexpr, NP: tl.constexpr, TF32_HEADS: tl.constexpr,
                                RAW_HEADS: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr):
    """Program (TB tokens, column block): the hc_expand of those columns, and their part of the
    next site's mixes while the new streams are in registers: the projections onto fn's rows
    (flat column k * H + d) [TB, NP] at part_ptr[t, block] and the sums of squares at
    sq_ptr[t, block] (hc_gates sums the blocks' parts in order). fp32-accurate dots: _project.
    BF16: as _hc_expand_kernel's, the parts made from the rounded streams."""
    pdl.wait_for_inputs(PDL)
    t = (tl.program_id(0) * TB + tl.arange(0, TB)).to(tl.int64)
    block = tl.program_id(1)
    d = block * BLOCK + tl.arange(0, BLOCK)
    j = tl.arange(0, S)
    n = tl.arange(0, NP)
    tok = t < T
    live = tok[:, None] & (d < H)[None, :]
    x = tl.load(x_ptr + t[:, None, None] * sxt + j[None, :, None] * sxs + d[None, None, :],
                mask=live[:, None, :], other=0.0).to(tl.float32)  # [t, j, d]
    y = tl.load(y_ptr + t[:, None] * syt + d[None, :], mask=live, other=0.0).to(tl.float32)
    proj = tl.zeros((TB, NP), tl.float32)
    squares = tl.zeros((TB, BLOCK), tl.float32)
    for k in tl.static_range(S):
        comb = tl.load(comb_ptr + t[:, None] * S * S + j[None, :] * S + k, mask=tok[:, None], other=0.0)  # [t, j]
        post = tl.load(post_ptr + t * S + k, mask=tok, other=0.0)
        out = as_stored(post[:, None] * y + tl.sum(comb[:, :, None] * x, axis=1), BF16)
        tl.store(out_ptr + t[:, None] * sot + k * sos + d[None, :], out, mask=live)
        squares += out * out
        w = tl.load(fn_ptr + n[:, None] * sfn + (k * H + d)[None, :], mask=(n < N)[:, None] & (d < H)[None, :],
                    other=0.0)
        proj = _project(out, w, proj, TF32_HEADS, RAW_HEADS)
    at = t * tl.num_programs(1) + block
    tl.store(part_ptr + at[:, None] * NP + n[None, :], proj, mask=tok[:, None])
    tl.store(sq_ptr + at, tl.sum(squares, axis=1), mask=tok)


@triton.jit
def _hc_collapse_norm_kernel(x_ptr, pre_ptr, w_ptr, out_ptr, H, eps, sxt, sxs, sot,
                             S: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program (token t): the collapsed row, normalized (BLOCK >= H: the whole row at once)."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK)
    s = tl.arange(0, S)
    live = d < H
    x = tl.load(x_ptr + t * sxt + s[:, None] * sxs + d[None, :], mask=live[None, :], other=0.0).to(tl.float32)
    pre = tl.load(pre_ptr + t * S + s)
    row = tl.sum(pre[:, None] * x, axis=0)
    inv = 1.0 / tl.sqrt(tl.sum(row * row, axis=0) / H + eps)
    w = tl.load(w_ptr + d, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * sot + d, w * (row * inv), mask=live)


@triton.jit
def _hc_mixes_kernel(x_ptr, fn_ptr, out_ptr, part_ptr, squares_ptr, T, N, K, K_PER_SPLIT, eps, sxt, sfn, sot,
                     BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
                     TF32_HEADS: tl.constexpr, RAW_HEADS: tl.constexpr, PDL: tl.constexpr):
    """Program (BLOCK_T rows, K split): their projections and sums of squares in one pass over
    the split's columns (fp32-accurate dots: _project). One split scales and stores
    the mixes; several leave [SPLITS, T, BLOCK_N] projections and [SPLITS, T] sums of squares."""
    pdl.wait_for_inputs(PDL)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    split = tl.program_id(1)
    n = tl.arange(0, BLOCK_N)
    live = rows < T
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    squares = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)  # summed along the rows once, after the loop
    for k0 in range(split * K_PER_SPLIT, tl.minimum(K, (split + 1) * K_PER_SPLIT), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * sxt + k[None, :], mask=live[:, None] & (k < K)[None, :],
                    other=0.0).to(tl.float32)
        # fn's rows are contiguous along K: loaded as they lie (coalesced), then transposed
        w = tl.load(fn_ptr + n[:, None] * sfn + k[None, :], mask=(n < N)[:, None] & (k < K)[None, :], other=0.0)
        squares += x * x
        acc = _project(x, w, acc, TF32_HEADS, RAW_HEADS)
    squares = tl.sum(squares, axis=1)
    if SPLITS == 1:
        inv = 1.0 / tl.sqrt(squares / K + eps)
        tl.store(out_ptr + rows[:, None] * sot + n[None, :], acc * inv[:, None],
                 mask=live[:, None] & (n < N)[None, :])
    else:
        at = split * T + rows
        tl.store(part_ptr + at[:, None] * BLOCK_N + n[None, :], acc, mask=live[:, None])
        tl.store(squares_ptr + at, squares, mask=live)


@triton.jit
def _hc_site_kernel(x_ptr, y_ptr, post_ptr, comb_ptr, pre_ptr, fn_ptr, w_ptr, streams_ptr, mixes_ptr, row_ptr,
                    codes_ptr, scales_ptr, T, H, N, sxt, sxs, syt, sst, sss, sfn, smt, srt, CODE_ROWS, mix_eps,
                    norm_eps, S: tl.constexpr, TB: tl.constexpr, BLOCK: tl.constexpr, NP: tl.constexpr,
                    EXPAND: tl.constexpr, ENCODE: tl.constexpr, HW_FP8: tl.constexpr, TF32_HEADS: tl.constexpr,
                    RAW_HEADS: tl.constexpr, PDL: tl.constexpr, ROW_OUT: tl.constexpr = True,
                    BF16: tl.constexpr = False, fnp_ptr=None, FN_PARTS: tl.constexpr = False):
    """Program (TB tokens, every column): an mHC site of those tokens in one read of their
    streams. EXPAND: the streams are first the sublayer's output y taken in (hc_expand), and
    written to streams_ptr. Of the (new) streams, column block by column block: the site's
    mixes, their projections onto fn's rows (flat column k * H + d; fp32-accurate dots,
    _project) and sums of squares, stored [T, N] scaled as hc_mixes scales them; and the site's
    input, the streams collapsed by the previous site's `pre` (known before the pass), stored
    as it is made, then RMS-normalized times w in a second pass over these tokens' rows: 4 bytes
    a column read back and written again where the streams would be read again (16). At a
    16K chunk they come back from HBM, not L2: ~132 resident programs write 1.3 MB of rows
    each, over L2's 50 MB. ENCODE: that second pass also writes the input's FP8 operand as
    rows_1x128(input, round_first=True) makes it (codes [CODE_ROWS, H], scales of block b at
    b * CODE_ROWS + row), 128 columns a step; without ROW_OUT (with ENCODE) only that: row_ptr
    is then the first pass's scratch, left holding the rows before their norm. BF16: bf16
    streams, read into fp32; the new ones rounded once as stored, before anything reads them.
    FN_PARTS (with BF16): the mixes' dots as bf16 MMAs against fn's three bf16 parts at fnp_ptr
    (_project_parts), not fn's fp32 rows in TF32 passes."""
    pdl.wait_for_inputs(PDL)
    t = (tl.program_id(0) * TB + tl.arange(0, TB)).to(tl.int64)
    tok = t < T
    j = tl.arange(0, S)
    n = tl.arange(0, NP)
    proj = tl.zeros((TB, NP), tl.float32)
    squares = tl.zeros((TB, BLOCK), tl.float32)  # (both summed along the rows once, after the loop)
    row_squares = tl.zeros((TB, BLOCK), tl.float32)
    for d0 in range(0, H, BLOCK):
        d = d0 + tl.arange(0, BLOCK)
        live = tok[:, None] & (d < H)[None, :]
        if EXPAND:  # all S streams of these columns: each new stream mixes them
            x = tl.load(x_ptr + t[:, None, None] * sxt + j[None, :, None] * sxs + d[None, None, :],
                        mask=live[:, None, :], other=0.0).to(tl.float32)  # [t, j, d]
            y = tl.load(y_ptr + t[:, None] * syt + d[None, :], mask=live, other=0.0).to(tl.float32)
        row = tl.zeros((TB, BLOCK), tl.float32)
        for k in tl.static_range(S):
            if EXPAND:
                comb = tl.load(comb_ptr + t[:, None] * S * S + j[None, :] * S + k, mask=tok[:, None], other=0.0)
                post = tl.load(post_ptr + t * S + k, mask=tok, other=0.0)
                stream = as_stored(post[:, None] * y + tl.sum(comb[:, :, None] * x, axis=1), BF16)
                tl.store(streams_ptr + t[:, None] * sst + k * sss + d[None, :], stream, mask=live)
            else:
                stream = tl.load(x_ptr + t[:, None] * sxt + k * sxs + d[None, :], mask=live, other=0.0).to(tl.float32)
            squares += stream * stream
            if FN_PARTS:
                proj = _project_parts(stream, fnp_ptr, n, k * H + d, N, S * H, d < H, proj, HW_FP8)  # (on the GPU)
            else:
                w = tl.load(fn_ptr + n[:, None] * sfn + (k * H + d)[None, :],
                            mask=(n < N)[:, None] & (d < H)[None, :], other=0.0)
                proj = _project(stream, w, proj, TF32_HEADS, RAW_HEADS)
            row += tl.load(pre_ptr + t * S + k, mask=tok, other=0.0)[:, None] * stream
        tl.store(row_ptr + t[:, None] * srt + d[None, :], row, mask=live)
        row_squares += row * row
    inv = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / (S * H) + mix_eps)
    tl.store(mixes_ptr + t[:, None] * smt + n[None, :], proj * inv[:, None], mask=tok[:, None] & (n < N)[None, :])
    inv = 1.0 / tl.sqrt(tl.sum(row_squares, axis=1) / H + norm_eps)
    tl.debug_barrier()  # (the layouts may give a row's columns back to other threads than wrote them)
    STEP: tl.constexpr = 128 if ENCODE else BLOCK  # (ENCODE: H a multiple of 128)
    for d0 in range(0, H, STEP):
        d = d0 + tl.arange(0, STEP)
        live = tok[:, None] & (d < H)[None, :]
        row = tl.load(row_ptr + t[:, None] * srt + d[None, :], mask=live, other=0.0)
        scale = tl.load(w_ptr + d, mask=d < H, other=0.0).to(tl.float32)
        row = scale[None, :] * (row * inv[:, None])
        if ROW_OUT:
            tl.store(row_ptr + t[:, None] * srt + d[None, :], row, mask=live)
        if ENCODE:
            codes, scales = encode_blocks(row, TB, True, HW_FP8)
            tl.store(codes_ptr + t[:, None] * H + d[None, :], codes, mask=live)
            tl.store(scales_ptr + (d0 // 128) * CODE_ROWS + t, scales, mask=tok)


# Decode rows' hc_expand_mix_parts takes common.RAW_HEADS too. Its GPU tests pass, and it gains
# nothing there (H200, fifty-first session, bench/decode_ab.py, faithful 4K, two rounds, ms a
# step: batch 1 21.77, 20.12 off against 22.20, 20.18 on; batch 8 37.53, 36.69 against 36.67,
# 36.61), so decode keeps tf32x3's smaller error.
RAW_HEADS_AT_DECODE = False


def _dots(decode: bool = False) -> dict:
    """The mixes' dots' form as the switches say at this launch (_project)."""
    return dict(TF32_HEADS=common.TF32_HEADS, RAW_HEADS=common.RAW_HEADS and (RAW_HEADS_AT_DECODE or not decode))


# From this many rows (prefill) a site's mixes take hc_mixes; decode rows keep RMSNorm and the
# split-K fp32 GEMM, which spread a few rows' 20,480 columns over the SMs (hc_mixes gives each
# program BLOCK_T whole rows).
MIXES_ROWS = 4096
# H200, 2026-12-02, 8,192 rows of 4 x 5,120 (bench/prefill_passes.py; RMSNorm, then torch's
# fp32 GEMM: 661-680 us): 128 rows and 32 columns a step on 8 warps, K split 4 ways, 387 us
# (410 while the squares were summed along the rows at every step); split 8 398, split 2
# 443; 64 x 32 split 4 408; 64 x 64 unsplit 529-532; 32 x 128 unsplit 2,115.
MIXES_TILES = dict(BLOCK_T=128, BLOCK_K=32, num_warps=8, num_stages=3, SPLITS=4)


def hc_mixes(X: torch.Tensor, fn: torch.Tensor, eps: float, tiles: dict | None = None) -> torch.Tensor:
    """X [T, S, H] streams (supported), fn [N, S*H] fp32 -> the mixes [T, N] fp32 in one launch, or
    with SPLITS > 1 one and the sum of the splits' parts in fixed order (`tiles` overrides
    MIXES_TILES)."""
    T = X.shape[0]
    flat = X.reshape(T, -1)
    N, K = fn.shape
    assert flat.shape[1] == K and fn.dtype == torch.float32 and flat.stride(-1) == 1, (X.shape, fn.shape)
    fn = fn.contiguous()
    out = torch.empty(T, N, dtype=torch.float32, device=X.device)
    if T == 0:
        return out
    t = {**MIXES_TILES, **_dots(), **(tiles or {})}
    splits, block_n = t["SPLITS"], max(16, triton.next_power_of_2(N))
    per_split = triton.cdiv(triton.cdiv(K, splits), t["BLOCK_K"]) * t["BLOCK_K"]
    parts = torch.empty(splits, T, block_n, device=X.device) if splits > 1 else out
    squares = torch.empty(splits, T, device=X.device) if splits > 1 else out
    _hc_mixes_kernel[(triton.cdiv(T, t["BLOCK_T"]), splits)](flat, fn, out, parts, squares, T, N, K, per_split, eps,
                                                             flat.stride(0), fn.stride(0), out.stride(0),
                                                             BLOCK_N=block_n, **t, **pdl.options(flat.device))
    if splits > 1:
        inv = 1.0 / torch.sqrt(squares.sum(0) / K + eps)
        torch.mul(parts.sum(0)[:, :N], inv[:, None], out=out)
    return out


def supported(X: torch.Tensor) -> bool:
    """fp32 or bf16 streams [T, S, H] (layers/mhc.stream_dtype) with S a power of two and rows of
    contiguous columns."""
    S = X.shape[1]
    return X.dim() == 3 and X.dtype in STREAM_DTYPES and S & (S - 1) == 0 and X.stride(-1) == 1


def _bf16(X: torch.Tensor) -> bool:
    """Whether the new streams a launch makes from X are rounded to bf16 as stored."""
    return X.dtype == torch.bfloat16


def hc_expand(y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y [T, H], X [T, S, H] (supported), post [T, S], comb [T, S, S] -> [T, S, H] as X."""
    T, S, H = X.shape
    y, post, comb = y.contiguous(), post.float().contiguous(), comb.float().contiguous()
    out = torch.empty(T, S, H, dtype=X.dtype, device=X.device)
    if T:
        block = 256
        _hc_expand_kernel[(T, triton.cdiv(H, block))](y, X, post, comb, out, H, y.stride(0), X.stride(0), X.stride(1),
                                                      out.stride(0), out.stride(1), S=S, BLOCK=block,
                                                      BF16=_bf16(X), **pdl.options(y.device))
    return out


# Rows up to which hc_expand_mix_parts takes a sublayer's output into the streams and the next
# site's mixes in one launch (a decode batch; prefill rows keep hc_expand, then hc_mixes). 0: never.
# Used where the two follow each other in one graph: the attention's output, then the FFN
# site's mixes. H200, 2026-12-04 (bench/decode_kernel_diff.py, PDL off, us a step): batch 1
# 21,238 -> 20,997 (the FFN sites' mixes 416 us and 43 RMSNorms gone, this kernel 260, the
# gates 82 more); batch 8 45,826 -> 45,298. Step times within noise (bench/decode_ab.py).
# At prefill rows it paid nothing: a 32K faithful prefill 1.274 s either way (forty-second session).
EXPAND_MIX_ROWS = 256
EXPAND_MIX_TILES = dict(TB=16, BLOCK=64, num_warps=4)


def hc_expand_mix_parts(y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_expand(y, X, post, comb) -> the new streams [T, S, H], with the next site's mixes in
    parts: projections [T, B, NP] onto fn's [N, S*H] fp32 rows and sums of squares [T, B] of
    each of B column blocks (hc_gates.hc_gates_from_parts joins them). Saves the next site an
    RMSNorm and a split-K GEMM launch (~12 us at batch 1) and a read of the streams."""
    T, S, H = X.shape
    N = fn.shape[0]
    assert fn.shape[1] == S * H and fn.dtype == torch.float32, (fn.shape, X.shape)
    y, post, comb, fn = y.contiguous(), post.float().contiguous(), comb.float().contiguous(), fn.contiguous()
    t = EXPAND_MIX_TILES
    blocks, np_ = triton.cdiv(H, t["BLOCK"]), max(16, triton.next_power_of_2(N))
    out = torch.empty(T, S, H, dtype=X.dtype, device=X.device)
    parts = torch.empty(T, blocks, np_, dtype=torch.float32, device=X.device)
    squares = torch.empty(T, blocks, dtype=torch.float32, device=X.device)
    if T:
        _hc_expand_mix_parts_kernel[(triton.cdiv(T, t["TB"]), blocks)](
            y, X, post, comb, out, fn, parts, squares, T, H, N, y.stride(0), X.stride(0), X.stride(1), out.stride(0),
            out.stride(1), fn.stride(0), S=S, NP=np_, BF16=_bf16(X), **_dots(decode=True), **t,
            **pdl.options(y.device))
    return out, parts, squares


def hc_collapse_norm(X: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """X [T, S, H] (supported), pre [T, S] -> RMSNorm(sum_j pre_j X_j) [T, H] fp32, times weight if given."""
    T, S, H = X.shape
    pre = pre.float().contiguous()
    w = torch.ones(H, device=X.device) if weight is None else weight.contiguous()
    out = torch.empty(T, H, dtype=torch.float32, device=X.device)
    if T:
        block = triton.next_power_of_2(H)
        _hc_collapse_norm_kernel[(T,)](X, pre, w, out, H, eps, X.stride(0), X.stride(1), out.stride(0), S=S,
                                       BLOCK=block, num_warps=8 if block >= 4096 else 4, **pdl.options(X.device))
    return out


# From this many rows (prefill) an mHC site takes hc_site: the attention site's mixes and input
# in one read of its streams (two before), the FFN site's with the attention's expand in one
# read and a write (three reads and a write before): per layer 5 passes over the [T, 4, 5120]
# streams where there were 8 (1.34 GB a pass at a 16K chunk). 0: never (off until timed; the
# forty-second session's one-pass form, a decode-shaped tile of 16 tokens x 64 columns whose
# mixes went through 80 parts a token, ran 2x slower than the separate launches). H100,
# forty-sixth session, 16,384 rows (bench/prefill_passes.py --sections mixes,sites): the
# attention site in one pass 1,530 us (4 warps; 2,136 on 8) against 1,341 for its mixes and
# input apart; the FFN site with the expand 2,304 (4 warps; 3,792 on 8) against 2,406 apart.
# The one pass was bound by its mixes' dots (the mixes alone in one pass: 752 us, 2.35x the
# bytes). With the raw heads (common.RAW_HEADS) and SITE_TILES, fiftieth session: on. H100,
# 32K faithful prefills alternated in one process (16K chunks): 1.275 / 1.263 / 1.267 s off,
# 1.245 / 1.252 / 1.253 s on (the sites' tiles at 2 stages), ~14 ms a chunk.
SITE_ROWS = 4096
# Where SITE_ROWS takes a site: a block's FFN output goes into the streams inside the next
# block's attention site (its hc_site with the expand), not in an hc_expand of its own: one read
# of the streams fewer a layer (5 passes -> 4; 1.34 GB, ~0.32 ms a layer at a 16K chunk by its
# bytes). The same bits. Timed with SITE_ROWS only (fiftieth session, above).
DEFER_FFN_EXPAND = True
# TB tokens a program share each fn tile they read (fn is 2.6 MB: read T / TB times from L2),
# by whether the site takes an expand first. 8 warps: 1.4-1.6x slower (H100, see SITE_ROWS).
# H100, fiftieth session, 16,384 rows, the raw heads (bench/prefill_passes.py --sections
# sites, us): without the expand 1,084 at (TB 64, BLOCK 32, 3 stages), 1,153 at 2 stages, 1,485
# at (64, 16), 1,699-1,784 at (32, 32), 2,247-2,419 at BLOCK 64; with it 1,791 at (32, 32, 3
# stages), 1,981 at 2, 1,933 at (16, 64), 2,283 at (64, 16), 2,770-3,925 at (64, 32) (888
# stack bytes of spills at 2 stages), 6,546 at (32, 64). Apart, the two launches of the
# attention site took 1,145 and the FFN site's three 2,198. 16 tokens a program (BLOCK 32)
# take 94 registers without the expand and 168 with it (five and three programs an SM) and
# are slower (fifty-sixth session, call AK): 2,306 / 2,091 us at 2 / 3 stages without, 2,095 /
# 2,031 with, against 1,076 and 1,770 in the shipped tiles.
SITE_TILES = {False: dict(TB=64, BLOCK=32, num_warps=4, num_stages=3),
              True: dict(TB=32, BLOCK=32, num_warps=4, num_stages=3)}
# A site's pass also writes its input's FP8 operand (hc_site's operand) for the FP8 product that
# reads it first: the attention site's for wq_a and wkv (merged: attention.project), the FFN
# site's for the shared expert's gate and up and the routed experts' pairs (TritonOps.ffn_operand).
# Their own encode read the [T, H] fp32 input back (335 MB at a 16K chunk, ~0.08 ms a site by
# the bytes) to write the same codes. The FFN site's on one rank only (DeepseekV41._attn_out_ffn).
# The same bits (CPU tests; on the H100 the codes and scales of 16,384 rows equal). 16,384 rows
# (bench/prefill_passes.py, fifty-second session, call Z): the attention site then its encode
# 1,157 us, in the pass 1,013; the FFN site 1,862 -> 1,701. H100 32K faithful prefill,
# alternated: 1.179 / 1.176 -> 1.164 / 1.159 s, the same last logits.
SITE_OPERAND = True
# With it, a site whose input nothing but that product reads (the attention site of a layer that
# is neither a KV nor an index source: 32 of the bench preset's 40) leaves the fp32 input out
# (hc_site's keep_input): 268 MB of writes at a 16K chunk, ~0.06 ms a layer by the bytes, ~0.13 s
# of a 1M prefill. The same operand bits (the pass is the same). H100 32K faithful prefill,
# alternated (fifty-second session, call AB): 1.214 / 1.223 -> 1.212 / 1.213 s, the same last logits.
UNREAD_INPUT_LEFT = True
# On bf16 streams (layers/mhc.BF16_STREAMS) a prefill site's mixes take bf16 MMAs: a stream is
# exact in bf16, fn is given as three bf16 parts (fn_parts), so each product is exact and the
# sums are fp32's, as the TF32 passes' are. The sites are bound by their latency (fifty-fifth
# session: half the bytes, the same 1.6 ms at 16K rows on the H100); this shortens each step's
# chain: sm_90 SASS (bench/kernel_resources.py --kernel hc_site_bf16 --loop) with the expand
# 1,233 -> 715 instructions a thread a step (HMMA 192 -> 96, no TF32 splits), 255 registers
# either way; without it 1,145 -> 765, 255 -> 198 registers (still two programs an SM).
# Timed (H100, fifty-sixth session, call AK, 16K rows, us): the attention site 1,029 on fp32
# streams, 977 on bf16 ones, 1,030 with the dots, 887 in (64, 32, 3 stages); the FFN site with
# its expand 1,728 / 1,764 / 1,529. A 256K faithful prefill in 16K chunks, alternated: fp32
# streams 9.745 s, bf16 9.748 / 9.787, with the dots 9.544 / 9.556 (-2%). Not fp32's sums: the
# tensor cores' accumulation leaves the mixes ~6e-5 of their largest from the float64 ones,
# where the TF32 passes stay within 2e-6 (test_bf16_streams). Off with BF16_STREAMS.
BF16_DOTS = False
# Its tiles, by whether the site takes an expand, chosen by sm_90 SASS alone (untimed): without
# the expand 32 tokens a program on 2 stages take 127 registers and 32 KB of shared memory, four
# programs an SM where the TF32 form's 64 fit two (476 instructions a step of half the tokens);
# with it SITE_TILES' (255 registers; 64 x 16 on 2 stages 214, 634 instructions).
PARTS_TILES = {False: dict(TB=32, BLOCK=32, num_warps=4, num_stages=2),
               True: dict(TB=32, BLOCK=32, num_warps=4, num_stages=3)}
# With BF16_DOTS, a site that takes an expand takes it in hc_expand first (bandwidth-bound: the
# bf16 streams read and written, ~0.55 ms at 16K rows on an H100 by the bytes), then the site
# without it at four programs an SM (PARTS_TILES[False]), where the one pass with the expand
# holds two. The same streams, to the bit of the site's own expand; the mixes and the input
# within their sums' order. With fp32 streams the split loses (H100, 16K rows: the expand
# 1.06 ms, forty-ninth session, and the site without it 1.08, against 1.79 in one pass,
# fiftieth). H100, call AK: the FFN site with the dots 1,529 us in one pass, 1,678 split; a
# 256K prefill with the dots 9.544 / 9.556 s in one pass, 9.669 / 9.572 split. Off.
SPLIT_EXPAND = False


def fn_parts(fn: torch.Tensor) -> torch.Tensor:
    """fn [N, K] as three bf16 parts [3, N, K], largest first, each the bf16 rounding of what
    the parts before it leave: their sum is fn but where a part underflows bf16 (residues below
    ~1e-38, none in an mHC site's fn)."""
    parts, rest = [], fn.float()
    for _ in range(3):
        part = rest.bfloat16()
        parts.append(part)
        rest = rest - part.float()
    return torch.stack(parts).contiguous()


def hc_site(X: torch.Tensor, fn: torch.Tensor, mix_eps: float, pre: torch.Tensor, weight: torch.Tensor | None,
            norm_eps: float, expand: tuple | None = None, tiles: dict | None = None, operand: Operand | None = None,
            keep_input: bool = True, parts: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """An mHC site in one launch: X [T, S, H] streams (supported), fn [N, S*H] fp32 -> (streams, the
    site's mixes [T, N] as hc_mixes(streams, fn, mix_eps), its input [T, H] fp32 as
    hc_collapse_norm(streams, pre, weight, norm_eps)); streams = hc_expand(y, X, post, comb)
    with expand (y, post, comb), else X. The sums run by column block, so the mixes and the
    input are the separate launches' within their reordering, not to the bit; `tiles`
    overrides SITE_TILES (PARTS_TILES with parts). operand: fp8_blockwise.empty_operand(T, H, 1, ...) (encodes_input),
    filled with the input's FP8 operand, to the bit rows_1x128(input, round_first=True)'s;
    with it, keep_input False leaves the fp32 input out (its second-pass write: 4 bytes a
    column) and returns None in its place, for a site whose input only that product reads.
    parts: fn_parts(fn), for bf16 streams (BF16_DOTS): the mixes' dots as bf16 MMAs against them."""
    T, S, H = X.shape
    N = fn.shape[0]
    assert fn.shape[1] == S * H and fn.dtype == torch.float32 and supported(X), (fn.shape, X.shape, X.dtype)
    t = {**(SITE_TILES if parts is None else PARTS_TILES)[expand is not None], **_dots(), **(tiles or {})}
    fn, pre = fn.contiguous(), pre.float().contiguous()
    w = torch.ones(H, device=X.device) if weight is None else weight.contiguous()
    np_ = max(16, triton.next_power_of_2(N))
    mixes = torch.empty(T, N, dtype=torch.float32, device=X.device)
    row = torch.empty(T, H, dtype=torch.float32, device=X.device)
    streams, y, post, comb = X, X, pre, pre
    if expand is not None:
        y, post, comb = expand[0].contiguous(), expand[1].float().contiguous(), expand[2].float().contiguous()
        streams = torch.empty(T, S, H, dtype=X.dtype, device=X.device)
    assert operand is None or (encodes_input(H) and operand.codes.shape[0] == 1 and operand.shape == (T, H))
    assert keep_input or operand is not None, "the site's input goes somewhere"
    codes, scales = (row, row) if operand is None else (operand.codes, operand.scales)
    assert parts is None or (_bf16(X) and parts.shape == (3, N, S * H) and parts.dtype == torch.bfloat16), \
        "fn's bf16 parts take bf16 streams"
    if T:
        _hc_site_kernel[(triton.cdiv(T, t["TB"]),)](
            X, y, post, comb, pre, fn, w, streams, mixes, row, codes, scales, T, H, N, X.stride(0), X.stride(1),
            y.stride(0), streams.stride(0), streams.stride(1), fn.stride(0), mixes.stride(0), row.stride(0),
            codes.shape[1], mix_eps, norm_eps, S=S, NP=np_, EXPAND=expand is not None, ENCODE=operand is not None,
            HW_FP8=not interpreting(), ROW_OUT=keep_input, BF16=_bf16(X), fnp_ptr=parts,
            FN_PARTS=parts is not None, **t, **pdl.options(X.device))
    return streams, mixes, row if keep_input else None


def encodes_input(H: int) -> bool:
    """Whether hc_site can write its [T, H] input's FP8 operand too (SITE_OPERAND: whole 128-blocks)."""
    return SITE_OPERAND and H % ENCODE_BLOCK == 0
