"""Faithful prefill's matrix products on the FP8 tensor cores: both operands re-encoded to the
block scales cuBLAS's FP8 GEMM takes on Hopper (torch._scaled_mm): the activations 1 x 128
(a scale a row and 128 columns), the weights 128 x 128.

The checkpoint scales FP8 weights by 32 x 32 blocks and FP4 experts by 1 x 32, and faithful
mode rounds GEMM inputs onto 1 x 32 FP8 grids: Hopper's FP8 MMAs leave scaling to the code
around them, and a scale applied every 32 columns of K cost the CUDA cores as much as the
MMAs (seventh session). cuBLAS applies one every 128. Re-encoding a block of four 32-column
scales under its largest, 2^d times a smaller one, shifts that block's codes d binades down:
exact while a code stays on e4m3's grid, which ends at 2^-9; below, it rounds to the nearest
multiple of 2^-9 times the larger scale. Lost there are bits under 2^-17.8 of the larger
block's magnitude (448 times its scale). FP4 codes (e2m1, 2 significant bits, 0.5 and up)
stay exact while d <= 8. So the products differ from the bf16 path's exact ones by those
roundings and by the FP8 MMAs' own sums (cuBLAS adds each 128 columns' products in the tensor
cores, then in fp32, the promotion DeepSeek-V3's report describes for its FP8 GEMMs).

H200, 2026-12-04 (thirty-seventh session). One product, 16,384 rows, fp32 out, against
torch.mm in bf16 on the same values: wo_b 1,709 -> 1,089 us, the shared expert's w1+w3
1,087 -> 629, an expert's w1+w3 at 2,048 rows 129 -> 90; weights scaled 1 x 128 (a scale a
row and 128 columns) ran 25-35% slower than 128 x 128, so the weights take the coarser
blocks. A faithful 16K prefill chunk's GPU time 748 -> 665 ms (the products 351 -> 226 ms;
this module's encodes 66 ms, the rows' 45 of it at 4.5x their bytes' time); a 32K prefill
1.469 -> 1.338 s, a 1M one 59.9 -> 55.7 s (docs/performance.md).
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .common import e2m1_quads, e4m3_to_float, fp8_tensor_cores, interpreting, pow2, quad_scales
from .quantize import e4m3_rne, fp8_block_exponents, fp8_blocks
from .swiglu import clamped_swiglu_tile

log = logging.getLogger(__name__)

BLOCK = 128  # cuBLAS's scale blocks on Hopper
# The activations' encode, rows x 128-column blocks a program. (1, 8): a row's 1,024 columns,
# its scales written 8 apart by `count` floats; (32, 1): 32 rows of one block, each block's 32
# scales side by side. With the GPU's conversion instruction both run at 1.0-1.3x their bytes
# on the large operands and tie over a layer's eight (H200, 16,384 rows, forty-second session:
# 556 against 548 us plain, 732 against 739 with faithful mode's rounding inside), where the
# integer rounding's (1, 8) took 4.5x (thirty-seventh session). The first stays.
ROW_TILE = (1, 8)
# Rows of an FP8 product's left operand come in multiples of this: cuBLAS refused
# (CUBLAS_STATUS_NOT_SUPPORTED) runs of other lengths, whose scales' rows are unaligned.
ROW_ALIGN = 16


def fits(x: torch.Tensor, n: int, k: int) -> bool:
    """Whether a product of x [M, k] (faithful mode's bf16 rows on the FP8 grid) and an [n, k]
    weight runs here (runs_on)."""
    return x.dtype == torch.bfloat16 and runs_on(x.device, n, k)


def runs_on(device: torch.device, n: int, k: int) -> bool:
    """Whether an [n, k] weight's products run here on `device`: a GPU where the block-scaled
    FP8 product runs right (_runs_right), both sides whole 128-blocks."""
    return (device.type == "cuda" and not interpreting() and n % BLOCK == 0 and k % BLOCK == 0
            and _runs_right(device.index if device.index is not None else torch.cuda.current_device()))


@triton.jit
def _rows_kernel(x_ptr, up_ptr, weights_ptr, codes_ptr, scales_ptr, starts_ptr, counts_ptr, source_ptr, M, ROWS,
                 K_ALL, sxm, limit, SRC_ROWS, GROUP_K: tl.constexpr, TILE_ROWS: tl.constexpr,
                 TILE_BLOCKS: tl.constexpr, SEGMENTS: tl.constexpr, GATHER: tl.constexpr, SWIGLU: tl.constexpr,
                 WEIGHTED: tl.constexpr, ROUND_FIRST: tl.constexpr, ENCODED: tl.constexpr, HW_FP8: tl.constexpr):
    """Program (TILE_ROWS rows of ROWS, TILE_BLOCKS 128-column blocks, held as one 128-wide row a
    row and block): e4m3 codes under each block's power-of-two scale, as quant.fp8_round_trip
    with 128-column blocks rounds (rows from M on read as zeros). Codes go to group g's [ROWS,
    GROUP_K] matrix (columns g*GROUP_K ..); block b's fp32 scale to scales[b * count + r - start
    + blocks * start], rows in segments [start, start + count) (each a product's rows; one of
    ROWS without SEGMENTS): the layout torch._scaled_mm takes for each segment's scales, [count,
    blocks] with strides (1, count). GATHER: row r is x's row source[r]. SWIGLU: x is the gate
    and up_ptr the up projection (x's row stride); the row is their clamped SwiGLU, times
    weights[r] where WEIGHTED. SWIGLU or ROUND_FIRST: the row is first rounded onto faithful
    mode's 1 x 32 FP8 grid (to the bit as quantize.fp8_grid_bf16 or swiglu.py's fp8_grid).
    ENCODED: x is an operand's codes already (rows of sxm bytes) and up_ptr its scales (block b
    of row s at b * SRC_ROWS + s): the codes and scales are copied, not made."""
    unit = tl.arange(0, TILE_ROWS * TILE_BLOCKS)
    r = tl.program_id(0) * TILE_ROWS + unit // TILE_BLOCKS
    b = tl.program_id(1) * TILE_BLOCKS + unit % TILE_BLOCKS
    blocks = K_ALL // 128
    live = (b < blocks) & (r < ROWS)
    cols = b[:, None] * 128 + tl.arange(0, 128)[None, :]
    reads = live & (r < M)
    row = tl.minimum(r, M - 1)
    source = tl.load(source_ptr + row, mask=reads, other=0).to(tl.int64) if GATHER else row.to(tl.int64)
    if ENCODED:  # (always in runs, so every row reads)
        code = tl.load(x_ptr + source[:, None] * sxm + cols, mask=reads[:, None], other=0)
        scale = tl.load(up_ptr + b * SRC_ROWS + source, mask=reads, other=1.0)
    else:
        x = tl.load(x_ptr + source[:, None] * sxm + cols, mask=reads[:, None], other=0.0).to(tl.float32)
        if SWIGLU:  # (rows from M on: gate and up 0, so h 0)
            up = tl.load(up_ptr + source[:, None] * sxm + cols, mask=reads[:, None], other=0.0).to(tl.float32)
            x = clamped_swiglu_tile(x, up, limit)
            if WEIGHTED:
                x = x * tl.load(weights_ptr + row, mask=reads, other=0.0)[:, None]
        code, scale = encode_blocks(x, TILE_ROWS * TILE_BLOCKS, SWIGLU or ROUND_FIRST, HW_FP8)
    at = (cols // GROUP_K).to(tl.int64) * ROWS * GROUP_K + r[:, None].to(tl.int64) * GROUP_K + cols % GROUP_K
    tl.store(codes_ptr + at, code, mask=live[:, None])
    if SEGMENTS:
        start = tl.load(starts_ptr + r, mask=live, other=0)
        count = tl.load(counts_ptr + r, mask=live, other=0)
    else:
        start = 0
        count = ROWS
    tl.store(scales_ptr + blocks * start + b * count + (r - start), scale, mask=live)


@triton.jit
def encode_blocks(x, BLOCKS: tl.constexpr, ROUND_FIRST: tl.constexpr, HW_FP8: tl.constexpr):
    """x [BLOCKS, 128] fp32, a row's 128-column block each -> (e4m3 codes uint8 [BLOCKS, 128],
    fp32 scales [BLOCKS]) under each block's power-of-two scale; ROUND_FIRST: x first rounded
    onto faithful mode's 1 x 32 FP8 grid (rows_1x128's round_first)."""
    if ROUND_FIRST:
        x = tl.reshape(_on_fp8_grid(tl.reshape(x, (BLOCKS * 4, 32)), HW_FP8), (BLOCKS, 128))
    exponent = fp8_block_exponents(x)
    return _e4m3_codes(x * pow2(254 - exponent)[:, None], HW_FP8), pow2(exponent)


@triton.jit
def _on_fp8_grid(x, HW_FP8: tl.constexpr):
    """x [blocks, 32] fp32 -> its values on faithful mode's FP8 grid, quantize.fp8_blocks' to the
    bit: through the GPU's conversion instructions (two values an instruction each way), in the
    interpreter by fp8_blocks' integer rounding."""
    if HW_FP8:
        exponent = fp8_block_exponents(x)
        codes = (x * pow2(254 - exponent)[:, None]).to(tl.float8e4nv)
        return codes.to(tl.float32) * pow2(exponent)[:, None]
    return fp8_blocks(x)[1]


