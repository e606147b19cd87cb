"""The kernel path of `attend`: all runs' rows through one RoPE, one FP8 round trip and, most
often, one sparse_attention launch. A decode step is host-bound, and per-run work cost ~100
small ops per run and layer.

Shapes: T rows of all runs, n rows of one run, h heads, D latent, W window, K entries per query.
A decode-sized run (n <= ring capacity - W + 1, its ring written up to run.start) stores its
rows first and the kernel reads every window key in the ring: the new rows cannot overwrite a
slot its queries still need. Query i's keys are positions start+i-W+1 .. start+i, the same
layout the scratch buffer of `scratch_attention` gives, so the sums run in the same order.
Runs share a launch only where the kernel would lay out its programs the same for each run
alone (sparse_attention.launch_plan): a batch then computes what its runs compute alone,
bit for bit. The exception is a batch of BATCH_FORM_ROWS rows or more, which takes the
tensor-core form with one program per query (fp32-accurate like the split form smaller
batches take, not bit-equal to it).
A DSpark stage's block attention (every block row sees the stage ring before the block and
its whole block) runs for all requests in one launch too: attend_block_in_place.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ...kvcache.paged import page_offsets, tables_end_to_end
from ..batch import SeqRun, cat, end_to_end, offsets, run_rows
from ..config import LayerRole, ModelConfig
from ..device import tables_to_device, to_device
from ..kernels.attention_queries import Queries
from ..kernels.fp8_blockwise import Operand
from ..kernels.ring_write import write_rows
from ..kernels.sparse_attention import (LaunchPlan, attend_decoded, decode_keys, decoded_form, launch_plan,
                                        prefill_form_fits, sparse_attention)
from ..ops import ReferenceOps
from ..rope import Rope
from .compressor import compress
from .indexer import index, index_runs


def update_entries(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
                   run: SeqRun, rope: Rope, qat: bool) -> None:
    """This run's new compressed entries, then its top-k (run.shared['topk'])."""
    if role.is_kv_source and not run.skip_compressor:
        compress(ops, cfg, role, xa, [run], rope, qat)
    if role.is_index_source:
        index(ops, cfg, role, xa[run.rows], q_res[run.rows], run, rope, qat)


