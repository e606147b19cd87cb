"""Indexer scores of queries against a KV source's index keys, read packed from pool pages.

Shapes: n queries, Hi heads, Di head dim, N entries. score[i, j] = sum_h w[i, h] *
ReLU(q[i, h] . k[j]) for entries visible to query i (j < visible[i]), -inf otherwise; w already
holds the 1/sqrt(Di) and 1/sqrt(Hi) factors. Keys are e2m1 codes (low nibble first) with one
e8m0 scale per 32 values, decoded in registers; the scores stay on the device for top-k.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import dot_exact_rhs, e2m1_to_float


def indexer_scores_ref(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [n, Hi, Di], keys [N, Di] (dequantized), w [n, Hi], visible [n] -> [n, N] fp32."""
    scores = (torch.einsum("nhd,td->nht", q.float(), keys.float()).relu() * w.float().unsqueeze(-1)).sum(1)
    return scores.masked_fill(torch.arange(keys.shape[0], device=q.device) >= visible[:, None], float("-inf"))


@triton.jit
def _indexer_kernel(q_ptr, w_ptr, vis_ptr, page_ptr, k_off, k_soff, o_ptr, n, N, HI,
                    sqn, sqh, swn, son, DI: tl.constexpr, QB: tl.constexpr, NB: tl.constexpr):
    pid_q = tl.program_id(0)
    pid_n = tl.program_id(1)
    rq = pid_q * QB + tl.arange(0, QB)
    rj = pid_n * NB + tl.arange(0, NB)
    d = tl.arange(0, DI)
    half = tl.arange(0, DI // 2)
    off = tl.load(k_off + rj, mask=rj < N, other=0)
    soff = tl.load(k_soff + rj, mask=rj < N, other=0)
    live = rj < N
    packed = tl.load(page_ptr + off[:, None] + half[None, :], mask=live[:, None], other=0).to(tl.int32)
    keys = tl.reshape(tl.join(e2m1_to_float(packed & 0xF), e2m1_to_float((packed >> 4) & 0xF)), (NB, DI))
    sbytes = tl.load(page_ptr + soff[:, None] + (d // 32)[None, :], mask=live[:, None], other=127)
    keys = keys * tl.exp2(sbytes.to(tl.float32) - 127.0)
    acc = tl.zeros((QB, NB), tl.float32)
    for h in range(0, HI):
        q = tl.load(q_ptr + rq[:, None] * sqn + h * sqh + d[None, :], mask=rq[:, None] < n, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rq * swn + h, mask=rq < n, other=0.0)
        acc += tl.maximum(dot_exact_rhs(q, tl.trans(keys), tl.zeros((QB, NB), tl.float32)), 0.0) * w[:, None]
    visible = tl.load(vis_ptr + rq, mask=rq < n, other=0)
    acc = tl.where(rj[None, :] < visible[:, None], acc, float("-inf"))
    tl.store(o_ptr + rq[:, None] * son + rj[None, :], acc, mask=(rq[:, None] < n) & live[None, :])


def indexer_scores(q: torch.Tensor, w: torch.Tensor, visible: torch.Tensor, pages: torch.Tensor,
                   key_offsets: torch.Tensor, key_scale_offsets: torch.Tensor) -> torch.Tensor:
    n, heads, dim = q.shape
    N = key_offsets.shape[0]
    assert w.shape == (n, heads) and visible.shape == (n,) and pages.dtype == torch.uint8 and dim % 32 == 0
    out = torch.empty(n, N, dtype=torch.float32, device=q.device)
    if N == 0:
        return out
    q, w = q.contiguous(), w.float().contiguous()
    qb, nb = 16, 64
    grid = (triton.cdiv(n, qb), triton.cdiv(N, nb))
    _indexer_kernel[grid](q, w, visible.to(torch.int64).contiguous(), pages, key_offsets.contiguous(),
                          key_scale_offsets.contiguous(), out, n, N, heads, q.stride(0), q.stride(1), w.stride(0),
                          out.stride(0), DI=dim, QB=qb, NB=nb)
    return out
