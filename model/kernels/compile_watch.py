"""Triton's compiles as they happen, from its two compile hooks.

A kernel variant that compiles inside a request is a wait its warm-up should have spared it: a
first 1M prefill compiled 11 of the top-k filter's variants inside its timed run (1.6 s, H100,
fifty-seventh session). bench/compile_log.py prints every compile of a script, bench/h200.py
counts those inside each timed prefill, and a GPU worker logs those it makes while serving
(dsflash/serving/worker.warming_up).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import triton

OnCompile = Callable[[float, str, dict], None]


def watch(on_compile: OnCompile) -> None:
    """From now on call on_compile(seconds it took, the launch's repr, its compile dict) after
    each compile (or load from the disk cache: a variant new to this process), beside the hooks
    set before (compile_log.py's, where it runs a script that watches too)."""
    runtime = triton.knobs.runtime
    first, then = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    began: dict[object, float] = {}

    def before(**hook):  # jit_cache_hook: a falsy value lets the compile go on
        began[hook["key"]] = time.monotonic()
        return first(**hook) if first else None

    def after(**hook):
        now = time.monotonic()
        on_compile(now - began.pop(hook["key"], now), hook["repr"], hook["compile"])
        if then:
            then(**hook)

    runtime.jit_cache_hook = before
    runtime.jit_post_compile_hook = after


def kernel_name(launch: str) -> str:
    """A hook's launch repr (`_filter_kernel[num_warps=4, ...](x_ptr: *fp32, ...)`) -> its kernel."""
    return launch.split("[")[0]


def variant(compile: dict) -> str:
    """Which of a kernel's variants a compile made: the arguments passed as constants (integers
    equal to 1 among them), those known 16-byte aligned or divisible by 16, and the constexprs
    (the shapes' tiles, the forms' switches)."""
    names = list(compile.get("signature", ()))
    try:
        constants = {names[i[0]]: v for i, v in compile["constants"].items()}
        aligned = [names[i[0]] for i, attrs in compile["configs"][0].items()
                   if ["tt.divisibility", 16] in [list(a) for a in attrs]]
    except (KeyError, IndexError, TypeError):  # another Triton's hook arguments
        return str(compile.get("configs"))[:600]
    ones = sorted(n for n, v in constants.items() if v == 1 and not isinstance(v, bool))
    chosen = {n: v for n, v in constants.items() if isinstance(v, (bool, int)) and (v != 1 or isinstance(v, bool))}
    return f"ones={ones} aligned={aligned} constexprs={chosen}"
