"""Indexer scores of queries against a KV source's index keys, read packed from pool pages.

Shapes: n queries, Hi heads, Di head dim, N entries. score[i, j] = sum_h w[i, h] *
ReLU(q[i, h] . k[j]) for entries visible to query i (j < visible[i]), -inf otherwise; w already
holds the 1/sqrt(Di) and 1/sqrt(Hi) factors. Keys are e2m1 codes (low nibble first) with one
e8m0 scale per 32 values, decoded in registers; the scores stay on the device for top-k.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import quant
from . import pdl
from .compile_threads import launch_all
from .common import dot_exact_lhs, dot_exact_rhs, fp8_tensor_cores, interpreting, pow2
from .quantize import e4m3_rne
from .top_k import KeptWork, keep_tile, kept_work


def indexer_scores_ref(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [n, Hi, Di], keys [N, Di] (dequantized), w [n, Hi], visible [n] -> [n, N] fp32."""
    scores = (torch.einsum("nhd,td->nht", q.float(), keys.float()).relu() * w.float().unsqueeze(-1)).sum(1)
    return scores.masked_fill(torch.arange(keys.shape[0], device=q.device) >= visible[:, None], float("-inf"))


@triton.jit
def _e2m1_times(codes, scale):
    """e2m1 codes (int32, sign in bit 3; higher bits ignored) times `scale`, a power of two, in
    fp32: the code's 3 magnitude bits at fp32 bits 22-24 (the mantissa's top bit and the
    exponent field's two low ones) make an fp32 worth its e2m1 value times 2^-126 (code 1, 0.5,
    a subnormal), the sign goes to bit 31, and two exact multiplies finish it: 4 operations a
    code, where e2m1_to_float's selects took about twice that."""
    bits = ((codes & 0x7) << 22) | ((codes & 0x8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37 * scale  # 2^126


@triton.jit
def _entry_codes(page_ptr, k_off, k_soff, block, N, NB: tl.constexpr, DI: tl.constexpr,
                 ALIGNED: tl.constexpr = False):
    """(entries rj of block `block` of NB, whether each is one of the N, their index keys' code
    bytes [NB, DI / 32, 16] (byte i: codes 2i, 2i + 1) and scale exponents [NB, DI / 32]),
    zeros past N. ALIGNED: the codes' offsets are multiples of 16 and the scales' of 4, so the
    loads take 16-byte words: twice as fast in the few-query form, slower in the short tiles
    (1,676 against 837 us for 6 queries x 1M entries, H200, twenty-ninth session)."""
    SB: tl.constexpr = DI // 32
    rj = block * NB + tl.arange(0, NB)
    live = rj < N
    b = tl.arange(0, SB)
    off = tl.load(k_off + rj, mask=live, other=0)
    soff = tl.load(k_soff + rj, mask=live, other=0)
    if ALIGNED:  # int32 words [NB, SB, 4]: word j holds bytes 4j .. 4j + 3 of a scale block's 16
        words = (page_ptr + tl.multiple_of(off, 16)).to(tl.pointer_type(tl.int32), bitcast=True)
        at = words[:, None, None] + (b * 4)[None, :, None] + tl.arange(0, 4)[None, None, :]
        soff = tl.multiple_of(soff, 4)
    else:
        at = page_ptr + off[:, None, None] + (b * 16)[None, :, None] + tl.arange(0, 16)[None, None, :]
    codes = tl.load(at, mask=live[:, None, None], other=0)
    exps = tl.load(page_ptr + soff[:, None] + b[None, :], mask=live[:, None], other=127)
    return rj, live, codes, exps


# e2m1 code pairs to bf16 pairs by integer ops: byte t of word $4 (code 2t in its low nibble,
# 2t + 1 in its high one) alone in a register; its magnitude bits (& 0x77) times 2^6 + 2^18
# put the low code's at bits 6-8 and the high code's at 22-24 (the other two copies land at
# 10-12 and 18-20, clear of them), its sign bits (& 0x88) times 2^12 + 2^24 at bits 15 and 31
# (the others at 19 and 27), and one mask keeps those four fields: each half is then a bf16
# worth its code's e2m1 value times 2^-126 (code 1, 0.5, a subnormal). Two multiplies, by
# 2^126 and by the scale pair $6 (2^(e-127) in both halves), finish it exactly: pair $t holds
# codes 2t and 2t + 1.
_E2M1_BYTE_PAIRS_PTX = tl.constexpr("\n".join([
    "{", ".reg .b32 b, m, s, h;", "mov.b32 h, 0x7E807E80;",
    *[f"prmt.b32 b, $4, 0, {0x4440 | t:#06x}; and.b32 m, b, 0x77; mul.lo.u32 m, m, 0x40040; "
      f"and.b32 s, b, 0x88; mul.lo.u32 s, s, 0x1001000; or.b32 m, m, s; and.b32 ${t}, m, 0x81C081C0; "
      f"mul.rn.bf16x2 ${t}, ${t}, h; mul.rn.bf16x2 ${t}, ${t}, $6;" for t in range(4)], "}"]))


@triton.jit
def _decoded_words(words, exps, NB: tl.constexpr, DI: tl.constexpr, BF16: tl.constexpr, PTX: tl.constexpr):
    """_entry_codes' words (ALIGNED) and scale exponents as keys [NB, DI], as _decoded_keys:
    on the GPU (PTX) by _E2M1_BYTE_PAIRS_PTX, each word's pairs then put in column order;
    elsewhere its bytes, then _decoded_keys."""
    SB: tl.constexpr = DI // 32
    if PTX:
        e = exps.to(tl.int32)
        half = tl.where(e == 0, 0x40, e << 7)  # the bf16 2^(e - 127); 2^-127 a subnormal
        pair = tl.broadcast_to((half | (half << 16))[:, :, None, None], (NB, SB, 4, 2))
        # each word twice: a pack of two elements is one word's asm, whose 4 outputs each hold a pair
        p0, p1, p2, p3 = tl.inline_asm_elementwise(_E2M1_BYTE_PAIRS_PTX, "=r,=r,=r,=r,r,r,r,r",
                                                   [tl.join(words, words), pair], dtype=(tl.bfloat16,) * 4,
                                                   is_pure=True, pack=2)
        pairs = tl.join(tl.join(p0, p2), tl.join(p1, p3))  # [.., 2 halves, a, b]: code 2 (2a + b) + half
        keys = tl.reshape(tl.permute(pairs, (0, 1, 2, 4, 5, 3)), (NB, DI))
        if not BF16:
            keys = keys.to(tl.float32)
        return keys
    b0, b1, b2, b3 = words & 0xFF, (words >> 8) & 0xFF, (words >> 16) & 0xFF, (words >> 24) & 0xFF
    packed = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (NB, SB, 16))  # byte 4j + 2a + b
    return _decoded_keys(packed, exps, NB, DI, BF16)


@triton.jit
def _e8m0_value(e):
    """e8m0 scale bytes (int32) as their fp32 2^(e - 127), exactly (byte 0: 2^-127, a subnormal)."""
    return tl.where(e == 0, 1 << 22, e << 23).to(tl.float32, bitcast=True)


@triton.jit
def _keys_times(packed, scale, NB: tl.constexpr, DI: tl.constexpr):
    """_entry_codes' bytes (int32 [NB, DI / 32, 16], two codes each, low nibble first) as their
    e2m1 values times scale (broadcast to [NB, DI / 32, 1]) -> fp32 [NB, DI]."""
    return tl.reshape(tl.join(_e2m1_times(packed, scale), _e2m1_times(packed >> 4, scale)), (NB, DI))


@triton.jit
def _decoded_keys(packed, exps, NB: tl.constexpr, DI: tl.constexpr, BF16: tl.constexpr):
    """_entry_codes' bytes as keys [NB, DI]: bf16 with BF16 (exact: e2m1 codes times a power of
    two), else fp32. Each block's scale is made once ([NB, DI / 32]), not once a column as
    before (H200, 6 queries against 1M keys: 1,764 -> 837 us in the short tiles)."""
    keys = _keys_times(packed.to(tl.int32), _e8m0_value(exps.to(tl.int32))[:, :, None], NB, DI)
    if BF16:
        keys = keys.to(tl.bfloat16)
    return keys


@triton.jit
def _fp8_keys(packed, exps, NB: tl.constexpr, DI: tl.constexpr, HW_FP8: tl.constexpr):
    """_entry_codes' bytes as the FP8 tensor cores take keys: e4m3 [NB, DI] under one
    power-of-two scale an entry, its blocks' largest, and those scales [NB] fp32. A block's
    e2m1 values (0.5 to 6) shifted down by the binades its scale lies under the largest stay
    e4m3 values while that is at most 8 (e4m3's subnormals end at 2^-9); further down they
    round to nearest even. In the interpreter (HW_FP8 off, its fp8 conversions and dots are
    not the GPU's) fp32 values on the e4m3 grid."""
    e = exps.to(tl.int32)
    top = tl.max(e, axis=1)
    shift = pow2(tl.maximum(e - top[:, None] + 127, 1))[:, :, None]  # 2^(e - top), exactly
    values = _keys_times(packed.to(tl.int32), shift, NB, DI)
    if HW_FP8:
        keys = values.to(tl.float8e4nv)
    else:
        _, keys = e4m3_rne(values)
    return keys, _e8m0_value(top)


@triton.jit
def _entry_block(page_ptr, k_off, k_soff, block, N, NB: tl.constexpr, DI: tl.constexpr, BF16: tl.constexpr):
    """(entries rj of block `block` of NB, whether each is one of the N, their index keys
    [NB, DI] decoded from their pages, zeros past N): _entry_codes, then _decoded_keys."""
    rj, live, codes, exps = _entry_codes(page_ptr, k_off, k_soff, block, N, NB, DI)
    return rj, live, _decoded_keys(codes, exps, NB, DI, BF16)


@triton.jit
def _run_rows(first_ptr, count_ptr, n, block, QB: tl.constexpr, AXIS: tl.constexpr, RUNS: tl.constexpr):
    """(run, its first query row, the rows of its query block `block` of QB, whether each is
    one of the run's): with RUNS the run of program axis AXIS, else the one run of all n rows."""
    if RUNS:
        run = tl.program_id(AXIS)
        first = tl.load(first_ptr + run)
        count = tl.load(count_ptr + run)
    else:
        run = 0
        first = 0
        count = n
    local = block * QB + tl.arange(0, QB)
    return run, first, first + local, local < count


# a candidate pool's row stride and a slice's first row vary with the entries and the slice:
# one compile (kept_ptr is the pool's storage, always aligned; kept_row the slice's first row)
# (one compile likewise for every top-k work's shape: KEEP)
@triton.jit(do_not_specialize=["skn", "kept_row", "chunk_len", "chunks", "capacity"])
def _indexer_kernel(q_ptr, w_ptr, vis_ptr, page_ptr, k_off, k_soff, o_ptr, first_ptr, count_ptr, n, N, NP, HI,
                    sqn, sqh, swn, son, skr, DI: tl.constexpr, QB: tl.constexpr, NB: tl.constexpr,
                    RUNS: tl.constexpr, BF16: tl.constexpr, TMA: tl.constexpr, PDL: tl.constexpr,
                    FP8: tl.constexpr = False, HW_FP8: tl.constexpr = False, kept_ptr=None, skn=0, kept_row=0,
                    KEPT_BLOCK: tl.constexpr = 0, floor_ptr=None, top_kept_ptr=None, top_id_ptr=None,
                    top_count_ptr=None, top_ptr=None, chunk_len=1, chunks=1, capacity=1, KEEP: tl.constexpr = False,
                    KEEP_PTX: tl.constexpr = False):
    """Program (query block, entry block, run): with RUNS, run r's queries are rows
    first[r] .. first[r] + count[r] and its entries row r of the offset tables. Columns N ..
    NP - 1 of a row (padded_width) are stored -inf. BF16: the
    queries come as bf16 holding them exactly (FP4-quantized ones do), so one bf16 dot per
    head is exact (the keys are e2m1 times a power of two); otherwise fp32 queries dot at
    three-pass accuracy (dot_exact_rhs). FP8: the queries come as e4m3 codes (fp8_queries,
    their scales folded into w) and the keys are made e4m3 under a scale an entry
    (_fp8_keys), which multiplies each entry's sum over heads (ReLU(s * x) = s * ReLU(x) for
    s > 0); with HW_FP8 one FP8 dot a head, in the interpreter fp32 values on the e4m3 grid.
    TMA: q_ptr is a descriptor of the queries as [n, HI * DI] in [QB, DI] blocks, so a head's
    tile costs no registers of addresses (rows past n read as zeros, rows of the next run are
    read and never stored). KEPT_BLOCK (a power of two): entry j of row i scores only where
    kept[i, j // KEPT_BLOCK] (a candidate pool's blocks), -inf elsewhere; a row's few blocks of
    the tile are loaded, not a byte an entry (whose addresses took 57 more registers). KEEP
    (one run): the top-k's filtering of each row's scores in the epilogue (top_k.keep_tile
    into a KeptWork of chunk_len-entry chunks, which NB divides), so that they are not read
    back for it; KEEP_PTX: in PTX, a branch a score around the rare kept ones (the GPU's form)."""
    pdl.wait_for_inputs(PDL)
    pid_q = tl.program_id(0)
    pid_n = tl.program_id(1)
    run, first, rq, in_run = _run_rows(first_ptr, count_ptr, n, pid_q, QB, 2, RUNS)
    d = tl.arange(0, DI)
    if FP8:
        rj, live, codes, exps = _entry_codes(page_ptr, k_off + run * skr, k_soff + run * skr, pid_n, N, NB, DI)
        keys, key_scales = _fp8_keys(codes, exps, NB, DI, HW_FP8)
    else:
        rj, live, keys = _entry_block(page_ptr, k_off + run * skr, k_soff + run * skr, pid_n, N, NB, DI, BF16)
    acc = tl.zeros((QB, NB), tl.float32)
    for h in range(0, HI):
        if TMA:
            q = q_ptr.load([(first + pid_q * QB).to(tl.int32), h * DI])
        else:
            q = tl.load(q_ptr + rq[:, None] * sqn + h * sqh + d[None, :], mask=in_run[:, None], other=0.0)
        w = tl.load(w_ptr + rq * swn + h, mask=in_run, other=0.0)
        if BF16 or FP8:
            logits = tl.dot(q, tl.trans(keys))
        else:
            logits = dot_exact_rhs(q.to(tl.float32), tl.trans(keys), tl.zeros((QB, NB), tl.float32))
        acc += tl.maximum(logits, 0.0) * w[:, None]
    if FP8:
        acc = acc * key_scales[None, :]
    visible = tl.load(vis_ptr + rq, mask=in_run, other=0)
    seen = rj[None, :] < visible[:, None]
    if KEPT_BLOCK >= NB:  # the tile lies in one pool block a row (powers of two)
        b = pid_n * NB // KEPT_BLOCK
        seen = seen & (tl.load(kept_ptr + (kept_row + rq).to(tl.int64) * skn + b, mask=in_run, other=0) != 0)[:, None]
    elif KEPT_BLOCK:  # the tile's NB // KEPT_BLOCK blocks a row, loaded as such, spread over their entries
        b = pid_n * (NB // KEPT_BLOCK) + tl.arange(0, NB // KEPT_BLOCK)
        kept = tl.load(kept_ptr + (kept_row + rq)[:, None].to(tl.int64) * skn + b[None, :],
                       mask=in_run[:, None] & (b * KEPT_BLOCK < N)[None, :], other=0) != 0
        seen = seen & tl.reshape(tl.broadcast_to(kept[:, :, None], (QB, NB // KEPT_BLOCK, KEPT_BLOCK)), (QB, NB))
    acc = tl.where(seen & live[None, :], acc, float("-inf"))
    tl.store(o_ptr + rq[:, None] * son + rj[None, :], acc, mask=in_run[:, None] & (rj < NP)[None, :])
    if KEEP:
        keep_tile(acc, rq, in_run, rj, pid_n * NB // chunk_len, floor_ptr, top_kept_ptr, top_id_ptr, top_count_ptr,
                  top_ptr, chunks, capacity, KEEP_PTX)


@triton.jit
def _negative_zero():
    """-0.0 in fp32 (a float constant -0.0 reaches the kernel as +0)."""
    return tl.full((), -2147483648, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _head_queries(q_ptr, w_ptr, rq, in_run, g, HI, sqn, sqh, swn, DI: tl.constexpr, QC: tl.constexpr,
                  GH: tl.constexpr):
    """Heads g .. g + GH - 1 of query rows rq as a dot's right side [DI, GH * QC] (column
    h * QC + i: row i, head g + h; zeros past HI) and their weights [GH, QC] (-0 past HI: such
    a head then adds nothing, not even a sign to a zero)."""
    heads = g + tl.arange(0, GH)
    on = (heads < HI)[:, None] & in_run[None, :]
    d = tl.arange(0, DI)
    q = tl.load(q_ptr + heads[:, None, None] * sqh + rq[None, :, None] * sqn + d[None, None, :],
                mask=on[:, :, None], other=0.0)
    w = tl.load(w_ptr + rq[None, :] * swn + heads[:, None], mask=on, other=_negative_zero())
    return tl.trans(tl.reshape(q, (GH * QC, DI))), w


@triton.jit
def _weighted_heads(keys, q, w, acc, NB: tl.constexpr, QC: tl.constexpr, GH: tl.constexpr, BF16: tl.constexpr):
    """acc [NB, QC] plus the group's heads' ReLU(keys . q) times w, added in the heads' order
    as _indexer_kernel's loop over heads adds them, bit for bit: a thread holds a query's GH
    heads, and its sum over them runs in their order; the GPU fuses each product into the add
    that takes it, as it does the loop's acc + ReLU * w; acc joins the first head's product
    (fused the same way), and the other heads' + -0 changes no value, zeros' signs included,
    so the compiler drops it (H200: equal to the short tiles in every bench/indexer_decode.py
    shape; with +0 in its place the products were rounded before the sum)."""
    if BF16:
        logits = tl.dot(keys, q)
    else:
        logits = dot_exact_lhs(keys, q.to(tl.float32), tl.zeros((NB, GH * QC), tl.float32))
    first = (tl.arange(0, GH) == 0)[None, :, None]
    start = tl.where(first, acc[:, None, :], _negative_zero())
    terms = tl.maximum(tl.reshape(logits, (NB, GH, QC)), 0.0) * w[None, :, :] + start
    return tl.sum(terms, axis=1)


@triton.jit(do_not_specialize=["n", "N", "NP", "son", "skr", "programs"])  # one compile for every count
def _indexer_few_kernel(q_ptr, w_ptr, vis_ptr, page_ptr, k_off, k_soff, o_ptr, first_ptr, count_ptr, n, N, NP, HI,
                        sqn, sqh, swn, son, skr, programs, DI: tl.constexpr, QN: tl.constexpr, QC: tl.constexpr,
                        GH: tl.constexpr, NB: tl.constexpr, RUNS: tl.constexpr, BF16: tl.constexpr,
                        CHAIN: tl.constexpr, HOIST: tl.constexpr, ALIGNED: tl.constexpr, PTX: tl.constexpr,
                        PDL: tl.constexpr):
    """_indexer_kernel for runs of at most QN queries (a decode step's verify blocks), the
    entries as the dot's rows and GH heads of QC queries as its columns: program (p, run)
    scores entry blocks p, p + programs, ... of NB, each dot [NB, DI] x [DI, GH * QC] (column
    h * QC + i: query i, head h), so a thread holds a query's GH heads and sums them in its
    registers in the heads' order (_weighted_heads): a score is the short tiles' bit for bit
    where the dots are exact. One dot for 32 heads (8 wgmma k steps) where a dot a head took
    16 mma.sync a warp each: 311 against 499 us for 6 queries x 1M entries on the H200. QN
    over QC: the queries QC at a time; HI over GH (CHAIN): the head groups one after the
    other. HOIST (one of each): the queries load once, before the blocks (869 us reloading
    them a block). The next block's codes load while this one's are scored."""
    pdl.wait_for_inputs(PDL)
    pid = tl.program_id(0)
    run = tl.program_id(1) if RUNS else 0
    k_off, k_soff = k_off + run * skr, k_soff + run * skr
    blocks = tl.cdiv(N, NB)
    if HOIST:
        _, _, rq, in_run = _run_rows(first_ptr, count_ptr, n, 0, QC, 1, RUNS)
        q, w = _head_queries(q_ptr, w_ptr, rq, in_run, 0, HI, sqn, sqh, swn, DI, QC, GH)
    rj_next, live_next, codes_next, exps_next = _entry_codes(page_ptr, k_off, k_soff, pid, N, NB, DI, ALIGNED)
    for block in range(pid, blocks, programs):
        rj, live, codes, exps = rj_next, live_next, codes_next, exps_next
        rj_next, live_next, codes_next, exps_next = _entry_codes(page_ptr, k_off, k_soff, block + programs, N,
                                                                  NB, DI, ALIGNED)
        if ALIGNED:
            keys = _decoded_words(codes, exps, NB, DI, BF16, PTX)
        else:
            keys = _decoded_keys(codes, exps, NB, DI, BF16)
        for chunk in tl.static_range(QN // QC):
            _, _, rq, in_run = _run_rows(first_ptr, count_ptr, n, chunk, QC, 1, RUNS)
            if not CHAIN:  # one group: GH >= HI
                if not HOIST:
                    q, w = _head_queries(q_ptr, w_ptr, rq, in_run, 0, HI, sqn, sqh, swn, DI, QC, GH)
                acc = _weighted_heads(keys, q, w, tl.zeros((NB, QC), tl.float32), NB, QC, GH, BF16)
            else:
                acc = tl.zeros((NB, QC), tl.float32)
                for g in range(0, HI, GH):
                    qg, wg = _head_queries(q_ptr, w_ptr, rq, in_run, g, HI, sqn, sqh, swn, DI, QC, GH)
                    acc = _weighted_heads(keys, qg, wg, acc, NB, QC, GH, BF16)
            visible = tl.load(vis_ptr + rq, mask=in_run, other=0)
            acc = tl.where((rj[:, None] < visible[None, :]) & live[:, None], acc, float("-inf"))
            tl.store(o_ptr + rq[None, :] * son + rj[:, None], acc, mask=(rj < NP)[:, None] & in_run[None, :])


# (queries, entries, warps) per program: decode-sized runs, and runs of TALL_RUN rows and more
# (prefill), whose 64-query blocks take the Hopper tensor-core instructions (wgmma). Tall
# tiles on the H200 (2026-12-02, bench/h200.py --indexer-tiles, 32 heads of 128, 128 queries
# x 1M entries): one warpgroup 2,021-2,038 us with the queries by pointers, 1,896 by TMA
# (580 TFLOP/s); two warpgroups 2,363; 128 x 128 on two 2,353-2,455, 64 x 64 on one 2,363.
TILES = {"short": (16, 64, 4), "tall": (64, 128, 4)}
TALL_RUN = 256
# Runs of at most FEW_QUERIES rows (decode) take _indexer_few_kernel: FEW_HEADS_COLUMNS a dot
# (wgmma's widest; the release's 32 heads of 8 query columns), FEW_TILES (entries, warps) a
# program, at most FEW_PROGRAMS programs over a launch's runs. H200, 6 queries against 1M
# entries, 1, 8 and 32 runs (bench/indexer_decode.py, 2026-12-04, aligned keys): 158.6, 1,281
# and 6,942 us as set; 156.7, 1,284, 8,429 at 264 programs, 237, 2,502, 8,401 at 132; 257.8,
# 2,174, 11,050 at 128 columns (two groups); 204.9, 1,616, 9,119 at (128, 8).
# A program's warps must split its entries only (64 a warpgroup), never the heads: a sum over
# heads across warps is not in their order (16 entries on 4 warps differed from the short tiles).
FEW_QUERIES = 16
FEW_QUERY_COLUMNS = 8
FEW_HEADS_COLUMNS = 256
FEW_TILES = (64, 4)
FEW_PROGRAMS = 528
# Keys whose codes start on 16 bytes (CacheLayout.keys_aligned: the release's) loaded as 16-byte
# words: 155.5 against 310.1 us (1 run), 1,275 against 2,026 (8 runs), 5.1 against 6.7 at 4,096
# entries; decode at 1M batch 8 67.56 against 73.45 ms (H200, 2026-12-04).
FEW_ALIGNED_CODES = True
# Aligned keys decoded by _E2M1_BYTE_PAIRS_PTX on the GPU: 154.4 against 161.4 us (1 run), 1,198
# against 1,302 (8), 6,590 against 6,861 (32); the loop 768 against 923 instructions a thread.
FEW_PTX_DECODE = True
QUERY_TILES_BY_TMA = True  # off: tall tiles read the queries by pointers (bench/h200.py times both)
# Faithful prefill's 64-query tiles on the FP8 tensor cores (indexer_scores' fp8): the bf16
# form ran at 665 TFLOP/s, 96% of the bf16 matrix rate (1,654 us a 128 x 1M slice of the
# release's 32 heads of 128, H200, twenty-ninth session). H200, forty-second session: a 128 x
# 1M slice 1,322 us against 1,729 in bf16 (1.53x the FP8 rate's floor), every row's top-k the
# bf16 form's; a 32K faithful prefill 1.257 s against 1.274, its last logits the same to the
# bit. Tall tiles at 2,048 queries x 16K entries lose (652 against 452 us): not yet looked into.
TALL_FP8 = True
# Registers a thread those FP8 tiles may take (0: as Triton chooses, 167 for sm_90). Three of
# their programs fill an SM's 64K registers, so the index top-k's filtering launch on its side
# stream (indexer.TOP_K_BESIDE; 4 warps, 32 registers in PTX) runs only where a score program
# has ended, and barely overlaps them (fifty-fourth session: ~4 of a 128K chunk's ~17 ms of
# top-k). At 160 (159 for sm_90, no spills, the same 820-instruction loop) three score programs
# leave 4,096 registers: one filtering program beside them on every SM. H100, fifty-fifth
# session (call AJ), a 512K faithful prefill in 16K chunks alternated in one process: 22.09 /
# 21.21 s at 0, 21.25 s at 160 alone, 27.70 s at 160 with top_k.FILTER_PROGRAMS 1 (the same
# last logits): no gain. Stays 0.
TALL_FP8_MAXNREG = 0
# Those tiles in Gluon (indexer_score_gluon: a head's wgmma in flight under the previous head's
# epilogue; the same scores bit for bit), for one run's launches without a candidate pool or a
# kept top-k. Exact and slower (H100, fifty-third session, 128 x 1M: 1,542-1,714 us in its three
# tiles against these tiles' 1,139; the 1M prefill 49.67 against 46.89 s): off.
GLUON_TALL = False


def _on_16_bytes(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it where it does not start on 16 bytes: a caller's row slices start
    anywhere, and Triton compiles a kernel again for pointers that do not (H200, 2026-12-02:
    3 compiles, ~3.7 s, inside a 1M-token prefill whose warm-up had compiled the rest)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def indexer_scores(q: torch.Tensor, w: torch.Tensor, visible: torch.Tensor, pages: torch.Tensor,
                   key_offsets: torch.Tensor, key_scale_offsets: torch.Tensor,
                   runs: tuple[torch.Tensor, torch.Tensor, int] | None = None,
                   exact_in_bf16: bool = False, tall: bool = False, tiles: tuple | None = None,
                   keys_aligned: bool = False, fp8: bool = False, encoded: bool = False,
                   kept: tuple[torch.Tensor, int] | None = None, pad: bool = False,
                   keep: KeptWork | None = None) -> torch.Tensor:
    """key_offsets [N] for one run, or [R, N] with `runs` = (first row [R], rows [R], most rows)
    for several: each run's queries score its own row of entries (one launch for a batch). A
    query's score of an entry is computed the same way in either form, bit for bit, and in
    any slice of a run's rows: the tiles depend on `tall` (the run has TALL_RUN rows or more,
    whichever of them are scored now), `tiles`, and whether the runs have FEW_QUERIES rows at
    most; the last two give the same scores bit for bit where a dot is exact (FP4-quantized
    queries: a dot's products have 4 significant bits, and their sum fits fp32 unless a
    query's and a key's block scales together span more than 11 binades).
    exact_in_bf16: the caller knows every query value is a bf16 value (FP4-quantized, with
    power-of-two scales): the GPU then dots them in one bf16 pass, not three TF32 ones.
    keys_aligned: every key's codes start on 16 bytes and its scales on 4 (CacheLayout.keys_aligned).
    fp8 (faithful prefill): with exact_in_bf16, 64-query tiles dot on the FP8 tensor cores
    (TALL_FP8, on GPUs that have them): each score as the bf16 dots give it wherever the FP8
    MMA sums exactly and a query's and a key's block scales each span at most 8 binades.
    encoded: q and w are already fp8_queries' (a long run's queries encoded once, then scored
    in slices); only where that form runs (tall_fp8).
    kept (blocks [n, B] bool, block): a candidate pool; entry j of row i scores -inf unless
    blocks[i, j // block] (B * block >= N), in the tall tiles' epilogue (the scores are not
    read back to mask them), after the launch in the few-query form.
    pad: rows of padded_width(N) scores, -inf past N (what the top-k reads: see padded_width).
    keep: the filtered top-k's work for these rows, its floors taken (top_k.sample_floors):
    the tiles fill its kept scores as they make them (one run, not the few-query form); the
    scores are still written, for the pick's whole-row fallback (top_k.pick_kept)."""
    n, heads, dim = q.shape
    N = key_offsets.shape[-1]
    assert w.shape == (n, heads) and visible.shape == (n,) and pages.dtype == torch.uint8 and dim % 32 == 0
    assert (runs is None) == (key_offsets.dim() == 1)
    width = padded_width(N) if pad else N
    out = torch.empty(n, width, dtype=torch.float32, device=q.device)
    if N == 0 or n == 0:
        return out
    most = n if runs is None else runs[2]
    few = tiles is None and not tall and most <= FEW_QUERIES
    qb, nb, warps = tiles or TILES["tall" if tall else "short"]
    fp8 = fp8 and not few and qb >= 64 and tall_fp8(q.device, exact_in_bf16)
    assert fp8 or not encoded, "queries encoded for the FP8 form, which does not run here"
    bf16 = exact_in_bf16 and not interpreting() and not fp8  # the interpreter dots fp32 exactly anyway
    w, visible = _on_16_bytes(w.float().contiguous()), _on_16_bytes(visible.to(torch.int64).contiguous())
    if fp8 and not encoded:  # (from the queries as they come: no bf16 copy first)
        q, w = fp8_queries(q, w)
    else:
        q = (q.to(torch.bfloat16) if bf16 else q).contiguous()
    key_offsets, key_scale_offsets = key_offsets.contiguous(), key_scale_offsets.contiguous()
    if runs is not None:  # rows of one small table (index_runs): with an odd run count, one starts off 16 bytes
        runs = (_on_16_bytes(runs[0].contiguous()), _on_16_bytes(runs[1].contiguous()), runs[2])
    if kept is not None:
        blocks, block = kept
        assert blocks.shape[0] == n and blocks.shape[1] * block >= N and block & (block - 1) == 0, (blocks.shape, block, N)
    assert keep is None or not few and runs is None, "the few-query form and batched runs do not keep scores"
    if few:
        _few_queries(q, w, visible, pages, key_offsets, key_scale_offsets, out, runs, most, bf16,
                     FEW_ALIGNED_CODES and keys_aligned and pages.data_ptr() % 16 == 0)
        if kept is not None:
            out[:, :N].masked_fill_(~candidate_entries(blocks, block, N), float("-inf"))
        return out
    if fp8 and GLUON_TALL and tiles is None and not interpreting():
        from . import indexer_score_gluon
        if indexer_score_gluon.takes(q, runs, kept, keep):
            return indexer_score_gluon.scores(q, w, visible, pages, key_offsets, key_scale_offsets, out)
    if runs is None:
        first = count = visible  # unused
        grid = (triton.cdiv(n, qb), triton.cdiv(width, nb), 1)
    else:
        first, count, most = runs
        grid = (triton.cdiv(most, qb), triton.cdiv(width, nb), key_offsets.shape[0])
    # tall tiles (prefill); TMA wants 16-byte aligned rows
    tma = QUERY_TILES_BY_TMA and qb >= 64 and (q.data_ptr() | q.stride(0) * q.element_size()) % 16 == 0
    queries = TensorDescriptor.from_tensor(q.view(n, heads * dim), [qb, dim]) if tma else q
    _indexer_kernel[grid](queries, w, visible, pages, key_offsets, key_scale_offsets,
                          out, first, count, n, N, width, heads, q.stride(0), q.stride(1), w.stride(0), out.stride(0),
                          key_offsets.stride(0), DI=dim, QB=qb, NB=nb, RUNS=runs is not None, BF16=bf16,
                          TMA=tma, FP8=fp8, HW_FP8=fp8 and not interpreting(),
                          **_kept_arguments(kept), **_keep_arguments(keep, n, width, nb), num_warps=warps,
                          **({"maxnreg": TALL_FP8_MAXNREG} if fp8 and TALL_FP8_MAXNREG else {}),
                          **pdl.options(q.device))
    return out


class EntrySample(NamedTuple):
    """A run's entries `columns` (ascending ids) as indexer_scores takes them: their key and
    scale offsets, and how many of them each of the run's queries sees."""
    columns: torch.Tensor
    key_offsets: torch.Tensor
    key_scale_offsets: torch.Tensor
    seen: torch.Tensor


def entry_sample(visible: torch.Tensor, key_offsets: torch.Tensor, key_scale_offsets: torch.Tensor,
                 columns: torch.Tensor) -> EntrySample:
    """The EntrySample of a run's queries (visible [n]) at entries `columns` (once a layer)."""
    return EntrySample(columns, key_offsets[columns], key_scale_offsets[columns],
                       torch.searchsorted(columns, visible.to(columns.dtype)))


def sampled_scores(q: torch.Tensor, w: torch.Tensor, pages: torch.Tensor, sample: EntrySample, rows: slice,
                   kept: tuple[torch.Tensor, int] | None = None, **options) -> torch.Tensor:
    """[n, len(columns)]: indexer_scores(q, w, ...)[:, sample.columns] for queries `rows` of the
    sample's run (q and w: theirs) without the other entries' scores, bit for bit (a score
    depends on its query and entry alone): a row's filtered top-k floor
    (top_k.sample_floors) before its scores are made. `options` as indexer_scores' (pad and
    keep left out: the sampled rows are neither)."""
    out = indexer_scores(q, w, sample.seen[rows], pages, sample.key_offsets, sample.key_scale_offsets,
                         **{**options, "pad": False, "keep": None})
    if kept is not None:  # (the pool's blocks of the columns, not of their places in the sample)
        blocks, block = kept
        out.masked_fill_(~blocks[:, sample.columns // block], float("-inf"))
    return out


# A padded score row holds a multiple of ROW_ALIGN scores (64 bytes).
ROW_ALIGN = 16


def padded_width(N: int) -> int:
    """Scores a padded row of N entries holds (indexer_scores' pad). Triton specializes an
    integer that 16 divides: rows of such a length, -inf past N, are read by the top-k's kernels
    in 16-byte loads (sm_90: 6 LDGSTS.128 a filter step against 24 LDGSTS of 4 bytes for rows of
    an odd length, where a row's start and its last block's mask are known only to 4 bytes and 1
    score), and picked the same: -inf scores are never picked."""
    return -(-N // ROW_ALIGN) * ROW_ALIGN


def candidate_entries(blocks: torch.Tensor, block: int, width: int) -> torch.Tensor:
    """A candidate pool's kept blocks [n, B] -> its kept entries [n, width] (bool)."""
    return blocks.repeat_interleave(block, dim=-1)[:, :width]


def _kept_arguments(kept: tuple[torch.Tensor, int] | None) -> dict:
    """_indexer_kernel's kept_ptr, skn, kept_row and KEPT_BLOCK for a candidate pool: its bytes
    from their storage's start (so a slice of rows compiles nothing new) and the slice's first
    row there (a row, not a byte: a 1M prompt's pool holds more than 2^31 bytes)."""
    if kept is None:
        return {}
    blocks, block = kept
    blocks = blocks if blocks.stride(1) == 1 and blocks.storage_offset() % blocks.stride(0) == 0 else blocks.contiguous()
    blocks = blocks.view(torch.uint8)
    storage = torch.as_strided(blocks, (1,), (1,), 0)
    return dict(kept_ptr=storage, skn=blocks.stride(0), kept_row=blocks.storage_offset() // blocks.stride(0),
                KEPT_BLOCK=block)


def _keep_arguments(keep: KeptWork | None, n: int, width: int, nb: int) -> dict:
    """_indexer_kernel's top-k work arguments (KEEP) for n rows of `width` scores in NB-entry tiles."""
    if keep is None:
        return {}
    assert keep.atomic and keep.counts.shape[0] == n and keep.chunk_len % nb == 0, (keep.counts.shape, n, nb)
    assert keep.chunks == -(-width // keep.chunk_len), (keep.chunks, width, keep.chunk_len)
    return dict(floor_ptr=keep.floor, top_kept_ptr=keep.kept, top_id_ptr=keep.ids, top_count_ptr=keep.counts,
                top_ptr=keep.tops, chunk_len=keep.chunk_len, chunks=keep.chunks, capacity=keep.kept.shape[-1],
                KEEP=True, KEEP_PTX=not interpreting())


def tall_fp8(device: torch.device, exact_in_bf16: bool) -> bool:
    """Whether tall tiles of faithful (FP4-quantized) queries dot on the FP8 tensor cores here:
    TALL_FP8 on a device that has them."""
    return TALL_FP8 and exact_in_bf16 and _fp8_dots(device)


def _fp8_dots(device: torch.device) -> bool:
    """Whether this device dots e4m3 codes: GPUs from sm_89 (the interpreter emulates it)."""
    return interpreting() or (device.type == "cuda" and fp8_tensor_cores(device))


def fp8_queries(q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4-quantized queries q [n, Hi, Di] and their heads' weights w [n, Hi] -> (q's e4m3
    codes under a power-of-two scale a row and head, w times those scales), so that the scales
    leave each head's ReLU(q . k) * w as it was. A code is at most 6: a block's e2m1 values
    shifted down by the binades its scale lies under the head's largest, exact within 8. In
    the interpreter, fp32 values on the e4m3 grid (see _fp8_keys). One launch that reads q
    once (fp8_queries_ref, torch's five passes over q, gives the same bits)."""
    n, heads, dim = q.shape
    q = q if q.stride(-1) == 1 else q.contiguous()
    codes = torch.empty(n, heads, dim, device=q.device,
                        dtype=torch.float32 if interpreting() else torch.float8_e4m3fn)
    scaled = torch.empty(n, heads, device=q.device, dtype=torch.float32)
    if n:
        _fp8_queries_kernel[(triton.cdiv(n, 32), heads)](
            q, w, codes if interpreting() else codes.view(torch.uint8), scaled, n, q.stride(0), q.stride(1),
            w.stride(0), w.stride(1), DI=dim, RB=32, HW_FP8=not interpreting())
    return codes, scaled


def fp8_queries_ref(q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_queries in torch ops."""
    amax = q.abs().amax(-1).float()
    scales = torch.where(amax > 0, quant.pow2_ceil(amax / 6), 1.0)
    codes = (q.float() / scales[..., None]).to(torch.float8_e4m3fn)
    return (codes.float() if interpreting() else codes).contiguous(), w * scales


@triton.jit(do_not_specialize=["n"])  # one compile for every row count
def _fp8_queries_kernel(q_ptr, w_ptr, codes_ptr, scaled_ptr, n, sqn, sqh, swn, swh, DI: tl.constexpr,
                        RB: tl.constexpr, HW_FP8: tl.constexpr):
    """Program (RB rows, one head): fp8_queries' codes (contiguous [n, Hi, Di]) and scaled
    weights ([n, Hi]); the scale 2^ceil(log2(amax / 6)) from the ratio's bits (quant.pow2_ceil),
    1 for a head of zeros."""
    r = tl.program_id(0) * RB + tl.arange(0, RB)
    h = tl.program_id(1)
    heads = tl.num_programs(1)
    ok = r < n
    d = tl.arange(0, DI)
    q = tl.load(q_ptr + r[:, None].to(tl.int64) * sqn + h * sqh + d[None, :], mask=ok[:, None], other=0.0)
    q = q.to(tl.float32)
    amax = tl.max(tl.abs(q), axis=1)
    # amax / 6 rounded as torch divides (Triton's '/' may be off by an ulp on the GPU, and amax
    # / 6 is often exactly a power of two, where an ulp more doubles the scale)
    bits = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)).to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # biased exponent of the scale
    scale = tl.where(amax > 0, pow2(e), 1.0)
    v = q * tl.where(amax > 0, pow2(254 - e), 1.0)[:, None]  # / scale, exactly
    at = (r[:, None].to(tl.int64) * heads + h) * DI + d[None, :]
    if HW_FP8:
        tl.store(codes_ptr + at, v.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=ok[:, None])
    else:
        _, value = e4m3_rne(v)
        tl.store(codes_ptr + at, value, mask=ok[:, None])
    w = tl.load(w_ptr + r.to(tl.int64) * swn + h * swh, mask=ok, other=0.0).to(tl.float32)
    tl.store(scaled_ptr + r.to(tl.int64) * heads + h, w * scale, mask=ok)


def _few_queries(q, w, visible, pages, key_offsets, key_scale_offsets, out, runs, most: int, bf16: bool,
                 aligned: bool) -> None:
    """indexer_scores' launch for runs of at most FEW_QUERIES rows (_indexer_few_kernel)."""
    n, heads, dim = q.shape
    N = key_offsets.shape[-1]
    first, count = (visible, visible) if runs is None else runs[:2]  # (unused without runs)
    launches = 1 if runs is None else key_offsets.shape[0]
    nb, warps = FEW_TILES
    chunk = FEW_QUERY_COLUMNS
    columns = chunk * triton.cdiv(most, chunk)
    group = min(triton.next_power_of_2(heads), FEW_HEADS_COLUMNS // chunk)
    programs = min(triton.cdiv(N, nb), triton.cdiv(FEW_PROGRAMS, launches))
    # num_stages=1: pipelined, the queries reloaded a block took 400 KB of shared memory
    _indexer_few_kernel[(programs, launches)](
        q, w, visible, pages, key_offsets, key_scale_offsets, out, first, count, n, N, out.shape[1], heads, q.stride(0),
        q.stride(1), w.stride(0), out.stride(0), key_offsets.stride(0), programs, DI=dim, QN=columns, QC=chunk, GH=group, NB=nb,
        RUNS=runs is not None, BF16=bf16, CHAIN=group < heads, HOIST=columns == chunk and group >= heads,
        ALIGNED=aligned, PTX=FEW_PTX_DECODE and not interpreting(), num_warps=warps, num_stages=1,
        **pdl.options(q.device))


def warm_up_counts() -> list[tuple[int, int]]:
    """(queries, entries) of the launches scores_warm_up makes: queries 1, a multiple of 16 and
    neither, entries of both kinds, as Triton specializes integer arguments (a tall run of
    TALL_RUN rows sees at least TALL_RUN / 2 entries, never 1: the sources' ratios are 1 and
    2). A long prompt's score slices are 2^27 / entries rows (indexer._SCORE_BUDGET): at
    24,576 entries a 16,384-row run is cut into slices of 5,461 rows and a last one of 1.
    Up to FEW_QUERIES rows a run the few-query form takes them (at 8 and 16 query columns:
    1 and 9 rows, and two runs of 8 and of 8 and 9; its entry counts are not specialized),
    the short tiles from 17 (alone 17 and 32, two runs of 17 and of 24)."""
    return [(n, N) for n in (1, 9, 16, 17, 32, 34, 48) for N in (16, 17)]


def scores_warm_up(device: torch.device, heads: int, dim: int, keys_aligned: bool, fp8: bool = False,
                   kept_block: int = 0, pad: bool = False, keep: bool = False) -> None:
    """Compile the scoring tiles (FP4-quantized queries), tall (prefill), short and few-query,
    for every specialization of warm_up_counts, before a worker serves; and the batched forms
    (a decode batch's runs in one launch, index_runs), whose rows are never 1. H200,
    2026-12-02: after the two-prompt warm-up, a 1M-token prefill on an empty Triton cache still
    compiled the tall tiles four times, ~5 s, three of them in its first 64K tokens; with them
    warmed, the short tiles once (0.7 s, 16 queries of 16 entries, in its last step). The
    batched form was not warmed: a decode batch compiled it when its widest entry count first
    changed kind, as a batch-1 step without this warm-up compiled the single-run form
    (2026-12-03, 1.9 s in one step with two other kernels: bench/decode_compiles.py).
    keys_aligned: the serving pool's (CacheLayout.keys_aligned), which picks the few-query
    form's loads and decode. fp8: a faithful worker's, whose tall tiles also take the FP8 form.
    kept_block: a model's candidate pool's block (0: none), whose tall and short tiles then
    also take the pool's blocks (`kept`). pad: rows padded as a worker pads them
    (indexer.PADDED_ROWS: the padded width and row stride are specialized on). keep: the tall
    tiles (of the mode's form) also as they fill a top-k's kept scores (indexer.KEEP_IN_SCORES)."""
    launch_all(device, scores_warm_up_launches(device, heads, dim, keys_aligned, fp8, kept_block, pad, keep))


def scores_warm_up_launches(device: torch.device, heads: int, dim: int, keys_aligned: bool, fp8: bool = False,
                            kept_block: int = 0, pad: bool = False, keep: bool = False) -> list[Callable[[], object]]:
    """scores_warm_up's launches (for compile_threads.launch_all); the FP8 queries' encode they
    read is launched here."""
    launches = []
    most = max(n for n, _ in warm_up_counts())
    q = torch.zeros(most, heads, dim, dtype=torch.bfloat16, device=device)
    w = torch.zeros(most, heads, device=device)
    pages = torch.zeros(dim, dtype=torch.uint8, device=device)  # every entry reads one zero key
    # the FP8 tiles as a run takes them: its fp32 queries encoded once (fp8_queries), then scored
    encoded = fp8_queries(q.float(), w) if fp8 else None
    forms = [(True, False, False), (False, False, False)] + [(True, True, False)] * fp8 + [(True, fp8, True)] * keep
    for tall, on_fp8, keeps in forms:
        queries = encoded if on_fp8 else (q, w)
        for n, N in warm_up_counts():
            offsets = torch.zeros(N, dtype=torch.long, device=device)
            pools = [None]
            if kept_block:
                pools.append((torch.ones(n, -(-N // kept_block), dtype=torch.bool, device=device), kept_block))
            for kept in pools:
                launches.append(functools.partial(
                    _warm_up_scores, queries[0][:n], queries[1][:n], torch.full((n,), N, device=device), pages,
                    offsets, offsets, exact_in_bf16=True, tall=tall, keys_aligned=keys_aligned, fp8=on_fp8,
                    encoded=on_fp8, kept=kept, pad=pad, keep=keeps))
    for n, N in warm_up_counts():
        if n > 1:  # two runs, the second from row n // 2
            offsets = torch.zeros(2, N, dtype=torch.long, device=device)
            first = torch.tensor([0, n // 2], device=device)
            count = torch.tensor([n // 2, n - n // 2], device=device)
            launches.append(functools.partial(
                _warm_up_scores, q[:n], w[:n], torch.full((n,), N, device=device), pages, offsets, offsets,
                (first, count, n - n // 2), exact_in_bf16=True, keys_aligned=keys_aligned, pad=pad))
    return launches


def _warm_up_scores(*args, keep: bool = False, **kw) -> None:
    """indexer_scores(*args, **kw), with keep: into a top-k's work for its rows (zero floors)."""
    if keep:
        n, width = args[0].shape[0], padded_width(args[4].shape[-1]) if kw.get("pad") else args[4].shape[-1]
        kw["keep"] = work = kept_work(n, width, 1, args[0].device, atomic=True)
        work.floor.zero_()
    indexer_scores(*args, **kw)  # (looked up when it runs: tests wrap it)
