"""The routed experts' plan at decode (fp4_moe.RoutePlan's one program) by chunk of pairs and
warps: the plan reads and writes a few KB, so its time is the one program's latency, next to
the torch plan's for the same pairs (~40 small kernels; both give the same rows) and the time
its bytes take at the HBM rate (ids and weights read, the plan's rows written). Each figure is
the GPU time a plan in a CUDA graph, as a decode step's MoE layer launches it.

    python bench/route_plan.py [--batches 1,8,32] [--tiles 16384,4096,2048] [--warps 4,8]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe  # noqa: E402

EXPERTS, TOP_K, ROWS_A_REQUEST = 48, 6, 6  # the bench preset's experts; a 6-token verify block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--tiles", default="16384,4096,2048")
    parser.add_argument("--warps", default="4,8")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    for batch in map(int, args.batches.split(",")):
        tokens = batch * ROWS_A_REQUEST
        idx = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(tokens)]).cuda()
        weights = torch.rand(tokens, TOP_K, generator=g).cuda()
        block_m = fp4_moe.block_height(tokens * TOP_K, EXPERTS)
        torch_us = h200.graph_time(lambda: fp4_moe.RoutePlan(idx, weights, EXPERTS, block_m, one_program=False)) * 1e6
        plan = fp4_moe.RoutePlan(idx, weights, EXPERTS, block_m, one_program=True)
        plan_bytes = idx.numel() * (idx.element_size() + 4) + plan.rows * 12 + plan.block_expert.numel() * 4
        for tile in map(int, args.tiles.split(",")):
            for warps in map(int, args.warps.split(",")):
                fp4_moe.PLAN_TILE, fp4_moe.PLAN_WARPS = tile, warps
                us = h200.graph_time(lambda: fp4_moe.RoutePlan(idx, weights, EXPERTS, block_m, one_program=True)) * 1e6
                h200.record("route_plan", f"B{batch}_pairs{tokens * TOP_K}_tile{tile}_warps{warps}",
                            {"us": us, "hbm_limit_us": plan_bytes / h200.HBM_BPS * 1e6, "torch_plan_us": torch_us,
                             "block_m": block_m})


if __name__ == "__main__":
    main()
