"""Routed experts of a batch in two grouped GEMMs over packed FP4 weights.

Shapes: T tokens, k experts per token, P = T*k (token, expert) pairs, E experts, H hidden,
I expert width. Weights stay packed: w13 [E, 2I, H/2] (w1 rows then w3 rows, two e2m1 codes
per byte, low nibble first) with e8m0 scales [E, 2I, H/32]; w2 [E, H, I/2] with [E, H, I/32].
Pairs are sorted by expert and padded to blocks of BLOCK_M, so each program multiplies one
expert's rows:
  1. h[p] = w_p * silu(min(x W1^T, L)) * clamp(x W3^T, -L, L)     [P, I]
  2. o[p] = h[p] W2^T                                              [P, H]
and the token outputs are o summed over each token's k pairs (deterministic, no atomics).
Hopper has no FP4 tensor cores: codes are decoded to fp32 in registers, scaled, then dotted.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant import dequantize_fp4_weight
from .common import DOT, e2m1_to_float


def fp4_moe_ref(x, idx, weights, w13, s13, w2, s2, limit: float) -> torch.Tensor:
    """Plain torch over exactly dequantized experts (the oracle)."""
    T, H = x.shape
    inter = w13.shape[1] // 2
    y = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for e in torch.unique(idx).tolist():
        rows, slot = torch.where(idx == e)
        w13e = dequantize_fp4_weight(w13[e], s13[e])
        gate, up = x[rows].float() @ w13e[:inter].T, x[rows].float() @ w13e[inter:].T
        if limit > 0:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        h = torch.nn.functional.silu(gate) * up * weights[rows, slot, None]
        y.index_add_(0, rows, h @ dequantize_fp4_weight(w2[e], s2[e]).T)
    return y


@triton.jit
def _fp4_tile(w_ptr, s_ptr, row0, rows, col0, n_rows, n_cols, swr, swc, ssr, ssc,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Decode a [BLOCK_R, BLOCK_C] tile of a packed FP4 matrix (rows row0+rows, columns col0..)."""
    r = row0 + rows
    half = col0 // 2 + tl.arange(0, BLOCK_C // 2)
    packed = tl.load(w_ptr + r[:, None] * swr + half[None, :] * swc,
                     mask=(r[:, None] < n_rows) & (half[None, :] < n_cols // 2), other=0).to(tl.int32)
    lo = e2m1_to_float(packed & 0xF)
    hi = e2m1_to_float((packed >> 4) & 0xF)
    values = tl.reshape(tl.join(lo, hi), (BLOCK_R, BLOCK_C))  # element 2c low nibble, 2c+1 high
    s = tl.load(s_ptr + r * ssr + (col0 // 32) * ssc, mask=r < n_rows, other=127).to(tl.float32)
    return values * tl.exp2(s - 127.0)[:, None]


@triton.jit
def _gate_up_kernel(x_ptr, tok_ptr, wt_ptr, blk_ptr, w_ptr, s_ptr, h_ptr, H, INTER, limit,
                    sxt, sxh, swe, swr, swc, sse, ssr, ssc, shp, shi,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(blk_ptr + pid_b)
    pairs = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    tokens = tl.load(tok_ptr + pairs)
    live = tokens >= 0
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n0 = pid_n * BLOCK_N
    w_e, s_e = w_ptr + expert * swe, s_ptr + expert * sse
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        x = tl.load(x_ptr + tokens[:, None] * sxt + (k0 + rk)[None, :] * sxh,
                    mask=live[:, None] & ((k0 + rk)[None, :] < H), other=0.0).to(tl.float32)
        w1 = _fp4_tile(w_e, s_e, n0, rn, k0, INTER, H, swr, swc, ssr, ssc, BLOCK_N, BLOCK_K)
        w3 = _fp4_tile(w_e, s_e, INTER + n0, rn, k0, 2 * INTER, H, swr, swc, ssr, ssc, BLOCK_N, BLOCK_K)
        gate += tl.dot(x, tl.trans(w1), input_precision=DOT)
        up += tl.dot(x, tl.trans(w3), input_precision=DOT)
    if limit > 0:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    routed = tl.load(wt_ptr + pairs, mask=live, other=0.0)
    h = gate / (1.0 + tl.exp(-gate)) * up * routed[:, None]
    cols = n0 + rn
    tl.store(h_ptr + pairs[:, None] * shp + cols[None, :] * shi, h, mask=live[:, None] & (cols[None, :] < INTER))


@triton.jit
def _down_kernel(h_ptr, tok_ptr, blk_ptr, w_ptr, s_ptr, o_ptr, H, INTER,
                 shp, shi, swe, swr, swc, sse, ssr, ssc, sop, soh,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(blk_ptr + pid_b)
    pairs = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    live = tl.load(tok_ptr + pairs) >= 0
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n0 = pid_n * BLOCK_N
    w_e, s_e = w_ptr + expert * swe, s_ptr + expert * sse
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        h = tl.load(h_ptr + pairs[:, None] * shp + (k0 + rk)[None, :] * shi,
                    mask=live[:, None] & ((k0 + rk)[None, :] < INTER), other=0.0)
        w = _fp4_tile(w_e, s_e, n0, rn, k0, H, INTER, swr, swc, ssr, ssc, BLOCK_N, BLOCK_K)
        acc += tl.dot(h, tl.trans(w), input_precision=DOT)
    cols = n0 + rn
    tl.store(o_ptr + pairs[:, None] * sop + cols[None, :] * soh, acc, mask=live[:, None] & (cols[None, :] < H))


def align_pairs(idx: torch.Tensor, weights: torch.Tensor, num_experts: int, block_m: int):
    """Sort (token, slot) pairs by expert, pad each expert's run to a multiple of block_m.
    Pairs with expert id == num_experts belong to another rank and are dropped.
    Returns (token per padded row or -1, routing weight per row, expert per block, pair id
    per row (token*k + slot) or -1)."""
    T, k = idx.shape
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts + 1)[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    firsts = torch.cumsum(counts, 0) - counts
    sorted_experts = flat[order]
    ours = sorted_experts < num_experts
    expert = sorted_experts.clamp_max(num_experts - 1)
    rank = torch.arange(flat.numel(), device=idx.device) - firsts[expert]
    total = int(padded.sum())  # one host sync: the grid size
    dest = torch.where(ours, starts[expert] + rank, total)  # row `total`: a spare, cut off below
    tokens = torch.full((total + 1,), -1, dtype=torch.int32, device=idx.device)
    pair_ids = torch.full((total + 1,), -1, dtype=torch.long, device=idx.device)
    routed = torch.zeros(total + 1, dtype=torch.float32, device=idx.device)
    tokens[dest] = (order // k).to(torch.int32)
    pair_ids[dest] = order
    routed[dest] = weights.reshape(-1)[order].float()
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=idx.device), padded // block_m)
    return tokens[:total], routed[:total], block_expert.to(torch.int32), pair_ids[:total]


def fp4_moe(x, idx, weights, w13, s13, w2, s2, limit: float) -> torch.Tensor:
    """x [T, H], idx/weights [T, k]; stacked packed experts. Returns [T, H] fp32."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    assert w13.dtype == torch.uint8 and w13.shape[2] * 2 == H and w2.shape == (E, H, inter // 2)
    assert s13.shape == (E, two_i, H // 32) and s2.shape == (E, H, inter // 32)
    block_m, block_n, block_k = 16, 64, 32
    tokens, routed, block_expert, pair_ids = align_pairs(idx, weights, E, block_m)
    rows = tokens.numel()
    h = torch.empty(rows, inter, dtype=torch.float32, device=x.device)
    o = torch.empty(rows, H, dtype=torch.float32, device=x.device)
    blocks = rows // block_m
    _gate_up_kernel[(blocks, triton.cdiv(inter, block_n))](
        x, tokens, routed, block_expert, w13, s13, h, H, inter, float(limit),
        x.stride(0), x.stride(1), w13.stride(0), w13.stride(1), w13.stride(2), s13.stride(0), s13.stride(1),
        s13.stride(2), h.stride(0), h.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    _down_kernel[(blocks, triton.cdiv(H, block_n))](
        h, tokens, block_expert, w2, s2, o, H, inter, h.stride(0), h.stride(1), w2.stride(0), w2.stride(1),
        w2.stride(2), s2.stride(0), s2.stride(1), s2.stride(2), o.stride(0), o.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    per_pair = torch.zeros(T * idx.shape[1], H, dtype=torch.float32, device=x.device)
    live = pair_ids >= 0
    per_pair[pair_ids[live]] = o[live]
    return per_pair.view(T, idx.shape[1], H).sum(dim=1)
