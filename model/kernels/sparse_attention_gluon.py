"""Faithful mode's prefill attention on Hopper, written in Gluon (Triton's explicit-layout
language): bf16 queries over FP8 window keys and FP4 selected entries, with the sink. The
GPU machines' torch 2.11 carries Triton 3.6 and the project pins 3.9: the kernel compiles on
both (`_barrier` and `_copy` take either's name).

Why Gluon: Triton's form (sparse_attention._prefill_attention_kernel with BOTH) holds a
query's 64 heads x 512 fp32 outputs and every key tile's decoded fp32 values in registers at
once, and spills (255 registers, 480 stack bytes a thread, sm_90): it runs at ~68 TFLOP/s
against the 694 of bf16. Here the layouts and shared memory are ours:
- a program is one query's head block on two warpgroups; each holds half the output's
  columns (128 fp32 registers a thread) and half of a key tile's logits;
- the queries sit in shared memory once, the A operand of the logits' wgmma;
- a key tile's bytes are copied to shared memory by cp.async one tile ahead (its offsets two
  ahead, since the copies' addresses come from them), so no thread waits on a global load;
  they come from gather_keys' copies, or in place from the pool's buffers where its offsets
  are on 16 bytes (`in_place`), which saves the copies;
- each tile is decoded from there into bf16 shared memory, the B operand of both products
  (K = V), and its probabilities go to shared memory as the A operand of the weighted sum,
  which leaves them out of the registers.
Both wgmmas are waited for where they are issued: ptxas serializes every wgmma of a kernel
(one wait after each instruction, C7514/C7515) when an in-flight one's accumulator or
register operands meet other instructions, which is what a weighted sum left in flight over
the loop's back edge did here (the first form, 5.5 ms at 8,192 queries on an H100).
The numbers are those of the Triton form: keys decoded exactly (an e4m3 or e2m1 value times its
power-of-two or e4m3 scale fits bf16), logits and running softmax in fp32, probabilities
rounded to bf16 for the weighted sum (sparse_attention_ref's bf16 branch).

The decoded form (_attention_rows_kernel, prefill_attention_decoded) takes the keys decoded
once into bf16 rows (sparse_attention.decode_keys: a prefill chunk's window and its entries,
each key once, not once per query that reads it) and each query's rows of them: a tile's keys
come by cp.async into one of two buffers while the tensor cores work on the tile before, and
the steps hold no decode. Same keys, tiles and order of sums: the same outputs bit for bit
(H200, twentieth session, 8,192 queries: 3.12 ms in place -> 2.42 ms, decoding included).

Gluon does not run in Triton's interpreter: these forms are tested on the GPU only
(tests/model/test_sparse_attention_gluon.py); sparse_attention takes the first where `usable`
says, a prefill chunk's attention the decoded one where `sparse_attention.decoded_form` does.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.runtime.jit import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma, warpgroup_mma_init,
                                                             warpgroup_mma_wait)

from .fp8_blockwise import Operand
from .quantize import FP8_AMAX_FLOOR, INV_FP8_MAX

D_MODEL = 512  # the head dim this form is laid out for (the release's)
HEADS = 64  # heads a program: the wgmma's M
KEY_TILE = 64  # keys a step: the queries, a bf16 [64, 512] tile and its staged bytes take 190 KB of shared memory
# The decoded form stages every key tile's rows (int64 offsets, 512 bytes a tile) into shared
# memory before its loop, where it staged them two tiles ahead into three rotating buffers: then
# the loop writes no rows, and its sm_90 SASS has 9 CTA barriers a tile where it had 11 (the
# compiler fenced each rotating write against the reads of the others). A release prefill
# query's 10 tiles take 5 KB (206 KB of shared memory -> 211); up to MAX_ROW_TILES. The same
# keys in the same order: the same bits. H100 (fifty-seventh session, call AP): the kernel alone
# at a 16K chunk 5,108 / 5,023 -> 4,946 / 4,881 us, a 256K faithful prefill 9.78 -> 9.74 s.
ROWS_ONCE = True
MAX_ROW_TILES = 24
# Each tile count compiles its own form (1.4 s on an H100), so only a full query's counts are
# staged once: the release's 128-key window with 512 entries (10; V4.1-Pro's 1,024: 18), and
# the sliding-window layers' window with their one masked entry column (3). A short prompt's
# queries (fewer entries: up to 6 more counts) take the rotating form, one compile for all.
STAGED_TILES = (3, 10, 18)
# With ROWS_ONCE, each tile's weighted sum left in flight into the next tile, under the next
# tile's key wait and barriers (_tiles_sum_in_flight): the same bits. sm_90 SASS (Triton 3.6)
# with ROWS_ONCE: 690 -> 679 instructions a tile, 217 -> 228 registers, no wgmma serialized.
# H100 (call AP): the kernel alone 4,849 / 4,763 us (-5% against neither), a 256K prefill the
# same as ROWS_ONCE alone within its noise (9.74 / 9.77 s).
PV_IN_FLIGHT = True
# With ROWS_ONCE, each tile's keys copied a whole tile ahead (_tiles_sum_copy_ahead) in place of
# PV_IN_FLIGHT's order: tile t + 1's gather starts once tile t - 1's weighted sum is done, before
# tile t's logits, not after them; the weighted sum then runs with no key wait under it. The
# same bits. By the forty-eighth session's ablation the keys' copies cost ~13% of the kernel
# (H200, before PV_IN_FLIGHT). Sixtieth session (call BF, H100; sm_90 215 registers against
# 228, no wgmma serialized): the same bits, and slower: at a 16K chunk 4,916 / 4,825 us against
# PV_IN_FLIGHT's 4,870 / 4,789 (random rows 5,080 / 5,104 against 5,061 / 5,069), a 1M faithful
# prefill 47.00 against 46.71 s. So the gather's wait is not what binds once the weighted sum
# runs under it. Off.
COPY_AHEAD = False
DECODE_ROWS = 8  # keys decoded at a time (H200: 4.50 ms at 8,192 queries, 16: 4.67, 32: 4.52 and spills)
WARPS = 8
# the wgmma accumulators' layouts: a query's head block [HB, D] of outputs and [HB, KT] of a
# tile's logits, each warpgroup holding half the columns
O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, D_MODEL // 2, 16]))
S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, KEY_TILE // 2, 16]))
# a CTA-wide barrier: gl.thread_barrier in Triton 3.6 (the GPU machines' torch 2.11), gl.barrier in 3.9
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# cp.async of a pointer tensor into shared memory: async_copy_global_to_shared in 3.6, async_load in 3.9
_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# shared memory seen as another type and shape: `reinterpret` in 3.9, `_reinterpret` in 3.6
_REINTERPRET_39 = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@functools.cache
def _hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def usable(q: torch.Tensor, dim: int) -> bool:
    """Whether this form can take a launch: a Hopper GPU and the head dim it is laid out for."""
    return q.is_cuda and dim == D_MODEL and _hopper(q.device.index if q.device.index is not None else 0)


@gluon.jit
def _stage_keys(src_ptr, i, first, count, code_at, scale_at, base_code, base_scale, codes, scales,
                B: gl.constexpr, G: gl.constexpr, KT: gl.constexpr, GATHERED: gl.constexpr, num_warps: gl.constexpr):
    """Keys first .. first + KT (of count) of query i, each B blocks of G code bytes and B scale
    bytes -> codes [KT, B, G], scales [KT, B]. In place, their bytes are where the staged
    offsets code_at and scale_at [KT] say (plus the bases; -1: masked), every offset on 16
    bytes (a pool's layout: `in_place`); GATHERED, key after key in gather_keys' copy."""
    VEC: gl.constexpr = G if G < 16 else 16  # bytes a cp.async
    L3: gl.constexpr = gl.BlockedLayout([1, 1, VEC], [1, 32 * VEC // G, G // VEC], [num_warps, 1, 1], [2, 1, 0])
    LS: gl.constexpr = gl.BlockedLayout([1, B // 4], [8, 4], [num_warps, 1], [1, 0])
    ROWS: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))
    r = first + gl.arange(0, KT, layout=ROWS)
    rs = first + gl.arange(0, KT, layout=gl.SliceLayout(1, LS))
    b = gl.arange(0, B, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    u = gl.arange(0, G, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    bs = gl.arange(0, B, layout=gl.SliceLayout(0, LS))
    if GATHERED:
        live = r < count
        live_s = rs < count
        code_first = (i * count + r).to(gl.int64) * (B * G + B)
        scale_first = (i * count + rs).to(gl.int64) * (B * G + B) + B * G
    else:
        code_off = code_at.load(ROWS)
        live = (r < count) & (code_off >= 0)
        live_s = (rs < count) & (code_at.load(gl.SliceLayout(1, LS)) >= 0)
        code_first = code_off + base_code
        scale_first = scale_at.load(gl.SliceLayout(1, LS)) + base_scale
    at = gl.expand_dims(code_first, 1) + gl.expand_dims(b, 0) * G
    code_ptr = src_ptr + gl.expand_dims(at, 2) + gl.expand_dims(gl.expand_dims(u, 0), 1)
    scale_ptr = src_ptr + gl.expand_dims(scale_first, 1) + gl.expand_dims(bs, 0)
    if not GATHERED:  # the offsets' alignment, which the compiler cannot see
        code_ptr = gl.max_contiguous(gl.multiple_of(code_ptr, [1, 1, VEC]), [1, 1, VEC])
        scale_ptr = gl.max_contiguous(gl.multiple_of(scale_ptr, [1, B // 4]), [1, B // 4])
    _copy(codes, code_ptr, mask=gl.expand_dims(gl.expand_dims(live, 1), 2))
    _copy(scales, scale_ptr, mask=gl.expand_dims(live_s, 1))


@gluon.jit
def _stage_offsets(win_off, win_soff, ent_off, ent_soff, i, t, window_tiles, W, K, swn, sen, code_at, scale_at,
                   KT: gl.constexpr, num_warps: gl.constexpr):
    """Start copying key tile t's code and scale offsets into code_at and scale_at."""
    _stage_rows(win_off, ent_off, i, t, window_tiles, W, K, swn, sen, code_at, KT, num_warps)
    _stage_rows(win_soff, ent_soff, i, t, window_tiles, W, K, swn, sen, scale_at, KT, num_warps)


@gluon.jit
def _stage(ring_ptr, page_ptr, i, t, window_tiles, W, K, base_code, base_scale, code_at, scale_at,
           raw_w, raw_ws, raw_e, raw_es, KT: gl.constexpr, D: gl.constexpr, GATHERED: gl.constexpr,
           num_warps: gl.constexpr):
    """Start copying key tile t of query i (the window's tiles, then the entries') into the
    staging buffers: cp.async, so the bytes fly while the tensor cores work on tile t - 1
    (rows past the tile's end come as zeros). A window key is e4m3 codes with an e8m0
    exponent a 32 (its offsets plus the layer's bases); an entry, packed e2m1 pairs with an
    e4m3 scale a 16."""
    if t < window_tiles:
        _stage_keys(ring_ptr, i, t * KT, W, code_at, scale_at, base_code, base_scale, raw_w, raw_ws, D // 32, 32, KT,
                    GATHERED, num_warps)
    else:
        _stage_keys(page_ptr, i, (t - window_tiles) * KT, K, code_at, scale_at, 0, 0, raw_e, raw_es, D // 16, 8, KT,
                    GATHERED, num_warps)


@gluon.jit
def _decode_window(raw_w, raw_ws, keys, KT: gl.constexpr, SUB: gl.constexpr, D: gl.constexpr,
                   num_warps: gl.constexpr):
    """A staged window tile -> keys: e4m3 codes times 2^(e - 127) a 32 columns (e = 0 decodes
    to 0, as the Triton form does)."""
    B: gl.constexpr = D // 32
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, B, 32 // B], [num_warps, 1, 1], [2, 1, 0])
    for r0 in gl.static_range(0, KT, SUB):
        codes = raw_w.slice(r0, SUB).load(L3)
        exps = raw_ws.slice(r0, SUB).load(gl.SliceLayout(2, L3))
        scale = gl.expand_dims((exps.to(gl.int32) << 23).to(gl.float32, bitcast=True), 2)
        values = codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale
        keys.slice(r0, SUB).store(gl.reshape(values.to(gl.bfloat16), [SUB, D]))


# four packed e2m1 pairs (a 32-bit word) -> the e4m3 codes of their low (high) nibbles times
# 2^-6: magnitude bits moved to bits 2..4 of each byte, the sign to bit 7, four bytes at once
# (per byte, the compiler's shifts and masks and the repacking for the conversion took ~12
# instructions)
_LOW_NIBBLES = gl.constexpr("{ .reg .b32 a, b; shl.b32 a, $1, 2; and.b32 a, a, 0x1C1C1C1C; shl.b32 b, $1, 4; "
                            "and.b32 b, b, 0x80808080; or.b32 $0, a, b; }")
_HIGH_NIBBLES = gl.constexpr("{ .reg .b32 a, b; shr.b32 a, $1, 2; and.b32 a, a, 0x1C1C1C1C; "
                             "and.b32 b, $1, 0x80808080; or.b32 $0, a, b; }")


@gluon.jit
def _e4m3_codes(packed, ASM: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,r", [packed], dtype=gl.uint8, is_pure=True, pack=4)


@gluon.jit
def _decode_entries(raw_e, raw_es, keys, KT: gl.constexpr, SUB: gl.constexpr, D: gl.constexpr,
                    num_warps: gl.constexpr):
    """A staged entry tile -> keys: a byte's low nibble is column 2c, its high one 2c + 1,
    times one e4m3 scale a 16 columns. An e2m1 code's three magnitude bits shifted left by two
    are the e4m3 code of its value times 2^-6, subnormal 0.5 included, and its sign goes to
    bit 7: so the hardware's e4m3 conversion decodes it, and the scale carries the 2^6."""
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])
    for r0 in gl.static_range(0, KT, SUB):
        packed = raw_e.slice(r0, SUB).load(L3)
        sbytes = raw_es.slice(r0, SUB).load(gl.SliceLayout(2, L3))
        scale = gl.expand_dims(sbytes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 64.0, 2)
        low = _e4m3_codes(packed, _LOW_NIBBLES)
        high = _e4m3_codes(packed, _HIGH_NIBBLES)
        low = (low.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale).to(gl.bfloat16)
        high = (high.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale).to(gl.bfloat16)
        keys.slice(r0, SUB).store(gl.reshape(gl.join(low, high), [SUB, D]))


