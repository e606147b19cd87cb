"""DSpark: the 3-stage block drafter shipped as `mtp.0-2` in the checkpoint.

Shapes: R requests, B block size (5), H hidden, V vocab, r Markov rank, n taps.
Context (after the target processed positions .. p):
  taps   = mean over streams of the residual entering each target layer (37, 38, 39)   [n, 3H]
  main_x = RMSNorm(taps @ main_proj^T, main_norm)                                        [n, H]
  each stage writes FP8q(RoPE(RMSNorm(main_x @ wkv^T, kv_norm))) into its own window ring.
Propose, with y the token just chosen for p+1:
  block = [y, noise x (B-1)] at positions p+1..p+B, embedded on every stream;
  the 3 stages run as mHC blocks whose attention sees the stage ring [p-W+1, p] and every
  block row (non-causal); x = collapse with the last f_pre;
  logits_i = RMSNorm(x_i, mtp.2.norm) @ head^T + markov_embed[out_i] @ markov_head^T, with
  out_0 = y and out_{i+1} drawn from logits_i (sequentially);
  confidence_i = sigmoid(cat(x_i, markov_embed[out_i]) @ confidence_proj^T).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..kvcache.paged import PagedCache
from ..kvcache.state import SequenceCache
from . import graphs as graph_module
from .batch import SeqRun, pack
from .deepseek_v41 import DeepseekV41
from .device import tables_to_device, to_device
from .layers.mhc import hc_collapse
from .ops import argmax_rows

# (block row, logits [R, V]) -> a token per request: host ints, or a tensor left where the
# logits are (then the drafts never leave the device inside the block)
Chooser = Callable[[int, torch.Tensor], "list[int] | torch.Tensor"]


@dataclass
class Proposal:
    drafts: torch.Tensor  # [R, B] int64: tokens for positions p+2 .. p+B+1 (where the chooser left them)
    logits: torch.Tensor  # [R, B, V] fp32: the distribution each draft was drawn from
    confidence: torch.Tensor  # [R, B]: predicted probability that each draft is accepted


def greedy_chooser(_row: int, logits: torch.Tensor) -> torch.Tensor:
    """On the device: the next row's Markov term reads it there, so the block is drafted
    without the host waiting on the GPU once per row."""
    return argmax_rows(logits.float())


class DSparkDrafter:
    def __init__(self, model: DeepseekV41):
        c = model.config
        if c.num_dspark_stages == 0:
            raise ValueError("this checkpoint has no DSpark stages")
        self.model, self.config = model, c
        self.stages = c.roles[c.num_layers:]
        self.first, self.last = self.stages[0].prefix, self.stages[-1].prefix

    def absorb(self, cache: SequenceCache, start: int, taps: torch.Tensor) -> None:
        """Write the stage rings for positions start.. from the target's taps [n, targets*H]."""
        self.absorb_many([(cache, start, taps)])

    def absorb_many(self, items: list[tuple[SequenceCache, int, torch.Tensor]]) -> None:
        """absorb for several (cache, start, taps) at once, as a decode step's batch needs: the
        projections, norms, RoPE and quantization run once over every cache's rows (each row
        as alone), then each cache takes its own rows into its rings."""
        rows = []  # (cache, first position, taps): only the rows each ring keeps
        for cache, start, taps in items:
            keep = min(taps.shape[0], cache.ring_capacity)
            if keep:
                rows.append((cache, start + taps.shape[0] - keep, taps[-keep:]))
        if not rows:
            return
        taps = rows[0][2] if len(rows) == 1 else torch.cat([t for _, _, t in rows])
        parts = [(cache, first, t.shape[0]) for cache, first, t in rows]
        positions = np.concatenate([np.arange(first, first + n) for _, first, n in parts])
        where = PagedCache.ring_targets(parts) if self._graphs() is not None and self.model.qat else None
        if where is not None:  # the ring writes too in absorb's graph: the host launches nothing after it
            self._absorb_stored(parts[0][0].pool, taps, positions, where)
            for role in self.stages:
                PagedCache.note_ring_stores(role.index, parts)
            return
        written = self._absorb_rows(taps, tables_to_device(taps.device, positions)[0])
        for i, role in enumerate(self.stages):
            kv, packed = written[3 * i], (written[3 * i + 1], written[3 * i + 2]) if self.model.qat else None
            type(parts[0][0]).ring_store_runs(role.index, parts, kv, packed)

    def _absorb_stored(self, pool, taps: torch.Tensor, positions: np.ndarray, where: np.ndarray) -> None:
        """_stage_rows of the taps at `positions`, written into the pool's stage rings at `where`
        (PagedCache.ring_targets), from one graph per bucket of row counts."""
        def stored(taps, positions, where):
            written = self._stage_rows(taps, positions)
            for i, role in enumerate(self.stages):
                PagedCache.ring_scatter(pool, role.index, where, written[3 * i + 1], written[3 * i + 2])
            return ()

        self._graphs().run(("absorb", "stored", pool.serial), stored,
                           (taps,) + tables_to_device(taps.device, positions, where), unit=1)

    def warm_up(self, rows: int, pool=None) -> None:
        """Capture absorb's graphs for every bucket of up to `rows` rows now, not in front of a
        user: a step absorbs each request's accepted tokens, so its row count varies from step
        to step. The rows are zeros; with a paged `pool` the graphs that also write the rings
        are captured, writing into a slot taken for the while."""
        graphs = self._graphs()
        if graphs is None or not self.model.qat:
            return
        rows = min(rows, graphs.max_rows)
        width = len(self.config.dspark_target_layers) * self.config.hidden_size
        slot = pool.allocate_slot() if pool is not None and pool.free_slot_count else None
        try:
            with torch.inference_mode():  # the steps that replay them run in it (the buffers are its tensors)
                taps = torch.zeros(rows, width, device=self.model.device)
                for bucket in sorted({graphs.padded_rows(n, 1) for n in range(1, rows + 1)}):
                    positions = np.arange(bucket)
                    for _ in range(2):  # the eager run, then the capture
                        if slot is None:
                            self._absorb_rows(taps[:bucket], tables_to_device(taps.device, positions)[0])
                            continue
                        where = PagedCache.slot_targets(pool, slot, 0, bucket)
                        self._absorb_stored(pool, taps[:bucket], positions, where)
        finally:
            if slot is not None:
                pool.free_slot(slot)

    def _absorb_rows(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """_stage_rows, replayed from a graph per bucket of row counts where the graphs are on
        (with the quantizers: the graph's outputs are the ring's bytes)."""
        graphs = self._graphs()
        if graphs is None or not self.model.qat:
            return self._stage_rows(taps, positions)
        return graphs.run(("absorb",), self._stage_rows, (taps, positions), unit=1)

    def _stage_rows(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each stage's ring rows for the taps [n, targets*H] at `positions` [n]: (kv, FP8 codes,
        scales) a stage, the codes and scales None without the quantizers."""
        ops, c = self.model.ops, self.config
        main_x = ops.rms_norm(ops.linear(taps, f"{self.first}.main_proj"), ops.w(f"{self.first}.main_norm.weight"),
                              c.rms_norm_eps)
        cos, sin = self.model.rope.cos_sin("local", positions)
        stage_kv = ops.linear_many(main_x, tuple(f"{role.prefix}.attn.wkv" for role in self.stages))
        out = []
        for role, kv in zip(self.stages, stage_kv):
            kv = ops.rope(ops.rms_norm(kv, ops.w(f"{role.prefix}.attn.kv_norm.weight"), c.rms_norm_eps), cos, sin)
            packed = (None, None)
            if self.model.qat:
                kv, packed = ops.fp8_round_trip(kv)
            out += [kv, *packed]
        return tuple(out)

    def propose(self, requests: list[tuple[SequenceCache, int]], choose: Chooser = greedy_chooser) -> Proposal:
        """Drafts for each (cache, y): the cache has committed positions .. p, y is the token at p+1."""
        c, model = self.config, self.model
        B = c.dspark_block_size
        runs = [SeqRun(cache=cache, tokens=torch.tensor([y] + [c.dspark_noise_token_id] * (B - 1)),
                       start=cache.num_tokens, history=[]) for cache, y in requests]
        R = len(runs)
        graphs = self._graphs()
        if choose is greedy_chooser and graphs is not None:
            # every row's argmax stays on the device: the block's head is one graph per bucket,
            # and where the stages' attention is one fixed launch, the stages too: the host then
            # only prepares their tables while the GPU waits after the targets' sync
            tokens = to_device(pack(runs), model.device)
            prepared = model.prepare_draft_stages(runs)
            if prepared is not None:
                def stages_and_head(tokens, *tables):
                    return self._greedy_head(*model.draft_stages(prepared, tokens, *tables), tokens)

                out = graphs.run(("propose", prepared.plan, prepared.pool.serial), stages_and_head,
                                 (tokens,) + prepared.tensors, shared=len(prepared.tensors), unit=B)
            else:
                X, pre = model.draft_streams(runs)
                out = graphs.run(("draft_head",), self._greedy_head, (X, pre, tokens), unit=B)
            drafts, logits, confidence = out
            return Proposal(drafts.view(R, B), logits.view(R, B, -1), confidence.view(R, B))
        X, pre = model.draft_streams(runs)
        return self._head(X, pre, torch.tensor([y for _, y in requests], dtype=torch.long), choose)

    def _graphs(self):
        """The model's CUDA graphs, where the drafter's own parts take them (graphs.HOST_BOUND_PARTS)."""
        return self.model.graphs if graph_module.HOST_BOUND_PARTS else None

    def _greedy_head(self, X: torch.Tensor, pre: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """_head of greedy_chooser with each block's tokens [R*B] (y first), as rows [R*B, ...]."""
        B = self.config.dspark_block_size
        p = self._head(X, pre, tokens.view(-1, B)[:, 0], greedy_chooser)
        return p.drafts.reshape(-1), p.logits.flatten(0, 1), p.confidence.reshape(-1)

    def _head(self, X: torch.Tensor, pre: torch.Tensor, first: torch.Tensor, choose: Chooser) -> Proposal:
        """The drafts from the last stage's streams X [R*B, S, H]; `first`: each block's y [R]."""
        c, ops = self.config, self.model.ops
        B = c.dspark_block_size
        x = hc_collapse(X, pre).view(-1, B, X.shape[-1])  # [R, B, H]
        base = ops.linear(ops.rms_norm(x, ops.w(f"{self.last}.norm.weight"), c.rms_norm_eps), "head.weight")
        markov_embed = ops.w(f"{self.last}.markov_head.embed.weight")
        out = first
        drafts, logits, embeds = [], [], []
        for i in range(B):
            e = markov_embed[to_device(out, markov_embed.device)]  # [R, r]
            # (ops.linear: the bf16 weight as stored, half the bytes of e @ its fp32 copy)
            row = base[:, i] + ops.linear(e, f"{self.last}.markov_head.head.weight")  # [R, V]
            out = choose(i, row)
            if not isinstance(out, torch.Tensor):
                out = torch.tensor(out, dtype=torch.long)  # host ints
            drafts.append(out)
            logits.append(row)
            embeds.append(e)
        e = torch.stack(embeds, dim=1)  # [R, B, r]
        confidence = torch.sigmoid(torch.cat([x, e], dim=-1) @ ops.w(f"{self.last}.confidence_head.proj.weight").T)
        return Proposal(torch.stack(drafts, dim=1), torch.stack(logits, dim=1), confidence.squeeze(-1))
