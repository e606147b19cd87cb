"""Engram conditional memory: n-gram table rows gated into each residual stream.

Shapes: T rows, S streams, H hidden, C hash columns ((N-1) n-gram sizes x heads), d row width.
  e    = table rows for the hash ids                 [T, C*d]  (FP8 rows, e8m0 per 32)
  kv   = e @ wkv^T -> S keys ++ 1 value              [T, (S+1)*H]
  dot  = sum_d X_s * (q_w*k_w)_s * key_s * rstd(X_s) * rstd(key_s) / sqrt(H)
  g    = sigmoid(sign(dot) * sqrt(max(|dot|, 1e-6)))  [T, S]
  X_s += g_s * value
"""

from __future__ import annotations

import torch

from ..config import LayerRole, ModelConfig
from ..device import to_device
from ..ops import ReferenceOps


def engram(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, X: torch.Tensor, hash_ids: torch.Tensor) -> torch.Tensor:
    return engram_mix(ops, cfg, role, X, engram_rows(ops, role, hash_ids, X.device))


def engram_rows(ops: ReferenceOps, role: LayerRole, hash_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The table rows [T, C, d] of the hash ids (computed on the host), on `device`. The
    (large) table may live on the host: look the rows up where it lives and copy without a
    sync whichever side of the bus that is."""
    table = ops.weights[f"{role.prefix}.engram.embed"]
    return to_device(table.rows(to_device(hash_ids, table.weight.device)), device)


def engram_mix(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, X: torch.Tensor, rows: torch.Tensor
               ) -> torch.Tensor:
    """X with the gated values of the table rows [T, C, d] added to each stream: shapes set by
    T alone (one CUDA graph per row count at decode)."""
    p, S, H = role.prefix, cfg.hc_mult, cfg.hidden_size
    kv = ops.linear(rows.flatten(-2), f"{p}.engram.wkv")
    key, value = kv[:, : S * H].view(-1, S, H), kv[:, S * H:]
    wqk = ops.w(f"{p}.engram.q_weight") * ops.w(f"{p}.engram.k_weight")  # [S, H]
    return ops.engram_gated(X, key, value, wqk, cfg.rms_norm_eps)
