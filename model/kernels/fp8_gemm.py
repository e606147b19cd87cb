"""y = x @ W^T with W stored as FP8 e4m3 bytes and one e8m0 scale per 32x32 block (or as bf16).

Shapes: x [M, K] (fp32 or bf16), W [N, K] e4m3 bytes, scales [ceil(N/32), ceil(K/32)] e8m0 bytes,
y [M, N] fp32. The weight is decoded in registers (never materialized in memory): at decode
batch sizes the GEMM is bound by reading W, one byte per weight. With `act_quant`, x is first
rounded to FP8 in 1x32 blocks (the reference's faithful mode), in one launch, as bf16.
On the GPU the dots run on bf16 tensor cores: an e4m3 value times a power of two is exact in
bf16, and fp32 activations go in as 3 bf16 parts that sum to them (bf16 activations as
themselves), so the result keeps fp32 accuracy. Up to 16 rows of x (decode) run the transposed
product (_skinny_kernel), which cuts the parts itself; bigger tiles take them precomputed.

Decode-sized products have few output tiles, so K is split over the SMs. The partial sums are
added inside the same launch: each program stores its part, and the last one of its output
tile to finish (an atomic count per tile) adds the parts in split order and writes the result,
so the sum is deterministic and no second launch is needed.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ..quant import dequantize_fp8_weight, fake_quant_fp8
from . import common, pdl, prefill_gemms
from .common import (DOT, bf16_head, bf16_parts, dot_exact_lhs, dot_exact_rhs, dot_fp32, e4m3_to_float,
                     e4m3_words, interpreting, mma_sync, scale_bytes_within, sm_count, word_scales)
from .quantize import fp8_grid_bf16


def fp8_gemm_ref(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, act_quant: bool = False) -> torch.Tensor:
    if act_quant:
        x = fake_quant_fp8(x.float())
    return x.float() @ dequantize_fp8_weight(codes, scales).T


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, out_ptr, count_ptr, M, N, K, K_PER_SPLIT, SPLITS,
                     sxp, sxm, sxk, swn, swk, ssn, ssk, sys, sym, syn,
                     PARTS: tl.constexpr, GROUP_ROWS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     HW_FP8: tl.constexpr, FP8_WEIGHT: tl.constexpr, PDL: tl.constexpr):
    """One (M, N) tile over one K range (split-K: see _finish).
    The weight is e4m3 codes with e8m0 block scales, or (FP8_WEIGHT off) plain bf16. x comes
    as PARTS slices (stride sxp) that sum to the activations. GROUP_ROWS > 0: a block-diagonal
    weight, each GROUP_ROWS rows applied to their own K columns of x. PDL: see pdl.py."""
    pdl.wait_for_inputs(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if GROUP_ROWS > 0:  # a tile lies in one group (GROUP_ROWS is a multiple of BLOCK_N)
        x_ptr += (pid_n * BLOCK_N // GROUP_ROWS) * K * sxk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, tl.minimum(k_start + K_PER_SPLIT, K), BLOCK_K):
        kk = k0 + rk
        w = tl.load(w_ptr + rn[:, None] * swn + kk[None, :] * swk, mask=(rn[:, None] < N) & (kk[None, :] < K), other=0)
        if FP8_WEIGHT:
            w = tl.reshape(e4m3_to_float(w, HW_FP8), (BLOCK_N, BLOCK_K // 32, 32))
            # one e8m0 scale per 32x32 block of the weight
            sk = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            sbyte = tl.load(s_ptr + (rn // 32)[:, None] * ssn + sk[None, :] * ssk,
                            mask=(rn[:, None] < N) & (sk[None, :] * 32 < K), other=127).to(tl.float32)
            w = tl.reshape(w * tl.exp2(sbyte - 127.0)[:, :, None], (BLOCK_N, BLOCK_K))
        if HW_FP8:
            w = w.to(tl.bfloat16)
        else:
            w = w.to(tl.float32)
        for p in tl.static_range(PARTS):
            x = tl.load(x_ptr + p * sxp + rm[:, None] * sxm + kk[None, :] * sxk,
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            if HW_FP8:  # bf16 x bf16 products are exact in the fp32 accumulator
                acc = tl.dot(x, tl.trans(w), acc)
            else:
                acc = dot_exact_rhs(x.to(tl.float32), tl.trans(w), acc)
    _finish(acc, rm[:, None] * sym + rn[None, :] * syn, (rm[:, None] < M) & (rn[None, :] < N), y_ptr, out_ptr,
            count_ptr + pid_m * tl.num_programs(1) + pid_n, pid_k, SPLITS, sys, 1)


@triton.jit
def _finish(acc, offsets, mask, y_ptr, out_ptr, count_ptr, pid_k, SPLITS, sys, GROUP: tl.constexpr):
    """Write a program's sums at out[offsets]; with K split, store them as part pid_k of
    y, and let the last program of the tile add the SPLITS parts in order, reading GROUP of
    them at a time. Its count goes back to 0 for the next launch (CUDA graph replays included)."""
    if SPLITS == 1:
        tl.store(out_ptr + offsets, acc, mask=mask)
    else:
        tl.store(y_ptr + pid_k * sys + offsets, acc, mask=mask)
        tl.debug_barrier()  # every thread's part is stored before the count says so
        if tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            # GROUP parts read at once (one by one, each waits out an L2 round trip), added in split
            # order; -0.0 (the start, and parts past SPLITS) leaves every sum's bits as they are.
            # (tl.where: in the interpreter, mask & a scalar is int32, not a mask.)
            total = tl.full(acc.shape, -0.0, tl.float32)
            for g in range(0, SPLITS, GROUP):
                for j in tl.static_range(GROUP):
                    total += tl.load(y_ptr + (g + j) * sys + offsets, mask=tl.where(g + j < SPLITS, mask, False),
                                     other=-0.0, cache_modifier=".cg")
            tl.store(out_ptr + offsets, total, mask=mask)
            tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _dot_columns(w, x_ptr, rm, kk, K, sxm, sxk, acc, SPLIT: tl.constexpr, PTX: tl.constexpr, EVEN_K: tl.constexpr,
                 HEADS: tl.constexpr):
    """acc + w . x^T[kk, rm]: x's rows rm at columns kk, read transposed. With SPLIT the fp32
    values are cut into the 3 bf16 parts that sum to them, one dot each (bf16 products are
    exact in the fp32 accumulator); the cut happens once per value, before the tile is shared,
    by masks (_three_bf16_parts).
    An fp32 w (no PTX decode, or an fp32 weight) dots at DOT precision (three-pass TF32), or
    with HEADS as common.dot_fp32's three passes of masked heads (common.TF32_HEADS).
    (Each row's parts as columns of one dot, as fp4_moe does, measured slower on the H200 at
    6 rows: 32 columns, 72.7 against 47.7 us for wq_b. A sum of its own per part does not let
    the dots overlap: Triton 3.9 still waits for each MMA before the next.)"""
    at = x_ptr + rm[None, :] * sxm + kk[:, None] * sxk
    if EVEN_K:
        xt = tl.load(at)
    else:
        xt = tl.load(at, mask=(kk < K)[:, None], other=0.0)
    if not PTX:
        acc = dot_exact_lhs(w, xt.to(tl.float32), acc)
    elif w.dtype == tl.float32 and HEADS:
        acc = dot_fp32(w, xt.to(tl.float32), acc)
    elif w.dtype == tl.float32:
        acc = tl.dot(w, xt.to(tl.float32), acc, input_precision=DOT)
    elif SPLIT:
        head, middle, low = _three_bf16_parts(xt)
        acc = tl.dot(w, head, acc)
        acc = tl.dot(w, middle, acc)
        acc = tl.dot(w, low, acc)
    else:
        acc = tl.dot(w, xt, acc)
    return acc


@triton.jit
def _three_bf16_parts(x):
    """fp32 x as three bf16 parts that sum to it, cut by masks (bf16_head), exact with no
    rounding: 2 instructions a value fewer than rounding each part."""
    head = bf16_head(x)
    rest = x - head
    middle = bf16_head(rest)
    return head.to(tl.bfloat16), middle.to(tl.bfloat16), (rest - middle).to(tl.bfloat16)


# The row count M only bounds and masks the rows (never an address's alignment), so it is left
# unspecialized: one variant for every count of decode and short-prompt rows. Before, each
# weight's kernel compiled again for M = 1 and for 16 dividing M, and a prefill worker's warm-up
# took two prompts (40 and 45 tokens) for those alone. Decode is no slower for it (call BJ,
# whose sed takes the next line's do_not_specialize out: H100, 4K, batch 1 22.91 / 23.00 ms
# unspecialized against 22.97 specialized, batch 8 49.43 / 49.08 against 49.14).
@triton.jit(do_not_specialize=["M"])  # rows unspecialized
def _skinny_kernel(x_ptr, w_ptr, s_ptr, y_ptr, out_ptr, count_ptr, M, N, K, K_PER_SPLIT, SPLITS,
                   sxm, sxk, swn, ssn, ssk, sys, sym, syn,
                   FP8_WEIGHT: tl.constexpr, SMALL: tl.constexpr, SPLIT: tl.constexpr, PTX: tl.constexpr,
                   EVEN_K: tl.constexpr, GROUP_ROWS: tl.constexpr, SUM_GROUP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   HEADS: tl.constexpr, PDL: tl.constexpr):
    """y^T[rows, rm] = W[rows] x^T over one K range, for BLOCK_M rows rm of x (decode; grid axis 2
    takes BLOCK_M rows at a time, each program re-reading its weight tile from L2):
    the weight tile is the left operand as decoded (64 rows fill a Hopper warpgroup MMA) and
    the few activation rows the right one, read transposed and cut into parts once. FP8
    codes are read four at a time (int32 words) and decoded as four tiles, one per place in
    the word, so that each output register is the bf16 pair a tensor-core operand holds; bf16
    and fp32 weights are read as they are. Rows past N or M re-read the last real one instead
    of masking every load (their sums are not stored); EVEN_K: K is a multiple of BLOCK_K, no
    column masks either. GROUP_ROWS > 0: a block-diagonal weight, each GROUP_ROWS rows applied
    to their own K columns of x. SUM_GROUP: split parts the last program reads at once (_finish).
    PDL: see pdl.py."""
    pdl.wait_for_inputs(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    wn, xm = tl.minimum(rn, N - 1), tl.minimum(rm, M - 1)
    if GROUP_ROWS > 0:  # a tile lies in one group (GROUP_ROWS is a multiple of BLOCK_N)
        x_ptr += (pid_n * BLOCK_N // GROUP_ROWS) * K * sxk
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, tl.minimum(k_start + K_PER_SPLIT, K), BLOCK_K):
        if FP8_WEIGHT:
            c = k0 // 4 + tl.arange(0, BLOCK_K // 4)  # words of four codes: columns 4c .. 4c + 3
            sk = k0 // 32 + tl.arange(0, BLOCK_K // 32)  # one e8m0 scale per 32x32 block
            w_at = w_ptr + wn[:, None] * swn + c[None, :]
            s_at = s_ptr + (wn // 32)[:, None] * ssn + sk[None, :] * ssk
            if EVEN_K:
                words, sbyte = tl.load(w_at), tl.load(s_at)
            else:
                words = tl.load(w_at, mask=(c * 4 < K)[None, :], other=0)
                sbyte = tl.load(s_at, mask=(sk * 32 < K)[None, :], other=127)
            scales = word_scales(sbyte, PTX, SMALL)  # once a scale, before it spreads over its words
            exps = tl.reshape(tl.broadcast_to(scales[:, :, None], (BLOCK_N, BLOCK_K // 32, 8)), (BLOCK_N, BLOCK_K // 4))
            w = e4m3_words(words, exps, PTX, SMALL)
            for t in tl.static_range(4):
                acc = _dot_columns(w[t], x_ptr, xm, 4 * c + t, K, sxm, sxk, acc, SPLIT, PTX, EVEN_K, HEADS)
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            w_at = w_ptr + wn[:, None] * swn + kk[None, :]
            if EVEN_K:
                w = tl.load(w_at)
            else:
                w = tl.load(w_at, mask=(kk < K)[None, :], other=0.0)
            if not PTX:
                w = w.to(tl.float32)
            acc = _dot_columns(w, x_ptr, xm, kk, K, sxm, sxk, acc, SPLIT, PTX, EVEN_K, HEADS)
    _finish(acc, rm[None, :] * sym + rn[:, None] * syn, (rm[None, :] < M) & (rn[:, None] < N), y_ptr, out_ptr,
            count_ptr + pid_m * tl.num_programs(0) + pid_n, pid_k, SPLITS, sys, SUM_GROUP)


def tiles_for(m: int, fp8: bool = True) -> dict:
    """Tile shape by row count: decode rows are few and the weight's bytes bound the time;
    prefill rows are many and the tensor cores do. A bf16 weight tile takes twice the shared
    memory of an FP8 one."""
    if interpreting():
        return dict(BLOCK_M=16 if m <= 16 else 64, BLOCK_N=64, BLOCK_K=32)
    if m >= 1024 and not fp8:
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
    return dict(TILES[16 if m <= 16 else 64 if m < 1024 else 128])


TILES = {  # block_m: launch shape
    16: dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128),
    # 17-1023 rows (decode batches from 3). Tiles of rows x weight rows x K step, H200,
    # 2026-12-04 (bench/decode_kernel_diff.py, 4K, PDL off), a step's kernels at batch 8 / 32:
    # 64 x 64 x 128 (as before) 49.75 / 123.8 ms; 64 x 128 x 64 44.23 / 105.1-105.6; the same
    # on 2 stages 45.86 / 109.6; 32-deep K steps 46.42 / 109.8; 64 x 256 x 64 on 8 warps
    # 57.63 / 144.3; 32 x 128 x 64 at batch 8 50.89 against 46.27 in another process. A
    # 64-row x tile in three bf16 parts is 48 KB a 128-deep step: 64-wide weight tiles read it
    # for few columns, and at 180 KB of shared memory held one program an SM.
    64: dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64),
    # the best of 5 shapes at 8,192 rows on the H200 (2026-11-30): wq_b 3.96 ms (173 TFLOP/s),
    # wo_b 5.10 ms; 128 x 128 tiles took 5.21 and 6.26 ms
    128: dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
}


def small_fp8_scales(scales: torch.Tensor) -> bool:
    """Whether every scale is at most 2^7 (byte <= 134): then the decode kernel's weight decodes
    by integer ops and one multiply."""
    return scale_bytes_within(0, 134, scales)


def fp8_gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, act_quant: bool = False,
             tiles: dict | None = None, small: bool | None = None,
             kept: prefill_gemms.EncodedWeights | None = None) -> torch.Tensor:
    """x [M, K] @ (codes, scales)^T -> [M, N] fp32. `tiles` overrides the launch shape (and so
    keeps prefill rows on the kernel); small is small_fp8_scales(scales), worked out here when
    not given; kept: where prefill may keep the weight's FP8 tensor-core form."""
    N, K = codes.shape
    assert x.shape[1] == K and codes.dtype == torch.uint8, (x.shape, codes.shape, codes.dtype)
    assert scales.shape == (-(-N // 32), -(-K // 32)) and scales.dtype == torch.uint8
    if act_quant:
        if tiles is None and prefill_gemms.rounds_in_encode(x, N, K):  # prefill rows: rounded in the encode
            return prefill_gemms.fp8_product(x, codes, scales, round_first=True, kept=kept)
        # FP8 values times powers of two are exact in bf16, so one part (not three) dots them.
        # (Rounding decode rows in the transposed kernel as it read them, not in a launch before
        # it, measured slower on the H200: 22.3 against 16.8 + 1.5 ms per two batch-1 steps.)
        x = fp8_grid_bf16(x)
    if tiles is None and prefill_gemms.takes(x):  # a prefill chunk's rows: cuBLAS on the weight decoded to bf16
        return prefill_gemms.fp8_product(x, codes, scales, kept=kept)
    return _gemm(x, codes, scales, tiles, small_fp8_scales(scales) if small is None else small)


def grouped_fp8_gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, groups: int,
                     small: bool | None = None, act_quant: bool = False,
                     kept: prefill_gemms.EncodedWeights | None = None) -> torch.Tensor | None:
    """Block-diagonal y [M, G*R] = x [M, G*K] with group g's rows g*R .. of (codes, scales)
    [G*R, K] applied to x's columns g*K ..: one launch for all groups (the attention output's
    wo_a), on the FP8 bytes; act_quant rounds x and kept serves prefill as fp8_gemm's. None
    where no tile fits a group (the caller keeps its einsum)."""
    M, GK = x.shape
    N, K = codes.shape
    rows = N // groups
    if GK != groups * K or codes.stride(1) != 1:
        return None
    if act_quant:
        if prefill_gemms.rounds_in_encode(x, rows, K):
            return prefill_gemms.grouped_fp8_product(x, codes, scales, groups, round_first=True, kept=kept)
        x = fp8_grid_bf16(x)
    if prefill_gemms.takes(x):
        return prefill_gemms.grouped_fp8_product(x, codes, scales, groups, kept=kept)
    block_n = min(_skinny_tiles(N, M)["BLOCK_N"], rows)  # as _skinny picks it: a power of two dividing R
    if (M <= SKINNY_ROWS and _skinny_layout(codes) and rows % block_n == 0 and block_n >= 16
            and block_n & (block_n - 1) == 0):
        return _skinny(x, codes, scales, small_fp8_scales(scales) if small is None else small, group_rows=rows)
    tiles = tiles_for(M)
    if rows % tiles["BLOCK_N"]:  # a tile lies in one group: narrower ones where the groups are
        if rows % 64:
            return None
        tiles.update(BLOCK_N=64)
    return _gemm(x, codes, scales, tiles, False, group_rows=rows, skinny=False)


def bf16_gemm(x: torch.Tensor, weight: torch.Tensor, tiles: dict | None = None) -> torch.Tensor:
    """x [M, K] @ weight^T for a bf16 weight [N, K] -> [M, N] fp32, as accurate as the fp32
    product of the upcast weight: bf16 tensor cores and 3-part activations."""
    assert weight.dtype == torch.bfloat16 and x.shape[1] == weight.shape[1], (x.shape, weight.shape, weight.dtype)
    if tiles is None and small_weight_skinny(x.shape[0], weight, BF16_SKINNY_ROWS):
        return _skinny(x, weight, None, False)
    return _gemm(x, weight, None, tiles, False)


def bf16_decode_rows(rows: int, weight: torch.Tensor) -> bool:
    """Whether bf16_gemm takes `rows` of x against this weight on the transposed kernel."""
    return rows <= SKINNY_ROWS or small_weight_skinny(rows, weight, BF16_SKINNY_ROWS)


def small_weight_skinny(rows: int, weight: torch.Tensor, most_rows: int) -> bool:
    """Whether `rows` of x against this bf16 or fp32 weight take the transposed kernel past
    SKINNY_ROWS, 16 rows a program: up to most_rows, for a weight small enough that the
    programs' repeated reads of it come from L2."""
    return (SKINNY_ROWS < rows <= most_rows and weight.numel() * weight.element_size() <= SKINNY_REREAD_BYTES
            and _skinny_layout(weight))


def _skinny_layout(weight: torch.Tensor) -> bool:
    """Whether the transposed kernel can read this weight: rows contiguous along K, K a
    multiple of 4 (FP8 codes as int32 words)."""
    return weight.shape[1] % 4 == 0 and weight.stride(1) == 1


def fp32_gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight^T for an fp32 weight [N, K] -> [M, N] fp32 (three-pass TF32) for up to
    FP32_SKINNY_ROWS rows, 16 a program (past 16 rows a weight of SKINNY_REREAD_BYTES at most);
    more go to torch, whose kernels are good at those shapes. Small-N fp32 GEMMs (the mHC
    mixes: [6, 20480] x [20480, 24]) got a 65 us split-N kernel from cuBLAS."""
    assert weight.dtype == torch.float32 and x.shape[1] == weight.shape[1], (x.shape, weight.shape, weight.dtype)
    decode = x.shape[0] <= SKINNY_ROWS and _skinny_layout(weight)
    if decode or small_weight_skinny(x.shape[0], weight, FP32_SKINNY_ROWS):
        return _skinny(x, weight, None, False)
    return x.float() @ weight.T


# Up to this many rows (every decode batch: 32 six-row blocks) the mHC mixes stay on the
# transposed kernel, 16 rows a program: each row then sums as it does at batch 1, and the launch
# stays in the PDL chain. 16: past 16 rows torch's fp32 GEMM, as before the thirty-third session.
# H200, 2026-12-04, batch 8 at 4K (bench/decode_kernel_diff.py, PDL off): the mixes' 86
# launches 1,336 us a step against cuBLAS's sgemm and split-K reduce, 1,444; a step's kernels
# 51.49 against 51.64 ms (bench/decode_ab.py: within noise at batch 8 and 32).
FP32_SKINNY_ROWS = 256
# The same for bf16 weights (the routers', the indexer's head weights, the compressor's) past
# SKINNY_ROWS, where torch's fp32 product of an fp32 copy took them (cuBLAS's SIMT sgemm, 25 us
# a router at batch 8's 48 rows, 49 at batch 32's 192): each row then also sums as at batch 1.
# H200, 2026-12-04 (bench/decode_ab.py, 4K, two rounds alternated, ms a step): batch 8 47.36,
# 47.09 -> 46.55, 46.64; batch 32 115.7, 114.0 -> 112.6, 112.3. Batch 8's 51 routers and
# head weights, PDL off: 1,402 us a step on the sgemm -> 392 here (bench/decode_kernel_diff.py).
BF16_SKINNY_ROWS = 256
# Weights up to this size re-read by each 16-row program (L2 holds 50 MB); bigger ones (the
# LM heads) take the tile kernel, which reads each weight tile once for 64 rows.
SKINNY_REREAD_BYTES = 8 << 20


# Decode shapes (at most 16 rows of x): the transposed kernel, for FP8, bf16 and fp32 weights.
# In a decode step on the H200 (2026-11-30) its FP8 calls took about the GPU time of the tile
# kernel plus the activation-split launches that one needs (16 against 8.9 + 5.6 ms per two
# steps), with ~1,100 fewer kernels per step. SKINNY_FP8 off sends FP8 weights to the tile kernel.
SKINNY_FP8 = True
# Up to this many rows FP8 and bf16 weights take the transposed kernel, 16 rows a program (its
# grid's third axis), the rest the tile kernel (and bf16_parts' launch before it for fp32 x).
# 64 (batch 8's 48 rows in three programs, each decoding the weight tile again) lost, H200,
# 2026-12-04 (bench/decode_kernel_diff.py): a step's kernels 51.60 -> 55.17 ms (wo_b 71.4 ->
# 90.0 us, wq_b 68.1 -> 86.2), the step 55.39 -> 60.11 in bench/decode_ab.py. Faithful mode's
# bf16 rows (one part) past 16 in one program of 32-64 columns (248 registers at 64 on 8 warps,
# no spills) lost too, H200, 2026-12-04, batch 8: wq_b 1,190 -> 1,912 us a step, wo_b 1,338 ->
# 2,098, a step's kernels 35.36 -> 38.07 ms; steps 38.33 / 39.04 -> 41.74 / 40.70 ms alternated.
SKINNY_ROWS = 16


def _skinny_tiles(n: int, m: int) -> dict:
    """256-row weight tiles (two 64-row MMAs per warpgroup) were the fastest of six shapes on
    4-42 MB FP8 weights; narrow outputs (the router's 48 rows) take 64. Up to NARROW_ROWS
    activation rows take 8 columns (one m16n8k16 MMA a part), not 16."""
    block_m = 8 if m <= NARROW_ROWS else 16
    if n <= 64:
        return dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
    return dict(SKINNY_TILES, BLOCK_M=block_m)


SKINNY_TILES = dict(BLOCK_N=256, BLOCK_K=128, num_warps=8, num_stages=3)
# At 16 columns (9-16 rows: batch 2) this tile keeps 166 registers, one 8-warp program an SM.
# 64-code K steps on 4 stages compile to 125 (two programs an SM) and were faster there on the
# H200 (2026-12-03, 12 rows: wq_b 35.8 -> 31.3 us, main_proj 66.1 -> 55.7; a batch-2 step
# ~1.5 ms), but slower at 8 columns (wq_b 22.9 -> 24.8, main_proj 38.6 -> 42.9): and a K step
# that differs by columns sums K in another order, so a row's product would change with the
# rows beside it. Not taken.
# A batch-1 step's rows (the 6-token verify block, the 5-row draft) fit 8 columns. Compiled for
# sm_90 (bench/kernel_resources.py) with 6 rows of wq_b, 8 columns against 16 halve the MMAs
# and the activations' cutting: the K loop falls from 1,100 to 808 instructions a thread and
# the registers from 166 to 128, which lets two 8-warp programs share an SM. H200, 2026-12-03
# (bench/decode_gemm_floor.py, 6 rows): wq_b 35.8 -> 22.4 us, wo_b 38.0 -> 23.6, main_proj
# 64.9 -> 38.8, wkv 9.8 -> 8.2; a batch-1 step at 4K 32.2 -> 29.0 ms (bench/decode_ab.py). 0: always 16.
# Since the twenty-fifth session the loop is 597 instructions at 127 registers: the e4m3 pair
# decode in 3 (common._E4M3_WORDS_PTX), the scale's bf16 pair made once a scale, x cut by
# masks. H200: wq_b 23.1 -> 20.2 us, wo_b 23.6 -> 20.9, main_proj 38.8 -> 33.5, shared_w1
# 12.2 -> 11.3; in a batch-1 step's profile the GEMMs took 0.53-0.55 ms less (21.5 -> 21.0 ms
# of kernels). The step's wall time did not separate from noise in 5 alternated rounds.
NARROW_ROWS = 8


# Split-K in the interpreter (CI): 1, or more where a test exercises the in-kernel sum.
INTERPRETER_SPLITS = 1
TWO_WAVES_BYTES = 16 << 20  # weights from this size split K over twice the SMs (_split_k)


def _split_k(K: int, block_k: int, output_tiles: int, device: torch.device, weight_bytes: int = 0
             ) -> tuple[int, int]:
    """Few output tiles (decode): split K so that the programs fill the SMs, once for small
    weights and twice for big ones. Measured on the H200 (2026-12-01, 6 rows, parts summed in
    the launch): 12 MB (shared expert w1) 20.1 us in one wave, 23.3 in two; 42 MB (wq_b,
    wo_b) 42.3 and 46.7 us in one, 35.6 and 38.3 in two."""
    waves = 2 if weight_bytes >= TWO_WAVES_BYTES else 1
    wanted = INTERPRETER_SPLITS if interpreting() else waves * sm_count(device) // output_tiles
    splits = max(1, min(triton.cdiv(K, block_k), wanted))
    per_split = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    return triton.cdiv(K, per_split), per_split



# per (device, lane): one int32 count per output tile
_COUNTS: dict[tuple[torch.device, int], torch.Tensor] = {}
MAX_SPLIT_TILES = 1024  # K is split only while the output tiles are fewer than twice the SMs
LANES = 2  # sets of counts a device has: its main stream's and a side stream's (counts_lane)
_LANE = [0]  # the set the GEMMs enqueued now take


def tile_counts(device: torch.device, lane: int | None = None) -> torch.Tensor:
    """The counts split-K programs take turns on (_finish). The GEMMs of one lane (a stream)
    share them: its launches run one after another, and each leaves its counts at 0. GEMMs
    enqueued on a side stream, which may run beside the main one's, take lane 1 (counts_lane).
    Made once and never replaced (CUDA graphs hold their address), on first use, which must not
    be inside a graph capture (a capture records the zeroing without running it): TritonOps
    makes every lane's when it is built."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())  # the key GEMMs look up (x.device)
    key = (device, _LANE[0] if lane is None else lane)
    counts = _COUNTS.get(key)
    if counts is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("split-K tile counts must be made before a CUDA graph capture (tile_counts)")
        counts = _COUNTS[key] = torch.zeros(MAX_SPLIT_TILES, dtype=torch.int32, device=device)
    return counts


@contextlib.contextmanager
def counts_lane(lane: int):
    """GEMMs enqueued inside take lane `lane`'s counts (tile_counts)."""
    before, _LANE[0] = _LANE[0], lane
    try:
        yield
    finally:
        _LANE[0] = before


def _gemm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, tiles: dict | None,
          small: bool, group_rows: int = 0, skinny: bool = True) -> torch.Tensor:
    """The tile kernel (or, for decode rows where it serves, the transposed one). With
    group_rows, x holds one K-column block per group of weight rows (block-diagonal)."""
    M = x.shape[0]
    N, K = weight.shape
    if M == 0:  # e.g. a rank's share of the rows of a one-token step
        return torch.zeros(0, N, dtype=torch.float32, device=x.device)
    fp8 = scales is not None
    fits = _skinny_layout(weight) and (SKINNY_FP8 or not fp8)
    if skinny and M <= SKINNY_ROWS and tiles is None and fits:
        return _skinny(x, weight, scales, small)
    tiles = tiles or tiles_for(M, fp8=fp8)
    block_m, block_n, block_k = tiles["BLOCK_M"], tiles["BLOCK_N"], tiles["BLOCK_K"]
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    splits, per_split = _split_k(K, block_k, grid[0] * grid[1], x.device, weight.numel() * weight.element_size())
    # the interpreter dots in fp32; bf16 activations are their own single part. Cutting fp32 x
    # into its parts in the kernel as each tile loads (no bf16_parts launch; 183 registers and
    # 64 KB of shared memory against 178 and 106 KB) made every tile GEMM 5-20% slower: H200,
    # 2026-12-04, a step's kernels 46.41 -> 46.16 ms at batch 8, 109.1 -> 113.2 at batch 32. Not kept.
    parts = x[None] if interpreting() or x.dtype == torch.bfloat16 else bf16_parts(x, 3)
    out, y, counts = _outputs(M, N, splits, grid[0] * grid[1], x.device)
    scale_ptr, ssn, ssk = _scale_args(weight, scales)
    _fp8_gemm_kernel[grid + (splits,)](parts, weight, scale_ptr, y, out, counts, M, N, K, per_split, splits,
                                       *parts.stride(), weight.stride(0), weight.stride(1), ssn, ssk, *y.stride(),
                                       PARTS=parts.shape[0], GROUP_ROWS=group_rows, HW_FP8=not interpreting(),
                                       FP8_WEIGHT=fp8, **tiles, **pdl.options(x.device))
    return out


def _skinny(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, small: bool,
            group_rows: int = 0) -> torch.Tensor:
    M = x.shape[0]
    N, K = weight.shape
    fp8 = scales is not None
    tiles = _skinny_tiles(N, M)
    if interpreting():  # its time goes by K steps, not bytes: the tiny checkpoint's 64 columns in one
        tiles.update(BLOCK_K=64)
    if group_rows:
        tiles.update(BLOCK_N=min(tiles["BLOCK_N"], group_rows))
    out_tiles, row_tiles = triton.cdiv(N, tiles["BLOCK_N"]), triton.cdiv(M, tiles["BLOCK_M"])
    # K splits by the output tiles alone, so that a row's sums keep their order at any row count
    splits, per_split = _split_k(K, tiles["BLOCK_K"], out_tiles, x.device, weight.numel() * weight.element_size())
    out, y, counts = _outputs(M, N, splits, out_tiles * row_tiles, x.device)
    w = weight.view(torch.int32) if fp8 else weight
    scale_ptr, ssn, ssk = _scale_args(weight, scales)
    with mma_sync("decode_gemm"):
        _skinny_kernel[(out_tiles, splits, row_tiles)](
            x, w, scale_ptr, y, out, counts, M, N, K, per_split, splits, x.stride(0), x.stride(1), w.stride(0), ssn,
            ssk, *y.stride(), FP8_WEIGHT=fp8, SMALL=small, SPLIT=x.dtype != torch.bfloat16, PTX=not interpreting(),
            EVEN_K=K % tiles["BLOCK_K"] == 0, GROUP_ROWS=group_rows, SUM_GROUP=_sum_group(splits),
            HEADS=common.TF32_HEADS and weight.dtype == torch.float32, **tiles, **pdl.options(x.device))
    return out


# From this many K splits the last program of a tile reads 8 parts at once (_sum_group).
GROUPED_SUM_SPLITS = 16


def _sum_group(splits: int) -> int:
    """How many split parts the last program of a tile reads at once. H200, 2026-12-01, 6 rows
    (bench/decode_gemm_floor.py): 8 at once cut wkv (40 splits) from 17.3 to 11.6 us and wq_a
    (20) from 17.3 to 14.8, but slowed wo_b (13) and wq_b (2) from 38.8 and 36.2 to 47.6 us
    (the kernel's registers rose from 202 to 215), so few splits keep reading one at a time.
    Since the 8-column tiles the kernel compiles to 127 registers either way (sm_90,
    bench/kernel_resources.py --kernel skinny), and the 6-14 splits of wo_b, the shared
    expert's w1 + w3, wq_a + wkv, wo_a and w2 wait out as many L2 round trips in their tails.
    GROUPED_SUM_SPLITS 4 (the same bits: the sums keep their order) did not pay, H200,
    2026-12-04 (bench/decode_ab.py, 4K, two rounds): batch 1 23.53 and 25.68 ms against 22.29
    and 21.92 at 16; batch 8 55.54 and 59.03 against 56.43 and 56.29."""
    return 8 if splits >= GROUPED_SUM_SPLITS else 1


def _outputs(M: int, N: int, splits: int, tiles: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A GEMM's output [M, N], the [splits, M, N] parts split-K programs leave for the last of
    their tile (the output itself, as one part, when K is not split), and the tiles' counts.
    A part starts every whole 16 elements, so its stride (the kernels' `sys`) stays divisible
    by 16 at any M: Triton specializes on that, and M x N of an 8-column router's parts is odd
    in 16 at an odd M (a variant more to compile, and stores it cannot prove aligned)."""
    part = -(-M * N // 16) * 16
    out = torch.empty(M, N, dtype=torch.float32, device=device)
    if splits == 1:
        return out, out.as_strided((1, M, N), (part, N, 1)), out
    assert tiles <= MAX_SPLIT_TILES, (tiles, splits)
    parts = torch.empty(splits * part, dtype=torch.float32, device=device).as_strided((splits, M, N), (part, N, 1))
    return out, parts, tile_counts(device)


def _scale_args(weight: torch.Tensor, scales: torch.Tensor | None) -> tuple:
    """A kernel's scale pointer and strides; a bf16 or fp32 weight has none (the kernel's
    FP8_WEIGHT branch never reads them)."""
    return (scales, scales.stride(0), scales.stride(1)) if scales is not None else (weight, 0, 0)

