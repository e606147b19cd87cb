"""The clamped SwiGLU in one launch: silu(min(g, L)) * clamp(u, -L, L).

torch's form is four kernels (two clamps, silu, product) a layer at decode for the shared
expert; the routed experts compute the same (clamped_swiglu_tile) inside their gate/up kernel
(fp4_moe) at decode, and through this launch at prefill (prefill_gemms.fp4_experts), where it
also takes each row's routing weight and, in faithful mode, rounds the result onto the FP8 grid
for the down projection: at 8,192 tokens those were two more passes over a [49,152, I] fp32
tensor. Shapes: gate, up [T, I] (rows of contiguous columns, any row stride: the halves of one
merged GEMM's output).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import pdl
from .quantize import fp8_blocks


def clamped_swiglu_ref(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """The torch form (no clamp when limit is 0)."""
    if limit > 0:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return F.silu(gate) * up


@triton.jit
def clamped_swiglu_tile(gate, up, limit):
    """silu(min(gate, L)) * clamp(up, -L, L) of fp32 tiles (no clamp when limit is 0)."""
    if limit > 0:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, w_ptr, out_ptr, I, limit, sgt, sut, WEIGHTED: tl.constexpr, FP8_GRID: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program (row t, column block). WEIGHTED: times the row's weight w[t], as torch's product
    after the SwiGLU rounds it. FP8_GRID: then each 32 columns rounded as fp8_grid_bf16 does
    (I a multiple of 32: masked columns are whole blocks of zeros), stored as bf16."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = d < I
    gate = tl.load(g_ptr + t * sgt + d, mask=live, other=0.0).to(tl.float32)
    up = tl.load(u_ptr + t * sut + d, mask=live, other=0.0).to(tl.float32)
    h = clamped_swiglu_tile(gate, up, limit)
    if WEIGHTED:
        h = h * tl.load(w_ptr + t)
    if FP8_GRID:
        _, values, _ = fp8_blocks(tl.reshape(h, (BLOCK // 32, 32)))
        h = tl.reshape(values, (BLOCK,)).to(tl.bfloat16)
    tl.store(out_ptr + t * I + d, h, mask=live)


def supported(gate: torch.Tensor, up: torch.Tensor) -> bool:
    return gate.dim() == 2 and gate.shape == up.shape and gate.stride(-1) == 1 and up.stride(-1) == 1


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, row_weights: torch.Tensor | None = None,
                   fp8_grid: bool = False) -> torch.Tensor:
    """gate, up [T, I] -> [T, I] fp32, as clamped_swiglu_ref; times row_weights [T] where given;
    with fp8_grid (I a multiple of 32) as fp8_grid_bf16 of that: bf16 on the FP8 grid."""
    T, inter = gate.shape
    assert not fp8_grid or inter % 32 == 0, inter
    out = torch.empty(T, inter, dtype=torch.bfloat16 if fp8_grid else torch.float32, device=gate.device)
    weighted = row_weights is not None
    if weighted:
        row_weights = row_weights.to(torch.float32).contiguous()
    if T:
        block = 1024
        _swiglu_kernel[(T, triton.cdiv(inter, block))](gate, up, row_weights if weighted else out, out, inter,
                                                       float(limit), gate.stride(0), up.stride(0), WEIGHTED=weighted,
                                                       FP8_GRID=fp8_grid, BLOCK=block, **pdl.options(gate.device))
    return out
