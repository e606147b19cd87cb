"""Faithful prefill's attention over decoded keys (the work of sparse_attention_gluon's
_attention_rows_kernel) with its warps specialized, in the shape of FlashMLA's sparse prefill
kernel for Hopper (read for its design; DeepSeek reports 640 TFLOP/s there on an H800).

Why: the rows kernel's two warpgroups work in step. Both wait for a tile's keys, both run the
logits' wgmma (each over half of the tile's 64 keys, so both read all of the queries' 64 KB of
shared memory for 32 keys), both run the softmax while the tensor cores idle, and both meet at
barriers: ~30% of the bf16 rate at a 16K chunk (H100, forty-seventh session). Here:
- a loader warpgroup copies key tiles into shared memory by cp.async and signals mbarriers;
- each of two compute warpgroups takes every other tile whole: the logits of 64 keys (N = 64,
  half the queries' shared-memory reads a key), its own softmax (a row's max and sum within a
  warp), and the weighted sum of its half of the output's columns over both tiles of a pair;
- the two warpgroups run out of phase: warpgroup 0's weighted sum over its own tile (its
  probabilities from registers) runs while warpgroup 1 does its softmax, and so on.

Measured (forty-eighth session; sparse_attention.PINGPONG_ROWS, off): correct by its GPU
tests, and slower than the rows kernel, 8.8 against 5.0 ms at 16,384 queries on an H100 (8.1
against 5.1 on an H200). Not the key copies (forty-ninth session, H200,
bench/rows_kernel_ablation.py): without them it takes 6.66 ms, where the rows kernel takes 4.42
without its own; the compute warpgroups' chain is what is slow: each pair's softmax in one
waits on the other's maximum, and each of its wgmmas is waited where it is issued, so the two
rarely overlap (docs/performance.md, item 6).

A pair of tiles (a = 2j for warpgroup 0, b = 2j + 1 for warpgroup 1), each warpgroup holding
its output half O_w [64 heads, 256], its max m and its denominator part l_w:
- wg 0: S_a = Q K_a^T; m0 = max(m, rowmax S_a); P_a = exp(S_a - m0); O_0 = O_0 exp(m - m0) +
  P_a V_a[:, :256]; publish m0;
- wg 1: S_b = Q K_b^T; m1 = max(m0, rowmax S_b); P_b = exp(S_b - m1); O_1 = O_1 exp(m - m1) +
  P_b V_b[:, 256:]; publish m1 and P_b; then O_1 += P_a' V_a[:, 256:];
- wg 0: P_a' = P_a exp(m0 - m1), published; O_0 = O_0 exp(m0 - m1) + P_b V_b[:, :256].
P is rounded to bf16 where it meets the tensor cores, as in the rows kernel. The sums run in
another order than the rows kernel's 64-key steps, so the outputs agree with its to fp32
rounding, not bit for bit (its GPU test holds them to a tolerance, and to rows_1x128 of its own
fp32 outputs bit for bit).

Shared memory: the queries [64, 512] bf16 in two column halves (64 KB), the keys of a pair in
four half tiles [64 keys, 256] (128 KB: the loader refills a half as soon as its last reader
is done, so the next logits can start on the left halves while the right ones still land),
the probabilities exchanged [2, 64, 64] bf16 (16 KB), the maxima and denominators, 16
mbarriers. The epilogue stages the normalized fp32 rows in the keys' buffers; each warpgroup
encodes half of the heads as wo_a's operand (sparse_attention_gluon._encode_staged), or writes
its half of the columns as fp32.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

from .fp8_blockwise import Operand
from .sparse_attention_gluon import (D_MODEL, HEADS, KEY_TILE, _barrier, _copy_key_rows, _encode_staged, _finish,
                                     _fp32_stage, _normalized, _rotate_queries_into, launch_arguments)

HALF_D = D_MODEL // 2  # a compute warpgroup's output columns, and a key buffer's
LOADER_WARPS = gl.constexpr(4)
# per warpgroup: a tile's logits [64 heads, 64 keys] and an output half [64, 256]
S_WG = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, KEY_TILE, 16]))
O_WG = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF_D, 16]))
P_OPERAND = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_WG, k_width=2))
# registers a thread: maxnreg 168 gives the three warpgroups 168 * 3 a thread between them;
# warpgroup 1 asks 224 and the loader 48, and warpgroup 0 (the default partition) gets the
# rest, 232 (sm_90 SASS: setmaxnreg 232, 224, 48)
COMPUTE_REGS, LOADER_REGS, MAX_REGS = gl.constexpr(224), gl.constexpr(48), 168
# mbarriers: the key halves' ready (loader -> readers) and free (last reader -> loader),
# buffer 2 * tile_of_pair + column_half; then the warpgroups' exchanges
READY, FREE, Q_READY, MAX0, MAX1, P0, P1, L0, L1, STAGED, BARRIERS = (
    gl.constexpr(b) for b in (0, 4, 8, 9, 10, 11, 12, 13, 14, 15, 16))


@gluon.jit
def _pairs(W, K, KT: gl.constexpr):
    """A query's pairs of key tiles: its window's tiles, then its entries', two at a time."""
    return gl.cdiv(gl.cdiv(W, KT) + gl.cdiv(K, KT), 2)


