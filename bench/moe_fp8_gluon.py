"""moe_fp8_dots' products on f16 mma.sync, written in Gluon: a spike, not a shipped path.

Why Gluon: Triton's tl.dot takes FP8 operands either to wgmma, which it feeds the decoded codes
through shared memory and waits on (call BX: slower than the shipped kernels), or, with
mma.sync forced, to f16 MMAs after converting them. Here the codes are loaded straight into the
MMA's left-operand layout (a thread's four bytes a register are neighbouring codes of one
weight row) and decoded where the MMA reads them. sm_90 has no FP8 mma.sync of its own: Gluon's
mma_v2 on e4m3 operands (F8) writes PTX's mma.sync...e4m3.e4m3, and ptxas turns it into
F2FP.F16.E4M3 conversions and f16 HMMA.16816s (bench/kernel_resources.py --kernel
experts_gluon --variants "F8=1" --loop), so f16 is the form, F8 only the same at more cost.

Two decodes: split_bits' codes to e4m3 (5 integer instructions a word of 8 codes) and then
f16 (F2FP, one a pair); or with F16_BITS split_f16's codes straight to f16 by integer
instructions (an e2m1 code s e1 e0 m at f16 bits 15 11 10 9 is its value times 2^-14): 9 a
word, PRMTs in place of the conversions. The same count (278 SASS instructions a chunk of 128
codes a thread at 128 rows, 2.2 a code, against Triton's f16 form's 2.5 and the shipped
kernel's 3.2), and the conversions issue at the integer rate (bench/issue_rates.py), so they
time alike.

The activations: in the right operand's layout a thread holds one or two columns of the dot,
and column j is pair j // KB and block j % KB of a chunk (as in moe_fp8_dots); the low and
high codes' operands each load the chunk's activations of their blocks' columns under a mask
(zeros elsewhere), so one accumulator keeps the blocks apart and the scales apply once a chunk.

H100, 2026-12-07 (sixty-ninth session, calls CA and CB, 2-pair blocks): exact (1.2-1.9e-7 of
the largest product from float64) and slower than the shipped kernels: at 6 tokens 239-242 us a
layer at 16 columns, 250 at 8 with PREFETCH (the prefetch at 16 columns ran out of registers:
314-591), against the shipped 224-229 and Triton's f16 form 235; at 12 tokens 353-355 against
286-294. On the H100 the shipped kernels are within 1.09x of reading their weights; the H200 is
untimed (call CC).
"""
import pathlib
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from moe_fp8_dots import _BITS_PTX, split_groups  # noqa: E402  (split_bits' decode: a word -> its codes' e4m3)
from dsflash.model.kernels.sparse_attention_gluon import _pow2  # noqa: E402


def split_f16(packed: torch.Tensor) -> torch.Tensor:
    """split_groups' codes (byte j of a 64-code group: codes j and j + 32) with their bits placed
    for F16_BITS: code j (s e1 e0 m) at bits 7 3 2 1, where a byte is the high byte of its f16
    (the value times 2^-14); code j + 32's e1 e0 m at bits 6 5 4 and s at bit 0, which a right
    shift by 3 and a left shift by 7 bring there."""
    grouped = split_groups(packed)
    low, high = grouped & 0xF, grouped >> 4
    return ((low & 8) << 4) | ((low & 7) << 1) | ((high & 7) << 4) | ((high & 8) >> 3)


# split_f16's decode: a word of four bytes -> the f16 of its four low codes (two registers) and
# of its four high codes, by integer instructions alone (9 a word after ptxas: ANDs and shifts
# into the high bytes' places, then PRMTs that place each byte over a zero low byte).
_F16_PTX = gl.constexpr("""{
.reg .b32 a, b, t;
and.b32 a, $4, 0x8E8E8E8E;
prmt.b32 $0, a, 0, 0x1404;
prmt.b32 $1, a, 0, 0x3424;
shr.b32 t, $4, 3;
and.b32 t, t, 0x0E0E0E0E;
shl.b32 b, $4, 7;
and.b32 b, b, 0x80808080;
or.b32 b, b, t;
prmt.b32 $2, b, 0, 0x1404;
prmt.b32 $3, b, 0, 0x3424;
}""")


@gluon.jit
def _decoded(b, F8: gl.constexpr, F16_BITS: gl.constexpr):
    """A chunk's bytes -> the MMA's left operands for their low and high codes: split_f16's
    straight to f16 with F16_BITS; else split_bits' e4m3 codes, in f16 (or with F8 as they are)."""
    if F16_BITS:
        lo, hi = gl.inline_asm_elementwise(_F16_PTX, "=r,=r,=r,=r,r", [b], dtype=(gl.float16, gl.float16),
                                           is_pure=True, pack=4)
    else:
        lo, hi = gl.inline_asm_elementwise(_BITS_PTX, "=r,=r,r", [b], dtype=(gl.uint8, gl.uint8), is_pure=True,
                                           pack=4)
        lo = _operand(lo.to(gl.float8e4nv, bitcast=True), F8)
        hi = _operand(hi.to(gl.float8e4nv, bitcast=True), F8)
    return lo, hi


@gluon.jit
def _operand(x, F8: gl.constexpr):
    """e4m3 values as the MMA takes them: in f16 (exact), or with F8 as they are, for mma.sync's
    e4m3 form, which sm_90 has only in PTX: ptxas converts the codes to f16 and runs the f16 MMA."""
    if not F8:
        x = x.to(gl.float16)
    return x


