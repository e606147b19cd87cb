"""Attention of V4.1 queries over window keys plus selected compressed entries, with a sink.

Shapes: n queries, h heads, D latent (K = V), W window keys, k selected entries per query.
Per head: s = q.k / sqrt(D); o = sum e^(s-m) v / (sum e^(s-m) + e^(sink-m)). The sink only
grows the denominator, so a query with nothing visible returns zeros.
"""

from __future__ import annotations

import torch


def sparse_attention_ref(q: torch.Tensor, window_kv: torch.Tensor, window_mask: torch.Tensor,
                         selected_kv: torch.Tensor | None, selected_valid: torch.Tensor | None,
                         sink: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, h, D]; window_kv [W, D] shared by all queries, window_mask [n, W] bool;
    selected_kv [n, k, D] per query, selected_valid [n, k] bool; sink [h]. Returns [n, h, D] fp32."""
    q = q.float()
    logits = torch.einsum("nhd,wd->nhw", q, window_kv.float()) * scale
    logits = logits.masked_fill(~window_mask.unsqueeze(1), float("-inf"))
    parts = [logits]
    if selected_kv is not None and selected_kv.shape[1] > 0:
        picked = torch.einsum("nhd,nkd->nhk", q, selected_kv.float()) * scale
        parts.append(picked.masked_fill(~selected_valid.unsqueeze(1), float("-inf")))
    sinks = sink.float().view(1, -1, 1).expand(q.shape[0], -1, 1)
    combined = torch.cat(parts + [sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)
    width = logits.shape[-1]
    out = torch.einsum("nhw,wd->nhd", probs[..., :width], window_kv.float())
    if len(parts) > 1:
        out = out + torch.einsum("nhk,nkd->nhd", probs[..., width:-1], selected_kv.float())
    return out
