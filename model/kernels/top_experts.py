"""The router after its GEMM in one launch: scores, each token's k experts, their weights.

  s = sqrt(softplus(logits / gate_temp));  ids = top-k(s + bias);  w = s[ids] (normalized) * scaling
The torch form (top_experts_ref) is ten kernels a layer at decode: three for the scores, a
stable descending sort, a gather, a sum and three products. Here one program a token keeps its
E scores in registers and takes the largest k one at a time; a tie goes to the lower expert
id, as the stable sort orders them. softplus(x) is x past 20 (torch's threshold), else
log1p(e^x) by the compensated form log(1 + u) * u / ((1 + u) - 1), accurate where 1 + u
rounds (the interpreter has no log1p); its scores agree with torch's to a few ulps.

Shapes: logits [T, E] fp32 (E <= 1,024), bias [E] -> weights [T, k] fp32, ids [T, k] int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

MAX_EXPERTS = 1024


def top_experts_ref(logits: torch.Tensor, temp: float, bias: torch.Tensor, k: int, normalize: bool, scaling: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch form: top-k of scores + bias (ties -> lower expert id), weights from scores."""
    scores = torch.sqrt(torch.nn.functional.softplus(logits / temp))
    ids = torch.sort(scores + bias, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = scores.gather(1, ids)
    if normalize and k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


@triton.jit
def _top_experts_kernel(logit_ptr, bias_ptr, w_ptr, id_ptr, E, temp, scaling, slt,
                        K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, NORMALIZE: tl.constexpr,
                        PDL: tl.constexpr):
    """Program (token t): its scores, then k rounds of max, lowest id among the maxima, mask it out."""
    pdl.wait_for_inputs(PDL)
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    live = e < E
    x = tl.load(logit_ptr + t * slt + e, mask=live, other=0.0) / temp
    u = tl.exp(tl.minimum(x, 20.0))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))
    scores = tl.sqrt_rn(tl.where(x > 20.0, x, log1p))
    biased = tl.where(live, scores + tl.load(bias_ptr + e, mask=live, other=0.0), float("-inf"))
    j = tl.arange(0, BLOCK_K)
    weights = tl.zeros((BLOCK_K,), tl.float32)
    ids = tl.zeros((BLOCK_K,), tl.int64)
    for r in tl.static_range(K):
        top = tl.max(biased, axis=0)
        pick = tl.min(tl.where(biased == top, e, BLOCK_E), axis=0)
        weights = tl.where(j == r, tl.sum(tl.where(e == pick, scores, 0.0), axis=0), weights)
        ids = tl.where(j == r, pick.to(tl.int64), ids)
        biased = tl.where(e == pick, float("-inf"), biased)
    if NORMALIZE:
        weights = weights / (tl.sum(weights, axis=0) + 1e-20)
    tl.store(w_ptr + t * K + j, weights * scaling, mask=j < K)
    tl.store(id_ptr + t * K + j, ids, mask=j < K)


def supported(logits: torch.Tensor, k: int) -> bool:
    return logits.dim() == 2 and logits.dtype == torch.float32 and k <= logits.shape[1] <= MAX_EXPERTS


def top_experts(logits: torch.Tensor, temp: float, bias: torch.Tensor, k: int, normalize: bool, scaling: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] fp32, ids [T, k] int64): top_experts_ref in one launch."""
    T, E = logits.shape
    logits = logits.contiguous()
    weights = torch.empty(T, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(T, k, dtype=torch.int64, device=logits.device)
    if T:
        _top_experts_kernel[(T,)](logits, bias.float().contiguous(), weights, ids, E, float(temp), float(scaling),
                                  logits.stride(0), K=k, BLOCK_K=triton.next_power_of_2(k),
                                  BLOCK_E=triton.next_power_of_2(E), NORMALIZE=normalize and k > 1,
                                  **pdl.options(logits.device))
    return weights, ids
