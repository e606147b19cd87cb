"""A worker's warm-up launches on several threads, so that their compiles overlap.

The indexer's warm-up makes 122 launches, most of which compile a kernel variant (the bench
preset's faithful worker). Triton holds the GIL only for the front end of a compile; its MLIR
passes and ptxas run without it. H200 host with 16 CPUs, empty Triton cache (forty-third
session, bench/indexer_warm_up.py): 84.9 s one after another, 28.7 s on 8 threads.

Launches given here must not change the process's environment while they compile (as
common.mma_sync does: another thread's compile would read it). The interpreter runs them
one after another: it patches triton.language while a kernel runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

from .common import interpreting


def _usable_cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, where os.cpu_count() is the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# DSFLASH_COMPILE_THREADS=1 compiles one launch after another (a node shared with others)
COMPILE_THREADS = int(os.environ.get("DSFLASH_COMPILE_THREADS") or min(8, _usable_cpus()))


def launch_all(device: torch.device, launches: Sequence[Callable[[], object]], threads: int | None = None) -> None:
    """Run every launch, on `threads` threads (COMPILE_THREADS) on a GPU (one after another in
    the interpreter or on one thread), and wait for the GPU. A failure is raised (on threads,
    the first in the list once all have run)."""
    threads = COMPILE_THREADS if threads is None else threads
    if interpreting() or device.type != "cuda" or threads <= 1 or len(launches) <= 1:
        for launch in launches:
            launch()
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        _bind_kernels(index)
        stream = torch.cuda.current_stream(index)  # a thread's current stream is its own too

        def on_stream(launch: Callable[[], object]) -> None:
            with torch.cuda.stream(stream):
                launch()

        # a thread starts on GPU 0 (the CUDA runtime's current device is a thread's own)
        with _handles_made_once(), ThreadPoolExecutor(threads, initializer=torch.cuda.set_device,
                                                      initargs=(index,)) as pool:
            futures = [pool.submit(on_stream, launch) for launch in launches]
        for future in futures:
            future.result()
        torch.cuda.synchronize(index)


_HANDLES = threading.Lock()


def _run_after_handles(kernel: CompiledKernel):
    """CompiledKernel.run, its module loaded by one thread while the others wait. Triton's own
    (3.6 and 3.9) sets the launcher before it loads the module, and the load releases the GIL:
    a second thread launching the same compiled kernel then found the launcher set and passed
    its function handle, still None (triton-lang/triton#11518)."""
    if kernel.function is None:
        with _HANDLES:
            if kernel.function is None:
                kernel._init_handles()
    return kernel._run


@contextlib.contextmanager
def _handles_made_once():
    """CompiledKernel.run as _run_after_handles while the threads launch."""
    shipped = CompiledKernel.__dict__["run"]
    CompiledKernel.run = property(_run_after_handles)
    try:
        yield
    finally:
        CompiledKernel.run = shipped


def _bind_kernels(index: int) -> None:
    """Make each kernel of this package's modules its per-GPU caches now. Triton makes them on
    a kernel's first launch on a GPU, in a defaultdict: two threads launching a kernel first
    could each make one, and the compiles kept in the one overwritten would be lost."""
    package = __name__.rpartition(".")[0] + "."
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(package):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, JITFunction):  # (Gluon kernels too; the package wraps none in autotuners)
                value.device_caches[index]  # (reading it makes it)
