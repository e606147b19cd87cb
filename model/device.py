"""Host -> device copies that do not synchronize the stream.

`cpu_tensor.to("cuda")` waits for the whole stream to drain before it returns; a decode step
makes hundreds of such small copies, so the GPU idles between them. With non_blocking=True
CUDA stages pageable host memory into its own buffer before the call returns, so the source
may be freed or changed at once and nothing waits. An index tensor whose values the host
knows is better built on the device directly (torch.arange(a, b, device=...)) where one op
makes it; a table that takes several ops is better built on the host and moved in one copy
(tables_to_device). Device -> host: HostCopy waits for its own copy, not for the stream.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """t on `device`; a CPU -> CUDA copy does not synchronize."""
    device = torch.device(device)
    if t.device.type == "cpu" and device.type == "cuda":
        return t.to(device, non_blocking=True)
    return t.to(device)


def tables_to_device(device: str | torch.device, *tables: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Index tables built on the host, on `device` in one copy. A decode step builds a few
    dozen a forward from host ints (positions, ring slots): built on the device, each torch op
    is a launch costing the host ~10 us while the GPU may wait; a numpy op costs ~1 us."""
    blobs = [np.ascontiguousarray(t).reshape(-1).view(np.uint8) for t in tables]
    starts = np.cumsum([0] + [-(-b.size // 8) * 8 for b in blobs])  # 8-byte aligned: int64 views
    packed = np.zeros(int(starts[-1]), dtype=np.uint8)
    for blob, at in zip(blobs, starts):
        packed[at:at + blob.size] = blob
    flat = to_device(torch.from_numpy(packed), device)
    return tuple(flat[at:at + blob.size].view(torch.from_numpy(np.empty(0, t.dtype)).dtype).view(t.shape)
                 for t, blob, at in zip(tables, blobs, starts))


class HostCopy:
    """A device tensor's copy to the host, started now and waited for only when the host reads
    it: the GPU's queue keeps the work enqueued after it (`.cpu()` would drain the whole
    stream first). On the host the tensor itself."""

    def __init__(self, t: torch.Tensor):
        self._event = None
        if t.device.type != "cuda":
            self._host = t
            return
        self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._host.copy_(t, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def get(self) -> torch.Tensor:
        """The host copy, once the GPU has written it."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host
