"""Pieces the Triton kernels share: decoding FP8/FP4 bytes in registers.

On the GPU an e4m3 byte is reinterpreted as float8e4nv and converted by hardware, and packed
e2m1 bytes are decoded to bf16 pairs by a few PTX instructions per four bytes. The CPU
interpreter (CI) cannot be trusted with low-precision types and runs no PTX, so there the
codes are decoded arithmetically to fp32 (exact for every code); both give the same values.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# Dot precision: exact fp32 in the interpreter (CI compares with the reference bit-closely),
# three-pass TF32 on the GPU: one-pass TF32 rounds activations to 10 bits, which on H200 put
# the golden logits past 1e-2 (measured 2026-11-30); tf32x3 is fp32-accurate on tensor cores.
# DSFLASH_DOT_PRECISION=ieee (or tf32) overrides it, to tell rounding from bugs.
DOT = tl.constexpr(os.environ.get("DSFLASH_DOT_PRECISION") or ("ieee" if interpreting() else "tf32x3"))
# Where one operand holds dequantized FP8/FP4 values (at most 4 significant bits, times a power
# of two, or an e4m3 scale: at most 8 bits), that operand is exact in TF32. Splitting only the
# other one into a TF32 head and its remainder then gives tf32x3's accuracy in two passes.
_SPLIT_ONE = tl.constexpr(DOT.value == "tf32x3")


@triton.jit
def _tf32_head(x):
    """x with its low 13 mantissa bits cleared: exact in TF32, and x - head is the rest."""
    return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def dot_exact_rhs(a, b, acc):
    """acc + a @ b where every value of b is exact in TF32 (see above)."""
    if _SPLIT_ONE:
        head = _tf32_head(a)
        return tl.dot(a - head, b, tl.dot(head, b, acc, input_precision="tf32"), input_precision="tf32")
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def dot_exact_lhs(a, b, acc):
    """acc + a @ b where every value of a is exact in TF32 (the mirror of dot_exact_rhs)."""
    if _SPLIT_ONE:
        head = _tf32_head(b)
        return tl.dot(a, b - head, tl.dot(a, head, acc, input_precision="tf32"), input_precision="tf32")
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def e4m3_to_float(codes, HW_FP8: tl.constexpr):
    """uint8 e4m3 codes -> fp32 values (sign | 4 exponent bits, bias 7 | 3 mantissa bits)."""
    if HW_FP8:
        return codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    c = codes.to(tl.int32)
    exponent = (c >> 3) & 0xF
    mantissa = (c & 0x7).to(tl.float32)
    normal = (1.0 + mantissa / 8.0) * tl.exp2((exponent - 7).to(tl.float32))
    subnormal = mantissa / 8.0 * 0.015625  # 2^-6
    magnitude = tl.where(exponent == 0, subnormal, normal)
    return tl.where((c & 0x80) != 0, -magnitude, magnitude)


@triton.jit
def pow2(exponent):
    """The fp32 2^(e-127) for a biased exponent e (int32, 1 <= e <= 254), built from its bits
    (exact; e = 0 gives 0)."""
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_to_float(nibbles):
    """4-bit e2m1 codes (int32, sign in bit 3) -> fp32: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives.
    Integer operations only, on the fp32 bit patterns: magnitudes 1 .. 6 (codes 2..7) are
    0x3F000000 + code<<22, 0.5 is 0x3F000000, and the sign is bit 31 (so code 8 is -0.0,
    as the reference decodes it: a float negation compiled for the GPU may give +0.0)."""
    m = nibbles & 0x7
    magnitude = tl.where(m >= 2, 0x3F000000 + (m << 22), tl.where(m == 1, 0x3F000000, 0))
    return (magnitude | ((nibbles & 0x8) << 28)).to(tl.float32, bitcast=True)


# Four packed bytes -> their eight e2m1 values times 2^(e-127), as four bf16 pairs: $0 $1 the
# low nibbles (even columns), $2 $3 the high ones (odd), from bytes $4 and scale exponents $5.
# A nibble's three magnitude bits placed at bf16 bits 6..8 make a bf16 with exponent field
# e1e0 and mantissa m0: the e2m1 value times 2^-126 (code 1, 0.5, is a bf16 subnormal), which
# one multiply by 2^126 makes exact; the sign goes to bit 15. The bf16 whose exponent field is
# e (bits e << 7) is 2^(e-127), and 0 for e = 0.
_E2M1_PAIRS_PTX = tl.constexpr("""
{
.reg .b32 t<2>, s<2>, m, g, two126;
mov.b32 two126, 0x7E807E80;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
prmt.b32 s0, $5, 0, 0x4140;
prmt.b32 s1, $5, 0, 0x4342;
shl.b32 s0, s0, 7;
shl.b32 s1, s1, 7;
and.b32 m, t0, 0x00070007; and.b32 g, t0, 0x00080008; shl.b32 m, m, 6; shl.b32 g, g, 12; or.b32 $0, m, g;
and.b32 m, t1, 0x00070007; and.b32 g, t1, 0x00080008; shl.b32 m, m, 6; shl.b32 g, g, 12; or.b32 $1, m, g;
and.b32 m, t0, 0x00700070; and.b32 g, t0, 0x00800080; shl.b32 m, m, 2; shl.b32 g, g, 8; or.b32 $2, m, g;
and.b32 m, t1, 0x00700070; and.b32 g, t1, 0x00800080; shl.b32 m, m, 2; shl.b32 g, g, 8; or.b32 $3, m, g;
mul.rn.bf16x2 $0, $0, two126; mul.rn.bf16x2 $0, $0, s0;
mul.rn.bf16x2 $1, $1, two126; mul.rn.bf16x2 $1, $1, s1;
mul.rn.bf16x2 $2, $2, two126; mul.rn.bf16x2 $2, $2, s0;
mul.rn.bf16x2 $3, $3, two126; mul.rn.bf16x2 $3, $3, s1;
}
""")


@triton.jit
def e2m1_pairs(packed, exponents, PTX: tl.constexpr):
    """uint8 bytes of two e2m1 codes (low nibble first) and each byte's uint8 e8m0 scale
    exponent e -> (low values, high values) times 2^(e-127) (0 for e = 0): bf16 through PTX on
    the GPU, about 4 instructions per value instead of 20; fp32 by arithmetic elsewhere.
    Both are exact: an e2m1 value has 2 significant bits."""
    if PTX:
        low, high = tl.inline_asm_elementwise(_E2M1_PAIRS_PTX, "=r,=r,=r,=r,r,r", [packed, exponents],
                                              dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        codes = packed.to(tl.int32)
        scale = pow2(exponents.to(tl.int32))
        low, high = e2m1_to_float(codes & 0xF) * scale, e2m1_to_float(codes >> 4) * scale
    return low, high


def bf16_parts(x: torch.Tensor, splits: int) -> torch.Tensor:
    """[splits, *x.shape] bf16 whose sum is x: each part rounds what the ones before left over
    (three parts carry fp32's 24 significant bits)."""
    parts, rest = [], x.float()
    for _ in range(splits):
        parts.append(rest.to(torch.bfloat16))
        rest = rest - parts[-1].float()
    return torch.stack(parts)