@gluon.jit
def _queries(q_ptr, i, h0, H, sqn, sqh, HB: gl.constexpr, D: gl.constexpr, num_warps: gl.constexpr):
    """Query i's heads h0 .. h0 + HB (zeros past H), once, into shared memory: the logits' A operand."""
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    qh = h0 + gl.arange(0, HB, layout=gl.SliceLayout(1, blocked))
    qd = gl.arange(0, D, layout=gl.SliceLayout(0, blocked))
    q = gl.load(q_ptr + i.to(gl.int64) * sqn + gl.expand_dims(qh, 1) * sqh + gl.expand_dims(qd, 0),
                mask=gl.expand_dims(qh < H, 1), other=0.0)
    return gl.allocate_shared_memory(gl.bfloat16, [HB, D], gl.NVMMASharedLayout.get_default_for([HB, D], gl.bfloat16),
                                     q)


@gluon.jit
def _mul_rn(a, b):
    """a * b rounded on its own, never contracted into an FMA with the sum after it (rope.mul_rn)."""
    return gl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _rotated_queries(q_ptr, cos_ptr, sin_ptr, i, h0, H, sqn, sqh, scn, t_ptr, stn, sth, HB: gl.constexpr,
                     D: gl.constexpr, HALF: gl.constexpr, PLAIN: gl.constexpr, num_warps: gl.constexpr):
    """_queries of the fp32 queries before RoPE, or of their halves (_rotate_queries_into)."""
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HB, D], gl.NVMMASharedLayout.get_default_for([HB, D],
                                                                                                  gl.bfloat16))
    _rotate_queries_into(q_ptr, cos_ptr, sin_ptr, i, h0, H, sqn, sqh, scn, q_smem, 0, HB, D, D, HALF, num_warps,
                         t_ptr, stn, sth, PLAIN)
    return q_smem


