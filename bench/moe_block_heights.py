"""Routed experts at decode batch sizes with each block height (pairs per program) forced:
fp4_moe.block_height picks 2 below 1 pair an expert; then in the exact mode 4 below 4 and
short blocks of 8 below 8 and of 16 below 32, in the faithful one tall blocks of 8 below 8
and of 16 below 32; then 64 below 256. This measures decode batch sizes (batch 1, 4, 8, 16, 32 and 64 of 6-row verify
blocks: 0.75 to 48 pairs an expert), in the exact mode (fp32 activations, 3 bf16 parts) and
the faithful one (FP8-grid activations, one part), each in a CUDA graph, next to the bytes of
the experts touched at the measured HBM read and to the FLOPs of one part at bf16 peak.

--tile sets a height's shape in the tables fp4_moe reads for it in the modes run (fp4_moe.tile_table); heights
without one take the next lower height's. --short-up-to moves the bound up to which three
parts go as columns (PARTS_AS_COLUMNS_SPLIT).

    python bench/moe_block_heights.py [--tokens 6,24,48,96,192,384] [--heights 2,4,16,64,128]
        [--short-up-to 4] [--tile 8:64,64,4,3 (height:BLOCK_N,BLOCK_KU,num_warps,num_stages)]
        [--modes exact,faithful]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe as moe  # noqa: E402
from dsflash.model.kernels.quantize import fp8_grid_bf16  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tokens", default="6,24,48,96,192,384")
parser.add_argument("--heights", default="2,4,16,64,128")
parser.add_argument("--short-up-to", type=int, default=moe.PARTS_AS_COLUMNS_SPLIT)
parser.add_argument("--tile", action="append", default=[], help="height:BLOCK_N,BLOCK_KU,num_warps,num_stages")
parser.add_argument("--modes", default="exact,faithful")
args = parser.parse_args()
heights = [int(h) for h in args.heights.split(",")]
moe.PARTS_AS_COLUMNS_SPLIT = args.short_up_to
parts_of = {"exact": moe.SPLITS, "faithful": 1}
for spec in args.tile:
    height, shape = spec.split(":")
    shape = dict(zip(("BLOCK_N", "BLOCK_KU", "num_warps", "num_stages"), map(int, shape.split(","))))
    for mode in args.modes.split(","):  # the table each mode launches that height from
        moe.tile_table(int(height), parts_of[mode])[int(height)] = shape
for height in heights:
    if height not in moe.TILES:
        moe.TILES[height] = moe.TILES[max(h for h in moe.TILES if isinstance(h, int) and h < height)]
dev = "cuda"
E, H, inter, k = (h200.MOE_SHAPE[key] for key in ("E", "H", "inter", "k"))
(w13, s13, w2, s2), per_expert = h200.random_experts(dev)
torch.manual_seed(0)
for tokens in map(int, args.tokens.split(",")):
    x32 = torch.randn(tokens, H, device=dev)
    idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, device=dev)
    touched = len(torch.unique(idx))
    byte_time = touched * per_expert / h200.HBM_BPS
    flop_time = tokens * k * 3 * H * inter * 2 / h200.BF16_FLOPS
    for mode, x, act_quant in (("exact", x32, False), ("faithful", fp8_grid_bf16(x32), True)):
        if mode not in args.modes.split(","):
            continue
        chosen = moe.block_height(tokens * k, E, 1 if act_quant else moe.SPLITS)
        ref = moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, small=True, act_quant=act_quant)
        line = []
        for block_m in heights:
            run = lambda: moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, block_m, small=True,  # noqa: E731
                                      act_quant=act_quant)
            t = h200.graph_time(run, iters=10)
            diff = ((run() - ref).abs().max() / ref.abs().max()).item()
            mark = "*" if block_m == chosen else ""
            line.append(f"M{block_m}{mark} {t * 1e6:.1f} us ({diff:.0e})")
        print(f"[moe] {tokens} tokens ({tokens * k / E:.1f} pairs an expert, {touched} experts), {mode}: "
              + " | ".join(line) + f" || bytes {byte_time * 1e6:.1f} us, bf16 FLOPs {flop_time * 1e6:.1f} us",
              flush=True)
