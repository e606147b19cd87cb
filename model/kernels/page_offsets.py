"""Byte offsets of compressed entries through a page table, in one launch.

kvcache.paged.page_offsets in torch is ~10 small ops (clamp, divide, remainder, gather,
multiply-adds, and the callers' masks); the decode step looks up each index layer's top-k
lists and each source's index keys with it, and as eager torch those lookups were one of the
largest shares of the host's time in a batch-1 step (bench/decode_gaps.py). Integer
arithmetic only: the interpreter (CI) runs the same code as the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

_BLOCK = 1024


# n and cols follow a cache's entry count: specialized (divisibility by 16, == 1), a decode step
# whose count first reached a multiple of 16 compiled this kernel again, with the indexer's
# scores and top-k, 1.9 s inside one step (H200, twenty-fifth session, empty Triton cache).
@triton.jit(do_not_specialize=["n", "cols"])
def _page_offsets_kernel(ids_ptr, table_ptr, first_ptr, off_ptr, soff_ptr, n, cols, page_entries, page_bytes,
                         codes_at, codes_width, scales_at, scales_width,
                         FIRST: tl.constexpr, MASK: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Element e of ids [rows, cols] (row e // cols): its entry's codes and scales offsets. A
    negative id reads entry 0; with MASK the codes offset is -1 for ids below 0 and the scales
    offset -1 for ids below -1 (past a run's own list)."""
    pdl.wait_for_inputs(PDL)
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = e < n
    ids = tl.load(ids_ptr + e, mask=live, other=0).to(tl.int64)
    entry = tl.maximum(ids, 0)
    index = entry // page_entries
    if FIRST:  # several caches' tables end to end: where this row's own one starts
        index += tl.load(first_ptr + e // cols, mask=live, other=0).to(tl.int64)
    page = tl.load(table_ptr + index, mask=live, other=0).to(tl.int64) * page_bytes
    row = entry % page_entries
    off = page + codes_at + row * codes_width
    soff = page + scales_at + row * scales_width
    if MASK:
        off = tl.where(ids >= 0, off, -1)
        soff = tl.where(ids >= -1, soff, -1)
    tl.store(off_ptr + e, off, mask=live)
    tl.store(soff_ptr + e, soff, mask=live)


def page_offsets_kernel(table: torch.Tensor, ids: torch.Tensor, first_page: torch.Tensor | None, page_entries: int,
                        page_bytes: int, codes: tuple[int, int], scales: tuple[int, int], mask: bool
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes offsets, scales offsets) int64 shaped as ids. codes / scales: (byte offset in the
    page, bytes per entry) of the section. first_page [rows, 1]: see page_offsets."""
    ids = ids.contiguous()
    off = torch.empty(ids.shape, dtype=torch.long, device=ids.device)
    soff = torch.empty_like(off)
    n = ids.numel()
    if n:
        cols = ids.shape[-1] if ids.dim() else 1
        first = first_page.contiguous() if first_page is not None else ids
        _page_offsets_kernel[(triton.cdiv(n, _BLOCK),)](ids, table, first, off, soff, n, cols, page_entries,
                                                        page_bytes, *codes, *scales, FIRST=first_page is not None,
                                                        MASK=mask, BLOCK=_BLOCK, **pdl.options(ids.device))
    return off, soff
