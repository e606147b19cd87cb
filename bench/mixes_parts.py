"""Where a prefill mHC site's mixes launch (hc_streams.hc_mixes) spends its time: at 16,384 rows
of 4 x 5,120 fp32 streams it takes 746-807 us in every tile shape tried, ~1.7x its 1.34 GB at
the H100's HBM rate (forty-sixth session). This times, per tile shape, the same loop over the
streams with its dots left out (the rows' reads and sums of squares only), with one TF32 dot,
and with fp32-accurate dots (common.dot_fp32's masked heads; Triton's tf32x3; the shipped
common.dot_fp32_raw), next to hc_mixes itself:
whether the reads' pattern (each step a 128-byte piece of BLOCK_T rows 80 KB apart) or the
dots bind it.

    python bench/mixes_parts.py [--rows 16384] [--shapes "T,K,warps,stages,splits;..."]
"""
import argparse
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import hc_streams  # noqa: E402
from dsflash.model.kernels.common import dot_fp32, dot_fp32_raw  # noqa: E402

STREAMS, HIDDEN, MIXES = 4, 5120, 24


@triton.jit
def _loop_kernel(x_ptr, fn_ptr, out_ptr, sq_ptr, T, K, K_PER_SPLIT, sxt, sfn, BLOCK_T: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOTS: tl.constexpr):
    """hc_mixes' loop over a split's columns with DOTS 0 (reads and squares), 1 (one TF32 dot),
    2 (dot_fp32's masked heads), 3 (Triton's tf32x3, hc_mixes' before the fiftieth session) or
    4 (dot_fp32_raw, hc_mixes' since: the operands as they lie for their TF32 heads); the
    projections [split, rows, BLOCK_N] land in out, the sums of squares [split, rows] in sq."""
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    split = tl.program_id(1)
    n = tl.arange(0, BLOCK_N)
    live = rows < T
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    squares = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)
    for k0 in range(split * K_PER_SPLIT, tl.minimum(K, (split + 1) * K_PER_SPLIT), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * sxt + k[None, :], mask=live[:, None], other=0.0)
        squares += x * x
        if DOTS > 0:
            w = tl.load(fn_ptr + n[:, None] * sfn + k[None, :])
            if DOTS == 1:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="tf32")
            elif DOTS == 2:
                acc = dot_fp32(x, tl.trans(w), acc)
            elif DOTS == 3:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="tf32x3")
            else:
                acc = dot_fp32_raw(x, tl.trans(w), acc)
    at = split * T + rows
    tl.store(out_ptr + at[:, None] * BLOCK_N + n[None, :], acc, mask=live[:, None])
    tl.store(sq_ptr + at, tl.sum(squares, axis=1), mask=live)


def loop(X: torch.Tensor, fn: torch.Tensor, block_t: int, block_k: int, warps: int, stages: int, splits: int,
         dots: int) -> torch.Tensor:
    """_loop_kernel's mixes [T, 32] unscaled (the splits summed)."""
    T = X.shape[0]
    flat = X.reshape(T, -1)
    K = flat.shape[1]
    per_split = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    out = torch.empty(splits, T, fn.shape[0], device=X.device)
    squares = torch.empty(splits, T, device=X.device)
    _loop_kernel[(triton.cdiv(T, block_t), splits)](flat, fn, out, squares, T, K, per_split, flat.stride(0),
                                                     fn.stride(0), BLOCK_T=block_t, BLOCK_N=fn.shape[0],
                                                     BLOCK_K=block_k, DOTS=dots, num_warps=warps, num_stages=stages)
    return out.sum(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--shapes", default="128,32,8,3,4;128,64,8,3,4;64,64,4,3,4;64,128,4,3,4;64,128,4,2,8;"
                                            "128,128,8,2,4;32,128,4,3,8;64,256,8,2,8")
    args = parser.parse_args()
    X = torch.randn(args.rows, STREAMS, HIDDEN, device="cuda")
    fn = torch.zeros(32, STREAMS * HIDDEN, device="cuda")  # hc_mixes pads the 24 rows to 32
    fn[:MIXES] = torch.randn(MIXES, STREAMS * HIDDEN, device="cuda") / (STREAMS * HIDDEN) ** 0.5
    size = 4 * X.numel()
    limit = size / h200.HBM_BPS
    print(f"{args.rows} rows: {size / 1e9:.2f} GB of streams, {limit * 1e6:.0f} us at {h200.HBM_BPS / 1e12} TB/s")
    want = hc_streams.hc_mixes(X, fn[:MIXES], 1e-6)
    exact = (X.reshape(args.rows, -1).double() @ fn.double().T).float()
    flat = X.reshape(args.rows, -1)
    norms = h200.cuda_time(lambda: torch.linalg.vector_norm(flat, dim=1), iters=10)
    h200.record("mixes_parts", "torch_row_norms", {"us": norms * 1e6, "ratio_to_hbm": norms / limit})
    for shape in args.shapes.split(";"):
        block_t, block_k, warps, stages, splits = (int(v) for v in shape.split(","))
        label = f"T{block_t}_K{block_k}_w{warps}_s{stages}_split{splits}"
        tiles = dict(BLOCK_T=block_t, BLOCK_K=block_k, num_warps=warps, num_stages=stages, SPLITS=splits)
        try:
            got = hc_streams.hc_mixes(X, fn[:MIXES], 1e-6, tiles)
            figures = {"mixes_us": h200.cuda_time(lambda: hc_streams.hc_mixes(X, fn[:MIXES], 1e-6, tiles), iters=10)
                       * 1e6, "max_rel_diff": ((got - want).abs().max() / want.abs().max()).item()}
            for dots, name in ((0, "reads"), (1, "tf32"), (2, "tf32_heads"), (3, "tf32x3"), (4, "raw_heads")):
                run = lambda: loop(X, fn, block_t, block_k, warps, stages, splits, dots)  # noqa: E731
                figures[f"{name}_us"] = h200.cuda_time(run, iters=10) * 1e6
                if dots:  # the largest error against the float64 product, of the largest result
                    figures[f"{name}_err"] = ((run() - exact).abs().max() / exact.abs().max()).item()
            figures["mixes_ratio_to_hbm"] = figures["mixes_us"] / 1e6 / limit
            h200.record("mixes_parts", label, figures)
        except Exception as exc:  # a shape that needs more shared memory or registers than an SM has
            h200.record("mixes_parts", label, {"error": f"{type(exc).__name__}: {str(exc)[:120]}"})


if __name__ == "__main__":
    main()
