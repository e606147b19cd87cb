"""Which Triton kernel variants a prefill request meets that the prefill worker's warm-up did
not, found on the CPU: under TRITON_INTERPRET=1 nothing compiles, so every launch's variant is
worked out as Triton would key it (the constexprs, each integer's being 1 and its divisibility
by 16, each pointer's 16-byte alignment, the launch options; do_not_specialize honored).

    TRITON_INTERPRET=1 python bench/warm_up_coverage.py ../shared/golden/v41-tiny-a \
        --chunk 512 [--act-quant] 37 23 44+24 ...

A probe N is a fresh N-token prompt; A+B prefills A tokens, then B more on that cache (a
conversation's next turn, which the prefill worker computes past the prefix it imports).
Prints each probe's variants the warm-up did not meet. An approximation of the GPU's: the
kernels' launch code picks some tiles and splits by `interpreting()`, and the indexer's
kernel warm-up (long prompts only) is left out for its interpreter time. The GPU's own
record is a worker's `kernel_compiled_while_serving` lines (tests/tiers/test_gpu_worker.py).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

_SEEN: dict[tuple, str] = {}  # variant -> the phase that met it first
_PHASE = ["warm-up"]


def variant_key(fn, args: tuple, kwargs: dict) -> tuple:
    """A launch's variant as Triton's JIT keys it (approximately: see the module's docstring)."""
    names = list(fn.arg_names)
    annotations = getattr(fn.fn, "__annotations__", {})
    constexprs = {n for n in names if "constexpr" in str(annotations.get(n, ""))}

    def named(option) -> set[str]:
        return {names[i] if isinstance(i, int) else i for i in (fn.kwargs.get(option) or ())}
    unspecialized, unaligned = named("do_not_specialize"), named("do_not_specialize_on_alignment")
    bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    parts = []
    for name in names:
        value = bound.get(name)
        if name in constexprs:
            parts.append((name, repr(value)))
        elif isinstance(value, torch.Tensor):
            parts.append((name, str(value.dtype), None if name in unaligned else value.data_ptr() % 16 == 0))
        elif isinstance(value, bool) or value is None or isinstance(value, float):
            parts.append((name, type(value).__name__))
        elif isinstance(value, int):
            wide = not -2**31 <= value < 2**31
            if name in unspecialized:
                parts.append((name, wide))
            else:
                parts.append((name, wide, value == 1, None if name in unaligned else value % 16 == 0))
        else:
            parts.append((name, type(value).__name__))
    options = tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in names and k not in ("grid", "warmup")))
    return fn.__name__, tuple(parts), options


@contextlib.contextmanager
def recording():
    """Every interpreted launch's variant into _SEEN, under the current phase."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def recorded(self, *args, grid, warmup, **kwargs):
        if not warmup:
            _SEEN.setdefault(variant_key(self, args, kwargs), _PHASE[0])
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)
    InterpretedFunction.run = recorded
    try:
        yield
    finally:
        InterpretedFunction.run = run


def describe(key: tuple, warmed: list[tuple]) -> str:
    """A missed variant against the warmed one of its kernel that differs in the fewest places."""
    name, parts, options = key
    same_kernel = [w for w in warmed if w[0] == name]
    if not same_kernel:
        return f"{name}: no variant of it warmed"
    nearest = min(same_kernel, key=lambda w: sum(a != b for a, b in zip(w[1], parts)) + (w[2] != options))
    diff = [f"{a[0]}: {a[1:]} (warmed {b[1:]})" for a, b in zip(parts, nearest[1]) if a != b]
    if nearest[2] != options:
        diff.append(f"options {dict(options)} (warmed {dict(nearest[2])})")
    return f"{name}: " + "; ".join(diff)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("probes", nargs="+", help="N (a fresh prompt) or A+B (B more tokens on an A-token cache)")
    parser.add_argument("--chunk", type=int, default=512, help="the prefill token budget the warm-up takes")
    parser.add_argument("--act-quant", action="store_true", help="faithful mode")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run under TRITON_INTERPRET=1: the variants are worked out from the interpreter's launches")

    from dsflash.kvcache.layout import CacheLayout
    from dsflash.kvcache.pool import CachePool
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.kernels.compile_threads import launch_all
    from dsflash.model.layers import moe
    from dsflash.prefill_worker.engine import PrefillEngine, PrefillEngineConfig, PrefillRequest, PrefillStatus
    from dsflash.prefill_worker.scheduler import PrefillSchedulerConfig

    model = DeepseekV41.from_checkpoint(args.checkpoint, act_quant=args.act_quant)
    model.use_kernels()
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=64), num_pages=4 * args.chunk // 64 + 64,
                     num_slots=4)
    engine = PrefillEngine(model, pool, PrefillEngineConfig(PrefillSchedulerConfig(token_budget=args.chunk,
                                                                                   max_chunk=args.chunk)))
    g = torch.Generator().manual_seed(1)

    def prefill(tokens: list[int], cache=None):
        request = engine.add(PrefillRequest(f"probe-{time.monotonic_ns()}", tokens, cache=cache))
        while request.status is not PrefillStatus.FINISHED:
            engine.step()  # (which drops the request once it finished)
        return request.cache

    with recording():
        start = time.monotonic()
        launch_all(model.device, moe.warm_up_launches(model.ops, model.config))
        engine.warm_up(args.chunk)
        warmed = list(_SEEN)
        print(f"warm-up: {len(warmed)} variants, {time.monotonic() - start:.0f} s", flush=True)
        for probe in args.probes:
            _PHASE[0] = probe
            counts = [int(n) for n in probe.split("+")]
            tokens = torch.randint(3, model.config.vocab_size, (sum(counts),), generator=g).tolist()
            cache = None
            for end in (sum(counts[:i + 1]) for i in range(len(counts))):
                cache = prefill(tokens[:end], cache)
            cache.release()
            missed = [k for k, phase in _SEEN.items() if phase == probe]
            print(f"{probe}: {len(missed)} variant(s) the warm-up did not meet", flush=True)
            for key in missed:
                print("  " + describe(key, warmed), flush=True)


if __name__ == "__main__":
    main()
