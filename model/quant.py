"""The number formats of DeepSeek-V4.1: FP8 e4m3, FP4 e2m1 and their scales.

One piece of code serves three uses, so they can never drift apart:
- decoding checkpoint weights (FP8 with 32x32 e8m0 blocks, packed FP4 with 1x32 e8m0 blocks);
- the quantization-aware "fake quant" round trips the model applies to its caches and
  (in faithful mode) to GEMM activations;
- the KV cache's real storage format, which holds exactly the codes and scale bytes that
  the fake quant produced (so storing and loading a cache is lossless).

Scales are either powers of two kept as one e8m0 byte (value 2^(byte-127)) or, for the
compressed KV, one e4m3 byte. E8M0 bytes are always handled as uint8: a numeric cast of
float8_e8m0fnu is lossy in some stacks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP4_MAX = 6.0  # largest e2m1
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32
)
# Decision thresholds between neighbouring e2m1 magnitudes, round-to-nearest-even:
# a tie (exactly on a midpoint) goes to the even code, so 0.25, 1.25, 2.5, 5.0 round down
# and 0.75, 1.75, 3.5 round up.
_E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
_E2M1_TIE_UP = torch.tensor([False, True, False, True, False, True, False])


# ---------------------------------------------------------------- scales


def pow2_ceil(t: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 t) for positive fp32 t, from the IEEE bits (exponent, +1 if any mantissa bit)."""
    bits = t.float().contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.exp2(exponent.to(torch.float32))