@gluon.jit
def _tile_keys(win_rows, ent_rows, i, t, window_tiles, W, K, swn, sen, KT: gl.constexpr, layout: gl.constexpr):
    """Key tile t's rows of query i (the window's tiles, then the entries') and which are keys;
    a tile past the last (an odd count's pair) has none."""
    j = gl.arange(0, KT, layout=layout)
    if t < window_tiles:
        limit = W - t * KT
        rows = gl.load(win_rows + i * swn + t * KT + j, mask=j < limit, other=-1)
    else:
        limit = K - (t - window_tiles) * KT
        rows = gl.load(ent_rows + i * sen + (t - window_tiles) * KT + j, mask=j < limit, other=-1)
    return rows, (rows >= 0) & (j < limit)


@gluon.jit
def _load_half(window_keys, entry_keys, win_rows, ent_rows, i, t, window_tiles, W, K, swn, sen, dst, ready, skip,
               COL0: gl.constexpr, KT: gl.constexpr, WIDTH: gl.constexpr, D: gl.constexpr,
               num_warps: gl.constexpr):
    """Copy key tile t's columns COL0 .. COL0 + WIDTH into dst [KT, WIDTH] by cp.async (masked
    keys as zeros); `ready` completes when every loader thread's copies have landed."""
    L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    rows, live = _tile_keys(win_rows, ent_rows, i, t, window_tiles, W, K, swn, sen, KT, gl.SliceLayout(1, L))
    if (skip & 16) == 0:
        _copy_key_rows(window_keys, entry_keys, rows, live, t < window_tiles, dst, COL0, WIDTH, D, L)
    async_copy.mbarrier_arrive(ready, increment_count=False)


