"""Manifold-constrained hyper-connections (mHC): 4 residual streams mixed per sublayer.

Shapes: T tokens, S streams (hc_mult), H hidden.
A site's mix is one projection of the RMS-normalized flattened streams [T, S*H] into
S `pre` gates, S `post` gates and an SxS `comb` matrix that Sinkhorn iterations push
onto the doubly-stochastic manifold. V4.1 is single-pass: the `pre` a site computes is
used by the NEXT site's collapse.
"""

import torch

from .norm import rms_norm

# Faithful mode's streams stored in bf16, each new stream rounded once (to nearest, ties to even)
# as the reference inference code stores them (its hc_post, M:962-966, returns the model's
# bf16; so do the Engram site and the embedding's rows): half the bytes of every pass over
# [T, 4, 5120] streams (1.34 GB -> 0.67 GB at a 16K chunk). Everything read from them is still
# computed in fp32 (the DSpark taps' mean is rounded as stored, as the reference's is). Exact
# mode keeps fp32 streams (the golden logits' precision). H100, fifty-fifth session, a 256K
# faithful prefill in 16K chunks alternated in one process: 9.967 / 9.983 s off, 9.901 /
# 9.989 s on; the prefill site (hc_streams.hc_site) 1.604 -> 1.614 ms at
# 16K rows: not bound by its streams' bytes (255 registers, two programs an SM: by its latency).
# Peak memory 60.3-61.2 -> 59.3 GiB. Off: no gain, and it moves faithful mode's logits. And it
# breaks the exactness properties on the tiny checkpoint: a value's last fp32 bit, which differs
# with how many rows a product or a sum takes, now decides a bf16 tie, and the random model
# spreads it (faithful reference path, 16 tokens: chunked prefill against one-shot 6e-6 apart
# with fp32 streams, up to 2.0 with bf16 ones, an argmax changed; speculative greedy left plain
# greedy on one of the four golden prompts). Shipping it wants every sum before a rounding the
# same bits at any rows.
BF16_STREAMS = False


STREAM_DTYPES = (torch.float32, torch.bfloat16)  # what the stream kernels take


def stream_dtype(act_quant: bool) -> torch.dtype:
    """The dtype a model's streams are stored in: bf16 in faithful mode where BF16_STREAMS says."""
    return torch.bfloat16 if act_quant and BF16_STREAMS else torch.float32


def hc_mixes(X: torch.Tensor, fn: torch.Tensor, norm_eps: float, project=None, norm=rms_norm) -> torch.Tensor:
    """X [T, S, H] -> the site's raw mixes [T, (2+S)*S]: a projection of the normalized streams
    (by `project(x, fn)` when given: a kernel for x @ fn.T; `norm`: a kernel for rms_norm)."""
    x = norm(X.flatten(-2), None, norm_eps)
    return x @ fn.T if project is None else project(x, fn)


def hc_gates(mixes: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
             hc_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [T, (2+S)*S] -> pre [T, S], post [T, S], comb [T, S, S] (comb[j, k]: stream j into k)."""
    S = int(round((1 + mixes.shape[-1]) ** 0.5)) - 1  # width (2+S)*S = (S+1)^2 - 1
    pre = torch.sigmoid(mixes[:, :S] * scale[0] + base[:S]) + hc_eps
    post = 2 * torch.sigmoid(mixes[:, S:2 * S] * scale[1] + base[S:2 * S])
    logits = mixes[:, 2 * S:].view(-1, S, S) * scale[2] + base[2 * S:].view(S, S)
    comb = torch.softmax(logits, dim=-1) + hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    return pre, post, comb


def hc_mix(X: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
           hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """X [T, S, H] -> pre [T, S], post [T, S], comb [T, S, S]."""
    return hc_gates(hc_mixes(X, fn, norm_eps), base, scale, iters, hc_eps)


def hc_collapse(X: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """sum_j pre_j X_j: [T, S, H] -> [T, H]."""
    return (pre.unsqueeze(-1) * X).sum(dim=-2)


def hc_expand(y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Stream k <- post_k * y + sum_j comb[j, k] X_j, in fp32, stored as X is (stream_dtype)."""
    mixed = torch.einsum("tjk,tjd->tkd", comb, X.float())
    return (post.unsqueeze(-1) * y.float().unsqueeze(-2) + mixed).to(X.dtype)
