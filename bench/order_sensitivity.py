"""How far a prefill's logits move when only the order of the products' fp32 sums changes.

Two product paths (cuBLAS and our kernels, say) sum the same exact products in different
orders, so their logits can agree only as closely as that reordering allows. Discrete choices
amplify it: the router's and the indexer's top-k, and in faithful mode every FP8 rounding of a
GEMM input, where a last-bit change moves a value by a whole FP8 step. This runs a checkpoint's
reference path (CPU, plain torch; the tiny golden one by default) on a random prompt twice, the
second time with every linear product summed in float64 and rounded once, and prints the
largest logit change against the largest logit, in exact and faithful mode: the floor under
any test that compares two product paths end to end. With --fp8-blocks, faithful mode also
runs with the FP8 tensor cores' operands emulated (fp8_blockwise: inputs re-rounded under
1 x 128 scale blocks, FP8 and FP4 weights under 128 x 128): how far that path's rounding
alone moves the same logits (on a checkpoint whose widths are whole 128-blocks: the tiny one's
are not, so there it changes nothing, as its products on the GPU keep bf16).

With --jitter N, N draws in each mode of every product's output moved at random by about an
fp32 reordering's size (--jitter-scale): one reordering can miss a near-tie that another,
cuBLAS's say, lands on (fifty-seventh session: seed 11 held under float64 sums and not on
the H100).

    python bench/order_sensitivity.py [--tokens 1124] [--checkpoint ../shared/golden/v41-tiny-a] [--fp8-blocks]
        [--seed 8] [--jitter 8] [--positions]
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
from dsflash.model import quant  # noqa: E402
from dsflash.model.deepseek_v41 import DeepseekV41  # noqa: E402
from dsflash.model.runner import step  # noqa: E402
from dsflash.model.weights import Fp4Weight, Fp8Weight  # noqa: E402


def float64_sums(ops) -> None:
    """ops.linear with its products summed in float64 and rounded once to fp32."""
    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        if ops.is_quantized(name):
            x = ops.gemm_input(x)
        return (x.double() @ ops.w(name).double().T).float()
    ops.linear = linear


def jittered_sums(seed: int, scale: float):
    """ops.linear with each output scaled by (1 + scale * a normal draw; ops.linear's products
    only, as float64_sums: not the grouped wo_a's einsum): another order of the
    fp32 sums, one random draw of it (a K-term fp32 sum moves by about sqrt(K) x 2^-24 of its
    terms' size; 2^-20 stands for K ~ 256). Where float64_sums samples one reordering, several
    draws show the near-ties a prompt sits on."""
    generator = torch.Generator().manual_seed(seed)

    def variant(ops) -> None:
        linear = ops.linear

        def jittered(x: torch.Tensor, name: str) -> torch.Tensor:
            y = linear(x, name)
            return y * (1 + scale * torch.randn(y.shape, generator=generator))
        ops.linear = jittered
    return variant


def _scale_of_each_value(weight) -> torch.Tensor | None:
    """A packed weight's scale for each of its values (fp32 [N, K]), or None for a bf16 one."""
    if isinstance(weight, Fp8Weight):
        return quant._expand_blocks(quant.e8m0_to_float(weight.scale), weight.shape, weight.block)
    if isinstance(weight, Fp4Weight):
        return quant.e8m0_to_float(weight.scale).repeat_interleave(32, 1)
    return None


def fp8_blocks(ops) -> None:
    """ops as faithful prefill's FP8 tensor cores round (model/kernels/fp8_blockwise.py): each
    GEMM input, once on its 1 x 32 FP8 grid, re-rounded under 1 x 128 blocks; each packed weight
    whose sides are whole 128-blocks re-rounded under the largest scale of each 128 x 128 block."""
    for name in ops.weights.names():
        scale = _scale_of_each_value(ops.weights[name])
        if scale is None or scale.shape[0] % 128 or scale.shape[1] % 128:
            continue
        N, K = scale.shape
        top = scale.view(N // 128, 128, K // 128, 128).amax(dim=(1, 3), keepdim=True).expand(-1, 128, -1, 128)
        top = top.reshape(N, K)
        ops._dense[name] = quant.e4m3_decode(quant.e4m3_encode(ops.w(name) / top)) * top
    gemm_input = ops.gemm_input

    def blocked(x: torch.Tensor) -> torch.Tensor:
        x = gemm_input(x)
        return quant.fake_quant_fp8(x, 128) if x.shape[-1] % 128 == 0 else x
    ops.gemm_input = blocked


def prompt_logits(checkpoint: pathlib.Path, prompt: torch.Tensor, act_quant: bool, variant=None,
                  which: str = "last") -> torch.Tensor:
    """The reference path's logits `which` ("last", "all") of prompt, its ops changed by variant
    (float64_sums, fp8_blocks, jittered_sums)."""
    model = DeepseekV41.from_checkpoint(checkpoint, device="cpu", act_quant=act_quant)
    if variant is not None:
        variant(model.ops)
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=64), 400, 2, plain_allocator("cpu"))
    cache = PagedCache(pool, model.config)
    with torch.inference_mode():
        return step(model, [cache], [prompt], logits=which).logits[0].float()


def main() -> None:
    default = pathlib.Path(os.environ.get("DSFLASH_GOLDEN", "../shared/golden")) / "v41-tiny-a"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1124, help="the GPU test's prompt: a chunk and 100")
    parser.add_argument("--checkpoint", type=pathlib.Path, default=default)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--fp8-blocks", action="store_true",
                        help="faithful mode with the FP8 tensor cores' rounding too")
    parser.add_argument("--jitter", type=int, default=0, help="this many draws of jittered_sums in each mode too")
    parser.add_argument("--jitter-scale", type=float, default=2.0**-20)
    parser.add_argument("--positions", action="store_true", help="every position's logits, not the last only")
    args = parser.parse_args()
    model = DeepseekV41.from_checkpoint(args.checkpoint, device="cpu")
    generator = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(3, model.config.vocab_size, (args.tokens,), generator=generator)
    runs = [(False, float64_sums), (True, float64_sums)] + [(True, fp8_blocks)] * args.fp8_blocks
    runs += [(mode, jittered_sums(draw, args.jitter_scale)) for mode in (False, True) for draw in range(args.jitter)]
    which = "all" if args.positions else "last"
    base = {}
    for act_quant, variant in runs:
        if act_quant not in base:
            base[act_quant] = prompt_logits(args.checkpoint, prompt, act_quant, which=which)
        a, b = base[act_quant], prompt_logits(args.checkpoint, prompt, act_quant, variant, which)
        kind = {float64_sums: "order", fp8_blocks: "fp8_blocks"}.get(variant, "jitter")
        print(f"[{kind}] {'faithful' if act_quant else 'exact'}, {args.tokens} tokens: {change_line(a, b)}", flush=True)


def change_line(a: torch.Tensor, b: torch.Tensor) -> str:
    """How far logits b [positions, vocab] (or [vocab]) are from a: at the last position, and
    with several positions over all of them, each position's largest change against its
    largest logit."""
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    shares = (a - b).abs().amax(-1) / a.abs().amax(-1)
    same = a.argmax(-1) == b.argmax(-1)
    line = (f"last position's largest logit change {shares[-1].item():.2e} of its largest logit, "
            f"same argmax {bool(same[-1])}")
    if len(a) > 1:
        line += (f"; over {len(a)} positions: median change {shares.median().item():.2e}, largest "
                 f"{shares.max().item():.2e}, argmax the same at {same.float().mean().item():.4f}")
    return line


if __name__ == "__main__":
    main()
