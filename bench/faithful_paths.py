"""Does faithful mode (`act_quant`) decode the same tokens along every path of the fast model?

On one device (the GPU, or the CPU under TRITON_INTERPRET=1), for exact and faithful mode:
plain greedy on a dense cache (the gathering reference attention), plain greedy on a paged
cache (the attention kernels reading the pool in place), and the decode engine with and
without DSpark blocks. Each path's tokens are printed with whether they equal the dense
greedy's; at the first difference, the top-2 logit margin of the dense path says whether a
near tie was broken the other way (rounding) or not (a bug).

    python bench/faithful_paths.py [--device cuda] [--checkpoint DIR] [--tokens 8]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from dsflash.decode_worker.engine import DecodeEngine, DecodeEngineConfig  # noqa: E402
from dsflash.decode_worker.request import DecodeRequest  # noqa: E402
from dsflash.decode_worker.sampling import SamplingParams  # noqa: E402
from dsflash.kvcache.layout import CacheLayout  # noqa: E402
from dsflash.kvcache.paged import PagedCache  # noqa: E402
from dsflash.kvcache.pool import CachePool, plain_allocator  # noqa: E402
from dsflash.kvcache.state import DenseCache  # noqa: E402
from dsflash.model.checkpoint_writer import write_checkpoint  # noqa: E402
from dsflash.model.deepseek_v41 import DeepseekV41  # noqa: E402
from dsflash.model.runner import greedy, step  # noqa: E402


def _pool(model: DeepseekV41) -> CachePool:
    return CachePool(CacheLayout.for_model(model.config, page_entries=64), 200, 4, plain_allocator(model.device))


def engine_tokens(model: DeepseekV41, prompt: list[int], n: int, spec: int) -> list[int]:
    engine = DecodeEngine(model, _pool(model), DecodeEngineConfig(spec_tokens=spec))
    request = DecodeRequest("r", prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    engine.add(request)
    while engine.has_work():
        engine.step()
    return request.output


def margin_at(model: DeepseekV41, prompt: list[int], tokens: list[int], i: int) -> float:
    """Top-2 gap of the dense path's logits where token i is chosen."""
    logits = step(model, [DenseCache(model.config, device=model.device)], [torch.tensor(prompt + tokens[:i])])
    top = torch.topk(logits.logits[0][-1].float(), 2).values
    return float(top[0] - top[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", help="default: a new 'tiny' random checkpoint")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    checkpoint = args.checkpoint or write_checkpoint(pathlib.Path(tempfile.mkdtemp()) / "tiny", "tiny", seed=7)
    prompt = [(7 * i + 3) % 1000 + 5 for i in range(40)]
    for act_quant in (False, True):
        model = DeepseekV41.from_checkpoint(checkpoint, device=args.device, act_quant=act_quant)
        model.use_kernels()
        with torch.inference_mode():
            dense = greedy(model, torch.tensor(prompt), args.tokens)
            paths = {"paged": greedy(model, torch.tensor(prompt), args.tokens,
                                     cache=PagedCache(_pool(model), model.config)),
                     "engine": engine_tokens(model, prompt, args.tokens, 0),
                     "engine+dspark": engine_tokens(model, prompt, args.tokens, 5)}
            mode = "faithful" if act_quant else "exact"
            print(f"[{mode}] dense greedy: {dense}", flush=True)
            for name, tokens in paths.items():
                first = next((i for i, (a, b) in enumerate(zip(tokens, dense)) if a != b), None)
                where = "" if first is None else f", first differs at {first} (dense top-2 margin there " \
                                                 f"{margin_at(model, prompt, dense, first):.3g})"
                print(f"[{mode}] {name}: {tokens} equal: {first is None}{where}", flush=True)


if __name__ == "__main__":
    main()
