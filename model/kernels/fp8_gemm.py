"""y = x @ W^T with W stored as FP8 e4m3 bytes and one e8m0 scale per 32x32 block.

Shapes: x [M, K] (fp32 or bf16), W [N, K] e4m3 bytes, scales [ceil(N/32), ceil(K/32)] e8m0 bytes,
y [M, N] fp32. The weight is decoded in registers (never materialized in memory): at decode
batch sizes the GEMM is bound by reading W, one byte per weight. With `act_quant`, x is first
rounded to FP8 in 1x32 blocks (the reference's faithful mode).
On the GPU the dots run on bf16 tensor cores: an e4m3 value times a power of two is exact in
bf16, and fp32 activations go in as 3 bf16 parts that sum to them (bf16 activations as
themselves), so the result keeps fp32 accuracy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant import dequantize_fp8_weight, fake_quant_fp8
from .common import bf16_parts, dot_exact_rhs, e4m3_to_float, interpreting


def fp8_gemm_ref(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, act_quant: bool = False) -> torch.Tensor:
    if act_quant:
        x = fake_quant_fp8(x.float())
    return x.float() @ dequantize_fp8_weight(codes, scales).T


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, K_PER_SPLIT,
                     sxp, sxm, sxk, swn, swk, ssn, ssk, sys, sym, syn,
                     PARTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     HW_FP8: tl.constexpr):
    """One (M, N) tile over one K range (split-K: the ranges' partial sums are added after).
    x comes as PARTS slices (stride sxp) that sum to the activations."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, tl.minimum(k_start + K_PER_SPLIT, K), BLOCK_K):
        kk = k0 + rk
        codes = tl.load(w_ptr + rn[:, None] * swn + kk[None, :] * swk,
                        mask=(rn[:, None] < N) & (kk[None, :] < K), other=0)
        w = tl.reshape(e4m3_to_float(codes, HW_FP8), (BLOCK_N, BLOCK_K // 32, 32))
        # one e8m0 scale per 32x32 block of the weight
        sk = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        sbyte = tl.load(s_ptr + (rn // 32)[:, None] * ssn + sk[None, :] * ssk,
                        mask=(rn[:, None] < N) & (sk[None, :] * 32 < K), other=127).to(tl.float32)
        w = tl.reshape(w * tl.exp2(sbyte - 127.0)[:, :, None], (BLOCK_N, BLOCK_K))
        if HW_FP8:
            w = w.to(tl.bfloat16)
        for p in tl.static_range(PARTS):
            x = tl.load(x_ptr + p * sxp + rm[:, None] * sxm + kk[None, :] * sxk,
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            if HW_FP8:  # bf16 x bf16 products are exact in the fp32 accumulator
                acc = tl.dot(x, tl.trans(w), acc)
            else:
                acc = dot_exact_rhs(x.to(tl.float32), tl.trans(w), acc)
    tl.store(y_ptr + pid_k * sys + rm[:, None] * sym + rn[None, :] * syn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def tiles_for(m: int) -> dict:
    """Tile shape by row count: decode rows are few and the weight's bytes bound the time;
    prefill rows are many and the tensor cores do."""
    if interpreting():
        return dict(BLOCK_M=16 if m <= 16 else 64, BLOCK_N=64, BLOCK_K=32)
    return dict(TILES[16 if m <= 16 else 64 if m < 1024 else 128])


TILES = {  # block_m: launch shape
    16: dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128),
    64: dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128),
    # the best of 5 shapes at 8,192 rows on the H200 (2026-11-30): wq_b 3.96 ms (173 TFLOP/s),
    # wo_b 5.10 ms; 128 x 128 tiles took 5.21 and 6.26 ms
    128: dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
}


def fp8_gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, act_quant: bool = False,
             tiles: dict | None = None) -> torch.Tensor:
    """x [M, K] @ (codes, scales)^T -> [M, N] fp32. `tiles` overrides the launch shape."""
    if act_quant:
        x = fake_quant_fp8(x.float())
    M, K = x.shape
    N = codes.shape[0]
    assert codes.shape == (N, K) and codes.dtype == torch.uint8, (codes.shape, codes.dtype)
    assert scales.shape == (-(-N // 32), -(-K // 32)) and scales.dtype == torch.uint8
    if M == 0:  # e.g. a rank's share of the rows of a one-token step
        return torch.zeros(0, N, dtype=torch.float32, device=x.device)
    tiles = tiles or tiles_for(M)
    block_m, block_n, block_k = tiles["BLOCK_M"], tiles["BLOCK_N"], tiles["BLOCK_K"]
    output_tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    # Decode shapes have few output tiles: split K so every SM streams part of the weight.
    splits = 1 if interpreting() else max(1, min(triton.cdiv(K, block_k), 264 // output_tiles))
    per_split = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    splits = triton.cdiv(K, per_split)
    # the interpreter dots in fp32; bf16 activations are their own single part
    parts = x[None] if interpreting() or x.dtype == torch.bfloat16 else bf16_parts(x, 3)
    y = torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n), splits)
    _fp8_gemm_kernel[grid](parts, codes, scales, y, M, N, K, per_split, *parts.stride(), codes.stride(0),
                           codes.stride(1), scales.stride(0), scales.stride(1), *y.stride(), PARTS=parts.shape[0],
                           HW_FP8=not interpreting(), **tiles)
    return y[0] if splits == 1 else y.sum(dim=0)
