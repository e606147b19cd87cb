"""The compressor's chain around its GEMMs (model/layers/compressor.py), in two kernels.

Shapes: G groups (= compressed entries), r the ratio, D the latent width, n a row's width
(D for the entries, the index dim for the keys), half the rotated pairs.
- pool_norm: kv, gate [G*r, D] -> latent [G, D]: per channel, a softmax of the gates over
  each group's r rows weights the sum of its kv rows (r = 1: the row itself), then RMSNorm.
- norm_rope_fp4: x [G, n] -> the FP4 round trip of RoPE(x), or of RoPE(RMSNorm(x)): the
  compressed entries (block 16, e4m3 scales) and the index keys (block 32, pow2 scales).
In torch these are ~20 small ops per call, and a decode step runs them for each of the 4
KV-source layers (the compressor stays outside the CUDA graphs: its shapes follow the caches).

One program per group or row, so a batch computes what its runs compute alone. The RoPE and
the FP4 round trip give what ops.rope then ops.fp4_round_trip give on the same input, bit
for bit (the same jit helpers). The softmax and the RMSNorm sums run in another order than
torch's, so the latent (and a norm inside norm_rope_fp4) can differ in the last bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import quant
from ..layers.norm import rms_norm
from ..rope import apply_rope
from . import pdl
from .common import interpreting
from .quantize import fp4_round_trip_pairs
from .rope import mul_rn

_PTX = tl.constexpr(not interpreting())


def pool_norm_ref(kv: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, ratio: int,
                  eps: float) -> torch.Tensor:
    """kv [G*r, D], gate [G*r, D] (None for r = 1) -> RMSNorm(sum_t softmax_t(gate) * kv) [G, D] fp32."""
    if ratio > 1:
        groups = kv.shape[0] // ratio
        weights = gate.view(groups, ratio, -1).softmax(dim=1)
        kv = (kv.view(groups, ratio, -1) * weights).sum(dim=1)
    return rms_norm(kv, weight, eps)


def norm_rope_fp4_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block: int, e4m3_scales: bool = False,
                      norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> tuple[torch.Tensor, quant.Packed]:
    """quant.fp4_round_trip(apply_rope(x)), with x first RMS-normalized when norm_weight is given."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    return quant.fp4_round_trip(apply_rope(x, cos, sin), block, e4m3_scales)


@triton.jit
def _rms_inverse(sum_squares, N: tl.constexpr, eps):
    """1 / sqrt(mean + eps), correctly rounded as torch's rsqrt is on the CPU."""
    return tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(sum_squares, N * 1.0) + eps))


