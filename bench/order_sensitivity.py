"""How far a prefill's logits move when only the order of the products' fp32 sums changes.

Two product paths (cuBLAS and our kernels, say) sum the same exact products in different
orders, so their logits can agree only as closely as that reordering allows. Discrete choices
amplify it: the router's and the indexer's top-k, and in faithful mode every FP8 rounding of a
GEMM input, where a last-bit change moves a value by a whole FP8 step. This runs the tiny
golden checkpoint's reference path (CPU, plain torch) on a random prompt twice, the second time
with every linear product summed in float64 and rounded once, and prints the largest logit
change against the largest logit, in exact and faithful mode: the floor under any test that
compares two product paths end to end.

    python bench/order_sensitivity.py [--tokens 1124] [--checkpoint ../shared/golden/v41-tiny-a]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from dsflash.kvcache.layout import CacheLayout  # noqa: E402
from dsflash.kvcache.paged import PagedCache  # noqa: E402
from dsflash.kvcache.pool import CachePool, plain_allocator  # noqa: E402
from dsflash.model.deepseek_v41 import DeepseekV41  # noqa: E402
from dsflash.model.runner import step  # noqa: E402


def float64_sums(ops) -> None:
    """ops.linear with its products summed in float64 and rounded once to fp32."""
    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        if ops.is_quantized(name):
            x = ops.gemm_input(x)
        return (x.double() @ ops.w(name).double().T).float()
    ops.linear = linear


def last_logits(checkpoint: pathlib.Path, prompt: torch.Tensor, act_quant: bool, reordered: bool) -> torch.Tensor:
    model = DeepseekV41.from_checkpoint(checkpoint, device="cpu", act_quant=act_quant)
    if reordered:
        float64_sums(model.ops)
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=64), 400, 2, plain_allocator("cpu"))
    cache = PagedCache(pool, model.config)
    with torch.inference_mode():
        return step(model, [cache], [prompt], logits="last").logits[0].float()


def main() -> None:
    default = pathlib.Path(os.environ.get("DSFLASH_GOLDEN", "../shared/golden")) / "v41-tiny-a"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1124, help="the GPU test's prompt: a chunk and 100")
    parser.add_argument("--checkpoint", type=pathlib.Path, default=default)
    parser.add_argument("--seed", type=int, default=8)
    args = parser.parse_args()
    model = DeepseekV41.from_checkpoint(args.checkpoint, device="cpu")
    generator = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(3, model.config.vocab_size, (args.tokens,), generator=generator)
    for act_quant in (False, True):
        a = last_logits(args.checkpoint, prompt, act_quant, False)
        b = last_logits(args.checkpoint, prompt, act_quant, True)
        change = (a - b).abs().max().item()
        print(f"[order] {'faithful' if act_quant else 'exact'}, {args.tokens} tokens: largest logit change "
              f"{change:.4g} of largest logit {a.abs().max().item():.4g} ({change / a.abs().max().item():.2e}), "
              f"same argmax {a.argmax().item() == b.argmax().item()}", flush=True)


if __name__ == "__main__":
    main()
