"""Packed weights decoded to bf16 in one launch, for the matrix products of prefill.

A prefill chunk's GEMMs have thousands of rows: the tensor cores bound them, not the weight's
bytes, and cuBLAS's bf16 kernels run them faster than our kernels that decode the weight in
registers tile by tile. A bf16 copy made just before the product costs one read of the
packed bytes and one write of twice (FP8) or four times (FP4) as many, a few percent of the
product at 8,192 rows. Exact: an e4m3 or e2m1 value times a power-of-two scale has at most 4
significant bits, and the scales stay inside bf16's exponent range.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import e2m1_quads, e4m3_to_float, interpreting, quad_scales


@triton.jit
def _fp8_kernel(codes_ptr, scales_ptr, out_ptr, N, K, scn, ssn, son,
                BLOCK_K: tl.constexpr, HW_FP8: tl.constexpr):
    """Program (32 weight rows, BLOCK_K columns): e4m3 codes times their 32x32 block's e8m0
    scale, stored as bf16."""
    rn = tl.program_id(0) * 32 + tl.arange(0, 32)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    live = (rn[:, None] < N) & (rk[None, :] < K)
    codes = tl.load(codes_ptr + rn[:, None] * scn + rk[None, :], mask=live, other=0)
    exps = tl.load(scales_ptr + (tl.program_id(0) * ssn + rk // 32), mask=rk < K, other=127).to(tl.float32)
    values = e4m3_to_float(codes, HW_FP8) * tl.exp2(exps - 127.0)[None, :]  # the GEMM kernel's scale form
    tl.store(out_ptr + rn[:, None] * son + rk[None, :], values.to(tl.bfloat16), mask=live)


@triton.jit
def _fp4_quads_kernel(units_ptr, scales_ptr, out_ptr, R, KU, sur, ssr, sor, BLOCK_U: tl.constexpr,
                      ROWS: tl.constexpr, PTX: tl.constexpr):
    """Program (ROWS rows, BLOCK_U quad units): each unit's four e2m1 codes (columns 4c .. 4c+3)
    times their 32 columns' e8m0 scale, stored as bf16 (the expert kernels' decoder)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BLOCK_U + tl.arange(0, BLOCK_U)
    live = (r[:, None] < R) & (c[None, :] < KU)
    units = tl.load(units_ptr + r[:, None] * sur + c[None, :], mask=live, other=0)
    exps = tl.load(scales_ptr + r[:, None] * ssr + (c // 8)[None, :], mask=live, other=127).to(tl.int32)
    t0, t1, t2, t3 = e2m1_quads(units, quad_scales(exps, PTX, False), PTX, False)
    # columns 4c + t, t = 2a + b: the pairs joined along b, then along a
    quads = tl.join(tl.join(t0, t1), tl.join(t2, t3))
    values = tl.reshape(tl.permute(quads, (0, 1, 3, 2)), (ROWS, 4 * BLOCK_U))
    cols = tl.program_id(1) * 4 * BLOCK_U + tl.arange(0, 4 * BLOCK_U)
    tl.store(out_ptr + r[:, None] * sor + cols[None, :], values.to(tl.bfloat16),
             mask=(r[:, None] < R) & (cols[None, :] < 4 * KU))


def fp8_weight_bf16(codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """e4m3 codes [N, K] with e8m0 scales [ceil(N/32), ceil(K/32)] -> bf16 [N, K], exactly."""
    N, K = codes.shape
    assert codes.dtype == torch.uint8 and scales.shape == (-(-N // 32), -(-K // 32)), (codes.shape, scales.shape)
    assert codes.stride(1) == 1 and scales.stride(1) == 1, "rows of consecutive bytes"
    out = torch.empty(N, K, dtype=torch.bfloat16, device=codes.device) if out is None else out
    block_k = 64 if interpreting() else 256
    _fp8_kernel[(triton.cdiv(N, 32), triton.cdiv(K, block_k))](
        codes, scales, out, N, K, codes.stride(0), scales.stride(0), out.stride(0), BLOCK_K=block_k,
        HW_FP8=not interpreting())
    return out


def fp4_quads_bf16(units: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Quad units [..., R, K/4] (common.quad_units) with e8m0 scales [..., R, K/32] -> bf16
    [..., R, K], exactly (a scale byte of 0 gives 0, as the expert kernels read it)."""
    *lead, rows, ku = units.shape
    assert units.dtype == torch.int16 and scales.shape == (*lead, rows, ku // 8), (units.shape, scales.shape)
    units2, scales2 = units.reshape(-1, ku), scales.reshape(-1, ku // 8)
    assert units2.stride(1) == 1 and scales2.stride(1) == 1, "rows of consecutive units"
    out = torch.empty(*lead, rows, 4 * ku, dtype=torch.bfloat16, device=units.device) if out is None else out
    flat = out.view(-1, 4 * ku)
    # the interpreter's time goes by programs: the tiny checkpoint's experts in a few (8 s of a 50 s CI test)
    r, block_u = (128, 32) if interpreting() else (32, 128)
    _fp4_quads_kernel[(triton.cdiv(units2.shape[0], r), triton.cdiv(ku, block_u))](
        units2, scales2, flat, units2.shape[0], ku, units2.stride(0), scales2.stride(0), flat.stride(0),
        BLOCK_U=block_u, ROWS=r, PTX=not interpreting())
    return out
