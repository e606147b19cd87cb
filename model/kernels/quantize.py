"""The FP8 and FP4 cache round trips of model/quant.py, each in one launch.

In eager torch `quant.fp8_round_trip` and `quant.fp4_round_trip` are chains of ~20-30 small
ops; a decode step runs them for every layer's window KV, every compressed entry and index
key, and every indexer query, so they were a large share of its launches. Here one program
quantizes a group of 1 x block blocks in registers and writes what the chain returns, bit
for bit: the dequantized fp32 values, the codes and the scale bytes.

Rounding is done with integer and fp32 arithmetic only (no fp8 types), so the CPU
interpreter (CI) runs the same code as the GPU. Inputs must be finite: the reference
propagates NaN through amax, which tl.max need not do. The references are quant.fp8_round_trip
and quant.fp4_round_trip (tests/model/test_quant_kernels.py holds the kernels to them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import quant
from . import pdl
from .common import e2m1_to_float, grouped_column, pow2

_TILE_ELEMENTS = 2048  # elements per program: few programs for the interpreter, ample for decode sizes
INV_FP8_MAX = tl.constexpr(1.0 / quant.FP8_MAX)  # the reference multiplies by this fp32 constant
_FP4_MAX = tl.constexpr(quant.FP4_MAX)
_INV_FP4_MAX = tl.constexpr(1.0 / quant.FP4_MAX)
FP8_AMAX_FLOOR = tl.constexpr(1e-4)
_FP4_AMAX_FLOOR_E8M0 = tl.constexpr(quant.FP4_MAX * 2.0**-126)
_FP4_AMAX_FLOOR_E4M3 = tl.constexpr(quant.FP4_MAX * 2.0**-9)


@triton.jit
def _pow2_ceil_exponent(t):
    """Biased exponent of 2^ceil(log2 t) for positive normal fp32 t: quant.pow2_ceil, and its e8m0 byte."""
    bits = t.to(tl.int32, bitcast=True)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)


@triton.jit
def e4m3_rne(v):
    """fp32 -> (e4m3 byte as int32, its fp32 value), as torch's cast: round to nearest even,
    and saturate to 448 (0x7E) from 464 up."""
    bits = v.to(tl.int32, bitcast=True)
    magnitude_bits = tl.minimum(bits & 0x7FFFFFFF, 0x7F800000)  # so that no carry below overflows
    # |v| >= 2^-6: keep 3 of fp32's 23 mantissa bits, rounding half to even (a carry moves into
    # the exponent); that leaves fp32's exponent and 3 mantissa bits, rebiased from 127 to 7.
    normal_code = ((magnitude_bits + 0x7FFFF + ((magnitude_bits >> 20) & 1)) >> 20) - (120 << 3)
    # |v| < 2^-6: a multiple of 2^-9 (e4m3's subnormals); adding 2^23 rounds |v| * 2^9 to an integer.
    shifted = tl.minimum(tl.abs(v), 1.0) * 512.0 + 8388608.0  # (the minimum keeps large |v| finite)
    subnormal_code = shifted.to(tl.int32, bitcast=True) - 0x4B000000
    code = tl.minimum(tl.where(magnitude_bits >= (121 << 23), normal_code, subnormal_code), 0x7E)
    magnitude = tl.where(code >= 8, (code + (120 << 3)) << 20,
                         (code.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True))
    # the sign as a bit, not a negation: compiled for the GPU, -x of +0.0 may come out +0.0
    sign = bits & -2147483648
    return code | tl.where(bits < 0, 0x80, 0), (magnitude | sign).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_rne(q):
    """fp32 -> e2m1 code (int32, sign in bit 3), round to nearest even (ties at 0.25, 1.25, 2.5
    and 5 go down, at 0.75, 1.75 and 3.5 up), saturating at 6 as the reference's clamp does."""
    a = tl.abs(q)
    under = ((a <= 0.25).to(tl.int32) + (a < 0.75).to(tl.int32) + (a <= 1.25).to(tl.int32)
             + (a < 1.75).to(tl.int32) + (a <= 2.5).to(tl.int32) + (a < 3.5).to(tl.int32)
             + (a <= 5.0).to(tl.int32))
    return (7 - under) | tl.where(q.to(tl.int32, bitcast=True) < 0, 8, 0)


