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
bit for bit.
"""

from __future__ import annotations

import torch

from ..batch import SeqRun
from ..config import LayerRole, ModelConfig
from ..kernels.sparse_attention import launch_plan, sparse_attention
from ..ops import ReferenceOps
from ..rope import Rope, apply_rope
from .compressor import compress
from .indexer import index


def update_entries(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
                   run: SeqRun, rope: Rope, qat: bool) -> None:
    """This run's new compressed entries, then its top-k (run.shared['topk'])."""
    rows = run.rows
    if role.is_kv_source and not run.skip_compressor:
        compress(ops, cfg, role, xa[rows], run, rope, qat)
    if role.is_index_source:
        index(ops, cfg, role, xa[rows], q_res[rows], run, rope, qat)


def attend_in_place(ops: ReferenceOps, cfg: ModelConfig, role: LayerRole, xa: torch.Tensor, q_res: torch.Tensor,
                    q_all: torch.Tensor, kv_all: torch.Tensor, runs: list[SeqRun], rope: Rope) -> torch.Tensor:
    """`attend` with the quantizers on and every cache read in place -> o [T, h, D]."""
    cos, sin = _rope_rows(rope, role.rope, runs)  # [T, rope/2]
    q = apply_rope(q_all, cos, sin)
    kv, packed = ops.fp8_round_trip(apply_rope(kv_all, cos, sin))
    if role.ratio:
        for run in runs:
            update_entries(ops, cfg, role, xa, q_res, run, rope, True)
    o = _attention(cfg, role, q, kv, packed, runs, ops.w(f"{role.prefix}.attn.attn_sink"))
    return apply_rope(o, cos, sin, inverse=True)


def _rope_rows(rope: Rope, kind: str, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of every row, once per forward (each table is a run's, as alone)."""
    if len(runs) == 1:
        return rope.for_run(kind, runs[0])
    key = ("rope rows", kind, len(runs))
    if key not in runs[0].shared:
        tables = [rope.for_run(kind, run) for run in runs]
        runs[0].shared[key] = torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])
    return runs[0].shared[key]


def _attention(cfg: ModelConfig, role: LayerRole, q, kv, packed, runs: list[SeqRun], sink) -> torch.Tensor:
    """Writes each run's rows into its ring, then attends: one launch per program layout."""
    layer, heads = role.index, q.shape[1]
    groups: dict[tuple, list[tuple[SeqRun, tuple[torch.Tensor, torch.Tensor]]]] = {}
    outputs: dict[int, torch.Tensor] = {}
    for run in runs:
        rows, entries = run.rows, _entry_offsets(role, run, q.device)
        run_packed = (packed[0][rows], packed[1][rows])
        if not _fits_in_ring(cfg, run, layer):
            outputs[run.offset] = scratch_attention(cfg, run, role, q[rows], kv[rows], run_packed, entries, sink)
            continue
        run.cache.ring_store(layer, run.start, kv[rows], run_packed)
        plan = launch_plan(run.n, entries[0].shape[1], heads) + (id(run.cache.pool),)
        groups.setdefault(plan, []).append((run, entries))
    if not outputs and len(groups) == 1:
        (plan, members), = groups.items()
        return _launch(cfg, layer, q, members, sink, plan)  # every run, in row order
    for plan, members in groups.items():
        o = _launch(cfg, layer, _cat([q[run.rows] for run, _ in members]), members, sink, plan)
        outputs.update(zip((run.offset for run, _ in members), o.split([run.n for run, _ in members])))
    return torch.cat([outputs[run.offset] for run in runs])


def _fits_in_ring(cfg: ModelConfig, run: SeqRun, layer: int) -> bool:
    """Its rows can go into the ring before the kernel reads it: they overwrite no key still
    needed, and the ring holds every position up to run.start (no CED gap)."""
    cache = run.cache
    return run.n <= cache.ring_capacity - cfg.sliding_window + 1 and cache.ring_spans[layer].valid_to == run.start