@gluon.jit
def _loader(args, D: gl.constexpr, HB: gl.constexpr, KT: gl.constexpr, HALF: gl.constexpr,
            GROUP_HEADS: gl.constexpr):
    """The loader warpgroup: each pair's four key halves, in the order their readers free them
    (warpgroup 0 frees its tile's left half first, warpgroup 1 its tile's right half)."""
    (q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr, o_ptr, codes_ptr, scales_ptr, H,
     W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS, skip, q_halves, keys, probs, maxima, sums, bars) = args
    i = gl.program_id(0)
    window_tiles = gl.cdiv(W, KT)
    for j in range(_pairs(W, K, KT)):
        free_phase = (j & 1) ^ 1  # a fresh mbarrier's phase 1 counts as complete
        for step in gl.static_range(4):  # tiles a, b, a, b; halves left, right, right, left
            half = (step % 2) ^ (step // 2)
            buffer = 2 * (step % 2) + half
            mbarrier.wait(bars.index(FREE + buffer), free_phase)
            fence_async_shared()  # the readers' wgmmas (the async proxy) are done with the buffer
            _load_half(window_keys, entry_keys, win_rows, ent_rows, i, 2 * j + step % 2, window_tiles, W, K, swn, sen,
                       keys.index(buffer), bars.index(READY + buffer), skip, half * (D // 2), KT, D // 2, D,
                       LOADER_WARPS)


@gluon.jit
def _logits(args, j, WG: gl.constexpr, phase, HB: gl.constexpr, KT: gl.constexpr):
    """Warpgroup WG's tile of pair j (tile 2 j + WG): its raw logits [HB, KT] scaled (the keys
    that are not: -inf), from its two key halves as they land, its own half first (the loader's
    order)."""
    (q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr, o_ptr, codes_ptr, scales_ptr, H,
     W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS, skip, q_halves, keys, probs, maxima, sums, bars) = args
    _, valid = _tile_keys(win_rows, ent_rows, gl.program_id(0), 2 * j + WG, gl.cdiv(W, KT), W, K, swn, sen, KT,
                          gl.SliceLayout(0, S_WG))
    s = gl.zeros([HB, KT], gl.float32, layout=S_WG)
    for h in gl.static_range(2):
        mbarrier.wait(bars.index(READY + 2 * WG + (WG ^ h)), phase)
        fence_async_shared()
        s = warpgroup_mma(q_halves.index(WG ^ h), keys.index(2 * WG + (WG ^ h)).permute((1, 0)), s, use_acc=h > 0)
    return gl.where(gl.expand_dims(valid, 0), s * scale, float("-inf"))


@gluon.jit
def _running_start(HB: gl.constexpr, D: gl.constexpr):
    """A compute warpgroup's running max, denominator part and output half before its first tile."""
    m = gl.full([HB], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_WG))
    return m, gl.zeros([HB], gl.float32, layout=gl.SliceLayout(1, S_WG)), gl.zeros([HB, D // 2], gl.float32,
                                                                                 layout=O_WG)


@gluon.jit
def _safe(m):
    """A running max where exp(x - max) is defined: 0 for rows that saw no key yet."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _probabilities(logits, m, m_new, l_own):
    """A tile's step of the running softmax from max m to m_new: the output's factor
    exp(m - m_new), the tile's probabilities exp(logits - m_new) and the denominator part."""
    alpha = gl.exp(m - _safe(m_new))
    p = gl.exp(logits - gl.expand_dims(_safe(m_new), 1))
    return alpha, p, l_own * alpha + gl.sum(p, axis=1)


@gluon.jit
def _rescaled(o, factor):
    return o * gl.expand_dims(gl.convert_layout(factor, gl.SliceLayout(1, O_WG)), 1)


@gluon.jit
def _finish_half(o, m, l_own, args, WG: gl.constexpr, D: gl.constexpr, HB: gl.constexpr, HALF: gl.constexpr,
                 GROUP_HEADS: gl.constexpr):
    """Warpgroup WG's output half, once the other's denominator part has come (the exchange
    also tells that the other's last wgmma is done with the keys' buffers the stage reuses),
    normalized (the sink joins the denominator only; a query that saw nothing gets zeros): fp32
    into o_ptr, or staged with the other half, then half of the heads encoded as wo_a's
    operand."""
    (q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr, o_ptr, codes_ptr, scales_ptr, H,
     W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS, skip, q_halves, keys, probs, maxima, sums, bars) = args
    i = gl.program_id(0)
    h0 = gl.program_id(1) * HB
    sums.index(WG).store(l_own)
    _barrier()
    mbarrier.arrive(bars.index(L0 + WG))
    mbarrier.wait(bars.index(L1 - WG), 0)
    l_other = sums.index(1 - WG).load(gl.SliceLayout(1, S_WG))
    total = l_own + l_other if WG == 0 else l_other + l_own  # l_0 + l_1 in both: the same bits
    if GROUP_HEADS > 0:
        out, _ = _normalized(o, m, total, sink_ptr, h0, H, HB, O_WG)
        stage = _fp32_stage(keys, HB, D)
        stage.slice(WG * (D // 2), D // 2, dim=1).store(out)
        _barrier()
        mbarrier.arrive(bars.index(STAGED))
        mbarrier.wait(bars.index(STAGED), 0)
        _encode_staged(stage, cos_ptr, sin_ptr, codes_ptr, scales_ptr, i, h0, H, scn, ROWS, WG * (HB // 2), HB // 2,
                       D, HALF, GROUP_HEADS, 4)
    else:
        _finish(o, m, total, sink_ptr, o_ptr, i, h0, H, son, soh, HB, D // 2, O_WG, WG * (D // 2))


@gluon.jit
def _warpgroup0(args, D: gl.constexpr, HB: gl.constexpr, KT: gl.constexpr, HALF: gl.constexpr,
                GROUP_HEADS: gl.constexpr):
    """Compute warpgroup 0 (the default partition): the queries into shared memory, then each
    pair's tile a and the left half of the output."""
    (q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr, o_ptr, codes_ptr, scales_ptr, H,
     W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS, skip, q_halves, keys, probs, maxima, sums, bars) = args
    i = gl.program_id(0)
    h0 = gl.program_id(1) * HB
    for half in gl.static_range(2):
        _rotate_queries_into(q_ptr, cos_ptr, sin_ptr, i, h0, H, sqn, sqh, scn, q_halves.index(half), half * (D // 2),
                             HB, D // 2, D, HALF, 4, q_ptr, 0, 0, 0)
    fence_async_shared()
    _barrier()
    mbarrier.arrive(bars.index(Q_READY))
    rows_layout: gl.constexpr = gl.SliceLayout(1, S_WG)
    m, l_own, o = _running_start(HB, D)
    for j in range(_pairs(W, K, KT)):
        phase = j & 1
        logits = _logits(args, j, 0, phase, HB, KT)
        m0 = gl.maximum(m, gl.max(logits, axis=1))
        alpha, p, l_own = _probabilities(logits, m, m0, l_own)
        maxima.index(0).store(m0)
        _barrier()
        mbarrier.arrive(bars.index(MAX0))
        o = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), P_OPERAND), keys.index(0), _rescaled(o, alpha))
        mbarrier.arrive(bars.index(FREE + 0))  # tile a's left half: its logits and this sum are done
        mbarrier.wait(bars.index(MAX1), phase)
        m1 = maxima.index(1).load(rows_layout)
        beta = gl.exp(m0 - _safe(m1))  # 0 where m0 is -inf (p and o are 0 there)
        probs.index(0).store((p * gl.expand_dims(beta, 1)).to(gl.bfloat16))
        fence_async_shared()
        _barrier()
        mbarrier.arrive(bars.index(P0))
        l_own = l_own * beta
        m = m1
        mbarrier.wait(bars.index(P1), phase)  # (tile b's left half landed: warpgroup 1 waited for it)
        o = warpgroup_mma(probs.index(1), keys.index(2), _rescaled(o, beta))
        mbarrier.arrive(bars.index(FREE + 2))  # tile b's left half
    _finish_half(o, m, l_own, args, 0, D, HB, HALF, GROUP_HEADS)


@gluon.jit
def _warpgroup1(args, D: gl.constexpr, HB: gl.constexpr, KT: gl.constexpr, HALF: gl.constexpr,
                GROUP_HEADS: gl.constexpr):
    """Compute warpgroup 1: each pair's tile b and the right half of the output."""
    (q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr, o_ptr, codes_ptr, scales_ptr, H,
     W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS, skip, q_halves, keys, probs, maxima, sums, bars) = args
    mbarrier.wait(bars.index(Q_READY), 0)
    rows_layout: gl.constexpr = gl.SliceLayout(1, S_WG)
    m, l_own, o = _running_start(HB, D)
    for j in range(_pairs(W, K, KT)):
        phase = j & 1
        logits = _logits(args, j, 1, phase, HB, KT)
        mbarrier.wait(bars.index(MAX0), phase)
        m0 = maxima.index(0).load(rows_layout)
        m1 = gl.maximum(m0, gl.max(logits, axis=1))
        alpha, p, l_own = _probabilities(logits, m, m1, l_own)
        maxima.index(1).store(m1)
        _barrier()
        mbarrier.arrive(bars.index(MAX1))
        p16 = p.to(gl.bfloat16)
        o = warpgroup_mma(gl.convert_layout(p16, P_OPERAND), keys.index(3), _rescaled(o, alpha))
        mbarrier.arrive(bars.index(FREE + 3))  # tile b's right half
        probs.index(1).store(p16)
        fence_async_shared()
        _barrier()
        mbarrier.arrive(bars.index(P1))
        mbarrier.wait(bars.index(P0), phase)  # (tile a's right half landed: warpgroup 0 waited for it)
        o = warpgroup_mma(probs.index(0), keys.index(1), o)
        mbarrier.arrive(bars.index(FREE + 1))  # tile a's right half
        m = m1
    _finish_half(o, m, l_own, args, 1, D, HB, HALF, GROUP_HEADS)


@gluon.jit
def _attention_pingpong_kernel(q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr,
                               o_ptr, codes_ptr, scales_ptr, H, W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS,
                               skip, D: gl.constexpr, HB: gl.constexpr, KT: gl.constexpr, HALF: gl.constexpr,
                               GROUP_HEADS: gl.constexpr):
    """Program (query i, head block): every key of the query, in pairs of tiles, by three
    warpgroups (the module's docstring). Arguments as sparse_attention_gluon's
    _attention_rows_kernel's; skip 16 leaves the keys' copies out (a bench's ablation: the
    loader still reads the rows and waits for free buffers, then signals without copying;
    the outputs are wrong)."""
    gl.static_assert(HB == 64 and KT == 64 and D % 256 == 0, "the wgmma shapes above")
    gl.static_assert(HALF > 0 or GROUP_HEADS == 0, "wo_a's operand takes the inverse RoPE's angles")
    halves: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HB, D // 2], gl.bfloat16)
    q_halves = gl.allocate_shared_memory(gl.bfloat16, [2, HB, D // 2], halves)
    keys = gl.allocate_shared_memory(gl.bfloat16, [4, KT, D // 2], halves)
    probs = gl.allocate_shared_memory(gl.bfloat16, [2, HB, KT], gl.NVMMASharedLayout.get_default_for([HB, KT],
                                                                                                     gl.bfloat16))
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # (of each buffer)
    maxima = gl.allocate_shared_memory(gl.float32, [2, HB], plain)
    sums = gl.allocate_shared_memory(gl.float32, [2, HB], plain)
    bars = gl.allocate_shared_memory(gl.int64, [BARRIERS, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(4):
        mbarrier.init(bars.index(READY + b), count=32 * LOADER_WARPS)  # each loader thread's copies
        mbarrier.init(bars.index(FREE + b), count=1)
    for b in gl.static_range(Q_READY, STAGED):
        mbarrier.init(bars.index(b), count=1)
    mbarrier.init(bars.index(STAGED), count=2)
    args = (q_ptr, cos_ptr, sin_ptr, window_keys, win_rows, entry_keys, ent_rows, sink_ptr, o_ptr, codes_ptr,
            scales_ptr, H, W, K, scale, sqn, sqh, scn, swn, sen, son, soh, ROWS, skip, q_halves, keys, probs, maxima,
            sums, bars)
    # (the constants go in the calls' own tuples: a tuple held in a variable loses them)
    gl.warp_specialize([(_warpgroup0, (args, D, HB, KT, HALF, GROUP_HEADS)),
                        (_warpgroup1, (args, D, HB, KT, HALF, GROUP_HEADS)),
                        (_loader, (args, D, HB, KT, HALF, GROUP_HEADS))], [4, LOADER_WARPS],
                       [COMPUTE_REGS, LOADER_REGS])


def prefill_attention_pingpong(q: torch.Tensor, window_keys: torch.Tensor, window_rows: torch.Tensor,
                               entry_keys: torch.Tensor, entry_rows: torch.Tensor, sink: torch.Tensor, scale: float,
                               out: torch.Tensor | Operand, skip: int = 0,
                               rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | Operand:
    """sparse_attention_gluon.prefill_attention_decoded's work (the same arguments) by the
    warp-specialized kernel; `skip`: its ablation (16: no key copies; a bench's only)."""
    n, heads = q.shape[:2]
    arguments, constants = launch_arguments(q, window_keys, window_rows, entry_keys, entry_rows, sink, scale, out,
                                            rope)
    if n:
        _attention_pingpong_kernel[(n, triton.cdiv(heads, HEADS))](*arguments, skip, **constants, HB=HEADS,
                                                                   KT=KEY_TILE, num_warps=4, maxnreg=MAX_REGS)
    return out
