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
def _pair_sums_kernel(rows_ptr, place_ptr, plus_ptr, out_ptr, H, E, K: tl.constexpr, BLOCK: tl.constexpr,
                      OWN_ROWS: tl.constexpr, PLUS: tl.constexpr, PDL: tl.constexpr):
    """Program (token, column block): the sum of its K pairs' rows, in pair order, then plus
    the token's row of plus_ptr where PLUS. place holds each pair's row (-1: none), or with
    OWN_ROWS its expert id: pair j's row is then t * K + j, and ids from E on (another rank's)
    have none."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(K):
        at = tl.load(place_ptr + t * K + j)
        row = tl.where(at < E, t * K + j, -1) if OWN_ROWS else at
        values = tl.load(rows_ptr + tl.maximum(row, 0).to(tl.int64) * H + c, mask=c < H, other=0.0)
        acc += tl.where(row >= 0, values, 0.0)  # a select: an unwritten row's bits never reach the sum
    if PLUS:  # (after the pairs: the bits of adding it to their sum in a launch of its own)
        acc += tl.load(plus_ptr + t.to(tl.int64) * H + c, mask=c < H, other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * H + c, acc, mask=c < H)


def pair_sums(rows: torch.Tensor, place: torch.Tensor, plus: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum over j of rows[place[t, j]] (place -1: nothing), [T, H] fp32: the experts'
    outputs, left in expert order, summed per token without a scatter back; then + plus[t]
    where given (the shared expert's output [T, H] fp32: its add's read and write of the sum
    never made, 0.33 ms of bytes a layer at a 16K chunk on an H100)."""
    return _sums(rows, place, 0, False, plus)


def own_pair_sums(rows: torch.Tensor, ids: torch.Tensor, experts: int) -> torch.Tensor:
    """out[t] = sum over j of rows[t * k + j] where ids[t, j] < experts, [T, H] fp32: rows of
    pairs routed elsewhere are never read (they need not be zeroed)."""
    return _sums(rows, ids, experts, True)


def _sums(rows: torch.Tensor, place: torch.Tensor, experts: int, own_rows: bool,
          plus: torch.Tensor | None = None) -> torch.Tensor:
    T, k = place.shape
    H = rows.shape[1]
    out = torch.empty(T, H, dtype=torch.float32, device=rows.device)
    if plus is not None:
        assert plus.shape == (T, H) and plus.dtype == torch.float32, (plus.shape, plus.dtype)
        plus = plus.contiguous()
    if T:
        block = 1024
        _pair_sums_kernel[(T, triton.cdiv(H, block))](rows.contiguous(), place.contiguous(),
                                                        out if plus is None else plus, out, H, experts, K=k,
                                                        BLOCK=block, OWN_ROWS=own_rows, PLUS=plus is not None,
                                                        **pdl.options(rows.device))
    return out
