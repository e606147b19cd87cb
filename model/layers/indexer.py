"""CSA2 indexer: which compressed entries each query attends to.

Shapes: n queries, Hi indexer heads, Di head dim, N entries of the layer's KV source.
score(j) = sum_h w_h * ReLU(qI_h . k_j) / sqrt(Di), with qI = FP4q32(RoPE(q_res @ wq_b^T)) and
w = (x @ weights_proj^T) / sqrt(Hi). Entry j is visible to the query at position i iff
j < (i+1) // ratio. The candidate-source layer keeps the best `candidate_topk_blocks` blocks
of `candidate_block_size` entries (the block holding the newest visible entry always kept);
later index sources score only inside that pool. Each query keeps the top `index_topk`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...kvcache.layout import CacheLayout
from ...kvcache.paged import page_offsets, tables_end_to_end
from ..batch import SeqRun, end_to_end, offsets, rows_positions, run_rows
from ..config import LayerRole, ModelConfig
from ..device import to_device
from ..ops import ReferenceOps
from ..kernels import indexer_score, top_k
from ..kernels.compile_threads import launch_all
from ..kernels.indexer_score import TALL_RUN, candidate_entries, indexer_scores, scores_warm_up_launches
from ..kernels.top_k import top_k_ascending
from ..rope import Rope

# fp32 elements of one [queries, entries] score chunk: 128 queries at 1M entries (the torch
# top-k, used off the GPU, takes ~6x the scores' bytes while it runs; the kernel ~none)
_SCORE_BUDGET = 1 << 27


def _slice_queries(rows: int, entries: int) -> int:
    """Queries a score slice of a run of `rows` queries over `entries` entries holds."""
    return max(1, min(rows, _SCORE_BUDGET // entries))


# A long prompt's chunks score in slices (_SCORE_BUDGET): each slice's top-k on a side stream
# while the next slice's scores are computed. The scores keep the tensor cores busy, the
# top-k's filter reads them back at the HBM rate (at the end of a 1M prompt, 42 + 16 ms of a
# chunk's 1.23 s for the filter and the pick, twentieth session), so the two can overlap.
# H200, forty-second session: a 256K faithful prefill in 16K chunks 10.78 s against 11.07,
# its last logits the same to the bit.
TOP_K_BESIDE = True
# The side stream's priority (torch: lower is higher; CUDA maps it into the device's range).
# The scores' programs fill every SM's registers, so the top-k's programs run where a score
# program has ended: at 0 the block scheduler takes the two launches' programs as they come;
# at -1 the top-k's go first (its slice's picks sooner, the next scores behind them). H100,
# fifty-fourth session (call AG, a 512K faithful prefill in 16K chunks, alternated twice, the
# same last logits): 0 20.67 / 20.88 s, -1 20.74 / 20.80 s: no difference, so 0.
TOP_K_SIDE_PRIORITY = 0
# A run's score rows padded to a multiple of 16 scores, -inf past the layer's entries
# (indexer_score.padded_width): the top-k's kernels then read them in 16-byte loads (an odd
# row length left them 4-byte loads: a decode step's every other token, a prompt's last
# chunk). Untimed (forty-third session); off: rows of the entries.
PADDED_ROWS = True
# A tall run's filtered top-k (top_k.filters: rows of at least 128 k entries) filtered where its
# scores are made: every row's floor from its scores of top_k.SAMPLE entries first
# (_sampled_floors), then each slice's score tiles keep the scores reaching them in their
# epilogue (indexer_scores' keep), and the pick reads those: the filtering launch
# (63 ms of a late 1M chunk's GPU time, forty-third session) does not read the scores back.
# The same picks by construction (the floor sets only how much the pick reads). H100,
# forty-sixth session (bench/keep_in_scores.py, the FP8 score slice and its top-k): 128 x 1M
# 1,496 us against 1,515 with the filtering launch in PTX (top_k.FILTER_PTX), 512 x 256K 1,574
# against 1,541: no gain, so off.
KEEP_IN_SCORES = False
_SIDE_STREAMS: dict[tuple[torch.device, int], torch.cuda.Stream] = {}  # by (device, priority)


def top_k_rows(cfg: ModelConfig) -> dict[int, int]:
    """The longest score rows the indexer's top-k takes at each k, for prompts of up to the
    model's positions (what a worker's warm-up compiles for: top_k.warm_up): entries of a
    whole layer at index_topk, and the candidate pool's blocks at candidate_topk_blocks."""
    longest = {cfg.index_topk: _row_width(cfg.max_position_embeddings)}
    if cfg.candidate_source_layer >= 0:
        blocks = -(-cfg.max_position_embeddings // cfg.candidate_block_size)
        longest[cfg.candidate_topk_blocks] = max(longest.get(cfg.candidate_topk_blocks, 0), blocks)
    return longest


def warm_up(device: torch.device, cfg: ModelConfig, layout: CacheLayout, faithful: bool = False) -> None:
    """Compile the indexer's kernels for long prompts before a worker serves: the top-k for
    every plan its rows meet and the scoring tiles at every specialization, in the forms the
    pool's layout and the mode (faithful: the tall tiles' FP8 form) take."""
    launch_all(device, warm_up_launches(device, cfg, layout, faithful))


def warm_up_launches(device: torch.device, cfg: ModelConfig, layout: CacheLayout,
                     faithful: bool = False) -> list[Callable[[], object]]:
    """warm_up's launches, both kernels' on one list (their compiles overlap on threads)."""
    return top_k.warm_up_launches(device, top_k_rows(cfg)) + scores_warm_up_launches(
        device, cfg.index_n_heads, cfg.index_head_dim, layout.keys_aligned, fp8=faithful,
        kept_block=cfg.candidate_block_size if cfg.candidate_source_layer >= 0 else 0, pad=PADDED_ROWS,
        keep=KEEP_IN_SCORES)


def largest_top_k_slice(cfg: ModelConfig, rows: int, longest: int) -> tuple[int, int] | None:
    """(queries, entries) of the score slice whose top-k takes the most work memory
    (top_k.work_bytes), for runs of up to `rows` queries of prompts of up to `longest` tokens (a
    layer's entries are at most its tokens; a slice holds _SCORE_BUDGET // entries queries), or
    None where no slice takes the filtered form. At k = 512: 1,008 x 133,121 entries, 1.7 GiB
    (the places a power of two just past 131,072; 1 GiB at 65,536, 256 MiB at 1M)."""
    k = cfg.index_topk
    most = min(longest, cfg.max_position_embeddings)
    lengths = set(top_k.filtered_lengths(k, _row_width(most)))
    if PADDED_ROWS:  # the fewest entries whose padded rows are that long (a slice's queries follow the entries)
        lengths |= {n - indexer_score.ROW_ALIGN + 1 for n in lengths}
    best, shape = 0, None
    for entries in sorted(n for n in lengths if 1 <= n <= most):
        queries = _slice_queries(rows, entries)
        work = top_k.work_bytes(queries, _row_width(entries), k)
        if work > best:
            best, shape = work, (queries, entries)
    return shape


def top_k_work_bytes(cfg: ModelConfig, rows: int, longest: int) -> int:
    """The work memory of largest_top_k_slice's top-k (its scores too), 0 where there is none;
    with KEEP_IN_SCORES two slices' work (the main stream's, one slice's beside the next's)."""
    shape = _scores_shape(largest_top_k_slice(cfg, rows, longest))
    if shape is None:
        return 0
    return top_k.work_bytes(*shape, cfg.index_topk) * (2 if KEEP_IN_SCORES else 1) + shape[0] * shape[1] * 4


def _scores_shape(slice_shape: tuple[int, int] | None) -> tuple[int, int] | None:
    """(queries, entries) of a score slice -> the shape of its scores as the top-k gets them."""
    return None if slice_shape is None else (slice_shape[0], _row_width(slice_shape[1]))


def _row_width(entries: int) -> int:
    """Scores a row of `entries` holds as the top-k gets it (PADDED_ROWS)."""
    return indexer_score.padded_width(entries) if PADDED_ROWS else entries


def reserve_top_k_work(device: torch.device, cfg: ModelConfig, rows: int, longest: int) -> None:
    """Run the top-k of largest_top_k_slice's shape once (on the side stream too with
    TOP_K_BESIDE, whose work buffers live in that stream's pool), if there is one: a worker's
    start then compiles it and meets its memory, and a GPU that cannot hold it beside the pool
    fails there, not on a user's prompt. (The caching allocator keeps the memory for it, but
    gives cached blocks back when another allocation would fail: call this after the worker's
    other start-up allocations.)"""
    shape = _scores_shape(largest_top_k_slice(cfg, rows, longest))
    if shape is None:
        return
    scores = torch.randn(*shape, device=device)
    top_k_ascending(scores, cfg.index_topk)  # (a run of one slice takes it on the main stream)
    if TOP_K_BESIDE:
        pick, join = _top_k_beside(device, slices=True)
        work = None
        if KEEP_IN_SCORES:  # (a slice's work then comes from the main stream's pool, picked beside)
            work = top_k.kept_work(*shape, cfg.index_topk, device, atomic=True)
            work.floor.zero_()
        try:
            pick(scores, cfg.index_topk, work)
        finally:
            join()
    torch.cuda.synchronize(device)


def select_candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block: int) -> torch.Tensor:
    """scores [n, N] (-inf where invisible), visible [n] -> bool mask [n, B] of the kept blocks
    (B = ceil(N / block); candidate_entries spreads it over the entries). A pool is held for the
    rest of a forward: as an entry mask it was [n, N], 16 GiB for a 16K chunk at 1M entries."""
    width = scores.shape[-1]
    padded = torch.nn.functional.pad(scores, (0, -width % block), value=float("-inf"))
    # [n, B]: max_pool1d, not amax over [n, B, block], whose reduction took 3-4x as long (H200,
    # 2026-12-04: 4.3 against 12.0 us at 6 rows of 262,144, 87 against 345 at 192); both
    # give a NaN for a block holding one
    block_scores = torch.nn.functional.max_pool1d(padded.unsqueeze(1), block).squeeze(1)
    newest = ((visible - 1) // block).unsqueeze(-1)  # -1 when nothing is visible: pins nothing
    block_scores = block_scores.masked_fill(torch.arange(block_scores.shape[-1], device=scores.device) == newest,
                                            float("inf"))
    picked = top_k_ascending(block_scores, min(topk_blocks, block_scores.shape[-1]))
    keep = torch.zeros(block_scores.shape[0], block_scores.shape[1] + 1, dtype=torch.bool, device=scores.device)
    keep.scatter_(-1, torch.where(picked >= 0, picked, block_scores.shape[1]), True)
    return keep[:, :-1]


def _rows_of(pool: tuple[torch.Tensor, int] | None, lo: int, hi: int) -> tuple[torch.Tensor, int] | None:
    """Rows lo..hi of a candidate pool (blocks, block), if any."""
    return None if pool is None else (pool[0][lo:hi], pool[1])


def _reference_scores(q, keys, w, visible, pool: tuple[torch.Tensor, int] | None):
    keys_t = keys.float().T.contiguous()
    total = keys.shape[0]

    def score(lo: int, hi: int):
        """(the scores of rows lo..hi, None: no top-k work of theirs)"""
        kept = _rows_of(pool, lo, hi)
        # sum_h w_h * ReLU(q_h . k) / sqrt(Di), one head at a time (no [c, Hi, N] tensor)
        out = torch.zeros(hi - lo, total, device=q.device)
        for h in range(q.shape[1]):
            out += (q[lo:hi, h] @ keys_t).relu_() * w[lo:hi, h:h + 1]
        hidden = torch.arange(total, device=q.device) >= visible[lo:hi, None]
        if kept is not None:
            hidden |= ~candidate_entries(*kept, total)
        return out.masked_fill(hidden, float("-inf")), None

    return score


def _kernel_scores(run, role, q, w, visible, total, k: int, qat: bool, fp8: bool,
                   pool: tuple[torch.Tensor, int] | None):
    cache = run.cache
    # index sources of one KV source share them (pages only grow)
    key_off, key_soff = run.once(("key offsets", role.kv_source, total), lambda: cache.entry_offsets(
        role.kv_source, torch.arange(total, device=q.device), kind="key"))
    pages = cache.pool.pages_buffer
    tall = run.n >= TALL_RUN
    encoded = fp8 and tall and indexer_score.tall_fp8(q.device, qat)
    if encoded:  # once, not once a slice (a 1M prompt's 16K chunk scores 128 slices a layer)
        q, w = indexer_score.fp8_queries(q, w)

    options = dict(exact_in_bf16=qat, tall=tall, keys_aligned=cache.layout.keys_aligned, fp8=fp8, encoded=encoded)
    width = _row_width(total)
    floors = None
    if KEEP_IN_SCORES and tall and top_k.filters(k, width, _slice_queries(run.n, total)):
        floors = _sampled_floors(q, w, visible, pages, key_off, key_soff, total, k, pool, options)

    def score(lo: int, hi: int):
        """(the scores of rows lo..hi, their top-k's KeptWork where the tiles filled it, else None)"""
        work = None
        if floors is not None:
            work = top_k.kept_work(hi - lo, width, k, q.device, atomic=True, floor=floors[lo:hi])
        scores = indexer_scores(q[lo:hi], w[lo:hi], visible[lo:hi], pages, key_off, key_soff, **options,
                                kept=_rows_of(pool, lo, hi), pad=PADDED_ROWS, keep=work)
        return scores, work

    return score


def _sampled_floors(q, w, visible, pages, key_off, key_soff, total: int, k: int,
                    pool: tuple[torch.Tensor, int] | None, options: dict) -> torch.Tensor:
    """KEEP_IN_SCORES: every row's top-k floor [n] from its scores of top_k.SAMPLE sampled
    entries, before any slice's scores: in launches of up to _SCORE_BUDGET sampled scores (not
    two small ones a score slice: 197 slices in a late 1M chunk), whose memory the slices take
    after them."""
    n = q.shape[0]
    sample = indexer_score.entry_sample(visible, key_off, key_soff, top_k.sample_columns(total, q.device))
    floors = torch.empty(n, dtype=torch.int32, device=q.device)
    rows = max(1, _SCORE_BUDGET // top_k.SAMPLE)
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        sampled = indexer_score.sampled_scores(q[lo:hi], w[lo:hi], pages, sample, slice(lo, hi),
                                               _rows_of(pool, lo, hi), **options)
        top_k.sample_floors(sampled, k, total, floors[lo:hi])
    return floors


def index_queries(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, qat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' indexer queries qI [n, Hi, Di] and head weights w [n, Hi] (with 1/sqrt(Hi) and
    1/sqrt(Di)): dense work whose shapes the rows alone set, so at decode it runs in the
    attention site's CUDA graph (DeepseekV41) and reaches index_runs as `queries`."""
    p, heads, dim = role.prefix, cfg.index_n_heads, cfg.index_head_dim
    q = ops.rope(ops.linear(q_res, f"{p}.attn.indexer.wq_b").view(-1, heads, dim), cos, sin)
    if qat:
        q = ops.fake_quant_fp4(q, 32)
    weights = ops.linear(xa, f"{p}.attn.indexer.weights_proj.weight") * heads**-0.5
    return q, weights * dim**-0.5


def index(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor, run: SeqRun,
          rope: Rope, qat: bool, queries: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Publishes run.shared['topk'] ([n, k] entry ids, -1 = none) and, at the candidate source,
    run.shared['candidates'] ([n, B] bool: the kept blocks of candidate_block_size entries).
    `queries`: the run's index_queries, if computed."""
    shared = run.shared
    total = run.cache.num_entries(role.kv_source)
    if total == 0:
        shared["topk"] = None
        if role.is_candidate_source:
            shared["candidates"] = None
        return
    q, w = queries or index_queries(ops, cfg, role, xa, q_res, *rope.for_run("yarn", run), qat)
    visible = (run.positions_on(q.device) + 1) // role.ratio
    candidates_in = shared.get("candidates") if role.uses_candidates else None
    k = min(cfg.index_topk, total)
    # a candidate pool's unkept blocks score -inf where the scores are made
    pool = None if candidates_in is None or role.is_candidate_source else (candidates_in, cfg.candidate_block_size)
    if ops.reads_cache_in_place(run.cache):
        score = _kernel_scores(run, role, q, w, visible, total, k, qat, ops.act_quant, pool)  # faithful: FP8 dots
    else:
        score = _reference_scores(q, run.cache.index_keys(role.kv_source).to(q.device), w, visible, pool)
    chunk = _slice_queries(run.n, total)
    picks, pools = [], []
    pick, join = _top_k_beside(q.device, slices=run.n > chunk and not role.is_candidate_source)
    try:
        for lo in range(0, run.n, chunk):
            hi = min(lo + chunk, run.n)
            scores, work = score(lo, hi)
            if role.is_candidate_source:  # (a padded row's -inf past `total` is not a block of its own)
                pools.append(select_candidate_blocks(scores[:, :total], visible[lo:hi], cfg.candidate_topk_blocks,
                                                     cfg.candidate_block_size))
            picks.append(pick(scores, k, work))
    finally:
        join()
    if role.is_candidate_source:
        shared["candidates"] = torch.cat(pools)
    shared["topk"] = torch.cat(picks)


def _no_join() -> None:
    pass


def _top_k(scores: torch.Tensor, k: int, work: top_k.KeptWork | None = None) -> torch.Tensor:
    """top_k_ascending of a slice's scores, or its pick from the kept scores its tiles filled."""
    return top_k_ascending(scores, k) if work is None else top_k.pick_kept(scores, k, work)


def _top_k_beside(device: torch.device, slices: bool):
    """(pick, join): _top_k, or with TOP_K_BESIDE where the scores come in several
    slices on a GPU (not inside a graph capture) the same on a side stream behind the scores so
    far, so that the next slice's scores run beside it; join() makes the main stream wait for
    the picks before they are read. One slice's top-k is in flight at a time: before the
    next slice's top-k is queued, the main stream waits for the one before, and only then are
    its scores let go, so their memory returns to the main stream's pool in stream order.
    (record_stream held each slice's 512 MiB of scores until the host saw its top-k end: the
    host runs ahead, so every slice took new memory, up to the allocator's limit and its
    device-wide sync.) Each picks tensor stays allocated until the main stream is done with it."""
    if not (TOP_K_BESIDE and slices and device.type == "cuda" and not torch.cuda.is_current_stream_capturing()):
        return _top_k, _no_join
    side = _SIDE_STREAMS.get((device, TOP_K_SIDE_PRIORITY))
    if side is None:
        side = _SIDE_STREAMS[device, TOP_K_SIDE_PRIORITY] = torch.cuda.Stream(device, priority=TOP_K_SIDE_PRIORITY)
    main = torch.cuda.current_stream(device)
    in_flight: list[tuple[torch.Tensor, top_k.KeptWork | None, torch.cuda.Event]] = []  # (scores, work, top-k's end)

    def pick(scores: torch.Tensor, k: int, work: top_k.KeptWork | None = None) -> torch.Tensor:
        if in_flight:  # the slice before: its scores free once the main stream has waited for it
            main.wait_event(in_flight.pop()[-1])
        side.wait_stream(main)
        done = torch.cuda.Event()
        in_flight.append((scores, work, done))  # (held before the launches: an error in them keeps it too)
        with torch.cuda.stream(side):
            picks = _top_k(scores, k, work)
            done.record(side)
        picks.record_stream(main)
        return picks

    def join() -> None:
        main.wait_stream(side)
        in_flight.clear()
    return pick, join


def index_runs(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
               runs: list[SeqRun], rope: Rope, queries: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """`index` for every run of a forward at once (kernel path, quantizers on): one projection,
    one scoring launch over each run's own entries, one top-k. Each run's lists are what it
    gets alone: a query's scores are computed the same way and entries past a run's own count
    N_r are -inf. Alone it keeps k_r = min(topk, N_r); the batch keeps k = min(topk, max N):
    if N_r >= topk both are topk, else every finite score is kept either way, ascending, with
    the -1s after them, so the first k_r columns are its own list (the candidate blocks alike).
    `queries`: index_queries of every row, if computed."""
    totals = [run.cache.num_entries(role.kv_source) for run in runs]
    width, T = max(totals), sum(run.n for run in runs)
    one_pool = len({id(run.cache.pool) for run in runs}) == 1
    candidates = _candidate_pool(runs, width) if role.uses_candidates else None
    block = cfg.candidate_block_size
    # Runs of TALL_RUN rows or more go alone, always: their tiles differ from a batch's, and
    # a run's lists must not depend on what it was batched with.
    if (len(runs) == 1 or min(totals) == 0 or not one_pool or runs[0].offset != 0 or not end_to_end(runs)
            or T * width > _SCORE_BUDGET or max(run.n for run in runs) >= TALL_RUN
            or (role.uses_candidates and candidates is None)):
        for run in runs:
            index(ops, cfg, role, xa[run.rows], q_res[run.rows], run, rope, True,
                  None if queries is None else tuple(t[run.rows] for t in queries))
        return
    if queries is None:
        q, w = index_queries(ops, cfg, role, run_rows(xa, runs), run_rows(q_res, runs),
                             *rope.for_runs("yarn", runs), True)
    else:
        q, w = (run_rows(t, runs) for t in queries)
    visible = (rows_positions(runs, q.device) + 1) // role.ratio
    key_off, key_soff, first, count = _key_tables(runs, role.kv_source, totals, q.device)
    scores = indexer_scores(q, w, visible, runs[0].cache.pool.pages_buffer, key_off, key_soff,
                            (first, count, max(run.n for run in runs)), exact_in_bf16=True,
                            keys_aligned=runs[0].cache.layout.keys_aligned, pad=PADDED_ROWS)
    if role.is_candidate_source:
        pool = select_candidate_blocks(scores[:, :width], visible, cfg.candidate_topk_blocks, block)
        runs[0].shared[("candidate pool", offsets(runs))] = pool, width
    elif candidates is not None:
        scores[:, :width].masked_fill_(~candidate_entries(candidates, block, width), float("-inf"))
    picks = top_k_ascending(scores, min(cfg.index_topk, width))
    for run, total in zip(runs, totals):
        run.shared["topk"] = picks[run.rows, :min(cfg.index_topk, total)]
        if role.is_candidate_source:
            run.shared["candidates"] = pool[run.rows, :-(-total // block)]


def _candidate_pool(runs: list[SeqRun], width: int) -> torch.Tensor | None:
    """The candidate layer's [T, B] pool of kept blocks of a batched forward, if it covers
    these entries."""
    pool, pool_width = runs[0].shared.get(("candidate pool", offsets(runs)), (None, 0))
    return pool if pool is not None and pool_width == width else None


def _key_tables(runs: list[SeqRun], source: int, totals: list[int], device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Byte offsets [R, N] of every run's index keys (past a run's own count: its last entry,
    never scored), and each run's first row and rows; built once per forward and entry count."""
    def build():
        table, firsts = tables_end_to_end([run.cache.device_table(source) for run in runs])
        rows = [firsts, [t - 1 for t in totals], [run.offset for run in runs], [run.n for run in runs]]
        pad = [0] * (len(runs) % 2)  # even rows of int64: each starts on 16 bytes, as the kernels were warmed
        meta = to_device(torch.tensor([row + pad for row in rows]), device)[:, :len(runs)]
        ids = torch.minimum(torch.arange(max(totals), device=device)[None, :], meta[1][:, None])
        off, soff = page_offsets(runs[0].cache.layout, table, ids, kind="key", first_page=meta[0][:, None])
        return off, soff, meta[2], meta[3]

    return runs[0].once(("key tables", source, tuple(totals), offsets(runs)), build)