def _entry_offsets(role: LayerRole, run: SeqRun, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets [n, K] of the codes (-1: none) and scales of each query's selected entries."""
    topk = run.shared.get("topk") if role.ratio else None
    if topk is None or topk.shape[1] == 0:
        key = ("no entries", run.n)
        if key not in run.shared:
            run.shared[key] = torch.full((run.n, 1), -1, dtype=torch.long, device=device)
        return run.shared[key], run.shared[key]
    off, soff = run.cache.entry_offsets(role.kv_source, topk)
    return torch.where(topk >= 0, off, -1), soff


def _launch(cfg: ModelConfig, layer: int, q: torch.Tensor, members, sink, plan) -> torch.Tensor:
    """One sparse_attention over the members' rows q; keys in the ring and the pages."""
    hb, warps, splits = plan[:3]
    runs = [run for run, _ in members]
    win_off, win_soff = _window_offsets(cfg, layer, runs)
    width = max(entries[0].shape[1] for _, entries in members)
    ent_off = _cat([_pad(entries[0], width) for _, entries in members])
    ent_soff = _cat([_pad(entries[1], width) for _, entries in members])
    pool = runs[0].cache.pool
    return sparse_attention(q, pool.slots_buffer, win_off, win_soff, pool.pages_buffer, ent_off, ent_soff, sink,
                            cfg.head_dim**-0.5, num_warps=warps, entry_splits=splits, head_block=hb)


def _window_offsets(cfg: ModelConfig, layer: int, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets [rows, W] of the window keys' codes (-1: masked) and scales in this layer's ring:
    layer 0's offsets plus `layer` strides, built once per forward."""
    codes0, scales0, valid = _window_grid(cfg, layer, runs)
    code_stride, scale_stride = runs[0].cache.ring_layer_stride
    return torch.where(valid, codes0 + layer * code_stride, -1), scales0 + layer * scale_stride


def _window_grid(cfg: ModelConfig, layer: int, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer-0 ring offsets of key positions start+i-W+1 .. start+i of every query, and which of
    them hold data: from the layer's first valid position on (_fits_in_ring: no gap before
    run.start). Layers with the same first positions share one build per forward."""
    valid_from = tuple(run.cache.ring_spans[layer].valid_from for run in runs)
    key = ("window grid", tuple(run.offset for run in runs), valid_from)
    shared = runs[0].shared
    if key not in shared:
        parts = []
        for run, first in zip(runs, valid_from):
            device = run.cache.pool.device
            grid = run.positions_on(device)[:, None] - torch.arange(cfg.sliding_window - 1, -1, -1, device=device)
            parts.append(run.cache.ring_offsets(0, grid) + (grid >= first,))
        shared[key] = tuple(_cat(list(t)) for t in zip(*parts))
    return shared[key]


def _pad(offsets: torch.Tensor, width: int) -> torch.Tensor:
    """Masked (-1) entries up to `width`: they add nothing to any sum."""
    extra = width - offsets.shape[1]
    return offsets if extra == 0 else torch.nn.functional.pad(offsets, (0, extra), value=-1)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def scratch_attention(cfg: ModelConfig, run: SeqRun, role: LayerRole, q, kv, packed, entries, sink) -> torch.Tensor:
    """A run too long for the ring (or after a gap in it): old window rows and this run's rows go
    into one small scratch buffer (a long chunk would overwrite its own early rows in the ring);
    entries are read where they live in the pages."""
    cache, layer, window, D = run.cache, role.index, cfg.sliding_window, cfg.head_dim
    device = q.device  # the pool's device too (ops.reads_cache_in_place): every index is built here
    cached_pos = cache.window_positions(layer, run.start - window + 1, run.start, device=device)
    old_codes, old_scales = cache.ring_offsets(layer, cached_pos)
    buf = cache.pool.slots_buffer
    codes = torch.cat([buf[old_codes[:, None] + torch.arange(D, device=device)], packed[0]])
    scales = torch.cat([buf[old_scales[:, None] + torch.arange(D // 32, device=device)], packed[1]])
    scratch = torch.cat([codes.reshape(-1), scales.reshape(-1)])
    q_pos = run.positions_on(device)
    key_pos = torch.cat([cached_pos, q_pos])
    m = cached_pos.shape[0]
    rows = (m + torch.arange(run.n, device=device))[:, None] - torch.arange(window - 1, -1, -1, device=device)
    valid = (rows >= 0) & (key_pos[rows.clamp_min(0)] > q_pos[:, None] - window)
    win_off = torch.where(valid, rows * D, -1)
    win_soff = codes.numel() + rows.clamp_min(0) * (D // 32)
    cache.ring_store(layer, run.start, kv, packed)
    return sparse_attention(q, scratch, win_off, win_soff, cache.pool.pages_buffer, *entries, sink, D**-0.5)
