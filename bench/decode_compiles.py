"""Which Triton kernels compile inside decode steps, at which step, and from where.

Triton specializes a kernel's integer arguments (== 1, divisible by 16) and compiles again
when one changes class, so a count that follows the cache (entries of a compressed layer)
can make a step thousands of times its usual time the first time it crosses a multiple of
16. This runs a decode engine on an empty Triton cache (its own, in a temporary directory),
lets its first steps compile what they compile, then reports every compile of the steps
after them with its kernel, its specialization and the dsflash frames that launched it, and
every step over --slow-ms. H200, 2026-12-03 (twenty-fifth session), batch 1 at 4K: step 11
took 1,911 ms, compiling `_page_offsets_kernel`, `_indexer_kernel` and `_select_kernel` from
the indexer (a worker's warm-up covers the last two: indexer.warm_up).

    python bench/decode_compiles.py [--batch 1] [--context 4096] [--steps 40] [--first 6] [--indexer-warm-up]
"""
from __future__ import annotations

import os
import tempfile

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-empty-")  # before triton is imported

import argparse  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402


def caller() -> str:
    """The innermost dsflash frames of the launch being compiled."""
    frames = [f"{f.filename.split('dsflash/')[-1]}:{f.lineno} {f.name}"
              for f in traceback.extract_stack() if "dsflash" in f.filename]
    return " < ".join(reversed(frames[-4:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    h200.engine_arguments(parser, steps=40)
    parser.add_argument("--first", type=int, default=6, help="steps timed before compiles are reported")
    parser.add_argument("--slow-ms", type=float, default=100.0)
    parser.add_argument("--indexer-warm-up", action="store_true",
                        help="first compile what a worker's warm-up does (indexer.warm_up), as a server would")
    args = parser.parse_args()
    engine, _ = h200.warm_engine(argparse.Namespace(**dict(vars(args), steps=args.first)))
    if args.indexer_warm_up:
        from dsflash.model.layers import indexer
        indexer.warm_up(engine.model.device, engine.model.config, engine.pool.layout,
                        faithful=engine.model.ops.act_quant)
    step = [4 + args.first]  # warm_engine ran 4 steps, then `first` timed ones
    compiles, slow, lines = 0, 0, []

    def hook(*_, **kw) -> bool:  # installed now: the warm-up's own compiles are not reported
        nonlocal compiles
        fn = kw.get("fn")
        lines.append(f"step {step[0]}: compile {getattr(fn, 'name', fn)} {kw.get('repr', '')} | {caller()}")
        compiles += 1
        print(lines[-1], flush=True)
        return False  # compile as usual

    triton.knobs.runtime.jit_cache_hook = hook
    with torch.inference_mode():
        for _ in range(args.steps):
            step[0] += 1
            began = time.perf_counter()
            engine.step()
            h200.sync()
            ms = (time.perf_counter() - began) * 1e3
            if ms > args.slow_ms:
                lines.append(f"step {step[0]}: {ms:.0f} ms")
                slow += 1
                print(lines[-1], flush=True)
    summary = (f"batch {args.batch}, context {args.context}: {compiles} compiles and {slow} steps over "
               f"{args.slow_ms:g} ms in steps {args.first + 5}-{step[0]}")
    print(summary, flush=True)
    (h200.out_dir() / f"decode_compiles_B{args.batch}.txt").write_text("\n".join([summary] + lines) + "\n")


if __name__ == "__main__":
    main()
