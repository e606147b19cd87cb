"""Faithful prefill's indexer score tiles (indexer_score's tall FP8 form) in Gluon, with each
head's FP8 wgmma in flight while the previous head's ReLU and weighting run.

Triton's form issues a head's wgmma and waits for it before that head's epilogue (its dot is
always waited where it is issued), so a program's tensor-core work and its epilogue take
turns; only other programs on the SM fill the gaps (1,150 us a 128 x 1M slice, 1.33x the FP8
floor; forty-third session). Here the heads are unrolled: head h's wgmma is issued, then
head h - 1's is waited (wgmma.wait_group 1) and its epilogue runs under head h's MMA. Queries
come a head at a time by cp.async into a ring of STAGES buffers; the keys are decoded once a
program into shared memory as _fp8_keys makes them. Every score is the Triton form's bit for
bit: the same e4m3 operands, the same wgmma K order, the same fused ReLU-times-weight adds in
the heads' order, the entry scales applied last.

GPU only (Gluon has no interpreter form): the Triton form stays for the CPU and for launches
this does not take (batched runs, a candidate pool, the top-k kept in the epilogue).

Slower than the Triton form in every tile (H100, fifty-third session: 1,542-1,714 against
1,139 us at 128 x 1M), so off (indexer_score.GLUON_TALL): each head's cp.async wait, two CTA
barriers and proxy fence cost more than the overlap gains against Triton's three programs an
SM. Kept as the base of a form with the queries by TMA on mbarriers (docs/performance.md, item 5).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .sparse_attention_gluon import _barrier, _copy, _pow2

# Queries a program: 64, one warpgroup's wgmma M; 128, two warpgroups on the same keys (each
# key tile decoded for twice the products, each query tile read from L2 half as often; one
# program an SM at 255 registers, as two of 64).
QUERIES = 64
# Entries a program (the wgmma's N): 128 as the Triton tiles take them; 64 halves the two
# accumulators' registers (more programs an SM) for twice the query reads from L2 a score.
ENTRIES = 128
STAGES = gl.constexpr(3)  # query buffers: one head landing while one is read and one waits


@gluon.jit
def _keys(page_ptr, k_off, k_soff, rj, live, DI: gl.constexpr, layout: gl.constexpr):
    """Entries rj's index keys [NB, DI] as indexer_score._fp8_keys makes them: each entry's
    e2m1 codes shifted by its blocks' scales under the largest, as e4m3, and that largest
    scale [NB] (fp32). A column's byte is loaded by each of its two columns (L1 serves the
    second)."""
    d = gl.arange(0, DI, layout=gl.SliceLayout(0, layout))
    off = gl.load(k_off + rj, mask=live, other=0)
    soff = gl.load(k_soff + rj, mask=live, other=0)
    block = gl.expand_dims(d // 32, 0)
    row_live = gl.expand_dims(live, 1)
    byte = gl.load(page_ptr + gl.expand_dims(off, 1) + block * 16 + gl.expand_dims((d % 32) // 2, 0),
                   mask=row_live, other=0).to(gl.int32)
    codes = gl.where(gl.expand_dims(d % 2, 0) == 0, byte, byte >> 4)
    e = gl.load(page_ptr + gl.expand_dims(soff, 1) + block, mask=row_live, other=127).to(gl.int32)
    top = gl.max(e, axis=1)
    shift = _pow2(gl.maximum(e - gl.expand_dims(top, 1) + 127, 1))
    # _e2m1_times: the code's magnitude bits at fp32 bits 22-24 and its sign at 31, then two
    # exact multiplies
    bits = ((codes & 0x7) << 22) | ((codes & 0x8) << 28)
    values = bits.to(gl.float32, bitcast=True) * 8.507059173023462e37 * shift
    scale = gl.where(top == 0, 1 << 22, top << 23).to(gl.float32, bitcast=True)  # _e8m0_value
    return values.to(gl.float8e4nv), scale


@gluon.jit
def _load_head(q_ptr, row0, n, h, sqn, dst, QB: gl.constexpr, DI: gl.constexpr, layout: gl.constexpr):
    """Start copying head h's query codes of rows row0 .. row0 + QB ([QB, DI] e4m3) into dst by
    cp.async, 16 bytes a copy; rows past n come as zeros."""
    r = row0 + gl.arange(0, QB, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, DI, layout=gl.SliceLayout(0, layout))
    at = gl.expand_dims(r.to(gl.int64) * sqn + h * DI, 1) + gl.expand_dims(d, 0)
    _copy(dst, q_ptr + at, mask=gl.expand_dims(r < n, 1))


@gluon.jit
def _weighted(acc, logits, w_ptr, rq, in_rows, h, swn):
    """acc plus head h's ReLU(logits) times its weights, as the Triton form adds them."""
    w = gl.load(w_ptr + rq * swn + h, mask=in_rows, other=0.0)
    return acc + gl.maximum(logits, 0.0) * gl.expand_dims(w, 1)