def pow2_to_e8m0(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scale -> its e8m0 byte."""
    bits = scale.float().contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF).to(torch.uint8)


def e8m0_to_float(byte: torch.Tensor) -> torch.Tensor:
    """e8m0 byte (uint8, or float8_e8m0fnu viewed as uint8) -> fp32 2^(byte-127)."""
    return torch.exp2(as_uint8(byte).to(torch.float32) - 127.0)


def as_uint8(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes of a 1-byte tensor, never a numeric conversion."""
    if t.dtype == torch.uint8:
        return t
    if t.element_size() != 1:
        raise TypeError(f"expected a 1-byte dtype, got {t.dtype}")
    return t.view(torch.uint8)


# ---------------------------------------------------------------- element codes


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 (already within +-448) -> e4m3 byte, round to nearest even."""
    return x.float().to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(byte: torch.Tensor) -> torch.Tensor:
    return as_uint8(byte).view(torch.float8_e4m3fn).to(torch.float32)


@functools.cache
def _e2m1_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(decision thresholds, values) on one device, copied there once, not at every call."""
    mids = _E2M1_MIDPOINTS.to(device)
    thresholds = torch.where(_E2M1_TIE_UP.to(device), mids, torch.nextafter(mids, torch.full_like(mids, 1e9)))
    return thresholds, E2M1_VALUES.to(device)


@functools.cache
def _fp4_max(device: torch.device) -> torch.Tensor:
    """6 as a tensor on `device`, to divide by. ATen multiplies a CUDA tensor "divided" by a Python
    number by the number's fp32 inverse (div_true_kernel_cuda): an ulp off at times, which sends
    some amax/6 to the other e4m3 neighbour. A tensor divisor divides (IEEE) on CPU and GPU alike."""
    return torch.tensor(FP4_MAX, device=device)


def e2m1_encode(q: torch.Tensor) -> torch.Tensor:
    """fp32 (already within +-6) -> e2m1 code (uint8, sign in bit 3), round to nearest even."""
    thresholds = _e2m1_tables(q.device)[0]
    magnitude = torch.bucketize(q.abs().float().contiguous(), thresholds, right=True).to(torch.uint8)
    return magnitude | (torch.signbit(q).to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    return _e2m1_tables(code.device)[1][code.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] 4-bit codes -> [..., n] bytes; element 2c in the low nibble, 2c+1 in the high."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    packed = as_uint8(packed)
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


# ---------------------------------------------------------------- blockwise formats


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"last dimension {n} is not a multiple of the block size {block}")
    return x.float().reshape(*x.shape[:-1], n // block, block)


def fp8_quantize(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 e4m3 per 1 x block with a power-of-two scale 2^ceil(log2(max(amax, 1e-4)/448)).

    Returns (codes uint8 [..., n], e8m0 scale bytes uint8 [..., n/block]). This is the
    reference's activation quantizer and the window-KV quantizer.
    """
    blocks = _blocks(x, block)
    amax = blocks.abs().amax(-1).clamp_min(1e-4)
    scale = pow2_ceil(amax * (1.0 / FP8_MAX))
    codes = e4m3_encode((blocks / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX))
    return codes.flatten(-2), pow2_to_e8m0(scale)


def fp8_dequantize(codes: torch.Tensor, scales: torch.Tensor, block: int = 32) -> torch.Tensor:
    values = e4m3_decode(codes)
    values = values.reshape(*values.shape[:-1], values.shape[-1] // block, block) * e8m0_to_float(scales).unsqueeze(-1)
    return values.flatten(-2)


def fp4_quantize(x: torch.Tensor, block: int, e4m3_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 e2m1 per 1 x block; returns (packed nibbles [..., n/2], scale bytes [..., n/block]).

    block 32 (indexer q/k): power-of-two scale 2^ceil(log2(max(amax, 6*2^-126)/6)) as e8m0.
    block 16 with e4m3_scales (compressed KV): scale e4m3(max(amax, 6*2^-9)/6) as an e4m3 byte.
    """
    blocks = _blocks(x, block)
    amax = blocks.abs().amax(-1)
    if e4m3_scales:
        scale_bytes = e4m3_encode(amax.clamp_min(FP4_MAX * 2.0**-9) / _fp4_max(amax.device))
        scale = e4m3_decode(scale_bytes)
    else:
        scale = pow2_ceil(amax.clamp_min(FP4_MAX * 2.0**-126) * (1.0 / FP4_MAX))
        scale_bytes = pow2_to_e8m0(scale)
    codes = e2m1_encode((blocks / scale.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX))
    return pack_nibbles(codes.flatten(-2)), scale_bytes


def fp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, block: int, e4m3_scales: bool = False) -> torch.Tensor:
    values = e2m1_decode(unpack_nibbles(packed))
    scale = e4m3_decode(scales) if e4m3_scales else e8m0_to_float(scales)
    values = values.reshape(*values.shape[:-1], values.shape[-1] // block, block) * scale.unsqueeze(-1)
    return values.flatten(-2)


# ---------------------------------------------------------------- fake quant (QAT round trips)


Packed = tuple[torch.Tensor, torch.Tensor]  # (codes, scale bytes) exactly as a cache stores them


def fp8_round_trip(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, Packed]:
    """x on the FP8 grid, and the codes that hold it."""
    packed = fp8_quantize(x, block)
    return fp8_dequantize(*packed, block), packed


def fp4_round_trip(x: torch.Tensor, block: int, e4m3_scales: bool = False) -> tuple[torch.Tensor, Packed]:
    """x on the FP4 grid, and the codes that hold it (re-quantizing the values would not always
    give them back: an e4m3 scale need not survive a second pass)."""
    packed = fp4_quantize(x, block, e4m3_scales)
    return fp4_dequantize(*packed, block, e4m3_scales), packed


def fake_quant_fp8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x rounded onto the FP8 grid and back (window KV; activations before FP8/FP4 GEMMs)."""
    if x.shape[-1] % block:
        return x  # shapes the reference cannot block run unquantized
    return fp8_round_trip(x, block)[0].to(x.dtype)


def fake_quant_fp4(x: torch.Tensor, block: int, e4m3_scales: bool = False,
                   round_trip: Callable[..., tuple[torch.Tensor, Packed]] = fp4_round_trip) -> torch.Tensor:
    """x rounded onto the FP4 grid and back (compressed KV: block 16 e4m3; indexer: block 32 pow2).
    `round_trip`: fp4_round_trip or a kernel that computes the same (model/kernels/quantize.py)."""
    if x.shape[-1] % block:
        return x
    return round_trip(x, block, e4m3_scales)[0].to(x.dtype)


# ---------------------------------------------------------------- checkpoint weights


def _expand_blocks(scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    rows, cols = shape
    return scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]


def dequantize_fp8_weight(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (32, 32)) -> torch.Tensor:
    """W[i, j] = e4m3(q[i, j]) * 2^(s[i // bo, j // bi] - 127), exactly, in fp32."""
    values = e4m3_decode(weight)
    return values * _expand_blocks(e8m0_to_float(scale), tuple(values.shape), block)


def quantize_fp8_weight(w: torch.Tensor, block: tuple[int, int] = (32, 32)) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [out, in] -> (e4m3 bytes [out, in], e8m0 bytes [ceil(out/bo), ceil(in/bi)]), no clipping."""
    rows, cols = w.shape
    bo, bi = block
    padded = torch.zeros(-(-rows // bo) * bo, -(-cols // bi) * bi, dtype=torch.float32, device=w.device)
    padded[:rows, :cols] = w.float()
    tiles = padded.reshape(padded.shape[0] // bo, bo, padded.shape[1] // bi, bi)
    amax = tiles.abs().amax(dim=(1, 3)).clamp_min(2.0**-120)
    scale = pow2_ceil(amax * (1.0 / FP8_MAX))
    codes = e4m3_encode((w.float() / _expand_blocks(scale, (rows, cols), block)).clamp(-FP8_MAX, FP8_MAX))
    return codes, pow2_to_e8m0(scale)


def dequantize_fp4_weight(packed: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Routed-expert weight: I8 [out, in/2] (low nibble = even column) + e8m0 [out, in/block]."""
    return fp4_dequantize(as_uint8(packed), as_uint8(scale), block)


def quantize_fp4_weight(w: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    packed, scale = fp4_quantize(w, block)
    return packed, scale
