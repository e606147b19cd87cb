"""Engram's gate (layers/engram.py has the shapes): each stream's similarity to its key, as a
gate on the table row's value added to the stream. The reference math, in torch's fp32 ops;
the fast path's one launch is kernels/engram_gate.py."""

from __future__ import annotations

import torch


def engram_gated(X: torch.Tensor, key: torch.Tensor, value: torch.Tensor, wqk: torch.Tensor, eps: float
                 ) -> torch.Tensor:
    """X [T, S, H] + sigmoid(sign(dot) sqrt(max(|dot|, 1e-6))) * value [T, H], dot the rows'
    RMS-normalized product with the key [T, S, H] under wqk [S, H], over sqrt(H). In fp32,
    stored as X is (bf16 streams: rounded once, mhc.BF16_STREAMS)."""
    H, streams = X.shape[-1], X
    X = X.float()
    rstd = torch.rsqrt(X.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    dot = (X * wqk * key).sum(-1) * rstd * H**-0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
    return (X + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(streams.dtype)
