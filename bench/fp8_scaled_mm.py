"""Faithful prefill's products on the FP8 tensor cores (model/kernels/fp8_blockwise.py) against
the bf16 path they replace, at the bench preset's prefill shapes: torch.mm on bf16 values with
an fp32 output, and torch._scaled_mm with 1 x 128 activation scales and 128 x 128 (shipped)
or 1 x 128 weight scales, each next to its FLOP roofline (694 TFLOP/s bf16, 1,276 fp8), and
the encodes that feed it (the activations' rows, an FP8 weight's and an expert stack's blocks,
the down projections' SwiGLU and encode apart and in one launch, faithful mode's 1 x 32
rounding before the encode or in it, the encode's program shapes) next to their bytes' time at
4.2 TB/s.

    python bench/fp8_scaled_mm.py [--rows 16384] [--expert-rows 2048]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp8_blockwise  # noqa: E402
from dsflash.model.kernels.common import quad_units  # noqa: E402

DENSE = {"wq_a": (1280, 5120), "wkv": (512, 5120), "wq_b": (32768, 1280), "wo_a_group": (1024, 4096),
         "wo_b": (5120, 8192), "shared_w13": (4608, 5120), "shared_w2": (5120, 2304), "indexer_wq_b": (4096, 1280)}
EXPERT = {"expert_w13": (4608, 5120), "expert_w2": (5120, 2304)}


def products(name: str, rows: int, n: int, k: int) -> None:
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    codes, scales = h200.random_fp8(n, k)
    a, a_scales = fp8_blockwise.rows_1x128(x)
    a_scales = fp8_blockwise.segment_scales(a_scales, k // 128, 0, a.shape[1])
    w, w_scales = fp8_blockwise.fp8_weight_128(codes, scales)
    flops = 2 * rows * n * k
    wb = fp8_blockwise.weight_values(w, w_scales).to(torch.bfloat16)
    t = h200.cuda_time(lambda: torch.mm(x, wb.T, out_dtype=torch.float32), iters=10)
    h200.record(name, "bf16_mm", {"us": t * 1e6, "TFLOPs": flops / t / 1e12, "ratio_to_bf16": t / (flops / h200.BF16_FLOPS)})
    t = h200.cuda_time(lambda: fp8_blockwise.product(a[0], a_scales, w, w_scales), iters=10)
    h200.record(name, "fp8_128x128", {"us": t * 1e6, "TFLOPs": flops / t / 1e12, "ratio_to_fp8": t / (flops / h200.FP8_FLOPS)})
    per_row = torch.ones(k // 128, n, device="cuda")  # weights scaled 1 x 128: a scale a row
    t = h200.cuda_time(lambda: torch._scaled_mm(a[0].view(torch.float8_e4m3fn), w.view(torch.float8_e4m3fn).t(), a_scales,
                                                per_row, out_dtype=torch.float32), iters=10)
    h200.record(name, "fp8_1x128", {"us": t * 1e6, "TFLOPs": flops / t / 1e12, "ratio_to_fp8": t / (flops / h200.FP8_FLOPS)})
    row_encodes(name, x)
    t = h200.cuda_time(lambda: fp8_blockwise.fp8_weight_128(codes, scales), iters=10)
    h200.record(name, "encode_weight", {"us": t * 1e6, "ratio_to_hbm": t / (2 * n * k / h200.HBM_BPS)})


def row_encodes(name: str, x: torch.Tensor) -> None:
    """The activations' encode in each program shape (fp8_blockwise.ROW_TILE) from faithful
    rows (bf16, on the 1 x 32 grid: 3 bytes an element), and from the fp32 input, rounded by a
    launch before it (quantize.fp8_grid_bf16) or in it (round_first, prefill_gemms.
    ROUND_IN_ENCODE), both next to the one launch's 5 bytes an element."""
    from dsflash.model.kernels.quantize import fp8_grid_bf16

    x32 = x.float() * torch.linspace(0.5, 2.0, x.shape[1], device="cuda")  # (off the 1 x 32 grid)
    elements = x.numel()
    forms = {"round_then_encode": lambda: fp8_blockwise.rows_1x128(fp8_grid_bf16(x32)),
             "round_in_encode": lambda: fp8_blockwise.rows_1x128(x32, round_first=True)}
    for tile in ((1, 8), (32, 1)):
        fp8_blockwise.ROW_TILE = tile
        label = f"{tile[0]}x{tile[1]}"
        t = h200.cuda_time(lambda: fp8_blockwise.rows_1x128(x), iters=10)
        h200.record(name, f"encode_rows_{label}", {"us": t * 1e6, "ratio_to_hbm": t / (3 * elements / h200.HBM_BPS)})
        for form, run in forms.items():
            t = h200.cuda_time(run, iters=10)
            h200.record(name, f"{form}_{label}", {"us": t * 1e6, "ratio_to_hbm": t / (5 * elements / h200.HBM_BPS)})
        assert all(torch.equal(a, b) for a, b in zip(*(run() for run in forms.values()))), "the roundings differ"
    fp8_blockwise.ROW_TILE = (1, 8)


