"""Engram's gate in one launch (layers/engram_gate.py has the math): each (token, stream) row's
sums of squares and its product with the key under wqk in one read, then the row plus its
gated value written. torch's form made ~10 passes over [T, S, H] fp32 tensors (1.34 GB each at
a 16K chunk): squares, means, products, a broadcast value and the sum; the profile of an early
16K chunk (H100, forty-ninth session) put ~13 ms of elementwise kernels there for two Engram
sites, where this reads the streams and the key once and writes the streams once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layers.mhc import STREAM_DTYPES
from . import pdl
from .common import as_stored

# The fast path takes this launch (TritonOps.engram_gated). H100 32K faithful prefill, alternated
# (fifty-first session, call V): 1.194 / 1.204 -> 1.175 / 1.176 s; at the tiny checkpoint's sites
# the two forms differ by ~4e-8 of the largest value on the same inputs.
FUSED = True


@triton.jit
def _engram_gate_kernel(x_ptr, key_ptr, value_ptr, wqk_ptr, out_ptr, H, sxt, sxs, skt, sks, svt, sot, sos, eps,
                        scale, BLOCK: tl.constexpr, BF16: tl.constexpr, PDL: tl.constexpr):
    """Program (token, stream): the whole row (BLOCK >= H) held while its gate is made. BF16:
    bf16 streams, read into fp32 and the new row rounded once as stored."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    live = d < H
    x = tl.load(x_ptr + t * sxt + s * sxs + d, mask=live, other=0.0).to(tl.float32)
    key = tl.load(key_ptr + t * skt + s * sks + d, mask=live, other=0.0).to(tl.float32)
    wqk = tl.load(wqk_ptr + s * H + d, mask=live, other=0.0)
    rstd = (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)) * (1.0 / tl.sqrt(tl.sum(key * key, axis=0) / H + eps))
    dot = tl.sum(x * wqk * key, axis=0) * rstd * scale
    size = tl.sqrt(tl.maximum(tl.abs(dot), 1e-6, propagate_nan=tl.PropagateNan.ALL))  # (as clamp_min: NaN stays)
    gate = tl.sigmoid(tl.where(dot.to(tl.int32, bitcast=True) < 0, -size, size))  # copysign, by the sign bit
    value = tl.load(value_ptr + t * svt + d, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * sot + s * sos + d, as_stored(x + gate * value, BF16), mask=live)


def supported(X: torch.Tensor, key: torch.Tensor, value: torch.Tensor, wqk: torch.Tensor) -> bool:
    """fp32 or bf16 streams [T, S, H], fp32 key [T, S, H] and value [T, H] rows of contiguous
    columns, wqk [S, H], all on one device."""
    return (FUSED and X.dim() == 3 and X.dtype in STREAM_DTYPES
            and all(t.dtype == torch.float32 and t.device == X.device for t in (key, value, wqk))
            and X.stride(-1) == 1 and key.stride(-1) == 1 and value.stride(-1) == 1 and key.shape == X.shape
            and value.shape == (X.shape[0], X.shape[2]) and wqk.shape == X.shape[1:])


def engram_gated(X: torch.Tensor, key: torch.Tensor, value: torch.Tensor, wqk: torch.Tensor, eps: float
                 ) -> torch.Tensor:
    """layers/engram_gate.engram_gated in one launch (supported's shapes)."""
    T, S, H = X.shape
    out = torch.empty_like(X, memory_format=torch.contiguous_format)
    wqk = wqk.contiguous()
    if T:
        block = triton.next_power_of_2(H)
        _engram_gate_kernel[(T, S)](X, key, value, wqk, out, H, X.stride(0), X.stride(1), key.stride(0),
                                    key.stride(1), value.stride(0), out.stride(0), out.stride(1), eps, H**-0.5,
                                    BLOCK=block, BF16=X.dtype == torch.bfloat16, num_warps=8 if block >= 4096 else 4,
                                    **pdl.options(X.device))
    return out
