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
A byte's two codes are weights of columns 2c and 2c+1, so the dot runs as two half-width
dots (even columns with low nibbles, odd with high): no interleaving of registers, which
Triton 3.6 compiled wrongly on the H200 elsewhere. Each program computes the transposed
product, W x^T: the decoded weight tile is the dot's left operand as it stands (64 weight
rows fill a Hopper warpgroup MMA), and only the few activation rows are read transposed.
Codes are decoded with integer operations (common.e2m1_to_float); a 16-entry table in global
memory made the kernel 2.2x slower on the H200 than the exp2 decoding before it (7.2 vs 3.3 ms).
Nothing here waits for the GPU: the grid is sized for the worst case of the batch's shape
(every expert's run padded), and blocks past the real runs return at once, so a decode step
can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant import dequantize_fp4_weight
from .common import dot_exact_lhs, e2m1_to_float, interpreting


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
def _half_dots(w_ptr, s_ptr, rows, n_rows, a_ptr, a_cols, a_live, sak, kb, K, swr, ssr, acc,
               BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr):
    """acc + W[rows, 2c:2c+2] . a^T[2c:2c+2, :] summed over the BLOCK_KB bytes c from kb, as
    [BLOCK_N, BLOCK_M]: the weight's bytes are read once and decoded as two half tiles, each
    the left operand of its dot as decoded (the activations are read transposed instead)."""
    c = kb + tl.arange(0, BLOCK_KB)
    in_k = 2 * c < K
    a_mask = in_k[:, None] & a_live[None, :]
    a_even = tl.load(a_ptr + (2 * c)[:, None] * sak + a_cols[None, :], mask=a_mask, other=0.0).to(tl.float32)
    a_odd = tl.load(a_ptr + (2 * c + 1)[:, None] * sak + a_cols[None, :], mask=a_mask, other=0.0).to(tl.float32)
    row_ok = rows < n_rows
    packed = tl.load(w_ptr + rows[:, None] * swr + c[None, :], mask=row_ok[:, None] & in_k[None, :],
                     other=0).to(tl.int32)
    # one e8m0 scale per 32 columns = 16 bytes: 2^(e-127) is the float whose exponent field is e
    # (for e >= 1; e = 0 reads as 0 instead of 2^-127)
    g = kb // 16 + tl.arange(0, BLOCK_KB // 16)
    sbyte = tl.load(s_ptr + rows[:, None] * ssr + g[None, :], mask=row_ok[:, None] & (g * 32 < K)[None, :], other=127)
    scale = (sbyte.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_KB // 16, 16)), (BLOCK_N, BLOCK_KB))
    acc = dot_exact_lhs(e2m1_to_float(packed & 0xF) * scale, a_even, acc)
    return dot_exact_lhs(e2m1_to_float(packed >> 4) * scale, a_odd, acc)


@triton.jit
def _gate_up_kernel(x_ptr, tok_ptr, wt_ptr, blk_ptr, w_ptr, s_ptr, h_ptr, H, INTER, limit,
                    sxt, sxh, swe, swr, sse, ssr, shp, shi,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr):
    """Program (block of pairs, N tile): h^T[rows, pairs] of one expert."""
    pid_b = tl.program_id(0)
    expert = tl.load(blk_ptr + pid_b)
    if expert < 0:  # past the last real run of this batch
        return
    pairs = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    tokens = tl.load(tok_ptr + pairs)
    live = tokens >= 0
    x_cols = tokens.to(tl.int64) * sxt
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e, s_e = w_ptr + expert.to(tl.int64) * swe, s_ptr + expert.to(tl.int64) * sse
    gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(0, H // 2, BLOCK_KB):
        gate = _half_dots(w_e, s_e, rows, INTER, x_ptr, x_cols, live, sxh, kb, H, swr, ssr, gate, BLOCK_N, BLOCK_KB)
        up = _half_dots(w_e + INTER * swr, s_e + INTER * ssr, rows, INTER, x_ptr, x_cols, live, sxh, kb, H, swr, ssr,
                        up, BLOCK_N, BLOCK_KB)
    if limit > 0:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    routed = tl.load(wt_ptr + pairs, mask=live, other=0.0)
    h = gate / (1.0 + tl.exp(-gate)) * up * routed[None, :]
    tl.store(h_ptr + pairs[None, :] * shp + rows[:, None] * shi, h, mask=live[None, :] & (rows[:, None] < INTER))


@triton.jit
def _down_kernel(h_ptr, tok_ptr, pair_ptr, blk_ptr, w_ptr, s_ptr, o_ptr, H, INTER,
                 shp, shi, swe, swr, sse, ssr, sop, soh,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr):
    """Program (block of pairs, N tile): o^T[rows, pairs], stored at each pair's own row."""
    pid_b = tl.program_id(0)
    expert = tl.load(blk_ptr + pid_b)
    if expert < 0:
        return
    pairs = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    live = tl.load(tok_ptr + pairs) >= 0
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e, s_e = w_ptr + expert.to(tl.int64) * swe, s_ptr + expert.to(tl.int64) * sse
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(0, INTER // 2, BLOCK_KB):
        acc = _half_dots(w_e, s_e, rows, H, h_ptr, pairs.to(tl.int64) * shp, live, shi, kb, INTER, swr, ssr, acc,
                         BLOCK_N, BLOCK_KB)
    # straight to the pair's own row of the output: no gather pass afterwards
    dest = tl.load(pair_ptr + pairs, mask=live, other=0).to(tl.int64)
    tl.store(o_ptr + dest[None, :] * sop + rows[:, None] * soh, acc, mask=live[None, :] & (rows[:, None] < H))


# Tile shape and launch options per block height (bench/h200.py --sections moe_tiles sweeps them).
TILES = {  # H200, 2026-11-30, the best of 9 shapes at 6, 48 and 8192 tokens
    16: dict(BLOCK_N=64, BLOCK_KB=64, num_warps=4, num_stages=3),  # 1.64 ms at 6 tokens, 3.0 ms at 48
    64: dict(BLOCK_N=64, BLOCK_KB=64, num_warps=4, num_stages=3),  # 109 ms at 8192 tokens
    "interpreter": dict(BLOCK_N=64, BLOCK_KB=16),
}


class RoutePlan:
    """The batch's (token, expert) pairs sorted by expert into blocks of `block_m` rows, in
    tensors of a size fixed by (pairs, experts, block_m) alone, built without a host sync:
    tokens / pair_ids / routed: per row the token, its pair (token*k + slot) and the routing
    weight, or -1 / -1 / 0 for padding; block_expert: per block its expert, -1 past the end.
    Pairs whose expert id is E (another rank's) are left out."""

    def __init__(self, idx: torch.Tensor, weights: torch.Tensor, num_experts: int, block_m: int):
        E, dev = num_experts, idx.device
        k = idx.shape[1]
        flat = idx.reshape(-1).long()
        P = flat.numel()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))[:E]
        padded = (counts + block_m - 1) // block_m * block_m
        ends = torch.cumsum(padded, 0)
        firsts = torch.cumsum(counts, 0) - counts
        sorted_experts = flat[order]
        expert = sorted_experts.clamp_max(E - 1)
        self.rows = triton.cdiv(P + min(E, P) * (block_m - 1), block_m) * block_m  # every run padded
        rank = torch.arange(P, device=dev) - firsts[expert]
        dest = torch.where(sorted_experts < E, ends[expert] - padded[expert] + rank, self.rows)  # spare row
        self.tokens = self._scatter(dest, (order // k).to(torch.int32), -1)
        self.pair_ids = self._scatter(dest, order.to(torch.int32), -1)
        self.routed = self._scatter(dest, weights.reshape(-1)[order].float(), 0)
        block_start = torch.arange(0, self.rows, block_m, device=dev)
        owner = torch.searchsorted(ends, block_start, right=True)  # first expert whose run ends past it
        self.block_expert = torch.where(block_start < ends[-1], owner, -1).to(torch.int32)

    def _scatter(self, dest: torch.Tensor, values: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((self.rows + 1,), fill, dtype=values.dtype, device=values.device)
        out[dest] = values
        return out[: self.rows]


def fp4_moe(x, idx, weights, w13, s13, w2, s2, limit: float) -> torch.Tensor:
    """x [T, H], idx/weights [T, k]; stacked packed experts. Returns [T, H] fp32."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    assert w13.dtype == torch.uint8 and w13.shape[2] * 2 == H and w2.shape == (E, H, inter // 2)
    assert s13.shape == (E, two_i, H // 32) and s2.shape == (E, H, inter // 32)
    assert w13.stride(2) == 1 and w2.stride(2) == 1 and s13.stride(2) == 1 and s2.stride(2) == 1
    pairs = idx.numel()
    if pairs == 0:
        return torch.zeros(T, H, dtype=torch.float32, device=x.device)
    # Decode: a few pairs per expert, so short blocks; prefill: many, so each decoded weight
    # tile serves more rows.
    block_m = 16 if pairs < 16 * E else 64
    tiles = TILES["interpreter" if interpreting() else block_m]
    plan = RoutePlan(idx, weights, E, block_m)
    h = torch.empty(plan.rows, inter, dtype=torch.float32, device=x.device)
    out = torch.zeros(pairs, H, dtype=torch.float32, device=x.device)  # other ranks' pairs stay 0
    blocks = plan.rows // block_m
    _gate_up_kernel[(blocks, triton.cdiv(inter, tiles["BLOCK_N"]))](
        x, plan.tokens, plan.routed, plan.block_expert, w13, s13, h, H, inter, float(limit),
        x.stride(0), x.stride(1), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), h.stride(0), h.stride(1),
        BLOCK_M=block_m, **tiles)
    _down_kernel[(blocks, triton.cdiv(H, tiles["BLOCK_N"]))](
        h, plan.tokens, plan.pair_ids, plan.block_expert, w2, s2, out, H, inter, h.stride(0), h.stride(1),
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=block_m, **tiles)
    return out.view(T, idx.shape[1], H).sum(dim=1)
