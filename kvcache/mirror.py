"""A KV pool on the model's device, with the transfer segments on the host as its staging copy.

Transports move bytes only between registered host memory (TCP and shm copy from it, RDMA
hands it to the NIC), but the model's attention and indexer kernels read a cache in place only
on their own device. A GPU worker's pool therefore has two copies at the same offsets: the
device buffers the model reads and writes, and the host segments peers address by (segment,
offset). Bytes cross between the two only when a cache moves, and only that cache's ranges:
- before the host copy is read (a send, a checksum): device -> host (`to_host`);
- after bytes land in the host copy (a receive): host -> device (`to_device`), before the
  model reads them.
The model's own reads and writes, and copies between caches, stay on the device.
"""

from __future__ import annotations

import torch

Range = tuple[str, int, int]  # (segment, byte offset, length), as PagedCache.byte_ranges() gives them


def coalesce(ranges: list[Range]) -> list[tuple[str, int, int]]:
    """(segment, start, end) runs covering the ranges: adjacent or overlapping ranges of one
    segment become one copy (a cache's pages are mostly consecutive in the pool)."""
    runs: list[list] = []
    for segment, offset, length in sorted(ranges):
        if length <= 0:
            continue
        last = runs[-1] if runs else None
        if last is not None and last[0] == segment and offset <= last[2]:
            last[2] = max(last[2], offset + length)
        else:
            runs.append([segment, offset, offset + length])
    return [tuple(run) for run in runs]


class DeviceMirror:
    def __init__(self, host: dict[str, torch.Tensor], device: str | torch.device):
        """`host`: segment name -> its uint8 host storage. Device buffers of the same sizes are
        allocated (zeroed, so that no first touch happens during a step) on `device`; a CPU
        device gives tests the same arrangement without a GPU."""
        self.device = torch.device(device)
        self._host = dict(host)
        self._device = {name: torch.zeros(t.numel(), dtype=torch.uint8, device=self.device)
                        for name, t in host.items()}
        # Page-locked host memory lets the copies run as DMA at full PCIe speed; from pageable
        # memory the driver stages them through a bounce buffer (a 1M-token cache is ~0.9 GB).
        self.pinned = self.device.type == "cuda" and all(_page_lock(t) for t in self._host.values())

    def buffer(self, segment: str) -> torch.Tensor:
        """The bytes the model reads and writes."""
        return self._device[segment]

    def host(self, segment: str) -> torch.Tensor:
        """The bytes peers read and write."""
        return self._host[segment]

    def to_host(self, ranges: list[Range]) -> int:
        """Device -> host copy of the ranges; returns the bytes copied, once they are on the host."""
        return self._copy(ranges, self._host, self._device)

    def to_device(self, ranges: list[Range]) -> int:
        """Host -> device copy of the ranges; returns the bytes copied, once they are on the device."""
        return self._copy(ranges, self._device, self._host)

    def _copy(self, ranges: list[Range], dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> int:
        runs = coalesce(ranges)
        for segment, start, end in runs:
            if start < 0 or end > src[segment].numel():
                raise ValueError(f"[{start}, {end}) is outside segment {segment!r} of {src[segment].numel()} bytes")
        for segment, start, end in runs:
            dst[segment][start:end].copy_(src[segment][start:end], non_blocking=True)
        if self.device.type == "cuda":
            # The copies queue on this thread's stream behind the model's work that wrote the
            # bytes (workers run them on the engine thread, handoff.py), with no wait between
            # them; one wait here, so that no transport reads the host copy, and no transfer
            # overwrites it, before they finished.
            torch.cuda.current_stream(self.device).synchronize()
        return sum(end - start for _, start, end in runs)


def _page_lock(host: torch.Tensor) -> bool:
    """Registers a host segment with CUDA (kept for the process's life, as the segment is);
    False where the driver refuses (the copies then run from pageable memory, slower)."""
    if host.is_pinned():
        return True
    error = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel() * host.element_size(), 0)
    return int(error) == 0
