"""mHC gates of every token in one launch: sigmoid `pre`/`post` and the Sinkhorn-normalized
`comb`. In eager torch the Sinkhorn loop alone is ~80 tiny launches per site (two sites per
layer), which made decode launch-bound; here one program per token keeps its SxS in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .common import interpreting


@triton.jit
def _mixes(mix_ptr, stride, t, ours, at, inv, blocks, PB: tl.constexpr, SQUARE: tl.constexpr):
    """A site's mixes at offsets `at` ([1, ...]) of tokens t ([TOKENS, 1, ...], `ours` live):
    as stored (PB 0: rows `stride` apart), or summed over the `blocks` column blocks' parts of
    hc_streams.hc_expand_mix_parts (each `stride` wide), in block order, times inv."""
    if PB == 0:  # (an if/else throughout: Triton compiles what follows an early return)
        field = tl.load(mix_ptr + t * stride + at, mask=ours, other=0.0).to(tl.float32)
    elif not SQUARE:  # at [1, S]: parts [TOKENS, PB, S]
        b = tl.arange(0, PB)[None, :, None]
        field = tl.sum(tl.load(mix_ptr + (t[:, :, None] * blocks + b) * stride + at[:, None, :],
                               mask=ours[:, :, None] & (b < blocks), other=0.0), axis=1) * inv
    else:  # at [1, S, S]: parts [TOKENS, PB, S, S]
        b = tl.arange(0, PB)[None, :, None, None]
        field = tl.sum(tl.load(mix_ptr + (t[:, :, :, None] * blocks + b) * stride + at[:, None, :, :],
                               mask=ours[:, :, :, None] & (b < blocks), other=0.0), axis=1) * inv
    return field


@triton.jit
def _hc_gates_kernel(mix_ptr, sq_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr, T, smt, iters, hc_eps,
                     blocks, K, norm_eps, S: tl.constexpr, TOKENS: tl.constexpr, PB: tl.constexpr, PDL: tl.constexpr):
    """Program (TOKENS tokens): their gates, each token's SxS in registers. PB > 0: the mixes
    come in hc_expand_mix_parts' parts (mix_ptr), `blocks` a token, each smt wide, with their
    sums of squares (sq_ptr); they are summed in block order and scaled by rsqrt(mean square
    over the K columns + norm_eps)."""
    pdl.wait_for_inputs(PDL)
    t = (tl.program_id(0) * TOKENS + tl.arange(0, TOKENS))[:, None]
    ours = t < T
    s = tl.arange(0, S)[None, :]
    inv = 1.0
    if PB > 0:
        b = tl.arange(0, PB)[None, :]
        squares = tl.sum(tl.load(sq_ptr + t * blocks + b, mask=ours & (b < blocks), other=0.0), axis=1)
        inv = (1.0 / tl.sqrt(squares / K + norm_eps))[:, None]
    pre = tl.sigmoid(_mixes(mix_ptr, smt, t, ours, s, inv, blocks, PB, False) * tl.load(scale_ptr)
                     + tl.load(base_ptr + s)) + hc_eps
    post = 2.0 * tl.sigmoid(_mixes(mix_ptr, smt, t, ours, S + s, inv, blocks, PB, False) * tl.load(scale_ptr + 1)
                            + tl.load(base_ptr + S + s))
    jk = (tl.arange(0, S)[:, None] * S + tl.arange(0, S)[None, :])[None, :, :]  # [1, S, S]
    inv3 = inv if PB == 0 else inv[:, :, None]
    logits = (_mixes(mix_ptr, smt, t[:, :, None], ours[:, :, None], 2 * S + jk, inv3, blocks, PB, True)
              * tl.load(scale_ptr + 2) + tl.load(base_ptr + 2 * S + jk))
    e = tl.exp(logits - tl.max(logits, axis=2)[:, :, None])
    comb = e / tl.sum(e, axis=2)[:, :, None] + hc_eps
    comb = comb / (tl.sum(comb, axis=1)[:, None, :] + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (tl.sum(comb, axis=2)[:, :, None] + hc_eps)
        comb = comb / (tl.sum(comb, axis=1)[:, None, :] + hc_eps)
    tl.store(pre_ptr + t * S + s, pre, mask=ours)
    tl.store(post_ptr + t * S + s, post, mask=ours)
    tl.store(comb_ptr + t[:, :, None] * S * S + jk, comb, mask=ours[:, :, None])


def hc_gates(mixes: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
             hc_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [T, (2+S)*S] -> pre [T, S], post [T, S], comb [T, S, S]; same math as mhc.hc_gates."""
    T, width = mixes.shape
    S = int(round((1 + width) ** 0.5)) - 1
    assert (2 + S) * S == width and S & (S - 1) == 0, "hc_mult must be a power of two"
    return _gates(mixes.contiguous(), None, T, S, base, scale, iters, hc_eps)


def hc_gates_from_parts(parts: torch.Tensor, squares: torch.Tensor, width: int, columns: int, base: torch.Tensor,
                        scale: torch.Tensor, iters: int, hc_eps: float, norm_eps: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_gates of the mixes hc_streams.hc_expand_mix_parts left in parts [T, B, NP] (their
    first `width` columns) with sums of squares [T, B] over the streams' `columns` (S * H): the
    parts summed in block order, times rsqrt(mean square + norm_eps), in the same launch."""
    T = parts.shape[0]
    S = int(round((1 + width) ** 0.5)) - 1
    assert (2 + S) * S == width and S & (S - 1) == 0, "hc_mult must be a power of two"
    return _gates(parts, squares, T, S, base, scale, iters, hc_eps, norm_eps, columns)


def _gates(mixes: torch.Tensor, squares: torch.Tensor | None, T: int, S: int, base: torch.Tensor,
           scale: torch.Tensor, iters: int, hc_eps: float, norm_eps: float = 0.0, columns: int = 0
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    pre = torch.empty(T, S, dtype=torch.float32, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty(T, S, S, dtype=torch.float32, device=mixes.device)
    if T:
        # one token a program on the GPU; 16 in the interpreter, which runs each program in Python
        tokens = 16 if interpreting() else 1
        blocks = mixes.shape[1] if squares is not None else 0
        stride = mixes.stride(1) if squares is not None else mixes.stride(0)
        _hc_gates_kernel[(triton.cdiv(T, tokens),)](mixes, squares if squares is not None else mixes,
                                                    scale.float().contiguous(), base.float().contiguous(), pre, post,
                                                    comb, T, stride, iters, hc_eps, blocks, columns, norm_eps, S=S,
                                                    TOKENS=tokens, PB=triton.next_power_of_2(blocks) if blocks else 0,
                                                    **pdl.options(mixes.device))
    return pre, post, comb
