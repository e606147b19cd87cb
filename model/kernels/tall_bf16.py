"""A prefill chunk's fp32 rows times a bf16 weight of few outputs (the routers', the
compressors' projections) to fp32's accuracy on the TF32 tensor cores, in one read of the rows.

A bf16 weight is exact in TF32, so only the rows are split: as loaded they are their own TF32
heads (the tensor cores read them truncated; common.dot_exact_rhs_raw), and a second pass takes
their remainders. Before (H100, a 16K chunk, forty-ninth session's profile): a router's fp32
product on cuBLAS's SIMT sgemm, 223 us a layer for the bench preset's 48 outputs (~5x that for
the release's 256); the compressors' 512 through prefill_gemms.bf16_product, whose three bf16
parts of the rows are written out first (657 us a call for that copy alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .common import dot_exact_rhs_raw, interpreting

# From this many rows (a prefill chunk) and up to this many outputs, an fp32 x against a bf16
# weight takes this kernel (TritonOps.linear; 0 outputs: never). Wider weights (the LM heads)
# keep theirs. H100, fiftieth session, 16,384 x 5,120 rows (bench/tall_bf16_products.py, us;
# the largest error against the float64 product, of the largest result, in brackets): 48
# outputs 157 (7.5e-7) against the sgemm's 236 (9.1e-7); 256: 402 (6.7e-7) against 862
# (1.2e-6) and the bf16 parts' 1,161 (2.1e-5); 512: 804 (7.9e-7) against the parts' 1,280
# (2.3e-5). 32K faithful prefills alternated (OUTPUTS 0 / 1024 / 0 / 1024): 1.328 / 1.283 /
# 1.330 / 1.319 s.
ROWS = 1024
OUTPUTS = 1024
TILES = dict(BLOCK_M=128, BLOCK_K=32, num_warps=8, num_stages=3)


def takes(rows: int, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x [rows, K] times this weight runs here: on a GPU (the CPU tests call product
    directly; under the interpreter the model's rows keep the fp32 product)."""
    return (rows >= ROWS and weight.shape[0] <= OUTPUTS and x.dtype == torch.float32
            and weight.dtype == torch.bfloat16 and x.device.type == "cuda" and not interpreting())


@triton.jit
def _tall_kernel(x_ptr, w_ptr, out_ptr, M, N, K, sxm, swn, som, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """Program (output column block, BLOCK_M rows): the column blocks of a row block run one
    after another, so that they find its rows in L2."""
    pdl.wait_for_inputs(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * sxm + k[None, :], mask=(rows < M)[:, None] & (k < K)[None, :],
                    other=0.0)
        w = tl.load(w_ptr + cols[:, None] * swn + k[None, :], mask=(cols < N)[:, None] & (k < K)[None, :], other=0.0)
        acc = dot_exact_rhs_raw(x, tl.trans(w.to(tl.float32)), acc)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * som + cols[None, :], acc,
             mask=(rows < M)[:, None] & (cols < N)[None, :])


def product(x: torch.Tensor, weight: torch.Tensor, tiles: dict | None = None) -> torch.Tensor:
    """x [M, K] fp32 @ weight^T for a bf16 weight [N, K] -> [M, N] fp32 (`tiles` overrides TILES)."""
    M, K = x.shape
    N = weight.shape[0]
    assert weight.shape[1] == K and x.stride(1) == 1 and weight.stride(1) == 1, (x.shape, weight.shape)
    out = torch.empty(M, N, dtype=torch.float32, device=x.device)
    if M:
        t = {**TILES, "BLOCK_N": min(128, max(16, triton.next_power_of_2(N))), **(tiles or {})}
        grid = (triton.cdiv(N, t["BLOCK_N"]), triton.cdiv(M, t["BLOCK_M"]))
        _tall_kernel[grid](x, weight, out, M, N, K, x.stride(0), weight.stride(0), out.stride(0), **t,
                           **pdl.options(x.device))
    return out
