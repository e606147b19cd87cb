"""A prefill chunk's fp32 rows times the small bf16 weights (tall_bf16.product) against what
took them before: torch's fp32 product (cuBLAS's SIMT sgemm: the routers) and
prefill_gemms.bf16_product (three bf16 parts of the rows on cuBLAS: the compressors' 512
outputs), at 16,384 rows of 5,120 columns. Each figure next to the rows' bytes at the HBM rate
and the largest error against the float64 product (of the largest result).

    python bench/tall_bf16_products.py [--rows 16384] [--outputs 48,256,512]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import prefill_gemms, tall_bf16  # noqa: E402

HIDDEN = 5120


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--outputs", default="48,256,512")
    args = parser.parse_args()
    x = torch.randn(args.rows, HIDDEN, device="cuda")
    limit = x.numel() * 4 / h200.HBM_BPS
    for n in (int(v) for v in args.outputs.split(",")):
        weight = (torch.randn(n, HIDDEN, device="cuda") / 70).to(torch.bfloat16)
        exact = x.double() @ weight.double().T
        wide = weight.float()
        forms = {"tall_bf16": lambda: tall_bf16.product(x, weight), "fp32_sgemm": lambda: x @ wide.T,
                 "bf16_parts": lambda: prefill_gemms.bf16_product(x, weight)}
        figures = {"rows_bytes_us": limit * 1e6}
        for name, run in forms.items():
            figures[f"{name}_us"] = h200.cuda_time(run, iters=10) * 1e6
            figures[f"{name}_err"] = ((run().double() - exact).abs().max() / exact.abs().max()).item()
        h200.record("tall_bf16", f"{args.rows}x{HIDDEN}x{n}", figures)


if __name__ == "__main__":
    main()