@triton.jit
def _pool_norm_kernel(kv_ptr, gate_ptr, w_ptr, out_ptr, eps, skv, sgate, so,
                      D: tl.constexpr, RATIO: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Program g: rows g*RATIO .. g*RATIO + RATIO - 1 -> latent row g."""
    pdl.wait_for_inputs(PDL)
    g = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    live = d < D
    t = g * RATIO + tl.arange(0, RATIO)[:, None]  # [RATIO, 1]
    kv = tl.load(kv_ptr + t * skv + d[None, :], mask=live[None, :], other=0.0).to(tl.float32)
    if RATIO == 1:
        pooled = tl.sum(kv, axis=0)
    else:
        z = tl.load(gate_ptr + t * sgate + d[None, :], mask=live[None, :], other=0.0).to(tl.float32)
        e = tl.exp(z - tl.max(z, axis=0)[None, :])  # the largest term is exp(0): no overflow
        pooled = tl.sum(tl.div_rn(e, tl.sum(e, axis=0)[None, :]) * kv, axis=0)
    inverse = _rms_inverse(tl.sum(pooled * pooled, axis=0), D, eps)
    w = tl.load(w_ptr + d, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + g * so + d, w * (pooled * inverse), mask=live)


@triton.jit
def _norm_rope_fp4_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, values_ptr, packed_ptr, scales_ptr, eps, sx, sc,
                          N: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, NUM_BLOCKS: tl.constexpr,
                          BLOCKS_P2: tl.constexpr, NORM: tl.constexpr, E4M3_SCALES: tl.constexpr,
                          PTX: tl.constexpr, PDL: tl.constexpr):
    """Program: one row, as its quantizer blocks [BLOCKS_P2, BLOCK/2] of even and odd columns.
    A pair (2p, 2p+1) is both a RoPE pair and the two nibbles of packed byte p."""
    pdl.wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, BLOCKS_P2)
    live = (b < NUM_BLOCKS)[:, None]
    p = b[:, None] * (BLOCK // 2) + tl.arange(0, BLOCK // 2)[None, :]  # pair index in the row
    even = tl.load(x_ptr + row * sx + 2 * p, mask=live, other=0.0).to(tl.float32)
    odd = tl.load(x_ptr + row * sx + 2 * p + 1, mask=live, other=0.0).to(tl.float32)
    if NORM:
        inverse = _rms_inverse(tl.sum(tl.sum(even * even + odd * odd, axis=1), axis=0), N, eps)
        even = tl.load(w_ptr + 2 * p, mask=live, other=0.0).to(tl.float32) * (even * inverse)
        odd = tl.load(w_ptr + 2 * p + 1, mask=live, other=0.0).to(tl.float32) * (odd * inverse)
    i = p - (N // 2 - HALF)  # index in the cos/sin row (negative: a pair that does not rotate)
    rotates = live & (i >= 0)
    c = tl.load(cos_ptr + row * sc + i, mask=rotates, other=1.0)
    s = tl.load(sin_ptr + row * sc + i, mask=rotates, other=0.0)
    # as apply_rope rounds: two products, then their sum; pairs that do not rotate keep their
    # bits (o*1 + e*0 would turn a -0.0 into +0.0, and so its code)
    even, odd = (tl.where(rotates, mul_rn(even, c, PTX) - mul_rn(odd, s, PTX), even),
                 tl.where(rotates, mul_rn(odd, c, PTX) + mul_rn(even, s, PTX), odd))
    even, odd, packed, scale_byte = fp4_round_trip_pairs(even, odd, E4M3_SCALES)
    out = row * (N // 2) + p
    tl.store(values_ptr + 2 * out, even, mask=live)
    tl.store(values_ptr + 2 * out + 1, odd, mask=live)
    tl.store(packed_ptr + out, packed.to(tl.uint8), mask=live)
    tl.store(scales_ptr + row * NUM_BLOCKS + b, scale_byte.to(tl.uint8), mask=b < NUM_BLOCKS)


def pool_norm(kv: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, ratio: int,
              eps: float) -> torch.Tensor:
    """pool_norm_ref in one launch: kv, gate [G*r, D] (gate None for r = 1), weight [D] -> [G, D] fp32."""
    rows, D = kv.shape
    assert ratio & (ratio - 1) == 0 and rows % ratio == 0 and (gate is None) == (ratio == 1)
    assert kv.stride(-1) == 1 and weight.shape == (D,)
    gate = kv if gate is None else gate  # (unread for r = 1)
    assert gate.shape == kv.shape and gate.stride(-1) == 1
    out = torch.empty(rows // ratio, D, dtype=torch.float32, device=kv.device)
    if rows:
        _pool_norm_kernel[(rows // ratio,)](kv, gate, weight.contiguous(), out, eps, kv.stride(0), gate.stride(0),
                                            out.stride(0), D=D, RATIO=ratio, BLOCK_D=triton.next_power_of_2(D),
                                            **pdl.options(kv.device))
    return out


def norm_rope_fp4(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block: int, e4m3_scales: bool = False,
                  norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> tuple[torch.Tensor, quant.Packed]:
    """norm_rope_fp4_ref in one launch: x [G, n], cos/sin [G, half] -> (values fp32 [G, n],
    (packed e2m1 uint8 [G, n/2], scale bytes uint8 [G, n/block]))."""
    G, n = x.shape
    half = cos.shape[-1]
    assert cos.shape == sin.shape == (G, half) and 2 * half <= n and x.stride(-1) == 1
    assert n % block == 0 and block >= 2 and block & (block - 1) == 0
    assert norm_weight is None or norm_weight.shape == (n,)
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    values = torch.empty(G, n, dtype=torch.float32, device=x.device)
    packed = torch.empty(G, n // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(G, n // block, dtype=torch.uint8, device=x.device)
    if G:
        w = x if norm_weight is None else norm_weight.contiguous()  # (unread without a norm)
        _norm_rope_fp4_kernel[(G,)](x, w, cos, sin, values, packed, scales, eps, x.stride(0), cos.stride(0), N=n,
                                    HALF=half, BLOCK=block, NUM_BLOCKS=n // block,
                                    BLOCKS_P2=triton.next_power_of_2(n // block), NORM=norm_weight is not None,
                                    E4M3_SCALES=e4m3_scales, PTX=_PTX, **pdl.options(x.device))
    return values, (packed, scales)
