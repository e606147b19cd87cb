"""Where the routed experts' decode time goes: the shipped kernels (model/kernels/fp4_moe.py,
4-row blocks of quad units, common.quad_units) against kernels with their grids that do less, as
bench/decode_gemm_floor.py does for the dense GEMMs:
  - empty: each program reads its block's expert and ends (launch and scheduling floor);
  - read: each program reads its weight units and scales as the shipped one does;
  - read + decode: also decodes them to bf16 (no dots, no activations, no stores);
  - shipped.
Gate/up and down grids are summed, each in a CUDA graph, next to the bytes of the experts
touched at the measured HBM rate. Batch 1 and 2 of 6-row verify blocks (36 and 72 pairs).

    python bench/moe_floor.py
"""
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe as moe  # noqa: E402
from dsflash.model.kernels.common import e2m1_quads, quad_scales  # noqa: E402


@triton.jit
def _floor_kernel(blk_ptr, w_ptr, s_ptr, out_ptr, ROWS, KU, swe, swr, sse, ssr, MATS: tl.constexpr,
                  STAGE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KU: tl.constexpr):
    """Program (block of pairs, N tile) as _gate_up_kernel (MATS 2: gate and up rows) or
    _down_kernel (MATS 1) lay them out; STAGE 0 ends after the block's expert, 1 reads the
    units and scales, 2 also decodes them. One value a program is stored."""
    pid_b = tl.program_id(0)
    expert = tl.load(blk_ptr + pid_b)
    if expert < 0:
        return
    at = out_ptr + pid_b * tl.num_programs(1) + tl.program_id(1)
    if STAGE == 0:
        tl.store(at, 0.0)
        return
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e, s_e = w_ptr + expert.to(tl.int64) * swe, s_ptr + expert.to(tl.int64) * sse
    acc = tl.zeros((BLOCK_N, BLOCK_KU), tl.float32)
    for m in tl.static_range(MATS):
        for ku in range(0, KU, BLOCK_KU):
            c = ku + tl.arange(0, BLOCK_KU)
            units = tl.load(w_e + (rows + m * ROWS)[:, None] * swr + c[None, :])
            g = ku // 8 + tl.arange(0, BLOCK_KU // 8)  # one scale per 8 units (32 codes)
            exps = tl.load(s_e + (rows + m * ROWS)[:, None] * ssr + g[None, :]).to(tl.int32)
            if STAGE == 1:
                exps = tl.reshape(tl.broadcast_to(exps[:, :, None], (BLOCK_N, BLOCK_KU // 8, 8)), (BLOCK_N, BLOCK_KU))
                acc += (units ^ exps).to(tl.float32)
            else:
                scales = quad_scales(exps, True, True)
                scales = tl.reshape(tl.broadcast_to(scales[:, :, None], (BLOCK_N, BLOCK_KU // 8, 8)),
                                    (BLOCK_N, BLOCK_KU))
                w = e2m1_quads(units, scales, True, True)
                acc += w[0].to(tl.float32) + w[1].to(tl.float32) + w[2].to(tl.float32) + w[3].to(tl.float32)
    tl.store(at, tl.sum(tl.sum(acc, axis=1), axis=0))


def main() -> None:
    dev = "cuda"
    E, H, inter, k = (h200.MOE_SHAPE[key] for key in ("E", "H", "inter", "k"))
    (w13, s13, w2, s2), per_expert = h200.random_experts(dev)
    torch.manual_seed(0)
    for tokens in (6, 12):
        x = torch.randn(tokens, H, device=dev)
        idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
        weights = torch.rand(tokens, k, device=dev)
        block_m = moe.block_height(idx.numel(), E)
        tiles = moe.TILES[block_m]
        plan = moe.RoutePlan(idx, weights, E, block_m)
        blocks = plan.rows // block_m
        out = torch.empty(blocks * triton.cdiv(H, tiles["BLOCK_N"]), device=dev)
        line = []
        for stage, label in ((0, "empty"), (1, "read"), (2, "read + decode")):
            def run(stage=stage):
                for units, scales, rows, mats in ((w13, s13, inter, 2), (w2, s2, H, 1)):
                    _floor_kernel[(blocks, triton.cdiv(rows, tiles["BLOCK_N"]))](
                        plan.block_expert, units, scales, out, rows, units.shape[2], units.stride(0),
                        units.stride(1), scales.stride(0), scales.stride(1), MATS=mats, STAGE=stage,
                        BLOCK_N=tiles["BLOCK_N"], BLOCK_KU=tiles["BLOCK_KU"], num_warps=tiles["num_warps"],
                        num_stages=tiles["num_stages"])
            line.append(f"{label} {h200.graph_time(run, iters=10) * 1e6:.0f} us")
        shipped = h200.graph_time(lambda: moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, small=True), iters=10)
        line.append(f"shipped {shipped * 1e6:.0f} us")
        touched = len(torch.unique(idx))
        print(f"[moe floor] {tokens} tokens, {touched} experts, blocks of {block_m}: " + " | ".join(line)
              + f" || bytes {touched * per_expert / h200.HBM_BPS * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()
