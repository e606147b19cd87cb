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
def _hc_gates_kernel(mix_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr, T, smt, iters, hc_eps,
                     S: tl.constexpr, TOKENS: tl.constexpr, PDL: tl.constexpr):
    """Program (TOKENS tokens): their gates, each token's SxS in registers."""
    pdl.wait_for_inputs(PDL)
    t = (tl.program_id(0) * TOKENS + tl.arange(0, TOKENS))[:, None]
    ours = t < T
    s = tl.arange(0, S)[None, :]
    row = mix_ptr + t * smt
    pre = tl.sigmoid(tl.load(row + s, mask=ours, other=0.0).to(tl.float32) * tl.load(scale_ptr)
                     + tl.load(base_ptr + s)) + hc_eps
    post = 2.0 * tl.sigmoid(tl.load(row + S + s, mask=ours, other=0.0).to(tl.float32) * tl.load(scale_ptr + 1)
                            + tl.load(base_ptr + S + s))
    jk = (tl.arange(0, S)[:, None] * S + tl.arange(0, S)[None, :])[None, :, :]  # [1, S, S]
    logits = (tl.load(row[:, :, None] + 2 * S + jk, mask=ours[:, :, None], other=0.0).to(tl.float32)
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
    mixes = mixes.contiguous()
    pre = torch.empty(T, S, dtype=torch.float32, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty(T, S, S, dtype=torch.float32, device=mixes.device)
    if T:
        # one token a program on the GPU; 16 in the interpreter, which runs each program in Python
        tokens = 16 if interpreting() else 1
        _hc_gates_kernel[(triton.cdiv(T, tokens),)](mixes, scale.float().contiguous(), base.float().contiguous(), pre,
                                                    post, comb, T, mixes.stride(0), iters, hc_eps, S=S, TOKENS=tokens,
                                                    **pdl.options(mixes.device))
    return pre, post, comb
