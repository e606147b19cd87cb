"""Routed experts of a faithful prefill chunk (8,192 tokens, one bf16 part, 128-row blocks, the
bench preset's experts) with their e8m0 scales read as int32 words (fp4_moe.SCALE_WORDS,
loads Triton's pipeliner prefetches) against bytes (loaded inside the K loop, each waiting
out a DRAM round trip), alternated in one process, next to the bf16 FLOP roofline. (Three
parts in 128-row blocks do not fit the words' pipeline; 4-row decode blocks were slower.)

    python bench/moe_scale_words.py [--rounds 2]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe as moe  # noqa: E402
from dsflash.model.kernels.quantize import fp8_grid_bf16  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    h200.DEADLINE[0] = float("inf")
    dev = "cuda"
    E, H, inter, k = (h200.MOE_SHAPE[key] for key in ("E", "H", "inter", "k"))
    (w13, s13, w2, s2), _ = h200.random_experts(dev)
    torch.manual_seed(0)
    for tokens, mode in ((8192, "faithful"),):
        idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
        weights = torch.rand(tokens, k, device=dev)
        x = torch.randn(tokens, H, device=dev)
        faithful = mode == "faithful"
        x = fp8_grid_bf16(x) if faithful else x
        run = lambda: moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, small=True, act_quant=faithful)  # noqa: E731
        flops = 2.0 * tokens * k * 3 * H * inter
        line, outputs = [], {}
        for _ in range(args.rounds):
            for words in (False, True):
                moe.SCALE_WORDS = words
                t = h200.cuda_time(run, iters=5) if tokens > 1000 else h200.graph_time(run)
                outputs[words] = run()
                line.append(f"{'words' if words else 'bytes'} {t * 1e3:.3f} ms ({flops / t / 1e12:.0f} TFLOP/s)")
        same = torch.equal(outputs[True], outputs[False])
        print(f"[moe scale words] {tokens} tokens {mode}: " + " | ".join(line) + f" | same bits: {same}"
              + f" || bf16 roofline {flops / h200.BF16_FLOPS * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
