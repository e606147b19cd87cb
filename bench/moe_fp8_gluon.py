"""moe_fp8_dots' products on FP8 mma.sync (m16n8k32, e4m3 x e4m3 -> fp32), written in Gluon.

Why Gluon: Triton's tl.dot takes FP8 operands either to wgmma, which it feeds the decoded codes
through shared memory and waits on (call BX: slower than the shipped kernels), or, with mma.sync
forced, converts them to f16 first (one more instruction a code). Gluon's mma_v2 keeps the e4m3
codes: on sm_90 it compiles to mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, both
operands from registers. The codes are loaded straight into the MMA's left-operand layout (a
thread's four bytes a register are four neighbouring codes of one weight row), so decoding them
(split_bits' layout, 5 instructions a word of 8 codes) keeps them where the MMA reads them.

The activations: in the right operand's layout a thread holds one or two columns of the dot, and
column j is pair j // KB and block j % KB of a chunk (as in moe_fp8_dots): each thread loads its
columns' codes once a chunk, from their own block, and each block's MMA takes them where the
block is the column's and zeros elsewhere (a select a register). The scales apply once a chunk.

Untimed until a device call runs `bench/moe_fp8_dots.py --dots mma8`.
"""
import pathlib
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from moe_fp8_dots import _BITS_PTX  # noqa: E402  (split_bits' decode: a word -> its low and high codes' e4m3)
from dsflash.model.kernels.sparse_attention_gluon import _pow2  # noqa: E402


@gluon.jit
def _operand(x, F8: gl.constexpr):
    """e4m3 values as the MMA takes them: in f16 (exact), or with F8 as they are, for mma.sync's
    e4m3 form, which sm_90 has only in PTX: ptxas converts the codes to f16 and runs the f16 MMA."""
    if not F8:
        x = x.to(gl.float16)
    return x