@triton.jit
def fp8_block_exponents(x):
    """x [blocks, block] fp32 -> each row's e8m0 scale exponent (biased), as quant.fp8_round_trip
    picks it: the power of two at or above its largest magnitude / 448."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), FP8_AMAX_FLOOR)
    return _pow2_ceil_exponent(amax * INV_FP8_MAX)


@triton.jit
def fp8_blocks(x):
    """x [blocks, block] fp32 -> each row rounded onto the FP8 grid as quant.fp8_round_trip does:
    (e4m3 codes as int32, the values they stand for, each row's e8m0 scale exponent)."""
    exponent = fp8_block_exponents(x)
    # Dividing by a power of two and multiplying by its (exact) inverse round alike.
    # No clamp to +-448 before encoding: the encoder saturates there, as the clamp would.
    code, value = e4m3_rne(x * pow2(254 - exponent)[:, None])
    return code, value * pow2(exponent)[:, None], exponent


@triton.jit
def _fp8_round_trip_kernel(x_ptr, values_ptr, codes_ptr, scales_ptr, num_blocks, row_width,
                           BLOCK: tl.constexpr, GROUPS: tl.constexpr, PACKED: tl.constexpr, PIECES: tl.constexpr,
                           PDL: tl.constexpr):
    """GROUPS consecutive blocks of BLOCK elements per program; PACKED: the codes and scale
    bytes stored too (a GEMM input's round trip needs only the values). PIECES > 1: each row's
    values stored with its row_width columns grouped by their remainder mod PIECES (grouped_column)."""
    pdl.wait_for_inputs(PDL)
    blocks = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    is_block = blocks < num_blocks
    offsets = blocks[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + offsets, mask=is_block[:, None], other=0.0).to(tl.float32)
    code, value, exponent = fp8_blocks(x)
    if PIECES > 1:
        column = offsets % row_width
        at = offsets - column + grouped_column(column, row_width, PIECES)
    else:
        at = offsets
    tl.store(values_ptr + at, value, mask=is_block[:, None])
    if PACKED:
        tl.store(codes_ptr + offsets, code.to(tl.uint8), mask=is_block[:, None])
        tl.store(scales_ptr + blocks, exponent.to(tl.uint8), mask=is_block)


@triton.jit
def fp4_round_trip_pairs(even, odd, E4M3_SCALES: tl.constexpr):
    """Blocks [groups, BLOCK/2] given as their even and odd columns -> (even values, odd values,
    packed bytes int32 (even code low, odd code high), scale bytes int32 [groups]): what
    quant.fp4_round_trip gives for those blocks. Also the compressor's kernels' last step."""
    amax = tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1))
    if E4M3_SCALES:
        # True division, as the reference's: e4m3 scales are not powers of two.
        scale_byte, scale = e4m3_rne(tl.div_rn(tl.maximum(amax, _FP4_AMAX_FLOOR_E4M3), _FP4_MAX))
        low = _e2m1_rne(tl.div_rn(even, scale[:, None]))
        high = _e2m1_rne(tl.div_rn(odd, scale[:, None]))
    else:
        scale_byte = _pow2_ceil_exponent(tl.maximum(amax, _FP4_AMAX_FLOOR_E8M0) * _INV_FP4_MAX)
        scale = pow2(scale_byte)
        inverse = pow2(254 - scale_byte)[:, None]  # exact, so multiplying rounds as dividing does
        low = _e2m1_rne(even * inverse)
        high = _e2m1_rne(odd * inverse)
    return e2m1_to_float(low) * scale[:, None], e2m1_to_float(high) * scale[:, None], low | (high << 4), scale_byte


