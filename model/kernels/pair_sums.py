"""A token's routed experts' outputs summed, in pair order, in one launch.

The experts leave one output row per (token, pair); a token's k rows are added in pair
order (no atomics: every launch sums them the same way, whatever the batch). Prefill's
experts (prefill_gemms) leave their rows in expert order and say where each pair's row is;
decode's (fp4_moe) leave pair p of token t at row t * k + p, and a pair routed to another
rank's expert has no row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl


@triton.jit
def _pair_sums_kernel(rows_ptr, place_ptr, out_ptr, H, E, K: tl.constexpr, BLOCK: tl.constexpr,
                      OWN_ROWS: tl.constexpr, PDL: tl.constexpr):
    """Program (token, column block): the sum of its K pairs' rows, in pair order. place holds
    each pair's row (-1: none), or with OWN_ROWS its expert id: pair j's row is then t * K + j,
    and ids from E on (another rank's) have none."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(K):
        at = tl.load(place_ptr + t * K + j)
        row = tl.where(at < E, t * K + j, -1) if OWN_ROWS else at
        values = tl.load(rows_ptr + tl.maximum(row, 0).to(tl.int64) * H + c, mask=c < H, other=0.0)
        acc += tl.where(row >= 0, values, 0.0)  # a select: an unwritten row's bits never reach the sum
    tl.store(out_ptr + t.to(tl.int64) * H + c, acc, mask=c < H)


def pair_sums(rows: torch.Tensor, place: torch.Tensor) -> torch.Tensor:
    """out[t] = sum over j of rows[place[t, j]] (place -1: nothing), [T, H] fp32: the experts'
    outputs, left in expert order, summed per token without a scatter back."""
    return _sums(rows, place, 0, False)


def own_pair_sums(rows: torch.Tensor, ids: torch.Tensor, experts: int) -> torch.Tensor:
    """out[t] = sum over j of rows[t * k + j] where ids[t, j] < experts, [T, H] fp32: rows of
    pairs routed elsewhere are never read (they need not be zeroed)."""
    return _sums(rows, ids, experts, True)


def _sums(rows: torch.Tensor, place: torch.Tensor, experts: int, own_rows: bool) -> torch.Tensor:
    T, k = place.shape
    H = rows.shape[1]
    out = torch.empty(T, H, dtype=torch.float32, device=rows.device)
    if T:
        block = 1024
        _pair_sums_kernel[(T, triton.cdiv(H, block))](rows.contiguous(), place.contiguous(), out, H, experts, K=k,
                                                        BLOCK=block, OWN_ROWS=own_rows, **pdl.options(rows.device))
    return out
