"""Programmatic dependent launch (Hopper): a kernel's programs are placed before the one
ahead of it on the stream has ended.

A decode step is ~1,100 short kernels one after another on one stream, most of them a few
microseconds long. Between two of them the GPU drains the first, then launches and places
the second. Launched with PDL, the second kernel's programs are placed once every program of
the first has begun (`wait_for_inputs` signals it) and wait in `wait_for_inputs` until the
first has ended and its writes are visible. H200, 2026-12-04 (bench/pdl_chain.py, in CUDA
graphs): an RMSNorm of 6 rows 2.49 -> 2.07 us; a layer's dense FP8 GEMMs at 6 rows, each
behind an RMSNorm (10 kernels), 89.2 -> 84.3 us. Asking the L2 for a GEMM's first weight
steps before the wait did not pay (85.0 us): the next kernel's programs find no room while
the GEMM's own fill the SMs.

The rule that keeps this exact: every kernel launched with PDL calls `wait_for_inputs`
before it reads or writes any memory, so it also ends after the kernel ahead of it, and a
kernel's end covers every kernel before it (tests/model/test_pdl.py checks every kernel's
source for it). Kernels launched without PDL (torch's, cuBLAS's) wait for all work ahead of
them as always. CUDA graphs keep the launches' programmatic edges.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import common  # (the module: common's kernels use this one)

# Off: every kernel waits for the one before it to end (bench/decode_ab.py switches it).
# DSFLASH_PDL=0 turns it off for a run, e.g. where the driver cannot capture the launches'
# programmatic edges into CUDA graphs (graph edges with data came in CUDA 12.3).
ENABLED = os.environ.get("DSFLASH_PDL", "1") != "0"


def options(device: torch.device) -> dict:
    """A launch's PDL arguments: the kernel's PDL constexpr and Triton's launch_pdl option,
    on Hopper and newer GPUs only (the interpreter runs launches one at a time anyway)."""
    on = ENABLED and not common.interpreting() and device.type == "cuda" and _hopper_or_newer(device.index)
    return dict(PDL=True, launch_pdl=True) if on else dict(PDL=False)


@functools.cache
def _hopper_or_newer(index: int | None) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Wait until the kernels ahead have finished and their writes are visible, and let the
    next kernel's programs be placed. Before this, a program touches no memory (index
    arithmetic only: tests/model/test_pdl.py)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