@triton.jit
def _fp4_round_trip_kernel(x_ptr, values_ptr, packed_ptr, scales_ptr, num_blocks,
                           BLOCK: tl.constexpr, GROUPS: tl.constexpr, E4M3_SCALES: tl.constexpr,
                           PDL: tl.constexpr):
    """GROUPS consecutive blocks per program, each as its even and odd columns: the low and
    high nibbles of one packed byte."""
    pdl.wait_for_inputs(PDL)
    blocks = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    is_block = blocks[:, None] < num_blocks
    pairs = blocks[:, None] * (BLOCK // 2) + tl.arange(0, BLOCK // 2)[None, :]
    even = tl.load(x_ptr + 2 * pairs, mask=is_block, other=0.0).to(tl.float32)
    odd = tl.load(x_ptr + 2 * pairs + 1, mask=is_block, other=0.0).to(tl.float32)
    even, odd, packed, scale_byte = fp4_round_trip_pairs(even, odd, E4M3_SCALES)
    tl.store(values_ptr + 2 * pairs, even, mask=is_block)
    tl.store(values_ptr + 2 * pairs + 1, odd, mask=is_block)
    tl.store(packed_ptr + pairs, packed.to(tl.uint8), mask=is_block)
    tl.store(scales_ptr + blocks, scale_byte.to(tl.uint8), mask=blocks < num_blocks)


def _launch(kernel, x: torch.Tensor, block: int, code_columns: int, values_dtype: torch.dtype = torch.float32,
            packed: bool = True, **constants):
    """Allocates (values, codes [..., code_columns], scale bytes) shaped as the reference's and
    launches `kernel` over x's blocks (rows flattened: blocks never straddle rows). packed
    False (kernels with a PACKED constexpr, which it sets): the values alone, (None, None)
    for the rest."""
    n = x.shape[-1]
    assert n % block == 0, f"last dimension {n} is not a multiple of the block size {block}"
    assert block >= 2 and block & (block - 1) == 0, "the block size must be a power of two"
    x = x.contiguous()
    values = torch.empty(x.shape, dtype=values_dtype, device=x.device)
    num_blocks = values.numel() // block
    codes = scales = None
    if packed:
        codes = torch.empty(*x.shape[:-1], code_columns, dtype=torch.uint8, device=x.device)
        scales = torch.empty(*x.shape[:-1], n // block, dtype=torch.uint8, device=x.device)
    if "PACKED" in kernel.arg_names:
        constants["PACKED"] = packed
    else:
        assert packed, "this kernel always writes the codes and scale bytes"
    if num_blocks:
        groups = max(1, _TILE_ELEMENTS // block)
        kernel[(triton.cdiv(num_blocks, groups),)](x, values, values if codes is None else codes,
                                                   values if scales is None else scales, num_blocks, BLOCK=block,
                                                   GROUPS=groups, **constants, **pdl.options(x.device))
    return values, (codes, scales)


def fp8_round_trip(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, quant.Packed]:
    """quant.fp8_round_trip in one launch: x [..., n] -> (values fp32 [..., n],
    (e4m3 codes uint8 [..., n], e8m0 scale bytes uint8 [..., n/block]))."""
    return _launch(_fp8_round_trip_kernel, x, block, x.shape[-1], row_width=x.shape[-1], PIECES=1)


def fp8_grid_bf16(x: torch.Tensor, block: int = 32, pieces: int = 1) -> torch.Tensor:
    """quant.fake_quant_fp8's values in one launch, as bf16: an FP8 value times a power of two
    is exact there (faithful mode's GEMM inputs, which then dot as one bf16 part). Like it,
    x whose width is no multiple of the block comes back as it is. pieces > 1 (dividing the
    block): each row's columns come grouped by their remainder mod pieces, the layout
    fp4_moe reads its activations in (common.group_columns), in the same launch."""
    if x.shape[-1] % block:
        return x
    assert block % pieces == 0
    return _launch(_fp8_round_trip_kernel, x, block, x.shape[-1], values_dtype=torch.bfloat16, packed=False,
                   row_width=x.shape[-1], PIECES=pieces)[0]


def fp4_round_trip(x: torch.Tensor, block: int, e4m3_scales: bool = False) -> tuple[torch.Tensor, quant.Packed]:
    """quant.fp4_round_trip in one launch: x [..., n] -> (values fp32 [..., n],
    (packed e2m1 uint8 [..., n/2], e8m0 or e4m3 scale bytes uint8 [..., n/block]))."""
    return _launch(_fp4_round_trip_kernel, x, block, x.shape[-1] // 2, E4M3_SCALES=e4m3_scales)