def expert_stack(experts: int) -> None:
    for name, (n, k) in EXPERT.items():
        packed = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, device="cuda")
        units = quad_units(packed)
        scales = torch.randint(118, 127, (experts, n, k // 32), dtype=torch.uint8, device="cuda")
        t = h200.cuda_time(lambda: fp8_blockwise.fp4_weight_128(units, scales), iters=5)
        h200.record("experts", f"{name}_encode_{experts}",
                    {"us": t * 1e6, "ratio_to_hbm": t / (1.5 * experts * n * k / h200.HBM_BPS)})


def swiglu_encode(rows: int, inter: int = 2304) -> None:
    """The down projections' operand: the SwiGLU launch (routing weights, 1 x 32 rounding, bf16
    out) then rows_1x128, against both in one launch (prefill_gemms.SWIGLU_ENCODE), at a chunk's
    routed pairs (rows x 6, padded runs aside); their bytes: the fused form reads gate/up (fp32)
    and writes the codes."""
    from dsflash.model.kernels.swiglu import clamped_swiglu

    gate_up = torch.randn(rows, 2 * inter, device="cuda")
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    weights = torch.rand(rows, device="cuda")
    floor = (8 * rows * inter + rows * inter) / h200.HBM_BPS
    two = lambda: fp8_blockwise.rows_1x128(clamped_swiglu(gate, up, 10.0, row_weights=weights, fp8_grid=True))  # noqa: E731
    one = lambda: fp8_blockwise.swiglu_rows_1x128(gate, up, 10.0, weights)  # noqa: E731
    for tile in ((1, 8), (32, 1)):  # the encode's program shapes (fp8_blockwise.ROW_TILE)
        fp8_blockwise.ROW_TILE = tile
        for label, run in (("swiglu_then_encode", two), ("swiglu_in_encode", one)):
            t = h200.cuda_time(run, iters=10)
            h200.record("swiglu_encode", f"{label}_{rows}_{tile[0]}x{tile[1]}",
                        {"us": t * 1e6, "ratio_to_hbm": t / floor})
        assert all(torch.equal(a, b) for a, b in zip(two(), one())), "the fused encode's codes differ"
    fp8_blockwise.ROW_TILE = (1, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16384, help="a prefill chunk's tokens")
    parser.add_argument("--expert-rows", type=int, default=2048, help="an expert's rows (6 of 48 experts: 1/8 of the chunk)")
    parser.add_argument("--experts", type=int, default=48)
    args = parser.parse_args()
    for name, (n, k) in DENSE.items():
        products(name, args.rows, n, k)
    for name, (n, k) in EXPERT.items():
        products(name, args.expert_rows, n, k)
    expert_stack(args.experts)
    swiglu_encode(6 * args.rows)


if __name__ == "__main__":
    main()
