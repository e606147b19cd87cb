"""Rows' FP8 codes and scales into a layer's window ring in one launch.

The ring offsets of a forward's rows are built once, for layer 0 (layers/attention_kernel.py);
each layer writes at them plus its own byte offset. torch's form (two offset sums and two
scatters) is four kernels a layer at decode.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl


@triton.jit
def _write_rows_kernel(buf_ptr, codes_at_ptr, scales_at_ptr, codes_ptr, scales_ptr, code_base, scale_base,
                       CB: tl.constexpr, SB: tl.constexpr, PDL: tl.constexpr):
    """Program (row r): its CB code bytes and SB scale bytes at their offsets plus the bases."""
    pdl.wait_for_inputs(PDL)
    r = tl.program_id(0).to(tl.int64)
    c, s = tl.arange(0, CB), tl.arange(0, SB)
    tl.store(buf_ptr + tl.load(codes_at_ptr + r * CB + c) + code_base, tl.load(codes_ptr + r * CB + c))
    tl.store(buf_ptr + tl.load(scales_at_ptr + r * SB + s) + scale_base, tl.load(scales_ptr + r * SB + s))


def write_rows(buf: torch.Tensor, codes_at: torch.Tensor, scales_at: torch.Tensor, bases: tuple[int, int],
               codes: torch.Tensor, scales: torch.Tensor) -> None:
    """buf[codes_at + bases[0]] = codes and buf[scales_at + bases[1]] = scales: offsets [T, CB]
    and [T, SB] int64, bytes [T, CB] and [T, SB] uint8 (CB, SB powers of two)."""
    T, CB = codes.shape
    SB = scales.shape[1]
    assert codes_at.shape == codes.shape and scales_at.shape == scales.shape and buf.dtype == torch.uint8
    if T:
        _write_rows_kernel[(T,)](buf, codes_at.contiguous(), scales_at.contiguous(), codes.contiguous(),
                                 scales.contiguous(), int(bases[0]), int(bases[1]), CB=CB, SB=SB,
                                 **pdl.options(buf.device))
