"""Routed experts at decode batch sizes with each block height (pairs per program) forced:
fp4_moe.block_height picks 2 below 1 pair an expert, 4 below 4, 16 below 16 (32 in the exact
mode) and 64 below 256; this measures decode batch sizes (batch 1, 4, 8, 16, 32 and
64 of 6-row verify blocks: 0.75 to 48 pairs an expert), in the exact mode (fp32 activations, 3 bf16 parts) and
the faithful one (FP8-grid activations, one part), each in a CUDA graph, next to the bytes of
the experts touched at the measured HBM read and to the FLOPs of one part at bf16 peak.

    python bench/moe_block_heights.py
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe as moe  # noqa: E402
from dsflash.model.kernels.quantize import fp8_grid_bf16  # noqa: E402

dev = "cuda"
E, H, inter, k = (h200.MOE_SHAPE[key] for key in ("E", "H", "inter", "k"))
(w13, s13, w2, s2), per_expert = h200.random_experts(dev)
torch.manual_seed(0)
for tokens in (6, 24, 48, 96, 192, 384):
    x32 = torch.randn(tokens, H, device=dev)
    idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, device=dev)
    touched = len(torch.unique(idx))
    byte_time = touched * per_expert / h200.HBM_BPS
    flop_time = tokens * k * 3 * H * inter * 2 / h200.BF16_FLOPS
    for mode, x, act_quant in (("exact", x32, False), ("faithful", fp8_grid_bf16(x32), True)):
        chosen = moe.block_height(tokens * k, E, 1 if act_quant else moe.SPLITS)
        ref = moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, small=True, act_quant=act_quant)
        line = []
        for block_m in (2, 4, 16, 64, 128):
            run = lambda: moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, block_m, small=True,  # noqa: E731
                                      act_quant=act_quant)
            t = h200.graph_time(run, iters=10)
            diff = ((run() - ref).abs().max() / ref.abs().max()).item()
            mark = "*" if block_m == chosen else ""
            line.append(f"M{block_m}{mark} {t * 1e6:.1f} us ({diff:.0e})")
        print(f"[moe] {tokens} tokens ({tokens * k / E:.1f} pairs an expert, {touched} experts), {mode}: "
              + " | ".join(line) + f" || bytes {byte_time * 1e6:.1f} us, bf16 FLOPs {flop_time * 1e6:.1f} us",
              flush=True)
