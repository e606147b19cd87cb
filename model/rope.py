"""Interleaved RoPE on the last `rope_head_dim` channels, two tables.

`local`: rope_theta, plain (sliding-only layers and DSpark stages).
`yarn`:  compress_rope_theta with YaRN frequency blending and no mscale (every layer with a
         compressed branch: its queries, window KV and compressed entries).
Adjacent channel pairs (2i, 2i+1) rotate as one complex number.
"""

from __future__ import annotations

import torch

from .batch import SeqRun, offsets, rows_positions
from .config import ModelConfig, yarn_inv_freq_bounds


def inverse_frequencies(config: ModelConfig, kind: str) -> torch.Tensor:
    dim = config.rope_head_dim
    if kind == "local" or config.yarn is None:
        base = config.rope_theta if kind == "local" else config.compress_rope_theta
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    base, yarn = config.compress_rope_theta, config.yarn
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (yarn.factor * pos_freqs)
    low, high = yarn_inv_freq_bounds(dim, base, yarn)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_factor = 1 - ramp
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor


class Rope:
    """cos/sin per position for both tables, computed on demand (positions reach 1M)."""

    def __init__(self, config: ModelConfig, device="cpu"):
        self.inv_freq = {k: inverse_frequencies(config, k).to(device) for k in ("local", "yarn")}
        self.device = self.inv_freq["local"].device  # with its index: cuda:0, as tensors report it

    def cos_sin(self, kind: str, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions should already be on the device: a host tensor costs a synchronizing copy."""
        inv = self.inv_freq[kind]
        freqs = positions.to(inv.device, torch.float32)[:, None] * inv[None, :]  # [n, rope/2]
        return freqs.cos(), freqs.sin()

    def for_run(self, kind: str, run: SeqRun) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of a run's positions, once per forward: every layer of a forward asks for the same."""
        return run.once(("rope", kind), lambda: self.cos_sin(kind, run.positions_on(self.device)))

    def for_runs(self, kind: str, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of every row of the runs, once per forward (each table is its run's, as alone)."""
        if len(runs) == 1:
            return self.for_run(kind, runs[0])

        # one cos/sin over every row, not one a run (elementwise: the same rows)
        return runs[0].once(("rope rows", kind, offsets(runs)),
                            lambda: self.cos_sin(kind, rows_positions(runs, self.device)))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [n, ..., D]; cos/sin [n, rope/2]. Rotates the last 2*cos.shape[-1] channels.

    Each pair (e, o) becomes (e*cos - o*sin, o*cos + e*sin) in fp32, written as
    pair*cos + swapped*sin*sign with sign (-1, +1): the same rounded products and sums as the
    textbook form (negation is exact), in a handful of ops (a decode step is host-bound)."""
    half = cos.shape[-1]
    lead = cos.shape[:-1] + (1,) * (x.dim() - cos.dim()) + (half, 1)  # broadcast over heads and the pair
    rot = x[..., -2 * half:]
    pair = rot.unflatten(-1, (half, 2)).float()
    rotated = pair * cos.reshape(lead) + pair.flip(-1) * sin.reshape(lead) * _pair_sign(x.device, inverse)
    rotated = rotated.flatten(-2).to(x.dtype)
    return rotated if rotated.shape[-1] == x.shape[-1] else torch.cat([x[..., :-2 * half], rotated], dim=-1)


_PAIR_SIGNS: dict[tuple, torch.Tensor] = {}


def _pair_sign(device: torch.device, inverse: bool) -> torch.Tensor:
    """(-1, +1), or (+1, -1) for the inverse rotation, kept per device (no copy per call)."""
    key = (str(device), inverse)
    if key not in _PAIR_SIGNS:
        _PAIR_SIGNS[key] = torch.tensor([1.0, -1.0] if inverse else [-1.0, 1.0], device=device)
    return _PAIR_SIGNS[key]
