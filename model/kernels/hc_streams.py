"""The mHC stream updates of a site in one launch each (layers/mhc.py has the math).

Shapes: T tokens, S streams (a power of two), H hidden. Each reads the streams X [T, S, H]
once: torch's forms write and read [T, S, H] intermediates (a batched matmul, a product, a
sum), which at a prefill chunk's 8,192 rows is 670 MB per tensor.
- hc_expand: stream k <- post_k * y + sum_j comb[j, k] X_j;
- hc_collapse_norm: RMSNorm(sum_j pre_j X_j) * weight, as rms_norm(hc_collapse(X, pre), ...).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _hc_expand_kernel(y_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, H, syt, sxt, sxs, sot, sos,
                      S: tl.constexpr, BLOCK: tl.constexpr):
    """Program (token t, column block): all S output streams of those columns."""
    t = tl.program_id(0)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    s = tl.arange(0, S)
    live = d < H
    x = tl.load(x_ptr + t * sxt + s[:, None] * sxs + d[None, :], mask=live[None, :], other=0.0)  # [j, d]
    y = tl.load(y_ptr + t * syt + d, mask=live, other=0.0).to(tl.float32)
    comb = tl.load(comb_ptr + t * S * S + s[:, None] * S + s[None, :])  # [j, k]
    post = tl.load(post_ptr + t * S + s)
    mixed = tl.sum(comb[:, :, None] * x[:, None, :], axis=0)  # [k, d]
    out = post[:, None] * y[None, :] + mixed
    tl.store(out_ptr + t * sot + s[:, None] * sos + d[None, :], out, mask=live[None, :])


@triton.jit
def _hc_collapse_norm_kernel(x_ptr, pre_ptr, w_ptr, out_ptr, H, eps, sxt, sxs, sot,
                             S: tl.constexpr, BLOCK: tl.constexpr):
    """Program (token t): the collapsed row, normalized (BLOCK >= H: the whole row at once)."""
    t = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    s = tl.arange(0, S)
    live = d < H
    x = tl.load(x_ptr + t * sxt + s[:, None] * sxs + d[None, :], mask=live[None, :], other=0.0)
    pre = tl.load(pre_ptr + t * S + s)
    row = tl.sum(pre[:, None] * x, axis=0)
    inv = 1.0 / tl.sqrt(tl.sum(row * row, axis=0) / H + eps)
    w = tl.load(w_ptr + d, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * sot + d, w * (row * inv), mask=live)


def supported(X: torch.Tensor) -> bool:
    """fp32 streams [T, S, H] with S a power of two and rows of contiguous columns."""
    S = X.shape[1]
    return X.dim() == 3 and X.dtype == torch.float32 and S & (S - 1) == 0 and X.stride(-1) == 1


def hc_expand(y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y [T, H], X [T, S, H] fp32, post [T, S], comb [T, S, S] -> [T, S, H] fp32."""
    T, S, H = X.shape
    y, post, comb = y.contiguous(), post.float().contiguous(), comb.float().contiguous()
    out = torch.empty(T, S, H, dtype=torch.float32, device=X.device)
    if T:
        block = 256
        _hc_expand_kernel[(T, triton.cdiv(H, block))](y, X, post, comb, out, H, y.stride(0), X.stride(0), X.stride(1),
                                                      out.stride(0), out.stride(1), S=S, BLOCK=block)
    return out


def hc_collapse_norm(X: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """X [T, S, H] fp32, pre [T, S] -> RMSNorm(sum_j pre_j X_j) [T, H] fp32, times weight if given."""
    T, S, H = X.shape
    pre = pre.float().contiguous()
    w = torch.ones(H, device=X.device) if weight is None else weight.contiguous()
    out = torch.empty(T, H, dtype=torch.float32, device=X.device)
    if T:
        block = triton.next_power_of_2(H)
        _hc_collapse_norm_kernel[(T,)](X, pre, w, out, H, eps, X.stride(0), X.stride(1), out.stride(0), S=S,
                                       BLOCK=block, num_warps=8 if block >= 4096 else 4)
    return out
