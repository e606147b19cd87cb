"""Mixture of experts: sqrt-softplus router with a selection-only bias, clamped SwiGLU experts.

Shapes: T rows, H hidden, E routed experts, k per token, I expert width.
  s   = sqrt(softplus(x @ gate^T / gate_temp))                 [T, E] fp32
  idx = top-k(s + bias)   (ties -> lower expert id)             [T, k]
  w   = s[idx] / (sum s[idx] + 1e-20) * routed_scaling_factor   [T, k]
  y   = sum_e w2_e(w_e * silu(min(x w1_e, L)) * clamp(x w3_e, -L, L)) + shared(x)
The routing weight multiplies the activation before w2 (the reference's order).
"""

from __future__ import annotations

import torch

from ..config import LayerRole, ModelConfig
from ..kernels.fp4_moe import route_plan_warm_up_launches
from ..kernels.swiglu import clamped_swiglu_ref
from ..ops import ReferenceOps


def route(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p, k = role.prefix, role.num_experts_per_tok
    return ops.top_experts(ops.linear(x, f"{p}.ffn.gate.weight"), cfg.gate_temp, ops.w(f"{p}.ffn.gate.bias"), k,
                           cfg.norm_topk_prob, cfg.routed_scaling_factor)


# The shared expert is enqueued before the router (True) or after it: on the fast path's side
# stream (ops.beside) it then also runs beside the router's small launches. H200, 2026-12-04
# (bench/decode_ab.py, 4K, two rounds, ms): batch 1 22.07, 21.18 after against 21.90, 21.42
# before; batch 8 47.85, 47.81 against 46.93, 46.89.
SHARED_FIRST = True


def shared_input_weights(prefix: str) -> tuple[str, str]:
    """The FP8 weights that read a block's FFN input as one product: the shared expert's gate
    and up (ops.linear_many)."""
    return f"{prefix}.ffn.shared_experts.w1", f"{prefix}.ffn.shared_experts.w3"


def moe(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, x: torch.Tensor) -> torch.Tensor:
    p, limit = role.prefix, cfg.swiglu_limit
    s, rows = f"{p}.ffn.shared_experts", ops.parallel.rows(x.shape[0])
    local = ops.parallel.split(role.n_routed_experts)  # every expert on one rank
    # a faithful prefill chunk's rows encoded once for the shared and the routed experts (one rank)
    encoded = ops.ffn_operand(x, f"{p}.ffn.experts", local, role.num_experts_per_tok, shared_input_weights(p))
    xs = x[rows] if encoded is None else encoded

    def shared_expert() -> torch.Tensor:
        return ops.swiglu_linear(*ops.linear_many(xs, shared_input_weights(p)), limit, f"{s}.w2")
    if SHARED_FIRST:
        shared = ops.beside(shared_expert, xs.shape[0])
    weights, idx = route(ops, cfg, role, x)
    if not SHARED_FIRST:
        shared = ops.beside(shared_expert, xs.shape[0])
    if ops.fast:
        one_rank = ops.parallel.world == 1  # (then the shared expert's rows are every row: added in the sums)
        y = ops.routed_experts(f"{p}.ffn.experts", local, x, idx, weights, limit, plus=shared if one_rank else None,
                               operand=encoded)
        if one_rank:
            return y
    else:
        y = _routed_reference(ops, p, local, x, idx, weights, limit)
    # in place on the view (`y[rows] +=` would add, then copy the rows onto themselves)
    y[rows].add_(shared())
    return ops.parallel.all_reduce(y)


def _routed_reference(ops: ReferenceOps, p: str, local: range, x, idx, weights, limit: float) -> torch.Tensor:
    y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for expert in [e for e in torch.unique(idx).tolist() if e in local]:
        rows, slot = torch.where(idx == expert)
        xe = x[rows]
        e = f"{p}.ffn.experts.{expert}"
        h = clamped_swiglu_ref(ops.linear(xe, f"{e}.w1"), ops.linear(xe, f"{e}.w3"), limit) * weights[rows, slot, None]
        y.index_add_(0, rows, ops.linear(h, f"{e}.w2"))
    return y


def warm_up_launches(ops: ReferenceOps, cfg: ModelConfig) -> list:
    """The route plans of every batch size the routed experts' kernels plan in one program, for
    each (local experts, k) of the model's layers (fp4_moe.route_plan_warm_up_launches)."""
    shapes = {(len(ops.parallel.split(r.n_routed_experts)), r.num_experts_per_tok) for r in cfg.roles}
    return [launch for experts, k in sorted(shapes) for launch in route_plan_warm_up_launches(ops.device, experts, k)]
