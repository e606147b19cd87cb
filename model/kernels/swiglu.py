"""The shared expert's clamped SwiGLU in one launch: silu(min(g, L)) * clamp(u, -L, L).

torch's form is four kernels (two clamps, silu, product) a layer at decode; the routed
experts compute the same (clamped_swiglu_tile) inside their gate/up kernel (fp4_moe). Shapes:
gate, up [T, I] (rows of contiguous columns, any row stride: the halves of one merged GEMM's
output).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


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
def _swiglu_kernel(g_ptr, u_ptr, out_ptr, I, limit, sgt, sut, BLOCK: tl.constexpr):
    """Program (row t, column block)."""
    t = tl.program_id(0)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = d < I
    gate = tl.load(g_ptr + t * sgt + d, mask=live, other=0.0).to(tl.float32)
    up = tl.load(u_ptr + t * sut + d, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * I + d, clamped_swiglu_tile(gate, up, limit), mask=live)


def supported(gate: torch.Tensor, up: torch.Tensor) -> bool:
    return gate.dim() == 2 and gate.shape == up.shape and gate.stride(-1) == 1 and up.stride(-1) == 1


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """gate, up [T, I] -> [T, I] fp32, as clamped_swiglu_ref."""
    T, inter = gate.shape
    out = torch.empty(T, inter, dtype=torch.float32, device=gate.device)
    if T:
        block = 1024
        _swiglu_kernel[(T, triton.cdiv(inter, block))](gate, up, out, inter, float(limit), gate.stride(0), up.stride(0),
                                                       BLOCK=block)
    return out
