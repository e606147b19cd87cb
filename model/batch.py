"""One forward's view of the requests it serves: each request's rows in the flat token batch.

Dense work (projections, MoE, mHC) runs over all rows at once; per-request work
(attention, compressor, indexer, Engram look-back) loops over `SeqRun`s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

from ..kvcache.state import SequenceCache
from .device import HostCopy, tables_to_device

T = TypeVar("T")


@dataclass
class SeqRun:
    cache: SequenceCache
    tokens: torch.Tensor  # [n] int64 token ids of this forward (on the device: see host)
    start: int  # absolute position of tokens[0]
    history: list[int]  # token ids right before `start` (Engram look-back)
    offset: int = 0  # first row in the flat batch
    skip_compressor: bool = False  # CED decoder pass: the encoder pass already built the entries
    shared: dict = field(default_factory=dict)  # per-forward state: top-k lists, candidate pool, positions, RoPE
    # tokens on the device: their host copy in flight (a decode step's drafts), so that the
    # forward's first layers are enqueued before the host waits for them (host_tokens)
    host: HostCopy | None = None
    host_row: int = 0  # this run's row of host

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def rows(self) -> slice:
        return slice(self.offset, self.offset + self.n)

    def host_tokens(self) -> torch.Tensor:
        """The token ids on the host, waiting for their copy where they are on the device."""
        if self.tokens.device.type == "cpu":
            return self.tokens
        return self.tokens.cpu() if self.host is None else self.host.get()[self.host_row]

    def once(self, key, build: Callable[[], T]) -> T:
        """build(), computed once per forward under `key` (every layer asks for the same)."""
        if key not in self.shared:
            self.shared[key] = build()
        return self.shared[key]

    def positions_on(self, device: str | torch.device) -> torch.Tensor:
        """Absolute positions [n] of this forward's tokens, built on `device` (a host tensor would
        cost a synchronizing copy per layer), once per forward."""
        return self.once(("positions", torch.device(device)),
                         lambda: torch.arange(self.start, self.start + self.n, dtype=torch.long, device=device))


def run_rows(t: torch.Tensor, runs: list[SeqRun]) -> torch.Tensor:
    """The runs' rows of t, in order: a view when they lie end to end (t may have more rows:
    a CUDA graph's bucket pads the batch), else one copy."""
    if end_to_end(runs):
        return t[runs[0].offset:runs[-1].offset + runs[-1].n]
    return torch.cat([t[run.rows] for run in runs])


def cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat, without the copy when there is one part (a batch of one request)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def end_to_end(runs: list[SeqRun]) -> bool:
    """Each run's rows follow the previous run's (as `pack` lays them out)."""
    return all(run.offset == before.offset + before.n for before, run in zip(runs, runs[1:]))


def offsets(runs: list[SeqRun]) -> tuple[int, ...]:
    """The runs' first rows: which runs a per-forward memo (SeqRun.once) was built for."""
    return tuple(run.offset for run in runs)


def rows_positions(runs: list[SeqRun], device: str | torch.device) -> torch.Tensor:
    """Absolute positions [T] of every row of the runs, once per forward."""
    if len(runs) == 1:
        return runs[0].positions_on(device)
    # several runs: built on the host and moved in one copy (an arange a run cost a launch each)
    return runs[0].once(("row positions", torch.device(device), offsets(runs)), lambda: tables_to_device(
        device, np.concatenate([np.arange(run.start, run.start + run.n) for run in runs]))[0])


def pack(runs: list[SeqRun]) -> torch.Tensor:
    """Assign row offsets; returns the flat token ids [T]."""
    offset = 0
    for run in runs:
        run.offset = offset
        run.shared = {}
        offset += run.n
    return torch.cat([run.tokens for run in runs]) if runs else torch.zeros(0, dtype=torch.long)
