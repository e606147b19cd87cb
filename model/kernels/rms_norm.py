"""RMSNorm in one launch: w * x * 1/sqrt(mean(x^2) + eps), as layers/norm.py computes it.

The torch form is five or six kernels (square, mean, add, rsqrt, two products). A decode
step normalizes ~180 times (each mHC site's mix input, each attention's q and kv latents, the
DSpark stages): ~1,000 of its ~2,300 kernels, and in the eager stretches as many host launches
(H200, 2026-12-02, torch profiler: 181 `mean` reductions a batch-1 step).

Shapes: x [..., H] (rows of contiguous columns), weight [H] or None; out fp32 like x's shape.
One program a row holds the whole row (H up to 32,768: the mHC mixes read S*H = 20,480).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

MAX_WIDTH = 32768  # wider rows keep the torch form


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, H, eps, sxt, sot, WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    """Program (row t): its sum of squares, then every column scaled (and weighted)."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    live = d < H
    x = tl.load(x_ptr + t * sxt + d, mask=live, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps))
    if WEIGHT:
        y = tl.load(w_ptr + d, mask=live, other=0.0).to(tl.float32) * y
    tl.store(out_ptr + t * sot + d, y, mask=live)


def supported(x: torch.Tensor) -> bool:
    return x.dim() >= 1 and x.shape[-1] <= MAX_WIDTH and x.is_floating_point()


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., H] -> fp32 [..., H]: layers/norm.py's rms_norm (sums in another order)."""
    H = x.shape[-1]
    rows = x.reshape(-1, H)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(H)
        w = rows if weight is None else weight.contiguous()  # never read without WEIGHT
        _rms_norm_kernel[(rows.shape[0],)](rows, w, out, H, eps, rows.stride(0), out.stride(0),
                                           WEIGHT=weight is not None, BLOCK=block,
                                           num_warps=16 if block >= 16384 else 8 if block >= 4096 else 4,
                                           **pdl.options(rows.device))
    return out.view(x.shape)
