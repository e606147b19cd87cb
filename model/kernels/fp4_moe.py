"""Routed experts of a batch in two grouped GEMMs over packed FP4 weights.

Shapes: T tokens, k experts per token, P = T*k (token, expert) pairs, E experts, H hidden,
I expert width. Weights stay packed, as quad units (common.quad_units: four e2m1 codes in 16
bits, rearranged from the checkpoint's bytes once, when a layer's experts are stacked):
w13 [E, 2I, H/4] (w1 rows then w3 rows) with e8m0 scales [E, 2I, H/32]; w2 [E, H, I/4] with
[E, H, I/32].
Pairs are sorted by expert and padded to blocks of BLOCK_M, so each program multiplies one
expert's rows:
  1. h[p] = w_p * silu(min(x W1^T, L)) * clamp(x W3^T, -L, L)     [P, I]
  2. o[p] = h[p] W2^T                                              [P, H]
and the token outputs are o summed over each token's k pairs (deterministic, no atomics).
Hopper has no FP4 tensor cores: codes are decoded in registers, scaled, then dotted on bf16
tensor cores. An e2m1 value times a power of two is exact in bf16, and bf16 products are exact
in the fp32 accumulator, so the activations go in as 3 bf16 parts that sum to their fp32
values (bf16_parts): the result has fp32 accuracy.
Each unit is decoded as four tiles (code t of every unit: columns 4c + t) by a few PTX
instructions (common.e2m1_quads): a thread's two neighbouring units decode straight into the
bf16 pairs a tensor-core operand holds, 11 integer instructions and 4 multiplies per 8 values.
Decode blocks (at most 4 pairs: batch 1) are bound by that work (the weights are read once for
a few columns); their few pairs put each pair's three parts side by side as dot columns
(4 pairs x 4 slots), one dot where three ran. The activations are stored the same way as the
codes (piece t holding columns 4c + t), so every load is a contiguous vector. Each program
computes the transposed product, W x^T: the decoded weight tile is the dot's left operand as
it stands (64 weight rows fill a Hopper warpgroup MMA), and only the few activation rows are
read transposed. Triton's pipeliner prefetches every load of the K loop that moves 4 bytes or
more a thread; the e8m0 scales (1-8 bytes a row and step) are read as int32 words where that
paid (faithful prefill's tile), and bytes, each waiting out its round trip, elsewhere.
Nothing here waits for the GPU: the grid is sized for the worst case of the batch's shape
(every expert's run padded), and blocks past the real runs return at once, so a decode step
can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..quant import dequantize_fp4_weight, fake_quant_fp8
from . import pdl
from .common import (DOT, bf16_parts, byte_words, e2m1_quads, interpreting, mma_sync, quad_scales, quad_units,
                     scale_bytes_within, step_scales)
from .pair_sums import own_pair_sums
from .quantize import fp8_blocks, fp8_grid_bf16
from .swiglu import clamped_swiglu_tile


def fp4_moe_ref(x, idx, weights, w13, s13, w2, s2, limit: float, act_quant: bool = False) -> torch.Tensor:
    """Plain torch over exactly dequantized experts (the oracle), from the checkpoint's bytes
    (w13 [E, 2I, H/2], w2 [E, H, I/2]). act_quant: the down projection's input is rounded onto
    the FP8 grid first (the reference's faithful mode)."""
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
        if act_quant:
            h = fake_quant_fp8(h)
        y.index_add_(0, rows, h @ dequantize_fp4_weight(w2[e], s2[e]).T)
    return y


@triton.jit
def _expert_dots(w_ptr, s_ptr, rows, n_rows, a_ptr, a_cols, a_live, sap, saq, ku, KU, swr, ssr, acc,
                 PARTS: tl.constexpr, PIECES: tl.constexpr, PTX: tl.constexpr, SMALL: tl.constexpr,
                 VECTORS: tl.constexpr, SCALE_WORDS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KU: tl.constexpr):
    """acc + W[rows, cols] . a^T[cols, :] over the weight units ku .. ku + BLOCK_KU, as
    [BLOCK_N, columns]. A unit (int16) holds PIECES = 4 codes; it is read once and decoded as
    4 tiles, tile t holding the code of column 4c + t of every unit c, each the left operand of
    its dot as decoded. The activations a come as PARTS bf16 slices (stride sap) that sum to
    the fp32 values (or as one slice whose columns are the parts, PARTS = 1), each in PIECES
    pieces laid out the same way (piece stride saq), so that every piece is read contiguously;
    a_cols offsets each column.
    VECTORS: KU is whole steps and every column of a starts on 16 bytes (no column masks, and
    the loads of a are vectors). SCALE_WORDS: the scales come as int32 words (s_ptr and ssr in
    words). Triton's pipeliner prefetches loads of 4 bytes or more a thread; single scale bytes
    it loads inside the loop, each waiting out a DRAM round trip."""
    c = ku + tl.arange(0, BLOCK_KU)
    in_k = c < KU
    row_ok = rows < n_rows
    if VECTORS:
        units = tl.load(w_ptr + rows[:, None] * swr + c[None, :], mask=row_ok[:, None], other=0)
        a_cols = tl.multiple_of(a_cols, 8)
        a_mask = a_live[None, :]
    else:
        units = tl.load(w_ptr + rows[:, None] * swr + c[None, :], mask=row_ok[:, None] & in_k[None, :], other=0)
        a_mask = in_k[:, None] & a_live[None, :]
    per_scale: tl.constexpr = 32 // PIECES  # one e8m0 scale per 32 columns
    n_scales: tl.constexpr = BLOCK_KU // per_scale
    if SCALE_WORDS:
        exps = step_scales(s_ptr + rows * ssr, ku // per_scale, KU // per_scale // 4, row_ok, 0, BLOCK_N, n_scales)
    else:
        g = ku // per_scale + tl.arange(0, n_scales)
        exps = tl.load(s_ptr + rows[:, None] * ssr + g[None, :],
                       mask=row_ok[:, None] & (g * per_scale < KU)[None, :], other=0)
    scales = quad_scales(exps.to(tl.int32), PTX, SMALL)  # once a scale, then spread over its units
    scales = tl.reshape(tl.broadcast_to(scales[:, :, None], (BLOCK_N, n_scales, per_scale)), (BLOCK_N, BLOCK_KU))
    w = e2m1_quads(units, scales, PTX, SMALL)
    for p in tl.static_range(PARTS):
        for t in tl.static_range(PIECES):
            a = tl.load(a_ptr + p * sap + t * saq + c[:, None] + a_cols[None, :], mask=a_mask, other=0.0)
            if PTX:  # bf16 x bf16 products are exact in the fp32 accumulator
                acc = tl.dot(w[t], a, acc)
            else:
                acc = tl.dot(w[t], a.to(tl.float32), acc, input_precision=DOT)
    return acc


@triton.jit
def _columns(pid_b, tok_ptr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, SLOTS: tl.constexpr):
    """The dot's columns for a block of BLOCK_M pairs: SLOTS columns per pair, one per bf16
    part of its activations when SLOTS > 1 (the last slots past SPLITS stay empty). Returns
    each column's pair row, token and part, and whether it holds data."""
    j = tl.arange(0, BLOCK_M * SLOTS)
    pairs = pid_b * BLOCK_M + j // SLOTS
    tokens = tl.load(tok_ptr + pairs)
    part = j % SLOTS
    return pairs, tokens, part, (tokens >= 0) & (part < SPLITS)


@triton.jit
def _per_pair(acc, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SLOTS: tl.constexpr):
    """[BLOCK_N, BLOCK_M * SLOTS] partial products -> [BLOCK_N, BLOCK_M]: each pair's parts summed."""
    if SLOTS == 1:
        return acc
    return tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_M, SLOTS)), axis=2)


