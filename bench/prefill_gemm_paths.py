"""Prefill-sized GEMMs two ways: our kernels, which decode the packed weight tile by tile in
registers (model/kernels/fp8_gemm.py, fp4_moe.py), against the weight decoded to bf16 in one
launch (model/kernels/dequantize.py) and multiplied by cuBLAS (torch.mm with an fp32 output).
Both are exact in their products; they differ only in the order of the fp32 sums.

Dense: the bench preset's FP8 weights, faithful mode (the input on the FP8 grid, one bf16
part) and exact mode (fp32 input: three bf16 parts), fp8_gemm with prefill_gemms off and on.
Experts: the tokens routed to 6 of 48 experts, fp4_moe against prefill_gemms.fp4_experts
(an expert at a time: decode, products, SwiGLU, down, the per-token sum; the routing weights
and rounding in the SwiGLU's launch or after it, SWIGLU_EPILOGUE). Each figure next to
its bf16 FLOP roofline (694 TFLOP/s).

    python bench/prefill_gemm_paths.py [--rows 8192,1024] [--sections dense,experts,forms,grouped]
"""
import argparse
import contextlib
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe as moe  # noqa: E402
from dsflash.model.kernels import prefill_gemms  # noqa: E402
from dsflash.model.kernels.dequantize import fp4_quads_bf16, fp8_weight_bf16  # noqa: E402
from dsflash.model.kernels.fp8_gemm import fp8_gemm  # noqa: E402
from dsflash.model.kernels.quantize import fp8_grid_bf16  # noqa: E402
from dsflash.model.kernels.swiglu import clamped_swiglu  # noqa: E402

DENSE = {"wq_a": (1280, 5120), "wkv": (512, 5120), "wq_b": (32768, 1280), "wo_b": (5120, 8192),
         "shared_w13": (4608, 5120), "shared_w2": (5120, 2304)}


def report(section: str, key: str, seconds: float, flops: float, **extra) -> None:
    h200.record(section, key, {"ms": seconds * 1e3, "TFLOPs": flops / seconds / 1e12,
                               "ratio_to_bf16_roofline": seconds / (flops / h200.BF16_FLOPS), **extra})


def dense(rows: int) -> None:
    x = torch.randn(rows, 8192, device="cuda")
    for name, (n, k) in DENSE.items():
        codes, scales = h200.random_fp8(n, k)
        xk = x[:, :k].contiguous()
        flops = 2 * rows * n * k
        w = fp8_weight_bf16(codes, scales)
        t_dq = h200.cuda_time(lambda: fp8_weight_bf16(codes, scales, out=w), iters=10)
        h200.record("dense", f"{name}_dequantize",
                    {"us": t_dq * 1e6, "ratio_to_hbm": t_dq / (3 * n * k / h200.HBM_BPS)})
        xq = fp8_grid_bf16(xk)
        report("dense", f"{name}_cublas_mm_only", h200.cuda_time(lambda: torch.mm(xq, w.T, out_dtype=torch.float32),
                                                                 iters=10), flops)
        w = None  # frees the decoded weight (not del: a lambda names it)
        for act_quant in (True, False):
            mode = "faithful" if act_quant else "exact"
            run = lambda: fp8_gemm(xk, codes, scales, act_quant=act_quant)  # noqa: E731
            with cublas(False):
                ref = run()
                report("dense", f"{name}_kernel_{mode}", h200.cuda_time(run, iters=10), flops)
            with cublas(True):
                got = run()
                report("dense", f"{name}_cublas_{mode}", h200.cuda_time(run, iters=10), flops,
                       max_rel_diff=((got - ref).abs().max() / ref.abs().max()).item())


def grouped(rows: int) -> None:
    """wo_a (8 groups of 1,024 rows over 4,096 columns each), faithful mode's bf16 input:
    prefill_gemms.grouped_fp8_product, which writes each group's product to its columns, against
    the form before it (a [G, M, R] product, then copied over as [M, G * R])."""
    G, R, K = 8, 1024, 4096
    codes, scales = h200.random_fp8(G * R, K)
    x = fp8_grid_bf16(torch.randn(rows, G * K, device="cuda"))
    flops = 2 * rows * G * R * K

    def before():
        a = x.view(rows, G, K).transpose(0, 1)
        w = fp8_weight_bf16(codes, scales).view(G, R, K)
        return torch.bmm(a, w.transpose(1, 2), out_dtype=torch.float32).transpose(0, 1).reshape(rows, G * R)

    ref = before()
    got = prefill_gemms.grouped_fp8_product(x, codes, scales, G)
    diff = ((got - ref).abs().max() / ref.abs().max()).item()
    in_place = lambda: prefill_gemms.grouped_fp8_product(x, codes, scales, G)  # noqa: E731
    for _ in range(2):
        report("grouped", "wo_a_copied_after", h200.cuda_time(before, iters=10), flops)
        report("grouped", "wo_a_in_place", h200.cuda_time(in_place, iters=10), flops, max_rel_diff=diff)


@contextlib.contextmanager
def cublas(on: bool):
    """prefill_gemms on (its row threshold) or off (every row count on the kernels)."""
    rows = prefill_gemms.ROWS
    prefill_gemms.ROWS = rows if on else 1 << 62
    try:
        yield
    finally:
        prefill_gemms.ROWS = rows