@gluon.jit
def _chunk(w_at, x_at, ws_at, xs_at, lo_live, hi_live, q, KB: gl.constexpr, F8: gl.constexpr, F16_BITS: gl.constexpr):
    """Chunk q's operands: the weight's low and high codes decoded ([BLOCK_N, 16 KB] each), their
    activations (zeros outside each column's block) and the weight's and activations' scales."""
    lo, hi = _decoded(gl.load(w_at + q * 16 * KB), F8, F16_BITS)
    x_lo = gl.load(x_at + q * 32 * KB, mask=lo_live, other=0).to(gl.float8e4nv, bitcast=True)
    x_hi = gl.load(x_at + (q * 32 * KB + 32), mask=hi_live, other=0).to(gl.float8e4nv, bitcast=True)
    w_exp = gl.load(ws_at + q * KB).to(gl.int32)
    return lo, hi, _operand(x_lo, F8), _operand(x_hi, F8), w_exp, gl.load(xs_at + q * KB).to(gl.int32)


@gluon.jit
def _accumulate(acc, chunk, F16_BITS: gl.constexpr):
    """acc plus a chunk's products (_chunk's operands), each column's sum times its block's scales:
    2^(ew-127) 2^(ex-127) 2^6 (e4m3: the codes are the e2m1 values times 2^-6), 2^14 in f16."""
    lo, hi, x_lo, x_hi, w_exp, x_exp = chunk
    part = mma_v2(hi, x_hi, mma_v2(lo, x_lo, gl.zeros_like(acc)))
    return acc + part * _pow2(w_exp + x_exp[None, :] - (113 if F16_BITS else 121))


@gluon.jit
def _products_kernel(a_ptr, as_ptr, src_ptr, blk_ptr, w_ptr, s_ptr, out_ptr, N, K,
                     sar, sasr, swe, sse, ssr, sor, SWR: gl.constexpr,
                     COLS: gl.constexpr, NW: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr,
                     F8: gl.constexpr = False, F16_BITS: gl.constexpr = False, PREFETCH: gl.constexpr = True):
    """Program (block of COLS pairs, BLOCK_N weight rows): out[pair row, rows] = a[src] . W[rows]^T
    for one expert, a as e4m3 codes [*, K] with e8m0 scale bytes [*, K/32], W as split_bits
    bytes [N, K/2] (split_f16's with F16_BITS) with e8m0 scale bytes [N, K/32]. The dot has NW
    columns (8 or 16): column j is pair j // KB, block j % KB of a chunk of KB = NW / COLS
    32-column blocks."""
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
        chunks = K // (32 * KB)
        if PREFETCH:  # two chunks a trip, each one's loads issued while the one before it is decoded and
            # multiplied (the last one read twice where the count is odd): a chunk's bytes stay in flight
            cur = _chunk(w_at, x_at, ws_at, xs_at, lo_live, hi_live, 0, KB, F8, F16_BITS)
            for q in range(0, chunks, 2):
                nxt = _chunk(w_at, x_at, ws_at, xs_at, lo_live, hi_live, gl.minimum(q + 1, chunks - 1), KB, F8,
                             F16_BITS)
                acc = _accumulate(acc, cur, F16_BITS)
                cur = _chunk(w_at, x_at, ws_at, xs_at, lo_live, hi_live, gl.minimum(q + 2, chunks - 1), KB, F8,
                             F16_BITS)
                if q + 1 < chunks:
                    acc = _accumulate(acc, nxt, F16_BITS)
        else:
            for q in range(0, chunks):
                acc = _accumulate(acc, _chunk(w_at, x_at, ws_at, xs_at, lo_live, hi_live, q, KB, F8, F16_BITS),
                                  F16_BITS)
        rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        for p in gl.static_range(COLS):
            sums = gl.sum(gl.where((jc // KB == p)[None, :], acc, 0.0), axis=1)
            dest = gl.load(src_ptr + pid_b * COLS + p)
            if dest >= 0:
                gl.store(out_ptr + (pid_b * COLS + p).to(gl.int64) * sor + rows, sums, mask=rows < N)


TILES = {"64x4w": dict(BLOCK_N=64, num_warps=4), "128x4w": dict(BLOCK_N=128, num_warps=4)}


def products(a: torch.Tensor, a_scales: torch.Tensor, src: torch.Tensor, block_expert: torch.Tensor,
             w: torch.Tensor, w_scales: torch.Tensor, block_m: int, tile: dict, columns: int = 8,
             f8: bool = False, f16_bits: bool = False, prefetch: bool = True) -> torch.Tensor:
    """moe_fp8_dots.fp8_products' product (w in split_bits' layout; scales as bytes [*, K/32]) on
    f16 mma.sync: out [len(src), N] fp32, rows with src -1 left unwritten. columns: the dot's
    width (8 or 16), so a chunk holds columns / block_m 32-column blocks (2 to 8); f8: the MMAs
    given e4m3 operands (_operand); f16_bits: w in split_f16's layout, decoded straight to f16;
    prefetch: each chunk's loads issued a chunk ahead."""
    E, N, half = w.shape
    K = 2 * half
    kb = columns // block_m
    assert kb in (2, 4, 8) and K % (32 * kb) == 0 and a.shape[1] == K and block_m * kb == columns
    a_scales, w_scales = a_scales.contiguous(), w_scales.contiguous()
    out = torch.empty(src.numel(), N, dtype=torch.float32, device=a.device)
    grid = (block_expert.numel(), triton.cdiv(N, tile["BLOCK_N"]))
    _products_kernel[grid](a, a_scales, src, block_expert, w, w_scales, out, N, K, a.stride(0), a_scales.stride(0),
                           w.stride(0), w_scales.stride(0), w_scales.stride(1), out.stride(0), SWR=w.stride(1),
                           COLS=block_m, NW=columns, F8=f8, F16_BITS=f16_bits, PREFETCH=prefetch, **tile)
    return out