@gluon.jit
def _rotate_queries_into(q_ptr, cos_ptr, sin_ptr, i, h0, H, sqn, sqh, scn, dst, COL0: gl.constexpr,
                         HB: gl.constexpr, WIDTH: gl.constexpr, D: gl.constexpr, HALF: gl.constexpr,
                         num_warps: gl.constexpr, t_ptr, stn, sth, PLAIN: gl.constexpr):
    """Query i's heads h0 .. h0 + HB (zeros past H), columns COL0 .. COL0 + WIDTH, into dst [HB,
    WIDTH] bf16 shared memory. HALF > 0: q holds the fp32 queries before RoPE, rotated here (the
    last HALF channel pairs with row i's cos and sin [HALF], _turned) and cast to bf16, as
    attention_queries.query_parts(q, 1, 1) writes them; 0: bf16 queries, rotated. PLAIN > 0 (with
    HALF): the queries in halves (attention_queries.QueryHalves): q holds each head's first PLAIN
    channels in bf16 (sqn, sqh) and t_ptr its others in fp32 before RoPE (stn, sth); a thread's
    8 channels lie in one of them (PLAIN is a multiple of 8). A few heads at a time (a whole head
    block's fp32 values would not fit the registers)."""
    ROWS: gl.constexpr = 32  # rows a pass: their loads in flight together (8 left a program ~1 us a pass)
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    d = COL0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, blocked))
    if HALF > 0:
        angles = _pair_angles(cos_ptr, sin_ptr, i, scn, COL0 // 2, WIDTH // 2, D // 2 - HALF,
                              _pairs_layout(8, num_warps))
    for r0 in gl.static_range(0, HB, ROWS):
        qh = h0 + r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, blocked))
        row = q_ptr + i.to(gl.int64) * sqn + gl.expand_dims(qh, 1) * sqh
        live = gl.expand_dims(qh < H, 1)
        if PLAIN > 0:
            plain = gl.expand_dims(d < PLAIN, 0)
            x = gl.load(row + gl.expand_dims(d, 0), mask=live & plain, other=0.0).to(gl.float32)
            tail = t_ptr + i.to(gl.int64) * stn + gl.expand_dims(qh, 1) * sth + gl.expand_dims(d - PLAIN, 0)
            x = gl.where(plain, x, gl.load(tail, mask=live & gl.expand_dims(d >= PLAIN, 0), other=0.0))
        else:
            x = gl.load(row + gl.expand_dims(d, 0), mask=live, other=0.0)
        if HALF > 0:
            x = _turned(x.to(gl.float32), angles, False)  # (bf16 queries before RoPE: bench/query_bytes.py)
        dst.slice(r0, ROWS).store(x.to(gl.bfloat16))