def experts(tokens: int) -> None:
    E, H, k = (h200.MOE_SHAPE[key] for key in ("E", "H", "k"))
    (w13, s13, w2, s2), _ = h200.random_experts("cuda")
    x = torch.randn(tokens, H, device="cuda")
    idx = torch.stack([torch.randperm(E, device="cuda")[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, device="cuda")
    flops = 2 * tokens * k * 3 * h200.MOE_SHAPE["inter"] * H
    t_dq = h200.cuda_time(lambda: (fp4_quads_bf16(w13, s13), fp4_quads_bf16(w2, s2)), iters=5)
    nbytes = (w13.numel() + w2.numel()) * 2 * 5  # quad units' bytes read, 4 bf16 values written a unit
    h200.record("experts", "dequantize_all", {"ms": t_dq * 1e3, "ratio_to_hbm": t_dq / (nbytes / h200.HBM_BPS)})
    for act_quant in (True, False):
        mode = "faithful" if act_quant else "exact"
        xin = fp8_grid_bf16(x) if act_quant else x
        ref = moe.fp4_moe(xin, idx, weights, w13, s13, w2, s2, 10.0, act_quant=act_quant)
        report("experts", f"kernel_{mode}", h200.cuda_time(
            lambda: moe.fp4_moe(xin, idx, weights, w13, s13, w2, s2, 10.0, act_quant=act_quant), iters=5), flops)
        run = lambda: prefill_gemms.fp4_experts(xin, idx, weights, w13, s13, w2, s2, 10.0, act_quant)  # noqa: E731
        got = run()
        diff = ((got - ref).abs().max() / ref.abs().max()).item()
        for epilogue in (False, True, False, True):  # the SwiGLU's weights and rounding in its launch or after
            prefill_gemms.SWIGLU_EPILOGUE = epilogue
            report("experts", f"cublas_{mode}_swiglu_epilogue_{'on' if epilogue else 'off'}",
                   h200.cuda_time(run, iters=5), flops, max_rel_diff=diff)


def expert_forms(tokens: int) -> None:
    """fp4_experts' products two other ways, faithful mode: every expert decoded in one launch
    first (one launch, not one an expert), and torch._grouped_mm over all experts in one call
    (no host sync for the row counts), where this torch build offers it with an fp32 output."""
    E, H, k, inter = (h200.MOE_SHAPE[key] for key in ("E", "H", "k", "inter"))
    (w13, s13, w2, s2), _ = h200.random_experts("cuda")
    x = fp8_grid_bf16(torch.randn(tokens, H, device="cuda"))
    idx = torch.stack([torch.randperm(E, device="cuda")[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, device="cuda")
    flops = 2 * tokens * k * 3 * inter * H
    ref = prefill_gemms.fp4_experts(x, idx, weights, w13, s13, w2, s2, 10.0, True)

    def run(grouped: bool):
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        d13, d2 = fp4_quads_bf16(w13, s13), fp4_quads_bf16(w2, s2)
        rows = x[order // k]
        if grouped:
            ends = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
            gu = torch._grouped_mm(rows, d13.transpose(1, 2), offs=ends, out_dtype=torch.float32)
        else:
            counts = torch.bincount(flat, minlength=E).tolist()
            gu = torch.empty(rows.shape[0], 2 * inter, device="cuda")
            ends = [0]
            for c in counts:
                ends.append(ends[-1] + c)
            for e in range(E):
                torch.mm(rows[ends[e]:ends[e + 1]], d13[e].T, out_dtype=torch.float32, out=gu[ends[e]:ends[e + 1]])
        h = fp8_grid_bf16(clamped_swiglu(gu[:, :inter], gu[:, inter:], 10.0) * weights.reshape(-1)[order, None])
        if grouped:
            o = torch._grouped_mm(h, d2.transpose(1, 2), offs=ends, out_dtype=torch.float32)
        else:
            o = torch.empty(rows.shape[0], H, device="cuda")
            for e in range(E):
                torch.mm(h[ends[e]:ends[e + 1]], d2[e].T, out_dtype=torch.float32, out=o[ends[e]:ends[e + 1]])
        out = torch.empty_like(o)
        out[order] = o
        return out.view(tokens, k, H).sum(1)

    for grouped in (False, True):
        label = "grouped_mm" if grouped else "decode_all_then_mm_per_expert"
        try:
            got = run(grouped)
            report("expert_forms", f"T{tokens}_{label}", h200.cuda_time(lambda: run(grouped), iters=5), flops,
                   max_rel_diff=((got - ref).abs().max() / ref.abs().max()).item())
        except Exception as exc:
            h200.record("expert_forms", f"T{tokens}_{label}", {"error": f"{type(exc).__name__}: {exc}"[:300]})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="8192")
    parser.add_argument("--sections", default="dense,experts")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    for rows in map(int, args.rows.split(",")):
        h200.record("rows", str(rows), {})
        if "dense" in args.sections:
            dense(rows)
        if "experts" in args.sections:
            experts(rows)
        if "forms" in args.sections:
            expert_forms(rows)
        if "grouped" in args.sections:
            grouped(rows)


if __name__ == "__main__":
    main()
