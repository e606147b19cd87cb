"""Host -> device copies that do not synchronize the stream.

`cpu_tensor.to("cuda")` waits for the whole stream to drain before it returns; a decode step
makes hundreds of such small copies, so the GPU idles between them. With non_blocking=True
CUDA stages pageable host memory into its own buffer before the call returns, so the source
may be freed or changed at once and nothing waits. Index tensors whose values the host knows
are better built on the device directly (torch.arange(a, b, device=...)).
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """t on `device`; a CPU -> CUDA copy does not synchronize."""
    device = torch.device(device)
    if t.device.type == "cpu" and device.type == "cuda":
        return t.to(device, non_blocking=True)
    return t.to(device)