def attend_in_place(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
                    q_all: torch.Tensor, kv_all: torch.Tensor, runs: list[SeqRun], rope: Rope,
                    queries: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | Operand:
    """`attend` with the quantizers on and every cache read in place -> o [T, h, D] (or wo_a's
    operand: attend_updated); `queries`: the indexer's (indexer.index_queries), where computed
    already."""
    update_sources(ops, cfg, role, xa, q_res, runs, rope, queries)
    return attend_updated(ops, cfg, role, q_all, kv_all, runs, rope)


def update_sources(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
                   runs: list[SeqRun], rope: Rope, queries: tuple[torch.Tensor, torch.Tensor] | None = None,
                   projected: tuple[torch.Tensor, ...] | None = None) -> None:
    """The kernel path's compressor (new entries into the pages) and indexer (each run's top-k)
    of a KV or index source layer; nothing for other layers. `queries` and `projected`: the
    indexer's queries and the compressor's projections of every row, where computed already."""
    if role.is_kv_source:
        compress(ops, cfg, role, xa, [run for run in runs if not run.skip_compressor], rope, True, projected)
    if role.is_index_source:
        index_runs(ops, cfg, role, xa, q_res, runs, rope, queries)


def attend_updated(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, q_all: torch.Tensor, kv_all: torch.Tensor,
                   runs: list[SeqRun], rope: Rope) -> torch.Tensor | Operand:
    """attend_in_place after update_sources: RoPE, the ring writes and the attention -> o [T, h, D]
    after the inverse RoPE, or where the attention's launch can make it (one run: a prefill
    chunk), wo_a's FP8 operand of those rows (Operand; grouped_output takes either)."""
    prepared = prepare(cfg, role, runs, rope, q_all.shape[0], q_all.shape[1])
    if prepared is not None:
        o = attend_prepared(ops, cfg, role, prepared, q_all, kv_all, *prepared.tensors)
        note_ring_writes(runs, role.index)
        return o
    cos, sin = rope.for_runs(role.rope, runs)  # [T, rope/2]
    q = Queries.of(q_all, cos, sin, ops.act_quant)
    kv, packed = ops.fp8_round_trip(ops.rope(kv_all, cos, sin))
    groups = cfg.o_groups // ops.parallel.world
    operand = len(runs) == 1 and ops.takes_operand(f"{role.prefix}.attn.wo_a", q_all.shape[0], groups)
    o = _attention(cfg, role, q, kv, packed, runs, ops.w(f"{role.prefix}.attn.attn_sink"), groups if operand else 0)
    return o if isinstance(o, Operand) else ops.rope(o, cos, sin, inverse=True, overwrite=True)


# From this many rows a decode batch attends with one program per query and column parity,
# as prefill does; smaller ones split each query's keys over DECODE_KEY_SPLITS programs
# (sparse_attention.launch_plan). H200, 2026-12-01, per layer: 48 rows 159 us whole against
# 219 split; 24 rows 141 and 139 (the decode form that came before: 364). A request's
# attention then depends on whether its batch reached this size: both are fp32-accurate (they
# agree to ~2e-5 relative), and within each a batch equals its runs alone. Counted on the
# launch: a batch padded to a bucket of 48 rows takes this form too.
BATCH_FORM_ROWS = 48


class Prepared(NamedTuple):
    """The attention of runs that all fit in their rings, in one pool, under one launch plan:
    what it reads besides q and kv, built once per forward. `attend_prepared` on it is a
    fixed sequence of launches with no host work, so a CUDA graph can hold the whole block
    (DeepseekV41.block)."""
    plan: LaunchPlan
    pool: object  # the runs' CachePool
    ring_strides: tuple[int, int]  # bytes from one ring layer to the next (codes, scales)
    # causal (prepare): cos, sin [T, rope/2]; layer-0 ring offsets of the rows' codes [T, D] and
    # scales [T, D/32]; layer-0 window offsets [T, W] (codes, -1 where a key holds no data;
    # scales); entry offsets [T, K]. A DSpark block (prepare_block): cos, sin; each row's run's
    # layer-0 ring offsets of the W positions before its block [T, W] (codes, scales) and which
    # hold data; no entries [T, 1].
    tensors: tuple[torch.Tensor, ...]
    block_rows: int = 0  # a DSpark stage's block attention: the rows of each run's block


def prepare(cfg: ModelConfig, role: LayerRole, runs: list[SeqRun], rope: Rope, rows: int, heads: int,
            launched_rows: int | None = None) -> Prepared | None:
    """Prepared when this layer's runs can attend in one launch (else None: the general path).
    Call it after the layer's compressor and indexer: the entry offsets follow their top-k.
    launched_rows: the rows the launch will hold (a CUDA graph pads a batch to its bucket);
    the form is chosen for them."""
    layer = role.index
    if (rows != sum(run.n for run in runs) or runs[0].offset != 0 or not end_to_end(runs)
            or len({id(run.cache.pool) for run in runs}) > 1
            or not all(_fits_in_ring(cfg, run, layer) for run in runs)):
        return None
    entries, widths = _entry_offsets(role, runs, runs[0].cache.pool.device)
    if (launched_rows or rows) >= BATCH_FORM_ROWS and prefill_form_fits(cfg.head_dim):
        plans = {launch_plan(rows, max(widths), heads, cfg.head_dim, prefill=True)}
    else:
        plans = {launch_plan(run.n, width, heads, cfg.head_dim) for run, width in zip(runs, widths)}
    if len(plans) > 1:
        return None
    tensors = rope.for_runs(role.rope, runs) + _ring_rows(runs) + _window_grid(cfg, layer, runs) + entries
    return Prepared(plans.pop(), runs[0].cache.pool, runs[0].cache.ring_layer_stride, tensors)


def attend_prepared(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, prepared: Prepared, q_all: torch.Tensor,
                    kv_all: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
    """The attention `prepared` describes -> o [T, h, D]: device work only. The tensors are
    prepared.tensors, or a CUDA graph's copies of them."""
    attend = _attend_block if prepared.block_rows else _attend_causal
    return attend(ops, cfg, role, prepared, q_all, kv_all, *tensors)


def _attend_causal(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, prepared: Prepared, q_all, kv_all,
                   cos, sin, ring_codes, ring_scales, win_codes, win_scales, entry_off, entry_soff) -> torch.Tensor:
    """RoPE, the FP8 ring write of kv, attention, inverse RoPE (the caller notes the ring
    writes: note_ring_writes). The ring and window offsets are layer 0's: this layer's bytes
    lie `layer` strides further (no per-layer offset tables: fewer kernels in its graph)."""
    layer, pool = role.index, prepared.pool
    q = Queries.of(q_all, cos, sin, ops.act_quant)
    kv, packed = ops.fp8_round_trip(ops.rope(kv_all, cos, sin))
    bases = _layer_bases(layer, prepared.ring_strides)
    write_rows(pool.slots_buffer, ring_codes, ring_scales, bases, *packed)
    o = _attend_planned(cfg, q, pool.slots_buffer, (win_codes, win_scales), pool.pages_buffer, (entry_off, entry_soff),
                        ops.w(f"{role.prefix}.attn.attn_sink"), prepared.plan, bases)
    return ops.rope(o, cos, sin, inverse=True, overwrite=True)


def note_ring_writes(runs: list[SeqRun], layer: int) -> None:
    for run in runs:
        run.cache.note_ring_write(layer, run.start, run.n)


def attend_block_in_place(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, q_all: torch.Tensor,
                          kv_all: torch.Tensor, runs: list[SeqRun], rope: Rope) -> torch.Tensor | None:
    """A DSpark stage's block attention (attention.py: each block row sees the stage ring's W
    positions before the block and every row of its block) for all runs in one launch -> o
    [T, h, D]; None where the runs differ in length or pool (the per-run path takes those)."""
    prepared = prepare_block(cfg, role, runs, rope, q_all.shape[0], q_all.shape[1])
    if prepared is None:
        return None
    return attend_prepared(ops, cfg, role, prepared, q_all, kv_all, *prepared.tensors)


def prepare_block(cfg: ModelConfig, role: LayerRole, runs: list[SeqRun], rope: Rope, rows: int, heads: int
                  ) -> Prepared | None:
    """Prepared for a DSpark stage's block attention of runs of equal length in one pool (else
    None). What it reads does not depend on the stage: the stages of a forward share it."""
    B = runs[0].n
    if (any(run.n != B for run in runs) or len({id(run.cache.pool) for run in runs}) > 1
            or runs[0].offset != 0 or not end_to_end(runs) or rows != B * len(runs)):
        return None
    plan = launch_plan(B, 1, heads, cfg.head_dim)  # what each run alone gets: a batch equals its runs
    tensors = rope.for_runs(role.rope, runs) + _block_window(cfg, role.index, runs) + _no_entries(
        runs, runs[0].cache.pool.device, 1)
    return Prepared(plan, runs[0].cache.pool, runs[0].cache.ring_layer_stride, tensors, B)


def _block_window(cfg: ModelConfig, layer: int, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's run's layer-0 ring offsets [T, W] (codes, scales) of the W positions before
    its block, and which of them hold data; once per forward (the stages' rings are written
    together, so they hold the same positions)."""
    W, B = cfg.sliding_window, runs[0].n
    bounds = tuple(run.cache.window_bounds(layer, run.start - W, run.start) for run in runs)

    def build():  # on the host, one copy
        positions = np.arange(-W, 0) + np.array([[run.start] for run in runs])  # [R, W]
        ring = [run.cache.ring_offsets(0, row) for run, row in zip(runs, positions)]
        valid = np.stack([(row >= lo) & (row < hi) for (lo, hi), row in zip(bounds, positions)])
        per_row = lambda t: np.repeat(t, B, axis=0)  # noqa: E731
        return tables_to_device(runs[0].cache.pool.device, per_row(np.stack([c for c, _ in ring])),
                                per_row(np.stack([s for _, s in ring])), per_row(valid))

    return runs[0].once(("block window", offsets(runs), bounds), build)


def _attend_block(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, prepared: Prepared, q_all, kv_all,
                  cos, sin, ring_codes, ring_scales, ring_valid, entry_off, entry_soff) -> torch.Tensor:
    """RoPE, FP8 rounding, attention over a scratch buffer holding, for each run r at rows
    r*(W+B) .., its ring's W keys before the block and the block's own B rows (they must not go
    into the ring, which holds only what the target has confirmed), inverse RoPE. Each run's
    values are read at its first row, so a batch padded with copies of its last row works."""
    B, layer, strides, buf = prepared.block_rows, role.index, prepared.ring_strides, prepared.pool.slots_buffer
    W, D = cfg.sliding_window, cfg.head_dim
    q = Queries.of(q_all, cos, sin, ops.act_quant)
    kv, packed = ops.fp8_round_trip(ops.rope(kv_all, cos, sin))
    R = q.raw.shape[0] // B
    device = q.raw.device
    code_at, scale_at = _key_bytes(ring_codes[::B] + layer * strides[0], ring_scales[::B] + layer * strides[1], D)
    codes = torch.cat([buf[code_at], packed[0].view(R, B, D)], 1)
    scales = torch.cat([buf[scale_at], packed[1].view(R, B, D // 32)], 1)
    scratch = torch.cat([codes.reshape(-1), scales.reshape(-1)])
    keys = torch.arange(R * (W + B), device=device).view(R, W + B)  # each key's row in the scratch
    valid = torch.cat([ring_valid[::B], torch.ones(R, B, dtype=torch.bool, device=device)], 1)
    per_query = (R, B, W + B)  # a run's queries all read its rows
    win_off = torch.where(valid, keys * D, -1)[:, None].expand(per_query).reshape(R * B, -1)
    win_soff = (R * (W + B) * D + keys * (D // 32))[:, None].expand(per_query).reshape(R * B, -1)
    o = _attend_planned(cfg, q, scratch, (win_off, win_soff), prepared.pool.pages_buffer, (entry_off, entry_soff),
                        ops.w(f"{role.prefix}.attn.attn_sink"), prepared.plan)
    return ops.rope(o, cos, sin, inverse=True, overwrite=True)


def _attention(cfg: ModelConfig, role: LayerRole, q: Queries, kv, packed, runs: list[SeqRun], sink,
               operand_groups: int = 0) -> torch.Tensor | Operand:
    """What `prepare` does not take (runs too long for their rings, several pools or launch
    plans): writes the rows that fit into their rings, then attends, one launch per layout.
    operand_groups (one run): as attend_decoded's, where the run takes scratch_attention."""
    assert not operand_groups or len(runs) == 1, "wo_a's operand is made for one run's rows"
    layer, heads = role.index, q.raw.shape[1]
    fits = [_fits_in_ring(cfg, run, layer) for run in runs]
    entries, widths = _entry_offsets(role, runs, q.raw.device)
    _ring_store([run for run, fit in zip(runs, fits) if fit], layer, kv, packed)
    groups: dict[tuple, list[tuple[SeqRun, int]]] = {}
    outputs: dict[int, torch.Tensor | Operand] = {}
    for run, fit, width in zip(runs, fits, widths):
        if not fit:
            rows = run.rows
            own, run_packed = tuple(e[rows, :width] for e in entries), (packed[0][rows], packed[1][rows])
            own_q = q.take(lambda t: t[rows])
            outputs[run.offset] = scratch_attention(cfg, run, role, own_q, kv[rows], run_packed, own, sink,
                                                    operand_groups)
            continue
        plan = (launch_plan(run.n, width, heads, cfg.head_dim), id(run.cache.pool))
        groups.setdefault(plan, []).append((run, width))
    for plan, members in groups.items():
        group, width = [run for run, _ in members], max(w for _, w in members)
        own = tuple(run_rows(e, group)[:, :width] for e in entries)
        o = _launch(cfg, layer, q.take(lambda t: run_rows(t, group)), group, own, sink, plan)
        outputs.update(zip((run.offset for run in group), o.split([run.n for run in group])))
    return cat([outputs[run.offset] for run in runs])  # no copy of one run's 1 GB at a prefill chunk


def _fits_in_ring(cfg: ModelConfig, run: SeqRun, layer: int) -> bool:
    """Its rows can go into the ring before the kernel reads it: they overwrite no key still
    needed, and the ring holds every position up to run.start (no CED gap)."""
    cache = run.cache
    return run.n <= cache.ring_capacity - cfg.sliding_window + 1 and cache.ring_spans[layer].valid_to == run.start


def _ring_store(runs: list[SeqRun], layer: int, kv: torch.Tensor, packed) -> None:
    """The rows of runs that fit into their rings: one write of the codes and one of the scales
    for all of them (the same bytes at the same places as each cache's ring_store)."""
    if not runs:
        return
    if len({id(run.cache.pool) for run in runs}) > 1:
        for run in runs:
            run.cache.ring_store(layer, run.start, kv[run.rows], (packed[0][run.rows], packed[1][run.rows]))
        return
    if sum(run.n for run in runs) != kv.shape[0]:
        packed = tuple(run_rows(part, runs) for part in packed)
    write_rows(runs[0].cache.pool.slots_buffer, *_ring_rows(runs), _layer_bases(layer, runs[0].cache.ring_layer_stride),
               *packed)
    note_ring_writes(runs, layer)


def _layer_bases(layer: int, strides: tuple[int, int]) -> tuple[int, int]:
    """Bytes from layer 0's ring codes and scales to `layer`'s."""
    return layer * strides[0], layer * strides[1]


def _ring_rows(runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 byte offsets [rows, D] and [rows, D/32] in the slots of the runs' rows' codes and
    scales (positions start.., each in its own ring), built once per forward on the host."""
    def build():
        parts = [run.cache.ring_offsets(0, np.arange(run.start, run.start + run.n)) for run in runs]
        codes, scales = (np.concatenate(t) for t in zip(*parts))
        return tables_to_device(runs[0].cache.pool.device, *_key_bytes(codes, scales, runs[0].cache.layout.head_dim))

    return runs[0].once(("ring rows", offsets(runs)), build)


def _key_bytes(codes, scales, dim: int):
    """The offsets of every byte [..., dim] and [..., dim / 32] of keys whose FP8 codes and
    scales start at `codes` and `scales` (tensors, or numpy arrays on the host)."""
    columns = np.arange(dim) if isinstance(codes, np.ndarray) else torch.arange(dim, device=codes.device)
    return codes[..., None] + columns, scales[..., None] + columns[:dim // 32]


def _entry_offsets(role: LayerRole, runs: list[SeqRun], device) -> tuple[tuple[torch.Tensor, torch.Tensor], list[int]]:
    """Byte offsets [T, K] of the codes (-1: none) and scales of each query's selected entries,
    every run in one lookup, and each run's own K (-1 for both past it). The layers after an
    index source read its top-k lists of the same source: they reuse its offsets (pages only
    grow, so an entry's offsets never move)."""
    topks = [_run_topk(role, run) for run in runs]
    key = ("entry offsets", offsets(runs))
    last = runs[0].shared.get(key)
    if last is not None and last[0] == role.kv_source and all(a is b for a, b in zip(last[1], topks)):
        return last[2]
    runs[0].shared[key] = (role.kv_source, topks, _lookup_entries(role, runs, topks, device))
    return runs[0].shared[key][2]


def _lookup_entries(role: LayerRole, runs: list[SeqRun], topks: list, device
                    ) -> tuple[tuple[torch.Tensor, torch.Tensor], list[int]]:
    widths = [1 if t is None else t.shape[1] for t in topks]
    if all(t is None for t in topks):
        return _no_entries(runs, device, 1), widths
    width = max(widths)
    ids = cat([_no_entries([run], device, width, -2)[0] if t is None else _pad(t, width, -2)
                for run, t in zip(runs, topks)])  # -2: past the run's own K
    table, first_page = _page_tables(runs, role.kv_source)
    return page_offsets(runs[0].cache.layout, table, ids, first_page=first_page, mask=True), widths


def _no_entries(runs: list[SeqRun], device, width: int, value: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = runs[0].once(("no entries", offsets(runs), width, value),
                       lambda: torch.full((sum(run.n for run in runs), width), value, dtype=torch.long, device=device))
    return ids, ids


def _page_tables(runs: list[SeqRun], source: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The runs' page tables of `source` end to end and the first page [T, 1] of each row's own
    (0 for an empty table), rebuilt when a table changes (pages added)."""
    tables = tuple(run.cache.device_table(source) for run in runs)
    if len(runs) == 1:
        return tables[0], None
    key = ("page tables", source, offsets(runs))
    built = runs[0].shared.get(key)
    if built is None or any(a is not b for a, b in zip(built[0], tables)):
        table, firsts = tables_end_to_end(list(tables))
        rows = [first for first, run in zip(firsts, runs) for _ in range(run.n)]
        first_page = to_device(torch.tensor(rows, dtype=torch.long)[:, None], table.device)
        built = runs[0].shared[key] = (tables, table, first_page)
    return built[1], built[2]


def _launch(cfg: ModelConfig, layer: int, q: Queries, runs: list[SeqRun], entries, sink, plan) -> torch.Tensor:
    """One sparse_attention over the runs' rows q; keys in the ring, entries (offsets [rows, K])
    in the pages."""
    pool = runs[0].cache.pool
    return _attend_planned(cfg, q, pool.slots_buffer, _window_grid(cfg, layer, runs), pool.pages_buffer, entries,
                           sink, plan[0], _layer_bases(layer, runs[0].cache.ring_layer_stride))


def _attend_planned(cfg: ModelConfig, q: Queries, ring: torch.Tensor, window, pages: torch.Tensor, entries,
                    sink: torch.Tensor, plan: LaunchPlan, window_base: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """sparse_attention laid out as `plan` says; window and entries are (codes, scales) offsets,
    the window's `window_base` bytes before the keys' (layer 0's offsets for a later layer)."""
    return sparse_attention(q, ring, *window, pages, *entries, sink, cfg.head_dim**-0.5, num_warps=plan.warps,
                            entry_splits=plan.entry_splits, head_block=plan.head_block, prefill=plan.prefill,
                            window_base=window_base)


def _window_grid(cfg: ModelConfig, layer: int, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 ring offsets of key positions start+i-W+1 .. start+i of every query (codes, -1
    where a key holds no data; scales): data from the layer's first valid position on
    (_fits_in_ring: no gap before run.start). Layers with the same first positions share one
    build per forward."""
    valid_from = tuple(run.cache.ring_spans[layer].valid_from for run in runs)

    def build():  # on the host, one copy
        parts = []
        for run, first in zip(runs, valid_from):
            grid = np.arange(run.start, run.start + run.n)[:, None] - np.arange(cfg.sliding_window - 1, -1, -1)
            codes, scales = run.cache.ring_offsets(0, grid)
            parts.append((np.where(grid >= first, codes, -1), scales))
        return tables_to_device(runs[0].cache.pool.device, *(np.concatenate(t) for t in zip(*parts)))

    return runs[0].once(("window grid", offsets(runs), valid_from), build)


def _pad(ids: torch.Tensor, width: int, value: int) -> torch.Tensor:
    """`value` columns up to `width` (masked entries: they add nothing to any sum)."""
    extra = width - ids.shape[1]
    return ids if extra == 0 else torch.nn.functional.pad(ids, (0, extra), value=value)


def scratch_attention(cfg: ModelConfig, run: SeqRun, role: LayerRole, q: Queries, kv, packed, entries,
                      sink, operand_groups: int = 0) -> torch.Tensor | Operand:
    """A run too long for the ring (or after a gap in it): old window rows and this run's rows go
    into one small scratch buffer (a long chunk would overwrite its own early rows in the ring);
    entries are read where they live in the pages. Where decoded_form says (a prefill chunk),
    the scratch's keys and the source's entries are decoded once into bf16 rows instead, and
    each query reads its rows of them (attend_decoded, which takes operand_groups)."""
    cache, layer, window, D = run.cache, role.index, cfg.sliding_window, cfg.head_dim
    device = q.raw.device  # the pool's device too (ops.reads_cache_in_place): every index is built here
    cached_pos = cache.window_positions(layer, run.start - window + 1, run.start, device=device)
    old_codes, old_scales = cache.ring_offsets(layer, cached_pos)
    buf = cache.pool.slots_buffer
    code_at, scale_at = _key_bytes(old_codes, old_scales, D)
    codes = torch.cat([buf[code_at], packed[0]])
    scales = torch.cat([buf[scale_at], packed[1]])
    scratch = torch.cat([codes.reshape(-1), scales.reshape(-1)])
    q_pos = run.positions_on(device)
    key_pos = torch.cat([cached_pos, q_pos])
    m = cached_pos.shape[0]
    rows = (m + torch.arange(run.n, device=device))[:, None] - torch.arange(window - 1, -1, -1, device=device)
    valid = (rows >= 0) & (key_pos[rows.clamp_min(0)] > q_pos[:, None] - window)
    cache.ring_store(layer, run.start, kv, packed)
    if decoded_form(q, D):  # every key decoded once, not once per query that reads it
        key_rows = torch.arange(codes.shape[0], device=device)
        window_keys = decode_keys(scratch, key_rows * D, codes.numel() + key_rows * (D // 32), D, fp4=False)
        entry_keys, entry_rows = _decoded_entries(role, run, device)
        return attend_decoded(q, window_keys, torch.where(valid, rows, -1), entry_keys, entry_rows, sink, D**-0.5,
                              operand_groups)
    win_off = torch.where(valid, rows * D, -1)
    win_soff = codes.numel() + rows.clamp_min(0) * (D // 32)
    return sparse_attention(q, scratch, win_off, win_soff, cache.pool.pages_buffer, *entries, sink, D**-0.5)


def _decoded_entries(role: LayerRole, run: SeqRun, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every entry of the run's source decoded [E, D] bf16 (its table's pages, entry by entry)
    and each query's selected ones as rows of it [n, k] (< 0: none): what _entry_offsets
    points at in the pages. The layers that read one source find the same entries (only its
    own layer's compressor adds them): the last source's stay for the forward's next layers,
    one source's at a time (at 1M tokens, 512 MB of rows)."""
    topk = _run_topk(role, run)
    D = run.cache.layout.head_dim
    if topk is None:
        return torch.zeros(1, D, dtype=torch.bfloat16, device=device), _no_entries([run], device, 1)[0]
    source = (role.kv_source, run.cache.num_entries(role.kv_source))
    kept = run.shared.get("decoded entries")
    if kept is None or kept[0] != source:
        table = run.cache.device_table(role.kv_source)
        ids = torch.arange(table.shape[0] * run.cache.layout.page_entries, device=device)
        codes, scales = page_offsets(run.cache.layout, table, ids, mask=True)
        kept = run.shared["decoded entries"] = source, decode_keys(run.cache.pool.pages_buffer, codes, scales, D,
                                                                   fp4=True)
    return kept[1], topk


def _run_topk(role: LayerRole, run: SeqRun) -> torch.Tensor | None:
    """The run's top-k entry lists of role's source [n, k] (-1: none), or None where it has none."""
    topk = run.shared.get("topk") if role.ratio else None
    return None if topk is None or topk.shape[1] == 0 else topk