@gluon.jit(do_not_specialize=["n", "N"])  # one compile for every slice's rows and entry count
def _scores_kernel(q_ptr, w_ptr, vis_ptr, page_ptr, k_off, k_soff, o_ptr, n, N, NP, sqn, swn, son,
                   DI: gl.constexpr, HI: gl.constexpr, QB: gl.constexpr, NB: gl.constexpr,
                   num_warps: gl.constexpr):
    """Program (query block of QB, entry block of NB): indexer_score._indexer_kernel's FP8 tile
    (one run, no candidate pool, no kept top-k): scores [QB, NB] into o_ptr, -inf where an entry
    is past a query's visible count or past N (columns up to NP)."""
    gl.static_assert(num_warps * 16 == QB, "a warpgroup a wgmma's 64 rows")
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, NB, 32])
    copy_layout: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // DI, DI // 16], [num_warps, 1], [1, 0])
    key_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    row0 = gl.program_id(0) * QB
    queries = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, QB, DI],
                                        gl.NVMMASharedLayout.get_default_for([QB, DI], gl.float8e4nv))
    keys = gl.allocate_shared_memory(gl.float8e4nv, [NB, DI],
                                     gl.NVMMASharedLayout.get_default_for([NB, DI], gl.float8e4nv))
    for s in gl.static_range(STAGES - 1):
        if s < HI:
            _load_head(q_ptr, row0, n, s, sqn, queries.index(s), QB, DI, copy_layout)
        async_copy.commit_group()

    rj_keys = gl.program_id(1) * NB + gl.arange(0, NB, layout=gl.SliceLayout(1, key_layout))
    codes, key_scales = _keys(page_ptr, k_off, k_soff, rj_keys, rj_keys < N, DI, key_layout)
    keys.store(codes)

    rq = row0 + gl.arange(0, QB, layout=gl.SliceLayout(1, acc_layout))
    in_rows = rq < n
    zero = gl.zeros([QB, NB], gl.float32, layout=acc_layout)
    acc = zero
    pending = zero
    for h in gl.static_range(HI):
        # head h's queries have landed (each step commits one group), and the keys are stored
        async_copy.wait_group(STAGES - 2)
        fence_async_shared()
        _barrier()
        issued = warpgroup_mma(queries.index(h % STAGES), keys.permute((1, 0)), zero, use_acc=False, is_async=True)
        if h > 0:
            done = warpgroup_mma_wait(1, deps=[pending])  # head h - 1's, while head h's runs
            _barrier()  # every warp is past head h - 1's MMA: its buffer takes head h + STAGES - 1
        if h + STAGES - 1 < HI:
            _load_head(q_ptr, row0, n, h + STAGES - 1, sqn, queries.index((h + STAGES - 1) % STAGES), QB, DI,
                       copy_layout)
        async_copy.commit_group()
        if h > 0:
            acc = _weighted(acc, done, w_ptr, rq, in_rows, h - 1, swn)
        pending = issued
    done = warpgroup_mma_wait(0, deps=[pending])
    acc = _weighted(acc, done, w_ptr, rq, in_rows, HI - 1, swn)

    rj = gl.program_id(1) * NB + gl.arange(0, NB, layout=gl.SliceLayout(0, acc_layout))
    acc = acc * gl.expand_dims(gl.convert_layout(key_scales, gl.SliceLayout(0, acc_layout)), 0)
    visible = gl.load(vis_ptr + rq, mask=in_rows, other=0)
    seen = (gl.expand_dims(rj, 0) < gl.expand_dims(visible, 1)) & gl.expand_dims(rj < N, 0)
    acc = gl.where(seen, acc, float("-inf"))
    gl.store(o_ptr + gl.expand_dims(rq.to(gl.int64) * son, 1) + gl.expand_dims(rj, 0), acc,
             mask=gl.expand_dims(in_rows, 1) & gl.expand_dims(rj < NP, 0))


def takes(q: torch.Tensor, runs, kept, keep) -> bool:
    """Whether a tall FP8 launch of encoded queries q [n, Hi, Di] runs here (indexer_score.GLUON_TALL)."""
    n, heads, dim = q.shape
    return (runs is None and kept is None and keep is None and q.is_cuda and q.dtype == torch.float8_e4m3fn
            and dim in (64, 128) and q.stride(-1) == 1 and q.stride(1) == dim and q.stride(0) % 16 == 0
            and q.data_ptr() % 16 == 0)


def scores(q: torch.Tensor, w: torch.Tensor, visible: torch.Tensor, pages: torch.Tensor, key_offsets: torch.Tensor,
           key_scale_offsets: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """indexer_score.indexer_scores' tall FP8 tiles for one run: q [n, Hi, Di] e4m3 codes and w
    [n, Hi] their scaled weights (fp8_queries), visible [n] int64, key offsets [N] -> out [n,
    width] fp32 (width >= N: padded_width's -inf columns)."""
    n, heads, dim = q.shape
    N, width = key_offsets.shape[0], out.shape[1]
    grid = (triton.cdiv(n, QUERIES), triton.cdiv(width, ENTRIES))
    _scores_kernel[grid](q, w, visible, pages, key_offsets, key_scale_offsets, out, n, N, width, q.stride(0),
                         w.stride(0), out.stride(0), DI=dim, HI=heads, QB=QUERIES, NB=ENTRIES,
                         num_warps=QUERIES // 16)
    return out
