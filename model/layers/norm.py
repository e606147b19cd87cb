"""RMSNorm in fp32: w * x * rsqrt(mean(x^2) + eps) (eps is 1e-20 in V4.1)."""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x = x.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else weight * y