@constexpr_function
def _pairs_layout(per_thread: int, num_warps: int) -> gl.SliceLayout:
    """The layout of a pair's angle beside rows in BlockedLayout([1, per_thread], [1, 32],
    [num_warps, 1]) split into their (even, odd) channels (_turned): the split's own."""
    pairs = gl.BlockedLayout([1, per_thread // 2, 2], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])
    return gl.SliceLayout(0, gl.SliceLayout(2, pairs))


@gluon.jit
def _pair_angles(cos_ptr, sin_ptr, i, scn, FIRST: gl.constexpr, PAIRS: gl.constexpr, UNTURNED: gl.constexpr,
                 layout: gl.constexpr):
    """Row i's cos and sin of channel pairs FIRST .. FIRST + PAIRS, and which pairs turn: those
    from UNTURNED on (RoPE's HALF angles)."""
    p = FIRST + gl.arange(0, PAIRS, layout=layout) - UNTURNED
    turns = p >= 0
    at = i.to(gl.int64) * scn + gl.where(turns, p, 0)
    return gl.load(cos_ptr + at, mask=turns, other=1.0), gl.load(sin_ptr + at, mask=turns, other=0.0), turns


@gluon.jit
def _turned(x, angles, INVERSE: gl.constexpr):
    """Rows x [R, W] fp32 with each turning channel pair (e, o) turned by its angle (angles:
    _pair_angles' cos, sin and turns [W // 2]): (e c - o s, o c + e s), or INVERSE (e c + o s,
    o c - e s), each product rounded on its own and then summed, as rope.rope_values rounds;
    the other pairs as they were. A pair lies in one thread, so it splits in registers."""
    R: gl.constexpr = x.shape[0]
    W: gl.constexpr = x.shape[1]
    c, sn, turns = angles
    even, odd = gl.split(gl.reshape(x, [R, W // 2, 2]))
    c = gl.expand_dims(c, 0)
    sn = gl.expand_dims(sn, 0)
    turns = gl.expand_dims(turns, 0)
    if INVERSE:
        even_out = _mul_rn(even, c) + _mul_rn(odd, sn)
        odd_out = _mul_rn(odd, c) - _mul_rn(even, sn)
    else:
        even_out = _mul_rn(even, c) - _mul_rn(odd, sn)
        odd_out = _mul_rn(odd, c) + _mul_rn(even, sn)
    return gl.reshape(gl.join(gl.where(turns, even_out, even), gl.where(turns, odd_out, odd)), [R, W])


@gluon.jit
def _softmax_start(HB: gl.constexpr, KT: gl.constexpr, D: gl.constexpr):
    """The probabilities' shared memory (the weighted sum's A operand), the running max and
    denominator, the output and the logits' zero accumulator, before a query's first tile."""
    probs = gl.allocate_shared_memory(gl.bfloat16, [HB, KT], gl.NVMMASharedLayout.get_default_for([HB, KT],
                                                                                                   gl.bfloat16))
    m_i = gl.full([HB], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([HB], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    return probs, m_i, l_i, gl.zeros([HB, D], gl.float32, layout=O_LAYOUT), gl.zeros([HB, KT], gl.float32,
                                                                                     layout=S_LAYOUT)


@gluon.jit
def _softmax_step(s, valid, scale, m_i, l_i, o, o_layout: gl.constexpr):
    """A key tile's raw logits s [HB, KT] (valid keys [KT]) into the running max m_i and
    denominator l_i (fp32); the output rescaled. Returns the tile's probabilities, m_i, l_i, o."""
    logits = gl.where(gl.expand_dims(valid, 0), s * scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(logits, axis=1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp(logits - gl.expand_dims(m_safe, 1))
    alpha = gl.exp(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return p, m_new, l_i, o


@gluon.jit
def _tile_products(q_smem, keys, probs, s_init, valid, scale, m_i, l_i, o, o_layout: gl.constexpr,
                   SKIP: gl.constexpr):
    """A key tile's step once its bf16 keys [KT, D] are in shared memory: the logits' wgmma,
    the softmax, the probabilities through shared memory, the weighted sum's wgmma (both
    waited where issued). SKIP 2, 4, 8 leave the logits' wgmma, the softmax, the weighted
    sum's wgmma out (a bench's ablation). Returns m_i, l_i, o."""
    if SKIP & 2:
        s = s_init
    else:
        s = warpgroup_mma(q_smem, keys.permute((1, 0)), s_init, use_acc=False)
    if SKIP & 4:
        p = s
    else:
        p, m_i, l_i, o = _softmax_step(s, valid, scale, m_i, l_i, o, o_layout)
    probs.store(p.to(gl.bfloat16))
    fence_async_shared()
    _barrier()
    if not SKIP & 8:
        o = warpgroup_mma(probs, keys, o)
    return m_i, l_i, o


@gluon.jit
def _normalized(o, m_i, l_i, sink_ptr, h0, H, HB: gl.constexpr, o_layout: gl.constexpr):
    """A query's output rows [HB, D] fp32 and their heads: the sink joins the denominator only;
    a query that saw nothing returns zeros (sparse_attention._finish)."""
    heads = h0 + gl.arange(0, HB, layout=gl.SliceLayout(1, o_layout))
    m_o = gl.convert_layout(m_i, gl.SliceLayout(1, o_layout))
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    sink = gl.load(sink_ptr + heads, mask=heads < H, other=0.0)
    m_fin = gl.maximum(m_o, sink)
    denominator = l_o * gl.exp(m_o - m_fin) + gl.exp(sink - m_fin)
    return o * gl.expand_dims(gl.exp(m_o - m_fin) / denominator, 1), heads


@gluon.jit
def _finish(o, m_i, l_i, sink_ptr, o_ptr, i, h0, H, son, soh, HB: gl.constexpr, D: gl.constexpr,
            o_layout: gl.constexpr, COL0: gl.constexpr):
    """Query i's output rows (_normalized; o holds their D columns from COL0) into o_ptr."""
    out, heads = _normalized(o, m_i, l_i, sink_ptr, h0, H, HB, o_layout)
    d = COL0 + gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + i.to(gl.int64) * son + gl.expand_dims(heads, 1) * soh + gl.expand_dims(d, 0), out,
             mask=gl.expand_dims(heads < H, 1))


@gluon.jit
def _pow2(exponent):
    """The fp32 2^(e - 127) of a biased exponent e: common.pow2's Gluon twin (a Gluon kernel
    cannot call Triton's @jit functions)."""
    return (exponent << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _scale_exponents(amax):
    """Each block's biased scale exponent from its largest magnitude: quantize.fp8_block_exponents'
    Gluon twin."""
    bits = (gl.maximum(amax, FP8_AMAX_FLOOR) * INV_FP8_MAX).to(gl.int32, bitcast=True)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(gl.int32)


@gluon.jit
def _finish_encoded(o, m_i, l_i, sink_ptr, stage, cos_ptr, sin_ptr, codes_ptr, scales_ptr, i, h0, H, scn, ROWS,
                    HB: gl.constexpr, D: gl.constexpr, HALF: gl.constexpr, GROUP_HEADS: gl.constexpr,
                    o_layout: gl.constexpr, num_warps: gl.constexpr):
    """Query i's output rows (_normalized) written as wo_a's FP8 operand, never as fp32: after
    the inverse RoPE, each 32 columns rounded onto faithful mode's FP8 grid, then encoded in
    128-column blocks, as fp8_blockwise.rows_1x128(rows, groups, round_first=True) encodes the
    rows [n, H * D] (head h's columns in group h // GROUP_HEADS's codes [ROWS, GROUP_HEADS * D],
    each block's fp32 scale at (h * D / 128 + block) * ROWS + i). The rows go through `stage`
    (fp32 [HB, D] shared memory) into a layout where a warp holds a head's row: a block's
    maxima then take shuffles, not shared memory."""
    out, _ = _normalized(o, m_i, l_i, sink_ptr, h0, H, HB, o_layout)
    _barrier()  # every warpgroup's last weighted sum is done with the keys' buffers `stage` reuses
    stage.store(out)
    _barrier()
    _encode_staged(stage, cos_ptr, sin_ptr, codes_ptr, scales_ptr, i, h0, H, scn, ROWS, 0, HB, D, HALF, GROUP_HEADS,
                   num_warps)


@gluon.jit
def _encode_staged(stage, cos_ptr, sin_ptr, codes_ptr, scales_ptr, i, h0, H, scn, ROWS, FIRST: gl.constexpr,
                   COUNT: gl.constexpr, D: gl.constexpr, HALF: gl.constexpr, GROUP_HEADS: gl.constexpr,
                   num_warps: gl.constexpr):
    """Rows FIRST .. FIRST + COUNT of `stage` (query i's normalized fp32 outputs [HB, D], heads
    from h0) written as wo_a's FP8 operand (_finish_encoded), 8 heads a pass, each warp
    holding whole rows."""
    SLAB: gl.constexpr = 8  # heads a pass (the staging layout's swizzle spans 8 rows)
    BLOCKS: gl.constexpr = D // 128
    L2: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
    LS: gl.constexpr = gl.BlockedLayout([1, 1], [32 // BLOCKS, BLOCKS], [num_warps, 1], [1, 0])
    d = gl.arange(0, D, layout=gl.SliceLayout(0, L2))
    block = gl.arange(0, BLOCKS, layout=gl.SliceLayout(0, LS))
    angles = _pair_angles(cos_ptr, sin_ptr, i, scn, 0, D // 2, D // 2 - HALF, _pairs_layout(4, num_warps))
    for s0 in gl.static_range(FIRST, FIRST + COUNT, SLAB):
        if h0 + s0 < H:  # a tensor-parallel rank's head block ends short of HB
            x = gl.reshape(_turned(stage.slice(s0, SLAB).load(L2), angles, True), [SLAB, BLOCKS, 4, 32])
            e32 = gl.expand_dims(_scale_exponents(gl.max(gl.abs(x), axis=3)), 3)
            y = (x * _pow2(254 - e32)).to(gl.float8e4nv).to(gl.float32) * _pow2(e32)
            e128 = _scale_exponents(gl.max(gl.max(gl.abs(y), axis=3), axis=2))  # [SLAB, BLOCKS]
            inverse = gl.expand_dims(gl.expand_dims(_pow2(254 - e128), 2), 3)
            code = gl.convert_layout(
                gl.reshape((y * inverse).to(gl.float8e4nv).to(gl.uint8, bitcast=True), [SLAB, D]), L2)
            heads = h0 + s0 + gl.arange(0, SLAB, layout=gl.SliceLayout(1, L2))
            at = ((heads // GROUP_HEADS).to(gl.int64) * ROWS + i) * (GROUP_HEADS * D) + (heads % GROUP_HEADS) * D
            gl.store(codes_ptr + gl.expand_dims(at, 1) + gl.expand_dims(d, 0), code,
                     mask=gl.expand_dims(heads < H, 1))
            scale_heads = h0 + s0 + gl.arange(0, SLAB, layout=gl.SliceLayout(1, LS))
            scale_at = (gl.expand_dims(scale_heads, 1) * BLOCKS + gl.expand_dims(block, 0)).to(gl.int64) * ROWS + i
            gl.store(scales_ptr + scale_at, gl.convert_layout(_pow2(e128), LS),
                     mask=gl.expand_dims(scale_heads < H, 1))


@gluon.jit
def _attention_kernel(q_ptr, ring_ptr, win_off, win_soff, page_ptr, ent_off, ent_soff, sink_ptr, o_ptr, H, W, K,
                      scale, base_code, base_scale, sqn, sqh, swn, sen, son, soh,
                      D: gl.constexpr, HB: gl.constexpr, KT: gl.constexpr, SUB: gl.constexpr,
                      GATHERED: gl.constexpr, SKIP: gl.constexpr, num_warps: gl.constexpr):
    """Program (query i, head block): every key of the query, window tiles then entry tiles.
    A tile's step: its staged bytes decoded into `keys`, the next tile's bytes and the tile
    after's offsets started, the logits' wgmma, the softmax, the probabilities into shared
    memory, the weighted sum's wgmma. SKIP (a bench's ablation; its outputs are wrong) leaves
    phases out: 1 the decode, 2 the logits' wgmma, 4 the softmax, 8 the weighted sum's wgmma,
    16 the key bytes' copies."""
    i = gl.program_id(0)
    h0 = gl.program_id(1) * HB
    o_layout: gl.constexpr = O_LAYOUT
    s_layout: gl.constexpr = S_LAYOUT
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    plain3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])

    raw_w = gl.allocate_shared_memory(gl.uint8, [KT, D // 32, 32], plain3)
    raw_ws = gl.allocate_shared_memory(gl.uint8, [KT, D // 32], plain)
    raw_e = gl.allocate_shared_memory(gl.uint8, [KT, D // 16, 8], plain3)
    raw_es = gl.allocate_shared_memory(gl.uint8, [KT, D // 16], plain)
    # tile x's code and scale offsets in buffer x % 2: staged two tiles ahead, since the bytes'
    # copies one tile ahead need them
    plain1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    code_at = gl.allocate_shared_memory(gl.int64, [2, KT], plain1)
    scale_at = gl.allocate_shared_memory(gl.int64, [2, KT], plain1)
    window_tiles = gl.cdiv(W, KT)
    tiles = window_tiles + gl.cdiv(K, KT)
    for x in gl.static_range(2):
        if x < tiles:
            _stage_offsets(win_off, win_soff, ent_off, ent_soff, i, x, window_tiles, W, K, swn, sen,
                           code_at.index(x), scale_at.index(x), KT, num_warps)
    async_copy.commit_group()
    async_copy.wait_group(0)
    _barrier()
    _stage(ring_ptr, page_ptr, i, 0, window_tiles, W, K, base_code, base_scale, code_at.index(0), scale_at.index(0),
           raw_w, raw_ws, raw_e, raw_es, KT, D, GATHERED, num_warps)
    async_copy.commit_group()

    q_smem = _queries(q_ptr, i, h0, H, sqn, sqh, HB, D, num_warps)
    keys = gl.allocate_shared_memory(gl.bfloat16, [KT, D], gl.NVMMASharedLayout.get_default_for([KT, D], gl.bfloat16))
    probs, m_i, l_i, o, s_init = _softmax_start(HB, KT, D)
    j = gl.arange(0, KT, layout=gl.SliceLayout(0, s_layout))
    for t in range(tiles):
        async_copy.wait_group(0)
        # every thread's copies have landed, and tile t - 1's weighted sum (both warpgroups')
        # no longer reads `keys` and `probs`
        _barrier()
        if SKIP & 1:
            pass
        elif t < window_tiles:
            _decode_window(raw_w, raw_ws, keys, KT, SUB, D, num_warps)
        else:
            _decode_entries(raw_e, raw_es, keys, KT, SUB, D, num_warps)
        offsets = code_at.index(t % 2).load(gl.SliceLayout(0, s_layout))
        limit = gl.where(t < window_tiles, W - t * KT, K - (t - window_tiles) * KT)
        valid = (offsets >= 0) & (j < limit)
        fence_async_shared()  # the decoded keys, before the wgmmas read them
        _barrier()  # and every thread is done with the staged bytes and tile t's offsets
        if t + 1 < tiles:
            if not SKIP & 16:
                nxt = (t + 1) % 2
                _stage(ring_ptr, page_ptr, i, t + 1, window_tiles, W, K, base_code, base_scale, code_at.index(nxt),
                       scale_at.index(nxt), raw_w, raw_ws, raw_e, raw_es, KT, D, GATHERED, num_warps)
        if t + 2 < tiles:
            _stage_offsets(win_off, win_soff, ent_off, ent_soff, i, t + 2, window_tiles, W, K, swn, sen,
                           code_at.index(t % 2), scale_at.index(t % 2), KT, num_warps)
        async_copy.commit_group()
        m_i, l_i, o = _tile_products(q_smem, keys, probs, s_init, valid, scale, m_i, l_i, o, o_layout, SKIP)

    _finish(o, m_i, l_i, sink_ptr, o_ptr, i, h0, H, son, soh, HB, D, o_layout, 0)


@gluon.jit
def _stage_rows(win_rows, ent_rows, i, t, window_tiles, W, K, swn, sen, rows_at, KT: gl.constexpr,
                num_warps: gl.constexpr):
    """Start copying key tile t's rows (the window's, then the entries') into rows_at [KT]."""
    j = gl.arange(0, KT, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
    if t < window_tiles:
        jw = t * KT + j
        _copy(rows_at, win_rows + i * swn + jw, mask=jw < W)
    else:
        je = (t - window_tiles) * KT + j
        _copy(rows_at, ent_rows + i * sen + je, mask=je < K)


@gluon.jit
def _tile_rows(rows_at, t, window_tiles, W, K, KT: gl.constexpr, layout: gl.constexpr):
    """Key tile t's staged rows in `layout` and which of them are keys (not masked, not past the end)."""
    rows = rows_at.load(layout)
    j = gl.arange(0, KT, layout=layout)
    limit = gl.where(t < window_tiles, W - t * KT, K - (t - window_tiles) * KT)
    return rows, (rows >= 0) & (j < limit)


@gluon.jit
def _stage_keys_bf16(window_keys, entry_keys, rows_at, t, window_tiles, W, K, dst, KT: gl.constexpr,
                     D: gl.constexpr, num_warps: gl.constexpr):
    """Start copying key tile t's bf16 keys (rows of window_keys, then of entry_keys) into dst
    [KT, D] by cp.async, 16 bytes a copy; masked keys come as zeros."""
    L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    rows, live = _tile_rows(rows_at, t, window_tiles, W, K, KT, gl.SliceLayout(1, L))
    _copy_key_rows(window_keys, entry_keys, rows, live, t < window_tiles, dst, 0, D, D, L)


@gluon.jit
def _copy_key_rows(window_keys, entry_keys, rows, live, window, dst, COL0: gl.constexpr,
                   WIDTH: gl.constexpr, D: gl.constexpr, L: gl.constexpr):
    """Start copying columns COL0 .. COL0 + WIDTH of the bf16 key rows `rows` (of window_keys
    where `window`, else of entry_keys; live [KT] in SliceLayout(1, L)) into dst [KT, WIDTH] by
    cp.async, 16 bytes a copy; the keys not live come as zeros."""
    columns = COL0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, L))
    at = gl.expand_dims(gl.where(live, rows, 0) * D, 1) + gl.expand_dims(columns, 0)
    at = gl.max_contiguous(gl.multiple_of(at, [1, 8]), [1, 8])
    if window:
        _copy(dst, window_keys + at, mask=gl.expand_dims(live, 1))
    else:
        _copy(dst, entry_keys + at, mask=gl.expand_dims(live, 1))


@gluon.jit
def _attention_rows_kernel(q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr, o_ptr,
                           codes_ptr, scales_ptr, H, W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS,
                           t_ptr, stn, sth, D: gl.constexpr, HB: gl.constexpr, KT: gl.constexpr,
                           HALF: gl.constexpr, GROUP_HEADS: gl.constexpr, SKIP: gl.constexpr,
                           ROW_TILES: gl.constexpr, PV_IN_FLIGHT: gl.constexpr, PLAIN: gl.constexpr,
                           COPY_AHEAD: gl.constexpr, num_warps: gl.constexpr):
    """The decoded form. Program (query i, head block): every key of the query, window tiles
    then entry tiles, as bf16 rows already decoded (decode_keys): a tile's keys land in shared
    memory by cp.async one tile ahead, in one of two buffers, while the tensor cores work on
    the tile before; its rows are staged two ahead (three buffers: a tile's rows are read in
    its own step and the one before). SKIP: as _attention_kernel's (2, 4, 8, and 16 the keys'
    copies), a bench's ablation. HALF > 0: q holds the fp32 queries before RoPE, rotated
    (cos_ptr, sin_ptr: [n, HALF] by scn) as they are read (_rotated_queries); 0: bf16 and
    rotated. PLAIN > 0 (with HALF): q holds the first PLAIN channels in bf16 and t_ptr the rest
    (stn, sth; _rotate_queries_into). GROUP_HEADS > 0 (with HALF): the outputs go out as wo_a's
    FP8 operand, codes and scales of ROWS rows (_finish_encoded), not into o_ptr. ROW_TILES > 0
    (the query's tiles, as row_tiles counts them from the same widths): every tile's rows staged
    once before the loop, so the loop writes no rows to shared memory (ROWS_ONCE). PV_IN_FLIGHT
    (with ROW_TILES): _tiles_sum_in_flight's order; COPY_AHEAD (with ROW_TILES) _tiles_sum_copy_ahead's."""
    i = gl.program_id(0)
    h0 = gl.program_id(1) * HB
    o_layout: gl.constexpr = O_LAYOUT
    s_layout: gl.constexpr = S_LAYOUT
    ROW_BUFFERS: gl.constexpr = ROW_TILES if ROW_TILES > 0 else 3
    rows_at = gl.allocate_shared_memory(gl.int64, [ROW_BUFFERS, KT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    keys = gl.allocate_shared_memory(gl.bfloat16, [2, KT, D],
                                     gl.NVMMASharedLayout.get_default_for([KT, D], gl.bfloat16))
    window_tiles = gl.cdiv(W, KT)
    tiles = window_tiles + gl.cdiv(K, KT)
    if ROW_TILES > 0:
        for x in range(ROW_TILES):  # (its bound, not `tiles`: no index past the buffer)
            _stage_rows(win_rows, ent_rows, i, x, window_tiles, W, K, swn, sen, rows_at.index(x), KT, num_warps)
    else:
        for x in gl.static_range(2):
            if x < tiles:
                _stage_rows(win_rows, ent_rows, i, x, window_tiles, W, K, swn, sen, rows_at.index(x), KT,
                            num_warps)
    async_copy.commit_group()
    async_copy.wait_group(0)
    _barrier()
    if tiles > 0:
        _stage_keys_bf16(window_keys, entry_keys, rows_at.index(0), 0, window_tiles, W, K, keys.index(0), KT, D,
                         num_warps)
    async_copy.commit_group()

    if HALF > 0:
        q_smem = _rotated_queries(q_ptr, cos_ptr, sin_ptr, i, h0, H, sqn, sqh, scn, t_ptr, stn, sth, HB, D, HALF,
                                  PLAIN, num_warps)
    else:
        q_smem = _queries(q_ptr, i, h0, H, sqn, sqh, HB, D, num_warps)
    probs, m_i, l_i, o, s_init = _softmax_start(HB, KT, D)
    if COPY_AHEAD:
        gl.static_assert(ROW_TILES > 1 and SKIP == 0, "the copy-ahead form: rows staged once, two tiles or more")
        m_i, l_i, o = _tiles_sum_copy_ahead(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, window_keys,
                                            entry_keys, window_tiles, W, K, scale, o_layout, s_layout, KT, D,
                                            ROW_TILES, num_warps)
    elif PV_IN_FLIGHT:
        gl.static_assert(ROW_TILES > 1 and SKIP == 0, "the in-flight form: rows staged once, two tiles or more")
        m_i, l_i, o = _tiles_sum_in_flight(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, window_keys,
                                           entry_keys, window_tiles, W, K, scale, o_layout, s_layout, KT, D,
                                           ROW_TILES, num_warps)
    else:
        m_i, l_i, o = _tiles_sum(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, win_rows, ent_rows, window_keys,
                                 entry_keys, i, tiles, window_tiles, W, K, swn, sen, scale, o_layout, s_layout, KT, D,
                                 SKIP, ROW_TILES, num_warps)

    if GROUP_HEADS > 0:
        gl.static_assert(HALF > 0 and KT == HB, "the inverse RoPE's angles; fp32 [HB, D] fills the keys' buffers")
        _finish_encoded(o, m_i, l_i, sink_ptr, _fp32_stage(keys, HB, D), cos_ptr, sin_ptr, codes_ptr, scales_ptr, i,
                        h0, H, scn, ROWS, HB, D, HALF, GROUP_HEADS, o_layout, num_warps)
    else:
        _finish(o, m_i, l_i, sink_ptr, o_ptr, i, h0, H, son, soh, HB, D, o_layout, 0)


@gluon.jit
def _tiles_sum(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, win_rows, ent_rows, window_keys, entry_keys, i,
               tiles, window_tiles, W, K, swn, sen, scale, o_layout: gl.constexpr, s_layout: gl.constexpr,
               KT: gl.constexpr, D: gl.constexpr, SKIP: gl.constexpr, ROW_TILES: gl.constexpr,
               num_warps: gl.constexpr):
    """The decoded form's loop over a query's key tiles, each wgmma waited for where it is
    issued (_attention_rows_kernel). Returns m_i, l_i, o."""
    ROW_BUFFERS: gl.constexpr = rows_at.shape[0]  # the query's tiles (ROW_TILES), or 3 rotating
    for t in range(tiles):
        # tile t's keys and tile t + 1's rows have landed, and tile t - 1's weighted sum (both
        # warpgroups') no longer reads the buffer tile t + 1 goes to, nor `probs`
        async_copy.wait_group(0)
        fence_async_shared()
        _barrier()
        if t + 1 < tiles:
            if not SKIP & 16:
                _stage_keys_bf16(window_keys, entry_keys, rows_at.index((t + 1) % ROW_BUFFERS), t + 1, window_tiles,
                                 W, K, keys.index((t + 1) % 2), KT, D, num_warps)
        if ROW_TILES == 0:
            if t + 2 < tiles:
                _stage_rows(win_rows, ent_rows, i, t + 2, window_tiles, W, K, swn, sen, rows_at.index((t + 2) % 3),
                            KT, num_warps)
        async_copy.commit_group()
        _, valid = _tile_rows(rows_at.index(t % ROW_BUFFERS), t, window_tiles, W, K, KT,
                              gl.SliceLayout(0, s_layout))
        current = keys.index(t % 2)
        m_i, l_i, o = _tile_products(q_smem, current, probs, s_init, valid, scale, m_i, l_i, o, o_layout, SKIP)
    return m_i, l_i, o


@gluon.jit
def _tiles_sum_in_flight(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, window_keys, entry_keys, window_tiles,
                         W, K, scale, o_layout: gl.constexpr, s_layout: gl.constexpr, KT: gl.constexpr,
                         D: gl.constexpr, TILES: gl.constexpr, num_warps: gl.constexpr):
    """The decoded form's loop with each tile's weighted sum left in flight into the next tile:
    tile t's logits are issued behind tile t - 1's weighted sum, so the tensor cores go from one
    to the other while the warps wait for tile t's keys, where _tiles_sum waits for each wgmma
    where it is issued. The same products in the same order (both are waited for before the
    softmax rescales the output): the same bits. TILES, a query's tiles (ROW_TILES: its rows
    staged before the loop), is a constant bound: with the count at run time the loop could be
    skipped, and ptxas, seeing that path's zeros written into the output's registers while a
    weighted sum might be in flight, serialized every wgmma of the kernel (C7515), as it did
    (C7514) with two waits, tile t - 1's sum first (sm_90, Triton 3.6 and 3.9 alike). One tile
    has nothing to overlap (and Triton 3.6 cannot lower a wait on the output's zeros). Returns
    m_i, l_i, o."""
    o = warpgroup_mma_init(o)
    for t in range(TILES):
        async_copy.wait_group(0)  # tile t's keys, copied during tile t - 1
        fence_async_shared()
        _barrier()
        current = keys.index(t % 2)
        s = warpgroup_mma(q_smem, current.permute((1, 0)), s_init, use_acc=False, is_async=True)
        # tile t - 1's weighted sum and tile t's logits are done, in every warpgroup: then tile
        # t - 1's keys' buffer takes tile t + 1
        o, s = warpgroup_mma_wait(0, deps=[o, s])
        _barrier()
        if t + 1 < TILES:
            _stage_keys_bf16(window_keys, entry_keys, rows_at.index(t + 1), t + 1, window_tiles, W, K,
                             keys.index((t + 1) % 2), KT, D, num_warps)
        async_copy.commit_group()
        m_i, l_i, o = _probabilities_stored(s, probs, rows_at.index(t), t, window_tiles, W, K, scale, m_i, l_i, o,
                                            o_layout, s_layout, KT)
        o = warpgroup_mma(probs, current, o, is_async=True)
    return m_i, l_i, warpgroup_mma_wait(0, deps=[o])


@gluon.jit
def _probabilities_stored(s, probs, tile_rows, t, window_tiles, W, K, scale, m_i, l_i, o, o_layout: gl.constexpr,
                          s_layout: gl.constexpr, KT: gl.constexpr):
    """Tile t's logits s (its staged rows tile_rows) through the softmax, its probabilities in
    `probs` for every warpgroup's weighted sum (the in-flight loops' step between their wgmmas).
    Returns m_i, l_i, o."""
    _, valid = _tile_rows(tile_rows, t, window_tiles, W, K, KT, gl.SliceLayout(0, s_layout))
    p, m_i, l_i, o = _softmax_step(s, valid, scale, m_i, l_i, o, o_layout)
    probs.store(p.to(gl.bfloat16))
    fence_async_shared()
    _barrier()
    return m_i, l_i, o


@gluon.jit
def _tiles_sum_copy_ahead(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, window_keys, entry_keys, window_tiles,
                          W, K, scale, o_layout: gl.constexpr, s_layout: gl.constexpr, KT: gl.constexpr,
                          D: gl.constexpr, TILES: gl.constexpr, num_warps: gl.constexpr):
    """The decoded form's loop with each tile's keys copied a whole tile ahead: tile t - 1's
    weighted sum is waited for first, then tile t + 1's keys start into the buffer it read, and
    only then are tile t's keys waited for, its logits made and its softmax run. _tiles_sum_in_flight
    starts that copy after tile t's logits, so it has only the softmax to hide under, and tile
    t - 1's weighted sum runs under the wait for it; here the copy has a whole tile (the logits,
    the softmax, the weighted sum) and the weighted sum runs alone. Which wins depends on a gather's
    latency against a weighted sum's time. The same products in the same order: the same bits.
    TILES a constant bound, as in _tiles_sum_in_flight; tile 0 runs before the loop, so the loop's
    first wait names a weighted sum really in flight. Returns m_i, l_i, o."""
    m_i, l_i, o = _copy_ahead_tile(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, window_keys, entry_keys, 0,
                                   window_tiles, W, K, scale, o_layout, s_layout, KT, D, TILES, True, num_warps)
    for t in range(1, TILES):
        o = warpgroup_mma_wait(0, deps=[o])  # tile t - 1's weighted sum, in every warpgroup (the barrier next)
        _barrier()
        m_i, l_i, o = _copy_ahead_tile(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, window_keys, entry_keys, t,
                                       window_tiles, W, K, scale, o_layout, s_layout, KT, D, TILES, False, num_warps)
    return m_i, l_i, warpgroup_mma_wait(0, deps=[o])


@gluon.jit
def _copy_ahead_tile(q_smem, keys, probs, rows_at, s_init, m_i, l_i, o, window_keys, entry_keys, t, window_tiles,
                     W, K, scale, o_layout: gl.constexpr, s_layout: gl.constexpr, KT: gl.constexpr,
                     D: gl.constexpr, TILES: gl.constexpr, FIRST: gl.constexpr, num_warps: gl.constexpr):
    """_tiles_sum_copy_ahead's tile t, once nothing reads the keys' other buffer nor `probs`:
    tile t + 1's keys started, tile t's waited for (committed one group before), its logits
    (waited where issued), its softmax, and its weighted sum left in flight. FIRST (tile 0): the
    output's zeros not read (use_acc off), since ptxas fenced a wgmma on accumulators filled by
    moves of one zero register (C7519)."""
    if t + 1 < TILES:
        _stage_keys_bf16(window_keys, entry_keys, rows_at.index(t + 1), t + 1, window_tiles, W, K,
                         keys.index((t + 1) % 2), KT, D, num_warps)
    async_copy.commit_group()
    async_copy.wait_group(1)
    fence_async_shared()
    _barrier()
    current = keys.index(t % 2)
    s = warpgroup_mma(q_smem, current.permute((1, 0)), s_init, use_acc=False)
    m_i, l_i, o = _probabilities_stored(s, probs, rows_at.index(t), t, window_tiles, W, K, scale, m_i, l_i, o,
                                        o_layout, s_layout, KT)
    return m_i, l_i, warpgroup_mma(probs, current, o, use_acc=not FIRST, is_async=True)


@gluon.jit
def _fp32_stage(keys, HB: gl.constexpr, D: gl.constexpr):
    """The keys' buffers seen as a query's normalized fp32 outputs [HB, D] (they hold 128 KB
    either way), swizzled so the accumulator layout's stores and the epilogue's row loads meet
    no bank conflicts."""
    fp32: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])
    if _REINTERPRET_39:
        return keys.reinterpret(gl.float32, [HB, D], fp32)
    else:
        return keys._reinterpret(gl.float32, [HB, D], fp32)


def offsets_on_16_bytes(codes: torch.Tensor, scales: torch.Tensor, base: tuple[int, int] = (0, 0)) -> bool:
    """Whether every valid key's code and scale offsets (codes >= 0), plus `base`, are multiples
    of 16, as the in-place form's copies assume. A pool's layout makes them so (64-byte slots,
    rings of 512-byte rows and 16-byte scales, pages of a multiple of 4 entries)."""
    bad = ((codes + base[0]) % 16 != 0) | ((scales + base[1]) % 16 != 0)
    return not bool((bad & (codes >= 0)).any())


_IN_PLACE: dict[tuple[int, int], bool] = {}


def in_place(ring: torch.Tensor, pages: torch.Tensor, window_offsets: torch.Tensor,
             window_scale_offsets: torch.Tensor, entry_offsets: torch.Tensor, entry_scale_offsets: torch.Tensor,
             window_base: tuple[int, int] = (0, 0)) -> bool:
    """Whether launches over these pool buffers can read their keys in place: the buffers and
    the first launch's offsets on 16 bytes. The pool's layout places every key alike, so the
    answer is kept per pair of buffers (it costs a device sync)."""
    key = (ring.data_ptr(), pages.data_ptr())
    if key not in _IN_PLACE:
        _IN_PLACE[key] = (ring.data_ptr() % 16 == 0 and pages.data_ptr() % 16 == 0
                          and offsets_on_16_bytes(window_offsets, window_scale_offsets, window_base)
                          and offsets_on_16_bytes(entry_offsets, entry_scale_offsets))
    return _IN_PLACE[key]


def prefill_attention(q: torch.Tensor, ring: torch.Tensor, window_offsets: torch.Tensor,
                      window_scale_offsets: torch.Tensor, pages: torch.Tensor, entry_offsets: torch.Tensor,
                      entry_scale_offsets: torch.Tensor, sink: torch.Tensor, scale: float, out: torch.Tensor,
                      decode_rows: int = DECODE_ROWS, gathered: bool = False,
                      window_base: tuple[int, int] = (0, 0), skip: int = 0) -> torch.Tensor:
    """q [n, h, D] bf16 (rotated); ring / pages: the pool's byte buffers, read in place at the
    offsets [n, W] / [n, k] (-1: masked; window_base added to the valid window ones), or with
    `gathered` gather_keys' copies of those keys (base included); sink [h] fp32. Writes and
    returns out [n, h, D] fp32. `skip`: the kernel's SKIP (a bench's ablation only)."""
    n, heads, dim = q.shape
    assert dim == D_MODEL and q.dtype == torch.bfloat16 and q.stride(-1) == 1 and out.stride(-1) == 1
    offsets = (window_offsets, window_scale_offsets, entry_offsets, entry_scale_offsets)
    assert all(o.stride(-1) == 1 for o in offsets)
    assert window_offsets.stride(0) == window_scale_offsets.stride(0)
    assert entry_offsets.stride(0) == entry_scale_offsets.stride(0)
    if n == 0:
        return out
    W, K = window_offsets.shape[1], entry_offsets.shape[1]
    base = (0, 0) if gathered else window_base
    _attention_kernel[(n, triton.cdiv(heads, HEADS))](
        q, ring, window_offsets, window_scale_offsets, pages, entry_offsets, entry_scale_offsets, sink, out, heads, W,
        K, scale, base[0], base[1], q.stride(0), q.stride(1), window_offsets.stride(0), entry_offsets.stride(0),
        out.stride(0), out.stride(1), D=dim, HB=HEADS, KT=KEY_TILE, SUB=decode_rows, GATHERED=gathered,
        SKIP=skip, num_warps=WARPS)
    return out


def prefill_attention_decoded(q: torch.Tensor, window_keys: torch.Tensor, window_rows: torch.Tensor,
                              entry_keys: torch.Tensor, entry_rows: torch.Tensor, sink: torch.Tensor, scale: float,
                              out: torch.Tensor | Operand, skip: int = 0,
                              rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                              tail: torch.Tensor | None = None) -> torch.Tensor | Operand:
    """q [n, h, D] bf16 (rotated); window_keys / entry_keys [*, D] bf16, the keys decoded
    (sparse_attention.decode_keys); window_rows [n, W] / entry_rows [n, k] int64 rows of them
    (< 0: masked); sink [h] fp32. Writes and returns out [n, h, D] fp32: what prefill_attention
    computes over those keys in their FP8 and FP4 forms, bit for bit. rope (cos, sin [n, half]
    fp32): q is fp32 before RoPE, rotated and rounded to bf16 as the kernel reads it, as
    attention_queries.query_parts(q, 1, 1) would have; out may then be wo_a's operand
    (fp8_blockwise.empty_operand of n rows, h * D columns), which gets the outputs as
    rows_1x128(apply_rope(outputs, cos, sin, inverse=True).flatten(1), groups, round_first=True)
    encodes them. tail (with rope): the queries in halves (attention_queries.QueryHalves), q
    [n, h, P] their first P channels in bf16 and tail [n, h, D - P] the rest in fp32 before RoPE:
    the same outputs as q's whole fp32 form where q is its first P channels rounded. `skip`: the
    kernel's SKIP (a bench's ablation only)."""
    arguments, constants = launch_arguments(q, window_keys, window_rows, entry_keys, entry_rows, sink, scale, out,
                                            rope, tail)
    if q.shape[0]:
        launch_rows(arguments, constants, row_tiles(window_rows, entry_rows), skip, tail)
    return out


def launch_rows(arguments: list, constants: dict, tiles: int, skip: int = 0,
                tail: torch.Tensor | None = None) -> None:
    """_attention_rows_kernel on launch_arguments' arguments and constants (their queries
    arguments[0], [n, heads, *]), a query's ROW_TILES, the ablation's SKIP and the queries' tail,
    in the loop order the switches pick (PV_IN_FLIGHT, COPY_AHEAD: two tiles or more, no SKIP)."""
    q = arguments[0]
    t = q if tail is None else tail  # (not read without a tail)
    overlaps = tiles > 1 and not skip
    _attention_rows_kernel[(q.shape[0], triton.cdiv(q.shape[1], HEADS))](
        *arguments, t, t.stride(0), t.stride(1), **constants, HB=HEADS, KT=KEY_TILE, SKIP=skip, ROW_TILES=tiles,
        PV_IN_FLIGHT=PV_IN_FLIGHT and overlaps, PLAIN=0 if tail is None else q.shape[2],
        COPY_AHEAD=COPY_AHEAD and overlaps, num_warps=WARPS)


def row_tiles(window_rows: torch.Tensor, entry_rows: torch.Tensor) -> int:
    """_attention_rows_kernel's ROW_TILES: a query's key tiles where ROWS_ONCE stages all their
    rows before the loop, at the STAGED_TILES counts (0: three rotating tiles, staged two ahead)."""
    tiles = triton.cdiv(window_rows.shape[1], KEY_TILE) + triton.cdiv(entry_rows.shape[1], KEY_TILE)
    return tiles if ROWS_ONCE and tiles in STAGED_TILES and 0 < tiles <= MAX_ROW_TILES else 0


def launch_arguments(q: torch.Tensor, window_keys: torch.Tensor, window_rows: torch.Tensor, entry_keys: torch.Tensor,
                     entry_rows: torch.Tensor, sink: torch.Tensor, scale: float, out: torch.Tensor | Operand,
                     rope: tuple[torch.Tensor, torch.Tensor] | None,
                     tail: torch.Tensor | None = None) -> tuple[list, dict]:
    """prefill_attention_decoded's arguments checked, as a decoded-form kernel takes them: its
    positional arguments (not the tail's) and the constants D, HALF and GROUP_HEADS."""
    n, heads, dim = q.shape
    if tail is not None:  # the queries' halves: the rotated channels all in the tail
        assert rope is not None and q.dtype == torch.bfloat16 and tail.dtype == torch.float32
        assert tail.shape[:2] == (n, heads) and tail.stride(-1) == 1 and dim % 8 == 0
        assert tail.shape[2] >= 2 * rope[0].shape[-1], "a rotated channel among the plain ones"
        dim += tail.shape[2]
    assert dim == D_MODEL and q.stride(-1) == 1
    if rope is None:
        assert q.dtype == torch.bfloat16
        cos = sin = q.new_empty(0, dtype=torch.float32)
        half = 0
    else:
        cos, sin = rope
        half = cos.shape[-1]
        assert (q.dtype == torch.float32 or tail is not None) and cos.shape == sin.shape == (n, half)
        assert 0 < 2 * half <= dim and cos.dtype == sin.dtype == torch.float32
        assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    for keys in (window_keys, entry_keys):
        assert keys.dtype == torch.bfloat16 and keys.is_contiguous() and keys.shape[-1] == dim
    assert window_rows.stride(-1) == 1 and entry_rows.stride(-1) == 1
    if isinstance(out, Operand):
        codes, scales = out.codes, out.scales
        groups, rows = codes.shape[:2]
        assert half and out.m == n and heads % groups == 0 and codes.shape[2] == heads // groups * dim
        assert codes.is_contiguous() and scales.numel() == heads * dim // 128 * rows and dim % 128 == 0
        o_ptr, son, soh, group_heads = codes, 0, 0, heads // groups  # (o_ptr not written)
    else:
        assert out.stride(-1) == 1
        codes = scales = o_ptr = out  # (codes and scales not written)
        son, soh, rows, group_heads = out.stride(0), out.stride(1), 0, 0
    arguments = [q, cos, sin, window_keys, window_rows, entry_keys, entry_rows, sink, o_ptr, codes, scales, heads,
                 window_rows.shape[1], entry_rows.shape[1], scale, q.stride(0), q.stride(1),
                 cos.stride(0) if half else 0, window_rows.stride(0), entry_rows.stride(0), son, soh, rows]
    return arguments, dict(D=dim, HALF=half, GROUP_HEADS=group_heads)