@gluon.jit
def _mma8_products_kernel(a_ptr, as_ptr, src_ptr, blk_ptr, w_ptr, s_ptr, out_ptr, N, K,
                          sar, sasr, swe, sse, ssr, sor, SWR: gl.constexpr,
                          COLS: gl.constexpr, NW: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr,
                          F8: gl.constexpr = False):
    """Program (block of COLS pairs, BLOCK_N weight rows): out[pair row, rows] = a[src] . W[rows]^T
    for one expert, a as e4m3 codes [*, K] with e8m0 scales as int32 words (4 blocks a word), W
    as split_bits bytes [N, K/2] with e8m0 scales as words. The dot has NW columns (8 or 16):
    column j is pair j // KB, block j % KB of a chunk of KB = NW / COLS 32-column blocks."""
    KB: gl.constexpr = NW // COLS
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    la: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    lb: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    pid_b = gl.program_id(0)
    expert = gl.load(blk_ptr + pid_b)
    if expert >= 0:
        row0 = gl.program_id(1) * BLOCK_N
        # the weight's codes in the left operand's layout (rows past N read the last one: not stored)
        ra = gl.minimum(row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, la)), N - 1)
        ca = gl.arange(0, 16 * KB, layout=gl.SliceLayout(0, la))
        w_at = w_ptr + expert.to(gl.int64) * swe + ra.to(gl.int64)[:, None] * SWR + ca[None, :]
        # the activations as the decoded codes' two halves need them (in the right operand's layout):
        # row c of the low half is chunk column (c // 32) * 64 + c % 32, of the high half 32 more;
        # column j holds pair j // KB's activations where the row's block is j % KB, zeros elsewhere
        cb = gl.arange(0, 16 * KB, layout=gl.SliceLayout(1, lb))
        jb = gl.arange(0, NW, layout=gl.SliceLayout(0, lb))
        src_b = gl.load(src_ptr + pid_b * COLS + jb // KB)
        x_at = a_ptr + gl.maximum(src_b, 0).to(gl.int64)[None, :] * sar + ((cb // 32) * 64 + cb % 32)[:, None]
        lo_live = (src_b >= 0)[None, :] & (((cb // 32) * 2)[:, None] == (jb % KB)[None, :])
        hi_live = (src_b >= 0)[None, :] & (((cb // 32) * 2 + 1)[:, None] == (jb % KB)[None, :])
        # the scales, in the accumulator's layout
        rc = gl.minimum(row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma)), N - 1)
        jc = gl.arange(0, NW, layout=gl.SliceLayout(0, mma))
        src_c = gl.load(src_ptr + pid_b * COLS + jc // KB)
        ws_at = s_ptr + expert.to(gl.int64) * sse + rc.to(gl.int64)[:, None] * ssr + (jc % KB)[None, :]
        xs_at = as_ptr + gl.maximum(src_c, 0).to(gl.int64) * sasr + jc % KB
        acc = gl.zeros([BLOCK_N, NW], gl.float32, layout=mma)
        for q in range(0, K // (32 * KB)):
            b = gl.load(w_at + q * 16 * KB)  # [BLOCK_N, 16 KB] bytes: the chunk's codes, two a byte
            lo, hi = gl.inline_asm_elementwise(_BITS_PTX, "=r,=r,r", [b], dtype=(gl.uint8, gl.uint8),
                                               is_pure=True, pack=4)
            x_lo = gl.load(x_at + q * 32 * KB, mask=lo_live, other=0).to(gl.float8e4nv, bitcast=True)
            x_hi = gl.load(x_at + (q * 32 * KB + 32), mask=hi_live, other=0).to(gl.float8e4nv, bitcast=True)
            part = gl.zeros([BLOCK_N, NW], gl.float32, layout=mma)
            part = mma_v2(_operand(lo.to(gl.float8e4nv, bitcast=True), F8), _operand(x_lo, F8), part)
            part = mma_v2(_operand(hi.to(gl.float8e4nv, bitcast=True), F8), _operand(x_hi, F8), part)
            # 2^(ew-127) 2^(ex-127) 2^6 (the codes are the e2m1 values times 2^-6)
            w_exp = gl.load(ws_at + q * KB).to(gl.int32)
            x_exp = gl.load(xs_at + q * KB).to(gl.int32)
            acc += part * _pow2(w_exp + x_exp[None, :] - 121)
        rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        for p in gl.static_range(COLS):
            sums = gl.sum(gl.where((jc // KB == p)[None, :], acc, 0.0), axis=1)
            dest = gl.load(src_ptr + pid_b * COLS + p)
            if dest >= 0:
                gl.store(out_ptr + (pid_b * COLS + p).to(gl.int64) * sor + rows, sums, mask=rows < N)


TILES = {"64x4w": dict(BLOCK_N=64, num_warps=4), "128x4w": dict(BLOCK_N=128, num_warps=4),
         "128x8w": dict(BLOCK_N=128, num_warps=8)}


def mma8_products(a: torch.Tensor, a_scales: torch.Tensor, src: torch.Tensor, block_expert: torch.Tensor,
                  w: torch.Tensor, w_scales: torch.Tensor, block_m: int, tile: dict, columns: int = 8,
                  f8: bool = False) -> torch.Tensor:
    """moe_fp8_dots.fp8_products' product (w in split_bits' layout; scales as bytes [*, K/32]) on
    f16 mma.sync: out [len(src), N] fp32, rows with src -1 left unwritten. columns: the dot's
    width (8 or 16), so a chunk holds columns / block_m 32-column blocks (2 to 8); f8: the MMAs
    given e4m3 operands (_operand)."""
    E, N, half = w.shape
    K = 2 * half
    kb = columns // block_m
    assert kb in (2, 4, 8) and K % (32 * kb) == 0 and a.shape[1] == K and block_m * kb == columns
    a_scales, w_scales = a_scales.contiguous(), w_scales.contiguous()
    out = torch.empty(src.numel(), N, dtype=torch.float32, device=a.device)
    grid = (block_expert.numel(), triton.cdiv(N, tile["BLOCK_N"]))
    _mma8_products_kernel[grid](a, a_scales, src, block_expert, w, w_scales, out, N, K, a.stride(0),
                                a_scales.stride(0), w.stride(0), w_scales.stride(0), w_scales.stride(1), out.stride(0),
                                SWR=w.stride(1), COLS=block_m, NW=columns, F8=f8, **tile)
    return out
