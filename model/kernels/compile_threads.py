"""A worker's warm-up launches on several threads, so that their compiles overlap.

The indexer's warm-up compiles ~100 kernel variants one after another: 54 s on an H200 with
an empty Triton cache (forty-second session). Triton holds the GIL only for the front end of
a compile; its MLIR passes and ptxas run without it. On the 2-core CI machine, the indexer's
4 sm_90 variants took 1.9-2.5 s one after another and 1.07-1.15 s on two threads.

Launches given here must not change the process's environment while they compile (as
common.mma_sync does: another thread's compile would read it). The interpreter runs them
one after another: it patches triton.language while a kernel runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from triton.runtime.jit import JITFunction

from .common import interpreting

# DSFLASH_COMPILE_THREADS=1 compiles one launch after another (a node shared with others)
COMPILE_THREADS = int(os.environ.get("DSFLASH_COMPILE_THREADS") or min(8, os.cpu_count() or 1))


def launch_all(device: torch.device, launches: Sequence[Callable[[], object]], threads: int | None = None) -> None:
    """Run every launch, on `threads` threads (COMPILE_THREADS) on a GPU (one after another in the interpreter or
    on one thread), and wait for the GPU. A failure is raised (on threads, the first in the
    list once all have run)."""
    threads = COMPILE_THREADS if threads is None else threads
    if interpreting() or device.type != "cuda" or threads <= 1 or len(launches) <= 1:
        for launch in launches:
            launch()
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        _bind_kernels(index)
        # a thread starts on GPU 0 (the CUDA runtime's current device is a thread's own)
        with ThreadPoolExecutor(threads, initializer=torch.cuda.set_device, initargs=(index,)) as pool:
            futures = [pool.submit(launch) for launch in launches]
        for future in futures:
            future.result()
        torch.cuda.synchronize(index)


def _bind_kernels(index: int) -> None:
    """Make each kernel of this package's modules its per-GPU caches now. Triton makes them on
    a kernel's first launch on a GPU, in a defaultdict: two threads launching a kernel first
    could each make one, and the compiles kept in the one overwritten would be lost."""
    package = __name__.rpartition(".")[0] + "."
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(package):
            continue
        for value in list(vars(module).values()):
            for _ in range(3):  # autotuners and heuristics wrap the kernel as .fn
                if isinstance(value, JITFunction) or not hasattr(value, "fn"):
                    break
                value = value.fn
            if isinstance(value, JITFunction):
                value.device_caches[index]  # (reading it makes it)
