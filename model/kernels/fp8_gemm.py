"""y = x @ W^T with W stored as FP8 e4m3 bytes and one e8m0 scale per 32x32 block.

Shapes: x [M, K] (fp32 or bf16), W [N, K] e4m3 bytes, scales [ceil(N/32), ceil(K/32)] e8m0 bytes,
y [M, N] fp32. The weight is decoded in registers (never materialized in memory): at decode
batch sizes the GEMM is bound by reading W, one byte per weight. With `act_quant`, x is first
rounded to FP8 in 1x32 blocks (the reference's faithful mode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant import dequantize_fp8_weight, fake_quant_fp8
from .common import e4m3_to_float, interpreting


def fp8_gemm_ref(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, act_quant: bool = False) -> torch.Tensor:
    if act_quant:
        x = fake_quant_fp8(x.float())
    return x.float() @ dequantize_fp8_weight(codes, scales).T


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K,
                     sxm, sxk, swn, swk, ssn, ssk, sym, syn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     HW_FP8: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * sxm + kk[None, :] * sxk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0).to(tl.float32)
        codes = tl.load(w_ptr + rn[:, None] * swn + kk[None, :] * swk,
                        mask=(rn[:, None] < N) & (kk[None, :] < K), other=0)
        w = e4m3_to_float(codes, HW_FP8)
        # one e8m0 scale per 32x32 block: BLOCK_K is 32, so one scale column per step
        sbyte = tl.load(s_ptr + (rn // 32) * ssn + (k0 // 32) * ssk, mask=rn < N, other=127).to(tl.float32)
        w = w * tl.exp2(sbyte - 127.0)[:, None]
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def fp8_gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, act_quant: bool = False) -> torch.Tensor:
    """x [M, K] @ (codes, scales)^T -> [M, N] fp32."""
    if act_quant:
        x = fake_quant_fp8(x.float())
    M, K = x.shape
    N = codes.shape[0]
    assert codes.shape == (N, K) and codes.dtype == torch.uint8, (codes.shape, codes.dtype)
    assert scales.shape == (-(-N // 32), -(-K // 32)) and scales.dtype == torch.uint8
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    block_m = 16 if M <= 16 else 64
    block_n = 64
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _fp8_gemm_kernel[grid](x, codes, scales, y, M, N, K, x.stride(0), x.stride(1), codes.stride(0),
                           codes.stride(1), scales.stride(0), scales.stride(1), y.stride(0), y.stride(1),
                           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=32, HW_FP8=not interpreting())
    return y
