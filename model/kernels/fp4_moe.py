"""Routed experts of a batch in two grouped GEMMs over packed FP4 weights.

Shapes: T tokens, k experts per token, P = T*k (token, expert) pairs, E experts, H hidden,
I expert width. Weights stay packed: w13 [E, 2I, H/2] (w1 rows then w3 rows, two e2m1 codes
per byte, low nibble first) with e8m0 scales [E, 2I, H/32]; w2 [E, H, I/2] with [E, H, I/32].
Pairs are sorted by expert and padded to blocks of BLOCK_M, so each program multiplies one
expert's rows:
  1. h[p] = w_p * silu(min(x W1^T, L)) * clamp(x W3^T, -L, L)     [P, I]
  2. o[p] = h[p] W2^T                                              [P, H]
and the token outputs are o summed over each token's k pairs (deterministic, no atomics).
Hopper has no FP4 tensor cores: codes are decoded in registers, scaled, then dotted on bf16
tensor cores. An e2m1 value times a power of two is exact in bf16, and bf16 products are exact
in the fp32 accumulator, so the activations go in as 3 bf16 parts that sum to their fp32
values (bf16_parts): the result has fp32 accuracy. On the GPU the codes are decoded by a few
PTX instructions per four bytes (common.e2m1_pairs): the main loop runs 8 instructions per
weight (SASS for sm_90), where the arithmetic fp32 decoding before it ran 20 and was ALU-bound
(6 tokens on the H200: 1.76-1.97 ms then, 0.76-1.17 ms now).
A byte's two codes are weights of columns 2c and 2c+1, so the dot runs as two half-width
dots (even columns with low nibbles, odd with high): no interleaving of registers, which
Triton 3.6 compiled wrongly on the H200 elsewhere. The activations are stored the same way,
even columns then odd, so every load is a contiguous 16-byte vector. Each program computes the
transposed product, W x^T: the decoded weight tile is the dot's left operand as it stands (64
weight rows fill a Hopper warpgroup MMA), and only the few activation rows are read transposed.
Nothing here waits for the GPU: the grid is sized for the worst case of the batch's shape
(every expert's run padded), and blocks past the real runs return at once, so a decode step
can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..quant import dequantize_fp4_weight
from .common import DOT, bf16_parts, e2m1_pairs, interpreting


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
def _expert_dots(w_ptr, s_ptr, rows, n_rows, a_ptr, a_cols, a_live, sap, sah, kb, K, swr, ssr, acc,
                 SPLITS: tl.constexpr, PTX: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr):
    """acc + W[rows, 2c:2c+2] . a^T[2c:2c+2, :] summed over the BLOCK_KB bytes c from kb, as
    [BLOCK_N, BLOCK_M]: the weight's bytes are read once and decoded as two half tiles (even
    and odd columns), each the left operand of its dots as decoded. The activations a come as
    SPLITS bf16 parts that sum to the fp32 values, each part in two halves, even columns then
    odd (stride sah), so that both halves are read contiguously; a_cols offsets each row."""
    c = kb + tl.arange(0, BLOCK_KB)
    in_k = c < K // 2  # not 2 * c < K: this form lets the loads below be 16-byte vectors
    row_ok = rows < n_rows
    packed = tl.load(w_ptr + rows[:, None] * swr + c[None, :], mask=row_ok[:, None] & in_k[None, :], other=0)
    g = kb // 16 + tl.arange(0, BLOCK_KB // 16)  # one e8m0 scale per 32 columns = 16 bytes
    exps = tl.load(s_ptr + rows[:, None] * ssr + g[None, :], mask=row_ok[:, None] & (g * 32 < K)[None, :], other=0)
    exps = tl.reshape(tl.broadcast_to(exps[:, :, None], (BLOCK_N, BLOCK_KB // 16, 16)), (BLOCK_N, BLOCK_KB))
    w_even, w_odd = e2m1_pairs(packed, exps, PTX)
    a_mask = in_k[:, None] & a_live[None, :]
    for p in tl.static_range(SPLITS):
        at = a_ptr + p * sap + c[:, None] + a_cols[None, :]
        a_even = tl.load(at, mask=a_mask, other=0.0)
        a_odd = tl.load(at + sah, mask=a_mask, other=0.0)
        if PTX:  # bf16 x bf16 products are exact in the fp32 accumulator
            acc = tl.dot(w_odd, a_odd, tl.dot(w_even, a_even, acc))
        else:
            acc = tl.dot(w_even, a_even.to(tl.float32), acc, input_precision=DOT)
            acc = tl.dot(w_odd, a_odd.to(tl.float32), acc, input_precision=DOT)
    return acc


@triton.jit
def _gate_up_kernel(x_ptr, tok_ptr, wt_ptr, blk_ptr, w_ptr, s_ptr, h_ptr, H, INTER, limit,
                    sxs, sxh, sxt, swe, swr, sse, ssr, shs, shh, shp,
                    SPLITS: tl.constexpr, PTX: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr):
    """Program (block of pairs, N tile): h^T[rows, pairs] of one expert, stored as SPLITS bf16
    parts for the down projection."""
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
        gate = _expert_dots(w_e, s_e, rows, INTER, x_ptr, x_cols, live, sxs, sxh, kb, H, swr, ssr, gate,
                            SPLITS, PTX, BLOCK_N, BLOCK_KB)
        up = _expert_dots(w_e + INTER * swr, s_e + INTER * ssr, rows, INTER, x_ptr, x_cols, live, sxs, sxh, kb, H,
                          swr, ssr, up, SPLITS, PTX, BLOCK_N, BLOCK_KB)
    if limit > 0:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    routed = tl.load(wt_ptr + pairs, mask=live, other=0.0)
    rest = gate / (1.0 + tl.exp(-gate)) * up * routed[None, :]
    at = h_ptr + pairs[None, :] * shp + (rows % 2 * shh + rows // 2)[:, None]  # even rows, then odd
    for p in tl.static_range(SPLITS):
        part = rest.to(tl.bfloat16)
        tl.store(at + p * shs, part, mask=live[None, :] & (rows[:, None] < INTER))
        rest -= part.to(tl.float32)


@triton.jit
def _down_kernel(h_ptr, tok_ptr, pair_ptr, blk_ptr, w_ptr, s_ptr, o_ptr, H, INTER,
                 shs, shh, shp, swe, swr, sse, ssr, sop, soh,
                 SPLITS: tl.constexpr, PTX: tl.constexpr,
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
        acc = _expert_dots(w_e, s_e, rows, H, h_ptr, pairs.to(tl.int64) * shp, live, shs, shh, kb, INTER, swr, ssr,
                           acc, SPLITS, PTX, BLOCK_N, BLOCK_KB)
    # straight to the pair's own row of the output: no gather pass afterwards
    dest = tl.load(pair_ptr + pairs, mask=live, other=0).to(tl.int64)
    tl.store(o_ptr + dest[None, :] * sop + rows[:, None] * soh, acc, mask=live[None, :] & (rows[:, None] < H))


# bf16 parts the activations are split into: 3 carry fp32 exactly, 2 carry 16 significant bits.
SPLITS = int(os.environ.get("DSFLASH_MOE_SPLITS", "3"))

# Tile shape and launch options per block height (bench/h200.py --sections moe_tiles sweeps them).
TILES = {  # H200, 2026-11-30: the best of 9 shapes at 6 and 48 tokens (16) and 8,192 tokens (64, 128)
    16: dict(BLOCK_N=64, BLOCK_KB=64, num_warps=4, num_stages=3),  # 0.76-1.17 ms at 6 tokens, 1.18 ms at 48
    64: dict(BLOCK_N=128, BLOCK_KB=32, num_warps=4, num_stages=2),  # 32.1 ms at 8,192 tokens
    128: dict(BLOCK_N=128, BLOCK_KB=64, num_warps=8, num_stages=2),  # 28.3 ms at 8,192 tokens
    "interpreter": dict(BLOCK_N=64, BLOCK_KB=16),
}


def block_height(pairs: int, experts: int) -> int:
    """Rows of pairs per program: decode has a few pairs per expert, so short blocks; prefill
    has many, and a taller block decodes each weight tile once for more of them."""
    per_expert = pairs / experts
    return 16 if per_expert < 16 else 64 if per_expert < 256 else 128


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


def fp4_moe(x, idx, weights, w13, s13, w2, s2, limit: float, block_m: int | None = None) -> torch.Tensor:
    """x [T, H], idx/weights [T, k]; stacked packed experts. Returns [T, H] fp32. block_m
    overrides the block height (a benchmark's choice)."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    assert w13.dtype == torch.uint8 and w13.shape[2] * 2 == H and w2.shape == (E, H, inter // 2)
    assert s13.shape == (E, two_i, H // 32) and s2.shape == (E, H, inter // 32)
    assert w13.stride(2) == 1 and w2.stride(2) == 1 and s13.stride(2) == 1 and s2.stride(2) == 1
    pairs = idx.numel()
    if pairs == 0:
        return torch.zeros(T, H, dtype=torch.float32, device=x.device)
    block_m = block_m or block_height(pairs, E)
    tiles = TILES["interpreter" if interpreting() else block_m]
    plan = RoutePlan(idx, weights, E, block_m)
    parts = bf16_parts(torch.stack((x[:, 0::2], x[:, 1::2])), SPLITS)  # [SPLITS, 2, T, H/2]
    h = torch.empty(SPLITS, 2, plan.rows, inter // 2, dtype=torch.bfloat16, device=x.device)
    out = torch.zeros(pairs, H, dtype=torch.float32, device=x.device)  # other ranks' pairs stay 0
    blocks = plan.rows // block_m
    ptx = not interpreting()
    _gate_up_kernel[(blocks, triton.cdiv(inter, tiles["BLOCK_N"]))](
        parts, plan.tokens, plan.routed, plan.block_expert, w13, s13, h, H, inter, float(limit), *parts.stride()[:3],
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), *h.stride()[:3],
        SPLITS=SPLITS, PTX=ptx, BLOCK_M=block_m, **tiles)
    _down_kernel[(blocks, triton.cdiv(H, tiles["BLOCK_N"]))](
        h, plan.tokens, plan.pair_ids, plan.block_expert, w2, s2, out, H, inter, *h.stride()[:3],
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), out.stride(0), out.stride(1),
        SPLITS=SPLITS, PTX=ptx, BLOCK_M=block_m, **tiles)
    return out.view(T, idx.shape[1], H).sum(dim=1)
