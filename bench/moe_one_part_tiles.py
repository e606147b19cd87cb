"""Routed experts at a prefill chunk (8,192 tokens, bench shapes), tile shapes against the
shipped ones, alternated: faithful mode's one bf16 part (fp4_moe.ONE_PART_TILES), or with
--exact the three parts of fp32 activations (fp4_moe.TILES). A shipped shape that reads its
scales as int32 words (SCALE_WORDS) is also timed reading bytes.

    python bench/moe_one_part_tiles.py [--exact]
"""
import pathlib
import sys
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe as moe  # noqa: E402
from dsflash.model.kernels.quantize import fp8_grid_bf16  # noqa: E402

h200.DEADLINE[0] = float("inf")
dev, E, H, k = "cuda", h200.MOE_SHAPE["E"], h200.MOE_SHAPE["H"], h200.MOE_SHAPE["k"]
(w13, s13, w2, s2), _ = h200.random_experts(dev)
tokens = 8192
FAITHFUL = "--exact" not in sys.argv
x = torch.randn(tokens, H, device=dev)
x = fp8_grid_bf16(x) if FAITHFUL else x
idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
weights = torch.rand(tokens, k, device=dev)
run = lambda: moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, small=True, act_quant=FAITHFUL)  # noqa: E731
ref = run()
table = moe.ONE_PART_TILES if FAITHFUL else moe.TILES
shipped = dict(table[128])
bytes_form = [{**shipped, "SCALE_WORDS": False}] if shipped.get("SCALE_WORDS") else []
candidates = [shipped] + bytes_form + [dict(BLOCK_N=128, BLOCK_KU=32, num_warps=8, num_stages=s) for s in (2, 3)] + [
    dict(BLOCK_N=64, BLOCK_KU=32, num_warps=4, num_stages=3), dict(BLOCK_N=256, BLOCK_KU=32, num_warps=8, num_stages=2),
    dict(BLOCK_N=128, BLOCK_KU=64, num_warps=8, num_stages=2)]  # BLOCK_KU in quad units (4 codes)
for round_ in range(2):
    for tiles in candidates:
        table[128] = tiles
        try:
            t = h200.cuda_time(run, iters=5)
            same = torch.equal(run(), ref)
        except Exception as exc:
            print(f"[moe] {tiles}: {type(exc).__name__}", flush=True)
            continue
        print(f"[moe] {'faithful' if FAITHFUL else 'exact'} round {round_} {tiles}: {t * 1e3:.2f} ms, same as shipped: {same}", flush=True)
table[128] = shipped
