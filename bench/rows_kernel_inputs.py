"""The Gluon rows kernel's inputs at a prefill chunk's shape, as the benches that time it build
them (rows_kernel_ablation.py, query_bytes.py): n queries of 64 heads x 512 channels, fp32
before RoPE (32 rotated pairs), 2^16 decoded bf16 keys of each kind, and each query's rows of
them in a prompt's locality (its 128-key window shared with its neighbours but one key, its
512 entries from a nearby range)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

HEADS, D, HALF, W, K, KEYS, GROUPS = 64, 512, 32, 128, 512, 1 << 16, 8


def rows_kernel_inputs(n: int, device: str = "cuda") -> SimpleNamespace:
    """raw [n, HEADS, D] fp32, cos / sin [n, HALF], window_keys / entry_keys [KEYS, D] bf16, sink
    [HEADS], local (window rows [n, W], entry rows [n, K]) and the generator they came from (for
    a caller's further draws in the same sequence)."""
    g = torch.Generator(device=device).manual_seed(0)
    raw = torch.randn(n, HEADS, D, device=device, generator=g) * 0.5
    angles = torch.rand(n, HALF, device=device, generator=g) * 100
    window_keys = (torch.randn(KEYS, D, device=device, generator=g) * 0.1).bfloat16()
    entry_keys = (torch.randn(KEYS, D, device=device, generator=g) * 0.1).bfloat16()
    sink = torch.randn(HEADS, device=device, generator=g)
    base = torch.arange(n, device=device)[:, None]
    local = (((base + torch.arange(W, device=device)) % KEYS),  # neighbours' windows share 127 keys
             (base // 64 * 64 + torch.randint(0, 4096, (n, K), device=device, generator=g)) % KEYS)
    return SimpleNamespace(raw=raw, cos=angles.cos(), sin=angles.sin(), window_keys=window_keys,
                           entry_keys=entry_keys, sink=sink, local=local, generator=g)