def rows_1x128(x: torch.Tensor, groups: int = 1, counts: list[int] | None = None,
               sources: torch.Tensor | None = None, round_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any float) -> (e4m3 codes uint8 [groups, rows, K / groups], fp32 scales
    [K / 128 * rows]). Group g's codes and scales (`segment_scales`) are the 1 x 128 operand of
    x's columns g*K/groups ..; with counts (M rows split into runs, one product each; cuBLAS
    wants each a multiple of ROW_ALIGN), run i's scales lie together and rows = M; without,
    rows is M rounded up to ROW_ALIGN, the rows past M zeros (their products are cut off).
    sources [M] (int64): the rows are x's rows sources[i] (the routed experts' tokens), read
    where they lie rather than gathered into a copy first. round_first: x (fp32) is first
    rounded onto faithful mode's 1 x 32 FP8 grid in the same launch, as rows_1x128 of
    quantize.fp8_grid_bf16(x) would encode it (that launch's bf16 write and read never made)."""
    return _encode_rows(x, groups=groups, counts=counts, sources=sources, round_first=round_first)


class Operand(NamedTuple):
    """rows_1x128's operand of m rows made by the launch that computed them (the attention's
    output: sparse_attention.ENCODE_IN_ROWS) or once for several products (the routed experts'
    rows: prefill_gemms.expert_rows_operand), handed to the product in place of the rows."""
    codes: torch.Tensor  # uint8 [groups, rows, K / groups], rows m .. zeros
    scales: torch.Tensor  # fp32 [K / 128 * rows]
    m: int

    @property
    def shape(self) -> tuple[int, int]:
        """The rows' [m, K]. (Only prefill rows come so, never a CUDA graph's input:
        DeepseekV41._dense.)"""
        return self.m, self.codes.shape[0] * self.codes.shape[2]


def empty_operand(m: int, k: int, groups: int, device: torch.device) -> Operand:
    """An Operand of m rows of k columns for a launch to fill: its rows past m, up to a multiple
    of ROW_ALIGN, zero codes under unit scales (rows_1x128 writes the floor's scale there; the
    products of those rows are cut off either way)."""
    rows = -(-m // ROW_ALIGN) * ROW_ALIGN
    codes = torch.empty(groups, rows, k // groups, dtype=torch.uint8, device=device)
    codes[:, m:].zero_()
    scales = torch.empty(k // BLOCK * rows, dtype=torch.float32, device=device)
    scales.view(k // BLOCK, rows)[:, m:] = 1.0
    return Operand(codes, scales, m)


def swiglu_rows_1x128(gate: torch.Tensor, up: torch.Tensor, limit: float, row_weights: torch.Tensor | None = None,
                      counts: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """rows_1x128(swiglu.clamped_swiglu(gate, up, limit, row_weights, fp8_grid=True), counts=counts)
    in one launch: faithful mode's down-projection input, the SwiGLU's output never written
    (gate, up [M, I], I a multiple of 128, rows of one stride: the halves of one product's
    output; row_weights [M] or None)."""
    assert gate.shape == up.shape and gate.stride() == up.stride(), (gate.shape, gate.stride(), up.stride())
    weights = None if row_weights is None else row_weights.to(torch.float32).contiguous()
    return _encode_rows(gate, counts=counts, swiglu=(up, weights, float(limit)))


def gathered_1x128(operand: Operand, counts: list[int], sources: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows_1x128(rows, counts=counts, sources=sources) of the rows `operand` encodes (one group),
    from its codes and scales: each source row's bytes copied, none re-encoded (the routed
    experts' pairs: a token's row encoded once, not once a pair)."""
    assert operand.codes.shape[0] == 1, operand.codes.shape
    return _encode_rows(operand.codes[0], counts=counts, sources=sources, encoded=operand.scales)


def _encode_rows(x: torch.Tensor, groups: int = 1, counts: list[int] | None = None,
                 sources: torch.Tensor | None = None, swiglu: tuple | None = None, round_first: bool = False,
                 encoded: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """rows_1x128's launch; swiglu (up, row weights or None, limit): x is the gate (_rows_kernel's
    SWIGLU); encoded (an operand's scales): x is its codes (ENCODED)."""
    M, K = x.shape if sources is None else (sources.shape[0], x.shape[1])
    assert K % (BLOCK * groups) == 0 and x.stride(1) == 1
    assert encoded is None or counts is not None  # (runs: no padding rows, whose scales rows_1x128 makes)
    rows = M if counts is not None else -(-M // ROW_ALIGN) * ROW_ALIGN
    codes = torch.empty(groups, rows, K // groups, dtype=torch.uint8, device=x.device)
    scales = torch.empty(K // BLOCK * rows, dtype=torch.float32, device=x.device)
    starts = lengths = scales
    if counts is not None:
        sizes = torch.tensor(counts, device=x.device)
        lengths = torch.repeat_interleave(sizes, sizes, output_size=M).to(torch.int32)
        starts = torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes, output_size=M).to(torch.int32)
    up, weights, limit = swiglu or (x if encoded is None else encoded, None, 0.0)
    tile_rows, tile_blocks = ROW_TILE
    if rows:
        _rows_kernel[(triton.cdiv(rows, tile_rows), triton.cdiv(K // BLOCK, tile_blocks))](
            x, up, scales if weights is None else weights, codes, scales, starts, lengths,
            scales if sources is None else sources, M, rows, K, x.stride(0), limit,
            0 if encoded is None else x.shape[0], GROUP_K=K // groups,
            TILE_ROWS=tile_rows, TILE_BLOCKS=tile_blocks, SEGMENTS=counts is not None, GATHER=sources is not None,
            SWIGLU=swiglu is not None, WEIGHTED=weights is not None, ROUND_FIRST=round_first,
            ENCODED=encoded is not None, HW_FP8=not interpreting())
    return codes, scales


def segment_scales(scales: torch.Tensor, blocks: int, start: int, count: int, first_block: int = 0,
                   of_blocks: int | None = None) -> torch.Tensor:
    """Rows start .. start + count's scales of blocks first_block .. + blocks (of of_blocks a
    row) from rows_1x128's: [count, blocks] with strides (1, count), as _scaled_mm takes them."""
    of_blocks = blocks if of_blocks is None else of_blocks
    base = of_blocks * start + first_block * count
    return scales[base:base + blocks * count].view(blocks, count).t()


@triton.jit
def _e4m3_codes(v, HW_FP8: tl.constexpr):
    """fp32 -> e4m3 code bytes, rounding to nearest even and saturating at 448: the GPU's
    conversion instruction (two values an instruction; the integer form took ~15 operations a
    value), the same rounding in integer arithmetic in the interpreter."""
    if HW_FP8:
        return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    code, _ = e4m3_rne(v)
    return code.to(tl.uint8)


@triton.jit
def _fp8_weight_kernel(codes_ptr, scales_ptr, out_ptr, out_scales_ptr, scn, ssn, son, oss,
                       HW_FP8: tl.constexpr):
    """Program (a 128 x 128 block): its 16 checkpoint blocks' codes re-encoded under their
    largest scale, and that scale as fp32."""
    n = tl.program_id(0) * 128 + tl.arange(0, 128)
    k = tl.program_id(1) * 128 + tl.arange(0, 128)
    codes = tl.load(codes_ptr + n[:, None].to(tl.int64) * scn + k[None, :])
    e = tl.load(scales_ptr + (n // 32)[:, None] * ssn + (k // 32)[None, :]).to(tl.int32)
    top = tl.max(tl.max(e, axis=1), axis=0)
    # times 2^(e - top) exactly (e - top + 127 >= 1 for any e >= 1); byte 0 (scale 0) stays 0
    shift = tl.where(e > 0, pow2(tl.maximum(e - top + 127, 1)), 0.0)
    code = _e4m3_codes(e4m3_to_float(codes, HW_FP8) * shift, HW_FP8)
    tl.store(out_ptr + n[:, None].to(tl.int64) * son + k[None, :], code)
    tl.store(out_scales_ptr + tl.program_id(0) * oss + tl.program_id(1), pow2(top))


def fp8_weight_128(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP8 weight (e4m3 codes uint8 [N, K], e8m0 32 x 32 scales) -> (codes uint8 [N, K],
    fp32 scales [N/128, K/128]) under 128 x 128 blocks."""
    N, K = codes.shape
    assert N % BLOCK == 0 and K % BLOCK == 0 and codes.stride(1) == 1 and scales.stride(1) == 1
    out = torch.empty_like(codes)
    out_scales = weight_scales_like(N, K, codes.device)
    _fp8_weight_kernel[(N // BLOCK, K // BLOCK)](codes, scales, out, out_scales, codes.stride(0), scales.stride(0),
                                                 out.stride(0), out_scales.stride(0), HW_FP8=not interpreting())
    return out, out_scales


@triton.jit
def _fp4_weight_kernel(units_ptr, scales_ptr, out_ptr, out_scales_ptr, sur, ssr, sor, oss, PTX: tl.constexpr):
    """Program (128 rows of one expert, 32 quad units = 128 columns): e2m1 codes times 2^(e - top)
    as e4m3 codes (top: the block's largest scale), and top as fp32. Columns 4c + t as
    dequantize._fp4_quads_kernel places them."""
    r = tl.program_id(0) * 128 + tl.arange(0, 128)
    c = tl.program_id(1) * 32 + tl.arange(0, 32)
    units = tl.load(units_ptr + r[:, None].to(tl.int64) * sur + c[None, :])
    e = tl.load(scales_ptr + r[:, None].to(tl.int64) * ssr + (c // 8)[None, :]).to(tl.int32)
    top = tl.max(tl.max(e, axis=1), axis=0)
    # the values times 2^(e - top), exact in bf16 (0 for a scale byte of 0)
    shifted = tl.where(e > 0, tl.maximum(e - top + 127, 1), 0)
    t0, t1, t2, t3 = e2m1_quads(units, quad_scales(shifted, PTX, False), PTX, False)
    quads = tl.join(tl.join(t0, t1), tl.join(t2, t3))
    values = tl.reshape(tl.permute(quads, (0, 1, 3, 2)), (128, 128)).to(tl.float32)
    cols = tl.program_id(1) * 128 + tl.arange(0, 128)
    tl.store(out_ptr + r[:, None].to(tl.int64) * sor + cols[None, :], _e4m3_codes(values, PTX))
    tl.store(out_scales_ptr + tl.program_id(0) * oss + tl.program_id(1), pow2(top))


def _weight_scales(E: int, N: int, K: int, device: torch.device) -> torch.Tensor:
    """fp32 [E, N/128, K/128] whose rows start every 4 scales (16 bytes), as cuBLAS reads 128 x 128 scales."""
    blocks = K // BLOCK
    return torch.empty(E, N // BLOCK, -(-blocks // 4) * 4, dtype=torch.float32, device=device)[:, :, :blocks]


def weight_scales_like(N: int, K: int, device: torch.device) -> torch.Tensor:
    """Empty 128 x 128 scales of an [N, K] weight, laid out as fp8_weight_128's (rows padded)."""
    return _weight_scales(1, N, K, device)[0]


def fp4_weight_128(units: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts' quad units [E, R, K/4] (common.quad_units) with e8m0 1 x 32 scales [E, R, K/32]
    -> (e4m3 codes uint8 [E, R, K], fp32 scales [E, R/128, K/128]) under 128 x 128 blocks."""
    E, R, KU = units.shape
    K = 4 * KU
    assert R % BLOCK == 0 and K % BLOCK == 0 and units.dtype == torch.int16
    units2, scales2 = units.reshape(E * R, KU), scales.reshape(E * R, KU // 8)
    out = torch.empty(E, R, K, dtype=torch.uint8, device=units.device)
    out_scales = _weight_scales(E, R, K, units.device)
    _fp4_weight_kernel[(E * R // BLOCK, K // BLOCK)](
        units2, scales2, out, out_scales, units2.stride(0), scales2.stride(0), K, out_scales.stride(1),
        PTX=not interpreting())
    return out, out_scales


def product(a: torch.Tensor, a_scales: torch.Tensor, w: torch.Tensor, w_scales: torch.Tensor,
            out: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e4m3 codes a [M, K] (1 x 128 scales [M, K/128], strides (1, M)) @ w [N, K] (128 x 128
    scales [N/128, K/128])^T -> fp32 [M, N] (or bf16, `dtype`: the fp32 sums rounded as they
    are written): cuBLAS on the GPU; elsewhere (the CPU tests) the fp32 product of the values
    the codes and scales stand for."""
    if a.is_cuda:
        operands = _operands(a, a_scales, w, w_scales)
        if out is not None and (out.is_contiguous() or (out.stride(1) == 1 and _writes_column_slices())):
            return torch._scaled_mm(*operands, out_dtype=dtype, out=out)
        result = torch._scaled_mm(*operands, out_dtype=dtype)
        return result if out is None else out.copy_(result)
    M, K = a.shape
    av = (a.view(torch.float8_e4m3fn).float().view(M, K // BLOCK, BLOCK) * a_scales[:, :, None]).view(M, K)
    sums = torch.matmul(av, weight_values(w, w_scales).T, out=out if dtype == torch.float32 else None)
    if dtype == torch.float32:
        return sums
    return sums.to(dtype) if out is None else out.copy_(sums)


def _operands(a: torch.Tensor, a_scales: torch.Tensor, w: torch.Tensor, w_scales: torch.Tensor) -> tuple:
    """product's operands as torch._scaled_mm takes them on the GPU."""
    if not _padded_rows_taken():  # the same memory, described as torch 2.11 asks for it
        w_scales = torch.as_strided(w_scales, w_scales.shape, (w_scales.shape[1], 1))
    return a.view(torch.float8_e4m3fn), w.view(torch.float8_e4m3fn).t(), a_scales, w_scales.t()


def weight_values(w: torch.Tensor, w_scales: torch.Tensor) -> torch.Tensor:
    """e4m3 codes [..., N, K] under 128 x 128 scales [..., N/128, K/128] -> the fp32 values they stand for."""
    *lead, N, K = w.shape
    values = w.view(torch.float8_e4m3fn).float().view(*lead, N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    return (values * w_scales[..., :, None, :, None]).view(*lead, N, K)


@functools.cache
def _padded_rows_taken() -> bool:
    """Whether this torch takes 128 x 128 scales as cuBLAS reads them, rows padded to 4 scales.
    torch 2.11 asks for unpadded rows, then passes cuBLAS the pointer alone: with K/128 no
    multiple of 4 its products read the wrong scales past the first row (H200, thirty-seventh
    session: a 256 x 384 weight's second 128 columns of output were wrong); newer ones ask for
    the padding."""
    a = torch.zeros(16, 384, dtype=torch.float8_e4m3fn, device="cuda")
    w = torch.zeros(256, 384, dtype=torch.float8_e4m3fn, device="cuda")  # two rows of scales: one is not checked
    try:
        torch._scaled_mm(a, w.t(), torch.ones(3, 16, device="cuda").t(), _weight_scales(1, 256, 384, "cuda")[0].fill_(1).t(),
                         out_dtype=torch.float32)
        return True
    except RuntimeError:
        return False


@functools.cache
def _writes_column_slices() -> bool:
    """Whether this torch's _scaled_mm writes into columns of a wider output (its row stride
    passed to cuBLAS as the leading dimension), as torch 2.11 does on the H200 (thirty-eighth
    session): wo_a's groups then go straight to their columns, not through a copy each."""
    ones = torch.full((256, 256), 0x38, dtype=torch.uint8, device="cuda")  # e4m3 1.0
    a_scales = torch.ones(2, 16, device="cuda").t()  # [16, 2], strides (1, 16), as segment_scales gives them
    y = torch.full((16, 512), float("nan"), device="cuda")
    try:  # two blocks each way, as product's callers pass them (one block reads as other scalings)
        torch._scaled_mm(*_operands(ones[:16], a_scales, ones, _weight_scales(1, 256, 256, "cuda")[0].fill_(1)),
                         out_dtype=torch.float32, out=y[:, 128:384])
    except RuntimeError:
        return False
    return bool((y[:, 128:384] == 256).all() and y[:, :128].isnan().all() and y[:, 384:].isnan().all())


@functools.cache
def _runs_right(device: int) -> bool:
    """Whether this GPU and torch give the block-scaled FP8 product its values, checked once on
    a small product (three 128-column blocks, so the weight scales' row padding counts) against
    the same codes' fp32 product on the CPU. Where not (no FP8 tensor cores before sm_89, a
    torch without these scale forms, or one that lays them out otherwise) the products keep the
    bf16 path: slower, not wrong."""
    try:
        if not fp8_tensor_cores(device):
            return False
        with torch.cuda.device(device):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(24, 384, generator=g).to(torch.bfloat16).cuda()
            codes = torch.randint(0, 126, (256, 384), dtype=torch.uint8, generator=g)  # positive, no NaN
            codes |= torch.randint(0, 2, codes.shape, dtype=torch.uint8, generator=g) << 7
            scales = torch.randint(118, 127, (8, 12), dtype=torch.uint8, generator=g)
            a, a_scales = rows_1x128(x)
            w, w_scales = fp8_weight_128(codes.cuda(), scales.cuda())
            a_scales = segment_scales(a_scales, 3, 0, a.shape[1])
            got = product(a[0], a_scales, w, w_scales).cpu()
            ref = product(a[0].cpu(), a_scales.cpu(), w.cpu(), w_scales.cpu())
            right = bool((got - ref).abs().max() <= 1e-3 * ref.abs().max())
    except Exception as error:  # (whatever torch, cuBLAS or Triton raise here, the answer is no)
        log.warning("FP8 block-scaled products unavailable on cuda:%d (%s): prefill keeps bf16 products", device, error)
        return False
    if not right:
        log.warning("FP8 block-scaled products on cuda:%d gave wrong values: prefill keeps bf16 products", device)
    return right