@triton.jit
def _gate_up_kernel(x_ptr, tok_ptr, wt_ptr, blk_ptr, w_ptr, s_ptr, h_ptr, H, INTER, limit,
                    sxs, sxq, sxt, swe, swr, sse, ssr, shs, shq, shp,
                    SPLITS: tl.constexpr, SLOTS: tl.constexpr, PIECES: tl.constexpr, PTX: tl.constexpr,
                    SMALL: tl.constexpr, ACT_QUANT: tl.constexpr, VECTORS: tl.constexpr, SCALE_WORDS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KU: tl.constexpr, PDL: tl.constexpr):
    """Program (block of pairs, N tile): h^T[rows, pairs] of one expert, stored as SPLITS bf16
    parts for the down projection (in PIECES pieces of every PIECES-th column, as x comes).
    ACT_QUANT: h rounded onto the FP8 grid in blocks of 32 of its rows (a tile holds whole blocks)."""
    pdl.wait_for_inputs(PDL)
    pid_b = tl.program_id(0)
    expert = tl.load(blk_ptr + pid_b)
    if expert < 0:  # past the last real run of this batch
        return
    col_pairs, col_tokens, col_part, col_live = _columns(pid_b, tok_ptr, SPLITS, BLOCK_M, SLOTS)
    x_cols = col_tokens.to(tl.int64) * sxt + col_part * sxs
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e, s_e = w_ptr + expert.to(tl.int64) * swe, s_ptr + expert.to(tl.int64) * sse
    gate = tl.zeros((BLOCK_N, BLOCK_M * SLOTS), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_M * SLOTS), dtype=tl.float32)
    parts: tl.constexpr = SPLITS if SLOTS == 1 else 1
    for ku in range(0, H // PIECES, BLOCK_KU):
        gate = _expert_dots(w_e, s_e, rows, INTER, x_ptr, x_cols, col_live, sxs, sxq, ku, H // PIECES, swr, ssr,
                            gate, parts, PIECES, PTX, SMALL, VECTORS, SCALE_WORDS, BLOCK_N, BLOCK_KU)
        up = _expert_dots(w_e + INTER * swr, s_e + INTER * ssr, rows, INTER, x_ptr, x_cols, col_live, sxs, sxq, ku,
                          H // PIECES, swr, ssr, up, parts, PIECES, PTX, SMALL, VECTORS, SCALE_WORDS, BLOCK_N, BLOCK_KU)
    gate = _per_pair(gate, BLOCK_N, BLOCK_M, SLOTS)
    up = _per_pair(up, BLOCK_N, BLOCK_M, SLOTS)
    pairs = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    live = tl.load(tok_ptr + pairs) >= 0
    routed = tl.load(wt_ptr + pairs, mask=live, other=0.0)
    rest = clamped_swiglu_tile(gate, up, limit) * routed[None, :]
    if ACT_QUANT:
        blocks = tl.reshape(tl.trans(rest), (BLOCK_M * BLOCK_N // 32, 32))
        rest = tl.trans(tl.reshape(fp8_blocks(blocks)[1], (BLOCK_M, BLOCK_N)))
    at = h_ptr + pairs[None, :] * shp + (rows % PIECES * shq + rows // PIECES)[:, None]  # the down projection's pieces
    for p in tl.static_range(SPLITS):
        part = rest.to(tl.bfloat16)
        tl.store(at + p * shs, part, mask=live[None, :] & (rows[:, None] < INTER))
        rest -= part.to(tl.float32)


@triton.jit
def _down_kernel(h_ptr, tok_ptr, pair_ptr, blk_ptr, w_ptr, s_ptr, o_ptr, H, INTER,
                 shs, shq, shp, swe, swr, sse, ssr, sop, soh,
                 SPLITS: tl.constexpr, SLOTS: tl.constexpr, PIECES: tl.constexpr, PTX: tl.constexpr,
                 SMALL: tl.constexpr, VECTORS: tl.constexpr, SCALE_WORDS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_KU: tl.constexpr, PDL: tl.constexpr):
    """Program (block of pairs, N tile): o^T[rows, pairs], stored at each pair's own row."""
    pdl.wait_for_inputs(PDL)
    pid_b = tl.program_id(0)
    expert = tl.load(blk_ptr + pid_b)
    if expert < 0:
        return
    col_pairs, col_tokens, col_part, col_live = _columns(pid_b, tok_ptr, SPLITS, BLOCK_M, SLOTS)
    h_cols = col_pairs.to(tl.int64) * shp + col_part * shs
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e, s_e = w_ptr + expert.to(tl.int64) * swe, s_ptr + expert.to(tl.int64) * sse
    acc = tl.zeros((BLOCK_N, BLOCK_M * SLOTS), dtype=tl.float32)
    parts: tl.constexpr = SPLITS if SLOTS == 1 else 1
    for ku in range(0, INTER // PIECES, BLOCK_KU):
        acc = _expert_dots(w_e, s_e, rows, H, h_ptr, h_cols, col_live, shs, shq, ku, INTER // PIECES, swr, ssr, acc,
                           parts, PIECES, PTX, SMALL, VECTORS, SCALE_WORDS, BLOCK_N, BLOCK_KU)
    acc = _per_pair(acc, BLOCK_N, BLOCK_M, SLOTS)
    # straight to the pair's own row of the output: no gather pass afterwards
    pairs = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    live = tl.load(tok_ptr + pairs) >= 0
    dest = tl.load(pair_ptr + pairs, mask=live, other=0).to(tl.int64)
    tl.store(o_ptr + dest[None, :] * sop + rows[:, None] * soh, acc, mask=live[None, :] & (rows[:, None] < H))


# bf16 parts the activations are split into: 3 carry fp32 exactly, 2 carry 16 significant bits.
SPLITS = int(os.environ.get("DSFLASH_MOE_SPLITS", "3"))
# Blocks of at most this many pairs put each pair's parts side by side as columns of one dot
# (4 pairs x 4 slots = the 16 columns a dot needs at least): one dot per weight tile where
# looping over the parts took three. Decode steps route 1-2 pairs to most experts.
PARTS_AS_COLUMNS = 4
# With three parts (exact mode) up to this many: 8 or 16 pairs x 4 slots, one dot of 32 or 64
# columns against three of 16 rows each. H200, 2026-12-04 (bench/moe_block_heights.py, a layer
# of the release's widths, 48 experts, in a CUDA graph): 6 pairs an expert (batch 8) 900 us in
# 16 tall rows -> 567 in 8 short ones (644 in 16 short); 12 pairs (batch 16) 999 -> 734 in 16
# short (842 in 8); 24 pairs (batch 32) 1,807 -> 1,310 (1,417 in 32 tall rows). One part fills
# only one slot of four: faithful mode keeps its tall blocks.
PARTS_AS_COLUMNS_SPLIT = 16


def parts_as_columns(block_m: int, splits: int) -> bool:
    """Whether a block of block_m pairs puts its pairs' `splits` parts side by side as columns."""
    return block_m <= (PARTS_AS_COLUMNS if splits == 1 else PARTS_AS_COLUMNS_SPLIT)

# Codes a weight unit holds (common.quad_units), and so the pieces the activations come in.
PIECES = 4


# Tile shape and launch options per block height, BLOCK_KU in units of 4 codes (bench/h200.py
# --sections moe_tiles sweeps them). The codes a step reads are those of the shapes the H200
# chose (2026-11-30, GPU time in a CUDA graph) when decode blocks read words of 8 codes and
# taller ones bytes of 2: 16 the best of 4 at 48 tokens; 64 and 128 the best at 8,192 tokens.
# 4: the best of 8 quad-unit shapes, H200 2026-12-02: 215.8 us at 6 tokens (3 stages; 225.6
# with 2, 276.8-678.8 the others), 318.5 at 12 (329.0 with 2).
TILES = {
    4: dict(BLOCK_N=64, BLOCK_KU=64, num_warps=4, num_stages=3),
    16: dict(BLOCK_N=64, BLOCK_KU=16, num_warps=4, num_stages=2),
    64: dict(BLOCK_N=128, BLOCK_KU=16, num_warps=4, num_stages=2),
    128: dict(BLOCK_N=128, BLOCK_KU=32, num_warps=8, num_stages=2),
    "interpreter": dict(BLOCK_N=64, BLOCK_KU=16),  # a 64-wide hidden in one K step (CI's time goes by steps)
}
TILES[2] = TILES[4]  # 2-pair blocks (TWO_PAIRS_BELOW) run the 4-pair shape, not swept on their own
# Three parts as columns in 8- and 16-pair blocks (PARTS_AS_COLUMNS_SPLIT): the best of the shapes
# tried (H200, 2026-12-04): 8, 567 us at 6 pairs an expert (605.6 with BLOCK_KU 64; 636 on
# 128 x 32 x 8 warps); 16, 128 x 32 on 8 warps (thirty-sixth session: 701 / 1,166 us at 12 / 24
# pairs an expert against 726 / 1,278 on 64 x 16 x 4 warps; 64 x 32 1,240 at 24, 64 x 64 1,553).
SHORT_TILES = {8: dict(BLOCK_N=64, BLOCK_KU=32, num_warps=4, num_stages=3),
               16: dict(BLOCK_N=128, BLOCK_KU=32, num_warps=8, num_stages=3)}
# Faithful mode's one part leaves shared memory for a deeper pipeline. H200, 2026-12-01, 8,192
# tokens: 13.3-13.5 ms with 3 stages against 14.9-15.1 with TILES' 2 (the same bytes out);
# three parts do not fit 3 stages (out of resources). Its scales as words (tenth session):
# 11.38-11.47 ms against 12.99-13.04 (bytes). Elsewhere words did not pay or fit: batch 1's
# 4-row blocks 370 us a layer against 283 (twice the shared memory held), and three parts in
# 128-row blocks need 241 KB.
# Its decode blocks (tall: one part fills one column a pair) read 256 codes a K step, where
# TILES' 16 and 64 read 64 (chosen before quad units). H200, 2026-12-04 (bench/moe_block_heights.py
# --modes faithful, a layer of the release's widths, 48 experts, in a CUDA graph), us at 6 / 12 /
# 24 / 48 pairs an expert: 8 rows 368 / 602 / 1,013 / 1,890; 16 rows 402 / 447 / 734 / 1,289
# (TILES' shape 510 at 6; 2 stages 413, 4 stages 491, 512-code steps 522, 128 x 64 on 8 warps
# 523); 64 rows 808 / 826 / 875 / 997 on TILES' shape, 729 / 746 / 790 / 883 on this one.
ONE_PART_TILES = {8: dict(BLOCK_N=64, BLOCK_KU=64, num_warps=4, num_stages=3),
                  16: dict(BLOCK_N=64, BLOCK_KU=64, num_warps=4, num_stages=3),
                  64: dict(BLOCK_N=128, BLOCK_KU=64, num_warps=8, num_stages=3),
                  128: dict(BLOCK_N=128, BLOCK_KU=32, num_warps=8, num_stages=3, SCALE_WORDS=True)}


def tile_table(block_m: int, splits: int) -> dict:
    """The table whose block_m entry fp4_moe launches with on the GPU (benchmarks sweep it in place)."""
    if parts_as_columns(block_m, splits) and block_m in SHORT_TILES:
        return SHORT_TILES
    return ONE_PART_TILES if splits == 1 and block_m in ONE_PART_TILES else TILES


def block_height(pairs: int, experts: int, parts: int = SPLITS) -> int:
    """Rows of pairs per program: decode has a few pairs per expert, so short blocks; prefill
    has many, and a taller block decodes each weight tile once for more of them. A block's
    dots run once per bf16 part of its activations, so with three (exact mode) the padding of
    a 64-row block costs three times over and 16 rows serve up to 32 pairs an expert. H200,
    2026-12-01 (bench/moe_block_heights.py), 24 pairs an expert: 16 rows 1.66 ms against
    1.91 with three parts, 1.23 against 1.15 with one; 48 pairs: 2.88 against 2.02 (three).
    Short blocks put each pair's parts side by side as columns of one dot; below 4 pairs an
    expert they win with any number of parts: 0.8 pairs an expert, 4 rows 298 us against 522
    for 16 (three parts), 295 against 405 (one); 3 pairs, 563 against 849 (three), 552
    against 659 (one); 6 pairs, 932 against 912 (three), 910 against 702 (one). With three
    parts, short blocks of 8 pairs from 4 an expert and of 16 from 8 (PARTS_AS_COLUMNS_SPLIT).
    One part takes the same heights from TWO_PAIRS_BELOW on, tall blocks of 8 where three take
    4 (one part's 4-pair block fills one slot of four), on ONE_PART_TILES' 256-code steps."""
    per_expert = pairs / experts
    if per_expert < TWO_PAIRS_BELOW:
        return 2
    if per_expert < 4 and parts > 1:
        return 4
    if per_expert < 8 and (parts == 1 or PARTS_AS_COLUMNS_SPLIT >= 8):  # (4: three parts' 16 tall rows)
        return 8
    return 16 if per_expert < 32 else 64 if per_expert < 256 else 128


# Short blocks: 4 pairs x 4 slots fill a 16-column dot; 2 pairs make 8 columns, an m16n8k16 MMA a
# weight tile (sm_90: 784 against 829 loop instructions a gate/up step), at the cost of a second
# block for an expert's third and fourth pairs. H200, 2026-12-03 (a CUDA graph, 48 experts of the
# release's widths): 6 tokens (batch 1's verify block, 0.75 pairs an expert) 256-261 -> 226 us;
# 12 tokens 299-337 either way; a batch-1 step at 4K 26.1-27.6 -> 25.3-26.7 ms, alternated
# (bench/decode_ab.py). Below this many pairs an expert, blocks of 2 (0: never).
TWO_PAIRS_BELOW = 1.0


@triton.jit
def _route_plan_kernel(idx_ptr, wt_ptr, tok_ptr, pair_ptr, routed_ptr, blk_ptr, P, E, K, ROWS, BLOCKS,
                       BLOCK_M: tl.constexpr, CP: tl.constexpr, EP: tl.constexpr, RP: tl.constexpr,
                       BP: tl.constexpr, PDL: tl.constexpr):
    """RoutePlan in one program, for decode-sized batches: the ~40 small torch kernels of the
    general path were ~40 graph nodes per MoE layer. A pair's row is its expert's first row
    plus its rank among that expert's pairs, in pair order (the stable sort of the general
    path): a one-hot [experts, CP pairs] matrix and its running sums, chunk by chunk (two
    passes: the experts' counts first, then the rows, each chunk after the pairs before it)."""
    pdl.wait_for_inputs(PDL)
    experts = tl.arange(0, EP)
    counts = tl.zeros((EP,), tl.int32)
    for first in range(0, P, CP):
        p = first + tl.arange(0, CP)
        ids = tl.load(idx_ptr + p, mask=p < P, other=E).to(tl.int32)  # E: another rank's expert, or none
        counts += tl.sum(((ids[None, :] == experts[:, None]) & (experts[:, None] < E)).to(tl.int32), axis=1)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # each expert's run, padded
    ends = tl.cumsum(padded, axis=0)
    rows = tl.arange(0, RP)
    tl.store(tok_ptr + rows, tl.full((RP,), -1, tl.int32), mask=rows < ROWS)  # padding first
    tl.store(pair_ptr + rows, tl.full((RP,), -1, tl.int32), mask=rows < ROWS)
    tl.store(routed_ptr + rows, tl.zeros((RP,), tl.float32), mask=rows < ROWS)
    tl.debug_barrier()
    taken = ends - padded  # each expert's next row
    for first in range(0, P, CP):
        p = first + tl.arange(0, CP)
        live = p < P
        ids = tl.load(idx_ptr + p, mask=live, other=E).to(tl.int32)
        onehot = (ids[None, :] == experts[:, None]) & (experts[:, None] < E)
        ones = onehot.to(tl.int32)
        rank = tl.sum(tl.where(onehot, tl.cumsum(ones, axis=1), 0), axis=0) - 1
        dest = tl.sum(tl.where(onehot, taken[:, None], 0), axis=0) + rank
        ours = live & (ids < E)
        tl.store(tok_ptr + dest, p // K, mask=ours)
        tl.store(pair_ptr + dest, p, mask=ours)
        tl.store(routed_ptr + dest, tl.load(wt_ptr + p, mask=ours, other=0.0).to(tl.float32), mask=ours)
        taken += tl.sum(ones, axis=1)
    starts = tl.arange(0, BP) * BLOCK_M
    owner = tl.sum((ends[:, None] <= starts[None, :]).to(tl.int32), axis=0)  # experts ending at or before
    tl.store(blk_ptr + tl.arange(0, BP), tl.where(starts < tl.sum(padded, axis=0), owner, -1),
             mask=tl.arange(0, BP) < BLOCKS)


# Pairs up to which one program builds the plan (a decode batch of 56 requests: 6 rows of 6
# experts each), and the one-hot tile it works through them with (pairs x experts, padded to
# powers of two), on PLAN_WARPS warps. One program walks the pairs alone, so very large batches
# take torch's kernels. Compiled for sm_90 (Triton 3.6) at batch 8's 288 pairs over 64 experts:
# 256-pair chunks on 4 warps (PLAN_TILE 16384, as shipped until the thirty-third session) hold
# 255 registers and spill 576 bytes a thread; 64-pair chunks on 8 warps 123 and none. H200,
# 2026-12-04 (bench/route_plan.py, a plan in a CUDA graph, us at batch 1 / 8 / 32):
# 16384 on 4 warps 3.87 / 20.48 / 50.95; 16384 on 8 3.90 / 18.74 / 45.91; 4096 on 8
# 3.91 / 14.61 / 49.55; 2048 on 8 3.97 / 13.63 / 51.81 (torch's plan 54 / 92 / 101). In a
# batch-8 step (bench/decode_kernel_diff.py, PDL off): 34.1 us a layer -> 17.7 (8 warps) -> 14.2.
ONE_PROGRAM_PAIRS = 2048
PLAN_TILE = 4096
PLAN_WARPS = 8


def _plan_shape(pairs: int, experts: int, block_m: int) -> tuple[int, int, dict]:
    """A plan's rows (every expert's run padded to whole blocks), blocks, and the one-program
    kernel's tiles for them."""
    rows = triton.cdiv(pairs + min(experts, pairs) * (block_m - 1), block_m) * block_m
    blocks = rows // block_m
    PP, EP = triton.next_power_of_2(pairs), triton.next_power_of_2(experts)
    return rows, blocks, dict(BLOCK_M=block_m, CP=max(16, min(PP, PLAN_TILE // EP)), EP=EP,
                              RP=triton.next_power_of_2(rows), BP=triton.next_power_of_2(blocks))


def route_plan_warm_up_launches(device: torch.device, experts: int, k: int) -> list:
    """One plan for each variant of the one-program kernel that a batch of 1 to
    ONE_PROGRAM_PAIRS / k tokens compiles, at the block heights of one part and of SPLITS: its
    tiles follow the pairs' and rows' powers of two, and Triton specializes its counts on being
    1 or divisible by 16. A prefill worker's warm-up takes a few short prompts only (their GEMM
    shapes): a prompt of another length still compiled its plan, 0.15-0.19 s (H100, fifty-eighth
    session, call AX)."""
    variants: dict[tuple, tuple[int, int]] = {}
    for tokens in range(1, ONE_PROGRAM_PAIRS // k + 1):
        pairs = tokens * k
        for splits in sorted({1, SPLITS}):
            block_m = block_height(pairs, experts, splits)
            rows, blocks, tiles = _plan_shape(pairs, experts, block_m)
            if tiles["EP"] > PLAN_TILE // 16:
                return []  # every plan takes torch's form
            counts = tuple((n == 1, n % 16 == 0) for n in (pairs, experts, k, rows, blocks))
            variants.setdefault((tuple(tiles.items()), counts), (tokens, block_m))

    def plan(tokens: int, block_m: int) -> RoutePlan:
        idx = torch.arange(tokens * k, device=device).remainder(experts).view(tokens, k)
        return RoutePlan(idx, torch.ones(tokens, k, device=device), experts, block_m, one_program=True)
    return [lambda t=tokens, b=block_m: plan(t, b) for tokens, block_m in variants.values()]


class RoutePlan:
    """The batch's (token, expert) pairs sorted by expert into blocks of `block_m` rows, in
    tensors of a size fixed by (pairs, experts, block_m) alone, built without a host sync:
    tokens / pair_ids / routed: per row the token, its pair (token*k + slot) and the routing
    weight, or -1 / -1 / 0 for padding; block_expert: per block its expert, -1 past the end.
    Pairs whose expert id is E (another rank's) are left out. Decode-sized batches take one
    kernel (_route_plan_kernel), bigger ones torch; both give the same plan."""

    def __init__(self, idx: torch.Tensor, weights: torch.Tensor, num_experts: int, block_m: int,
                 one_program: bool | None = None):
        E, dev = num_experts, idx.device
        k = idx.shape[1]
        P = idx.numel()
        self.rows, blocks, tiles = _plan_shape(P, E, block_m)
        if one_program is None:
            one_program = P <= ONE_PROGRAM_PAIRS and tiles["EP"] <= PLAN_TILE // 16
        if one_program:
            self.tokens = torch.empty(self.rows, dtype=torch.int32, device=dev)
            self.pair_ids = torch.empty(self.rows, dtype=torch.int32, device=dev)
            self.routed = torch.empty(self.rows, dtype=torch.float32, device=dev)
            self.block_expert = torch.empty(blocks, dtype=torch.int32, device=dev)
            _route_plan_kernel[(1,)](idx.reshape(-1).contiguous(), weights.reshape(-1).contiguous(), self.tokens,
                                     self.pair_ids, self.routed, self.block_expert, P, E, k, self.rows, blocks,
                                     **tiles, num_warps=PLAN_WARPS, **pdl.options(idx.device))
            return
        flat = idx.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))[:E]
        padded = (counts + block_m - 1) // block_m * block_m
        ends = torch.cumsum(padded, 0)
        firsts = torch.cumsum(counts, 0) - counts
        sorted_experts = flat[order]
        expert = sorted_experts.clamp_max(E - 1)
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


def small_scales(*scales: torch.Tensor) -> bool:
    """Whether every scale lies in 2^-126 .. 2 (byte 1..128): then the decoder needs one
    multiply per value instead of two. Real checkpoints' scales are far below 2; a byte of 0
    (2^-127, read as 0) takes the two-multiply decoder."""
    return scale_bytes_within(1, 128, *scales)


# Tile shapes with SCALE_WORDS read their scales as int32 words (common.step_scales), loads
# Triton's pipeliner prefetches, where the scales' layout allows; the others read bytes, each
# load waiting out its round trip inside the K loop. Off, every shape reads bytes
# (DSFLASH_SCALE_WORDS=0).
SCALE_WORDS = os.environ.get("DSFLASH_SCALE_WORDS", "1") != "0"


def _scale_operands(s13: torch.Tensor, s2: torch.Tensor, words: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales as the kernels read them: int32 words (common.byte_words) if wanted, the
    switch is on and both layouts allow the view; else bytes."""
    if words and SCALE_WORDS:
        words13, words2 = byte_words(s13), byte_words(s2)
        if words13 is not None and words2 is not None:
            return words13, words2
    return s13, s2


# Whether kernels whose K is whole steps drop their column masks and promise 16-byte aligned
# activation columns (_expert_dots' VECTORS), where the shapes allow.
VECTOR_LOADS = True


def _vectors(units: int, step: int, *column_strides: int) -> bool:
    """Whether a kernel's K (`units`) is whole steps and every activation column it reads starts
    on 16 bytes (bf16 strides in multiples of 8): _expert_dots' VECTORS."""
    return VECTOR_LOADS and units % step == 0 and all(stride % 8 == 0 for stride in column_strides)


def quad_experts(w13, s13, w2, s2) -> tuple[torch.Tensor, ...]:
    """Stacked experts from the checkpoint's bytes as fp4_moe takes them: codes as quad units."""
    return quad_units(w13), s13, quad_units(w2), s2


def fp4_moe(x, idx, weights, w13, s13, w2, s2, limit: float, block_m: int | None = None,
            small: bool | None = None, act_quant: bool = False, round_input: bool = False) -> torch.Tensor:
    """x [T, H], idx/weights [T, k]; stacked experts, their codes as quad units
    (common.quad_units; fp4_moe_ref takes the bytes). Returns [T, H] fp32. block_m
    overrides the block height (a benchmark's choice); small is small_scales(s13, s2), worked
    out here when not given. act_quant: as fp4_moe_ref's (x is taken as it comes). A bf16 x in
    faithful mode (FP8 values, as TritonOps.gemm_input gives it) and its FP8-rounded down
    projection input are both exact in bf16: they go in as one part each, not three.
    round_input (faithful mode): x is rounded onto the FP8 grid here, in the launch that lays
    it out in the pieces the kernels read (fp8_grid_bf16's pieces), one launch where
    gemm_input's rounding and bf16_parts' copy took two; the same values either way."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    assert w13.dtype == torch.int16 and w2.dtype == torch.int16, "expert codes as quad units (common.quad_units)"
    assert w13.shape[2] * PIECES == H and w2.shape == (E, H, inter // PIECES)
    assert s13.shape == (E, two_i, H // 32) and s2.shape == (E, H, inter // 32)
    assert w13.stride(2) == 1 and w2.stride(2) == 1 and s13.stride(2) == 1 and s2.stride(2) == 1
    pairs = idx.numel()
    if pairs == 0:
        return torch.zeros(T, H, dtype=torch.float32, device=x.device)
    small = small_scales(s13, s2) if small is None else small
    rounds_h = act_quant and inter % 32 == 0  # (fake_quant_fp8 leaves other widths as they are)
    grouped = round_input and rounds_h and H % 32 == 0
    if round_input and not grouped:
        x = fp8_grid_bf16(x)
    splits = 1 if rounds_h and (grouped or x.dtype == torch.bfloat16) else SPLITS
    block_m = block_m or block_height(pairs, E, splits)
    short = parts_as_columns(block_m, splits)
    slots = 4 if short else 1
    tiles = TILES["interpreter"] if interpreting() else tile_table(block_m, splits)[block_m]
    plan = RoutePlan(idx, weights, E, block_m)
    # [SPLITS, 4, T, H/4] (a strided view): piece t holds columns 4c + t, as the weight units' code t
    pieces = fp8_grid_bf16(x, pieces=PIECES)[None] if grouped else bf16_parts(x, splits, interleave=PIECES)
    parts = pieces.view(splits, T, PIECES, H // PIECES).transpose(1, 2)
    h = torch.empty(splits, PIECES, plan.rows, inter // PIECES, dtype=torch.bfloat16, device=x.device)
    out = torch.empty(pairs, H, dtype=torch.float32, device=x.device)  # other ranks' pairs: never read
    blocks = plan.rows // block_m
    tiles = dict(tiles)
    ku = tiles["BLOCK_KU"]
    sc13, sc2 = _scale_operands(s13, s2, tiles.pop("SCALE_WORDS", False))
    options = dict(SPLITS=splits, SLOTS=slots, PIECES=PIECES, PTX=not interpreting(), SMALL=small, BLOCK_M=block_m,
                   SCALE_WORDS=sc13.dtype == torch.int32, **tiles)
    with mma_sync("short_experts" if short else "tall_experts"):
        _gate_up_kernel[(blocks, triton.cdiv(inter, tiles["BLOCK_N"]))](
            parts, plan.tokens, plan.routed, plan.block_expert, w13, sc13, h, H, inter, float(limit),
            *parts.stride()[:3], w13.stride(0), w13.stride(1), sc13.stride(0), sc13.stride(1),
            *h.stride()[:3], ACT_QUANT=rounds_h, VECTORS=_vectors(H // PIECES, ku, *parts.stride()[:3]),
            **options, **pdl.options(parts.device))
        _down_kernel[(blocks, triton.cdiv(H, tiles["BLOCK_N"]))](
            h, plan.tokens, plan.pair_ids, plan.block_expert, w2, sc2, out, H, inter, *h.stride()[:3],
            w2.stride(0), w2.stride(1), sc2.stride(0), sc2.stride(1), out.stride(0), out.stride(1),
            VECTORS=_vectors(inter // PIECES, ku, *h.stride()[:3]), **options, **pdl.options(h.device))
    return own_pair_sums(out, idx, E)
