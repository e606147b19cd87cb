"""DeepSeek-V4.1-Flash: the wiring of embedding, 40 mHC blocks and the head.

Shapes: T rows (all requests' tokens of one forward), S = hc_mult streams, H hidden, V vocab.
  X [T, S, H] = embed(tokens) on every stream; pre = one-hot(stream 0)
  for each layer: [Engram] -> mHC block (attention, MoE), each collapse using the `pre`
                  of the site before it (single-pass mHC)
  logits = RMSNorm(sum_s pre_s X_s, norm) @ head^T   (fp32)

Three entry points share one layer loop:
- `forward`: every layer over every row (exact prefill, decode, verification);
- `encode`:  CED encoder — layers before the last KV source over every row, plus that
             layer's KV path (compressor, index keys), returning the streams entering it;
- `decode_rows`: CED decoder — the remaining layers over a request's tail rows only.
"""

from __future__ import annotations

import functools
import pathlib
import threading
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from .batch import SeqRun, pack
from .config import LayerRole, ModelConfig
from .device import to_device
from .engram_hash import EngramHasher, RunHashes, compressed_map
from . import graphs as graph_module
from .graphs import GraphCache
from .kernels.fp8_blockwise import Operand
from .layers.attention import attend, grouped_output, input_weights, project
from .layers.attention_kernel import (Prepared, attend_prepared, attend_updated, note_ring_writes, prepare,
                                      prepare_block, update_sources)
from .layers.compressor import compress, compressor_projections
from .layers.engram import engram, engram_mix, engram_rows
from .layers.indexer import index_queries
from .layers.mhc import stream_dtype
from .layers.moe import moe, shared_input_weights
from .ops import ReferenceOps
from .parallel import SINGLE, Parallel, check_divisible, check_fits, rank_tensors, shard_attention
from .rope import Rope
from .weights import ENGRAM_ON_DEVICE_BYTES, Checkpoint, WeightStore


# A table on the GPU is hashed there too, in the site's graph (False: on the host, as for a
# table in host memory; bench/decode_ab.py compares the two in one process).
HASH_ON_DEVICE = True
# The kernel path's row offsets are 32-bit: a row times the attention's row stride (64 heads of
# 512) stays under 2^31 up to this many rows of one forward. Longer prompts go in chunks (a
# prefill worker's budget is 16,384 tokens a step).
MAX_KERNEL_ROWS = 65536


@dataclass
class ForwardResult:
    logits: list[torch.Tensor | None]  # per run: [rows, V] fp32 (rows chosen by `logits=`)
    taps: list[torch.Tensor | None]  # per run: [n, targets*H] DSpark taps, when asked for


def _rows_per_request(runs: list[SeqRun]) -> int:
    """The rows every run has (a graph pads such a batch to its bucket), or 0 where they differ."""
    n = runs[0].n
    return n if all(run.n == n for run in runs) else 0


class DeepseekV41:
    def __init__(self, weights: WeightStore, *, tokenizer_json: str | pathlib.Path | None = None, qat: bool = True,
                 act_quant: bool = False, device: str | torch.device = "cpu", parallel: Parallel = SINGLE):
        self.config: ModelConfig = weights.config
        self.ops = ReferenceOps(weights, act_quant=act_quant, device=device, parallel=parallel)
        self.device = torch.device(device)
        self.rope = Rope(self.config, device=self.device)
        self.qat = qat
        self.graphs: GraphCache | None = None  # CUDA graphs of the dense parts (use_kernels turns them on)
        self.leader = None  # rank 0 of several: announces each call to the other ranks (lockstep.py)
        # Engines sharing this model (`dsflash serve` runs a prefill and a decode worker on one
        # copy of the weights) take turns, a whole step each: a forward's CUDA graphs share
        # buffers and outputs, and a capture must not see another thread's launches.
        self.step_lock = threading.RLock()
        self.hasher = None
        if self.config.engram_layers:
            if tokenizer_json is None:
                raise ValueError("Engram layers need the checkpoint's tokenizer.json to hash n-grams")
            self.hasher = EngramHasher(self.config, compressed_map(str(tokenizer_json)))

    @classmethod
    def from_checkpoint(cls, path: str | pathlib.Path, *, tier: str = "all", device="cpu", progress: bool = False,
                        **kwargs) -> "DeepseekV41":
        ckpt = Checkpoint(path)
        parallel = kwargs.get("parallel", SINGLE)
        check_divisible(ckpt.config, parallel.world)
        check_fits(ckpt.config, parallel.world, tier, torch.device(device), ckpt.spec_bytes)
        weights = ckpt.load(rank_tensors(ckpt.config, parallel, tier), device=device, progress=progress)
        tokenizer = pathlib.Path(path) / "tokenizer.json"
        return cls(shard_attention(weights, parallel), tokenizer_json=tokenizer if tokenizer.exists() else None,
                   device=device, **kwargs)

    def use_kernels(self, keep_unpacked: bool = True) -> None:
        """Switch to the Triton fast path (packed weights on the device, model/fast_ops.py).
        keep_unpacked=False (serving): stack the routed experts now and forget their per-expert
        tensors, which only the reference path reads: the weights are then held once."""
        from .fast_ops import TritonOps

        old = self.ops
        if self.device.type == "cuda":
            old.weights.engram_tables_to(self.device, ENGRAM_ON_DEVICE_BYTES)
        self.ops = TritonOps(old.weights, act_quant=old.act_quant, device=self.device, parallel=old.parallel)
        if not keep_unpacked:
            self.ops.stack_all_experts(self.config)
        if GraphCache.wanted(self.device):
            self.graphs = GraphCache()

    def release_graphs(self) -> None:
        """Free the CUDA graphs before the process group goes (GraphCache.release)."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None

    # ------------------------------------------------------------ entry points

    def forward(self, runs: list[SeqRun], *, logits: str = "last", taps: bool = False) -> ForwardResult:
        self._check_rows(runs)
        with self._lockstep("forward", runs, logits=logits, taps=taps):
            tokens = pack(runs)
            X, pre = self.embed(tokens)
            X, pre, tap_rows = self._layers(X, pre, runs, range(self.config.num_layers), self._hash(runs, tokens),
                                            taps)
            return self._outputs(X, pre, runs, logits, tap_rows)

    def _check_rows(self, runs: list[SeqRun]) -> None:
        """Refuse a forward of more rows than the kernel path takes (MAX_KERNEL_ROWS), before any
        rank is told of it."""
        rows = sum(run.n for run in runs)
        if self.ops.fast and rows > MAX_KERNEL_ROWS:
            raise ValueError(f"{rows:,} rows in one forward: the kernel path takes at most {MAX_KERNEL_ROWS:,} "
                             "(its row offsets are 32-bit); run the prompt in chunks (--prefill-token-budget, "
                             "dsflash logits --mode chunked:N)")

    def _lockstep(self, kind: str, runs: list[SeqRun], tensors: tuple[torch.Tensor, ...] = (), **options):
        """Rank 0 of several announces the call first: the other ranks join its collectives."""
        return nullcontext() if self.leader is None else self.leader.announce(kind, runs, tensors, **options)

    def encode(self, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
        """CED encoder pass. Returns (X, pre) entering the first decoder layer, for every row."""
        self._check_rows(runs)
        with self._lockstep("encode", runs):
            return self._encode(runs)

    def _encode(self, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
        split = self.config.ced_split
        tokens = pack(runs)
        X, pre = self.embed(tokens)
        hashes = self._hash(runs, tokens)
        X, pre, _ = self._layers(X, pre, runs, range(split), hashes, False)
        role = self.config.roles[split]
        Xs = self._engram(role, X, hashes, runs) if role.engram_slot is not None else X
        xa = self.ops.hc_collapse_norm(Xs, pre, self.ops.w(f"{role.prefix}.attn_norm.weight"),
                                       self.config.rms_norm_eps)
        compress(self.ops, self.config, role, xa, runs, self.rope, self.qat)
        return X, pre

    def decode_rows(self, runs: list[SeqRun], X: torch.Tensor, pre: torch.Tensor, *, logits: str = "last",
                    taps: bool = False) -> ForwardResult:
        """CED decoder pass over given rows (X, pre from `encode`), skipping the rebuilt entries."""
        self._check_rows(runs)
        with self._lockstep("decode_rows", runs, (X, pre), logits=logits, taps=taps):
            tokens = pack(runs)
            for run in runs:
                run.skip_compressor = True
            split = self.config.ced_split
            X, pre, tap_rows = self._layers(X, pre, runs, range(split, self.config.num_layers),
                                            self._hash(runs, tokens), taps)
            return self._outputs(X, pre, runs, logits, tap_rows)

    def draft_streams(self, runs: list[SeqRun]) -> tuple[torch.Tensor, torch.Tensor]:
        """The DSpark stages over the runs' blocks (model/dspark.py): (X, pre) after the last."""
        with self._lockstep("draft_streams", runs):
            X, pre = self.embed(pack(runs))
            for role in self.config.roles[self.config.num_layers:]:
                X, pre = self.block(role, X, pre, runs, block_mode=True)
            return X, pre

    def prepare_draft_stages(self, runs: list[SeqRun]) -> Prepared | None:
        """The DSpark stages' block attention prepared for draft_stages (the drafter's proposal
        in one CUDA graph) over packed runs (batch.pack), or None where a stage's attention is
        not one fixed launch or other ranks must follow each call (they run draft_streams)."""
        if self.leader is not None or self.ops.parallel.world > 1:
            return None
        stage = self.config.roles[self.config.num_layers]
        return self._graphable_block_attention(stage, runs, sum(run.n for run in runs))

    def draft_stages(self, prepared: Prepared, tokens: torch.Tensor, *tables: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """draft_streams of the block tokens [T] with the attention prepared once for every stage
        (prepare_draft_stages; its tensors as `tables`): (X, pre) after the last stage."""
        X, pre = self.embed(tokens)
        for role in self.config.roles[self.config.num_layers:]:
            X, pre = self._whole_block(role, prepared, X, pre, *tables)
        return X, pre

    # ------------------------------------------------------------ pieces

    def embed(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        S = self.config.hc_mult
        e = self.ops.rows("embed.weight", to_device(tokens, self.device))
        X = e.to(stream_dtype(self.ops.act_quant)).unsqueeze(1).expand(-1, S, -1).contiguous()
        pre = torch.zeros(e.shape[0], S, device=self.device)
        pre[:, 0] = 1.0
        return X, pre

    def block(self, role: LayerRole, X: torch.Tensor, pre: torch.Tensor, runs: list[SeqRun],
              block_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One mHC block; returns the new streams and this block's FFN `pre` for the next site."""
        return self._block(role, [X], pre, runs, block_mode)[:2]

    def _block(self, role: LayerRole, streams: list[torch.Tensor], pre: torch.Tensor, runs: list[SeqRun],
               block_mode: bool = False, defer: bool = False) -> tuple[torch.Tensor, ...]:
        """block of streams = [X, *pending]: pending the block before's FFN output, post and
        comb, not yet in X, taken into the streams in this block's attention site; with `defer`
        its own FFN output left out of them: (X, pre, its pending or nothing). See
        ReferenceOps.defers_expand. The list is emptied, so that the caller holds neither X nor
        the pending output once the site has made the new streams (at a 16K chunk 1.34 GB and
        0.34 GB, held through the FFN's peak otherwise)."""
        X, *pending = streams
        streams.clear()
        unit = _rows_per_request(runs)
        prepared = (self._graphable_block_attention(role, runs, X.shape[0]) if block_mode
                    else self._graphable_attention(role, runs, X.shape[0], unit))
        if prepared is not None:  # the whole block in one graph
            # (with the pending output taken in first: a prefill chunk's rows, which the deferring
            # is for, never fit its ring)
            X, pending = self._expanded(X, pending), ()
            key = ("block", role.index, prepared.plan, prepared.pool.serial)
            out = self.graphs.run(key, lambda *t: self._whole_block(role, prepared, *t), (X, pre) + prepared.tensors,
                                  shared=len(prepared.tensors), unit=unit)
            if not block_mode:  # (a DSpark block writes no ring)
                note_ring_writes(runs, role.index)
            return out
        yarn = self._index_rope(role, runs, block_mode)
        graphed_sources = self.graphs is not None and not block_mode and self._sources_in_place(role, runs)
        # there the compressor's projections join the site's graph as the indexer's queries do
        compressor = graphed_sources and role.is_kv_source and not any(run.skip_compressor for run in runs)
        # the input read by wq_a and wkv alone: a layer that is no source, its attention reading the pages in place
        only_projected = not (role.is_kv_source or role.is_index_source) and self.qat and self._in_place(runs)
        attn_in = functools.partial(self._attn_in, compressor=compressor, pending=len(pending),
                                    keep_input=not only_projected)
        site = self._dense("attn_in", role, attn_in, X, pre, *pending, *yarn, shared=len(yarn), unit=unit,
                           variant=(("compressor",) if compressor else ()) + (("deferred",) if pending else ()))
        if pending:  # (the streams with the block before's FFN output in them come first)
            (X, *site), pending = site, ()
        a_pre, a_post, a_comb, xa, q_res, q_all, kv_all, *extra = site
        queries, projected = extra[:2 if yarn else 0], extra[2 if yarn else 0:]
        if graphed_sources:
            # the compressor and indexer eagerly (their shapes follow the caches), then the
            # attention and the FFN in one graph where the attention is one fixed launch
            update_sources(self.ops, self.config, role, xa, q_res, runs, self.rope, tuple(queries) or None,
                           tuple(projected) or None)
            prepared = self._graphable_attention(role, runs, X.shape[0], unit, sources_updated=True)
            if prepared is not None:  # (its FFN output goes into the streams: defer is not followed)
                key = ("attn_ffn", role.index, prepared.plan, prepared.pool.serial)
                out = self.graphs.run(key, lambda *t: self._attention_and_ffn(role, prepared, *t),
                                      (q_all, kv_all, X, a_pre, a_post, a_comb) + prepared.tensors,
                                      shared=len(prepared.tensors), unit=unit)
                note_ring_writes(runs, role.index)
                return out
            o = attend_updated(self.ops, self.config, role, q_all, kv_all, runs, self.rope)
        else:
            o = attend(self.ops, self.config, role, xa, q_res, q_all, kv_all, runs, self.rope, self.qat, block_mode,
                       tuple(queries) or None)
        return self._dense("attn_out_ffn", role, functools.partial(self._attn_out_ffn, defer=defer), o, X, a_pre,
                           a_post, a_comb, unit=unit, variant=("deferring",) if defer else ())

    def _expanded(self, X: torch.Tensor, pending: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The streams X with a block's pending FFN output in them (_block), if any."""
        return self.ops.hc_expand(pending[0], X, *pending[1:]) if pending else X

    def _graphable_block_attention(self, role: LayerRole, runs: list[SeqRun], rows: int) -> Prepared | None:
        """A DSpark stage's block attention of runs of one length: one fixed launch sequence
        (attention_kernel.prepare_block), so the stage's whole block runs in one graph."""
        if self.graphs is None or not self.qat or not self._in_place(runs):
            return None
        return prepare_block(self.config, role, runs, self.rope, rows, self.config.num_heads // self.ops.parallel.world)

    def _in_place(self, runs: list[SeqRun]) -> bool:
        """Every run's cache is read where it lies (the kernel paths, ReferenceOps.reads_cache_in_place)."""
        return all(self.ops.reads_cache_in_place(run.cache) for run in runs)

    def _sources_in_place(self, role: LayerRole, runs: list[SeqRun]) -> bool:
        """A KV or index source layer on the kernel path (attention_kernel.update_sources)."""
        return (role.is_kv_source or role.is_index_source) and self.qat and self._in_place(runs)

    def _index_rope(self, role: LayerRole, runs: list[SeqRun], block_mode: bool) -> tuple[torch.Tensor, ...]:
        """The indexer's RoPE tables where its queries are computed with the attention site's
        dense part (an index source on the kernel path, which reads them at decode inside the
        site's graph), else ()."""
        if (not role.is_index_source or block_mode or not self.qat or not self.ops.fast
                or not self._in_place(runs)):
            return ()
        return self.rope.for_runs("yarn", runs)

    def _graphable_attention(self, role: LayerRole, runs: list[SeqRun], rows: int, unit: int,
                             sources_updated: bool = False) -> Prepared | None:
        """A layer whose attention is one fixed launch (attention_kernel.prepare) can run it in a
        graph: with its whole block where it has neither compressor nor indexer, with its FFN
        once they ran (sources_updated). Entry lists of index_topk (or none) only: shorter ones
        grow with the context, and each new width would capture another graph per layer."""
        if (self.graphs is None or not self.qat
                or (not sources_updated and (role.is_kv_source or role.is_index_source))
                or not self._in_place(runs)):
            return None
        heads = self.config.num_heads // self.ops.parallel.world
        prepared = prepare(self.config, role, runs, self.rope, rows, heads, self.graphs.padded_rows(rows, unit))
        if prepared is None or prepared.tensors[-1].shape[1] not in (1, self.config.index_topk):
            return None
        return prepared

    def _whole_block(self, role: LayerRole, prepared: Prepared, X: torch.Tensor, pre: torch.Tensor,
                     *tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a_pre, a_post, a_comb, xa, q_res, q_all, kv_all = self._attn_in(role, X, pre)
        return self._attention_and_ffn(role, prepared, q_all, kv_all, X, a_pre, a_post, a_comb, *tensors)

    def _attention_and_ffn(self, role: LayerRole, prepared: Prepared, q_all: torch.Tensor, kv_all: torch.Tensor,
                           X: torch.Tensor, a_pre: torch.Tensor, a_post: torch.Tensor, a_comb: torch.Tensor,
                           *tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = attend_prepared(self.ops, self.config, role, prepared, q_all, kv_all, *tensors)
        return self._attn_out_ffn(role, o, X, a_pre, a_post, a_comb)

    def _attn_in(self, role: LayerRole, X: torch.Tensor, pre: torch.Tensor, *rest: torch.Tensor,
                 compressor: bool = False, pending: int = 0, keep_input: bool = True) -> tuple[torch.Tensor, ...]:
        """The attention site's gates and its input, projected (dense: one graph per T); with
        the indexer's RoPE tables also its queries and head weights; with `compressor` then
        the compressor's projections (compressor_projections). `rest`: the block before's FFN
        output, post and comb where `pending` (3), taken into the streams first, which then
        come first in the result (_block); then the RoPE tables if any. keep_input False: only
        the projections read the input (ops.hc_mix_collapse's)."""
        c, w, p = self.config, self.ops.w, role.prefix
        site = (w(f"{p}.hc_attn_fn"), w(f"{p}.hc_attn_base"), w(f"{p}.hc_attn_scale"), c.hc_sinkhorn_iters, c.hc_eps,
                c.rms_norm_eps, pre, w(f"{p}.attn_norm.weight"))
        expand, yarn = rest[:pending], rest[pending:]
        streams = ()
        if expand:
            X, (a_pre, a_post, a_comb), xa = self.ops.hc_expand_mix_collapse(
                expand[0], X, *expand[1:], *site, encode_for=input_weights(p), keep_input=keep_input)
            streams = (X,)
        else:
            (a_pre, a_post, a_comb), xa = self.ops.hc_mix_collapse(X, *site, encode_for=input_weights(p),
                                                                   keep_input=keep_input)
        def sources(q_res: torch.Tensor) -> tuple[torch.Tensor, ...]:
            queries = index_queries(self.ops, c, role, xa, q_res, *yarn, self.qat) if yarn else ()
            return tuple(queries) + (compressor_projections(self.ops, role, xa) if compressor else ())
        q_res, q_all, kv_all, extra = project(self.ops, c, role, xa, sources if yarn or compressor else None)
        return streams + (a_pre, a_post, a_comb, xa, q_res, q_all, kv_all) + extra

    def _attn_out_ffn(self, role: LayerRole, o: torch.Tensor | Operand, X: torch.Tensor, a_pre: torch.Tensor,
                      a_post: torch.Tensor, a_comb: torch.Tensor, defer: bool = False) -> tuple[torch.Tensor, ...]:
        """Attention output into the streams, then the whole FFN site (dense: one graph per T):
        (streams, the FFN site's pre), with `defer` (streams without the FFN output, pre, the
        output, post, comb) for the next block's attention site (_block)."""
        c, w, p = self.config, self.ops.w, role.prefix
        one_rank = self.ops.parallel.world == 1  # (else each rank's shared expert takes its own rows)
        X, (f_pre, f_post, f_comb), xf = self.ops.hc_expand_mix_collapse(
            grouped_output(self.ops, c, role, o), X, a_post, a_comb, w(f"{p}.hc_ffn_fn"), w(f"{p}.hc_ffn_base"),
            w(f"{p}.hc_ffn_scale"), c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, a_pre, w(f"{p}.ffn_norm.weight"),
            encode_for=shared_input_weights(p) if one_rank else ())
        y = moe(self.ops, c, role, xf)
        return (X, f_pre, y, f_post, f_comb) if defer else (self.ops.hc_expand(y, X, f_post, f_comb), f_pre)

    def _dense(self, part: str, role: LayerRole, fn, *inputs: torch.Tensor, shared: int = 0,
               unit: int = 0, variant: tuple = ()) -> tuple[torch.Tensor, ...]:
        """fn(role, *inputs), from a graph per (part, layer, variant) and rows where graphs are on
        (never for wo_a's operand in place of the attention's output: prefill rows only)."""
        if self.graphs is None or isinstance(inputs[0], Operand):
            return fn(role, *inputs)
        return self.graphs.run((part, role.index) + variant, lambda *t: fn(role, *t), inputs, shared=shared,
                               unit=unit)

    def head(self, X: torch.Tensor, pre: torch.Tensor, norm: str = "norm.weight") -> torch.Tensor:
        h = self.ops.hc_collapse_norm(X, pre, self.ops.w(norm), self.config.rms_norm_eps)
        return self.ops.linear(h, "head.weight")

    def _layers(self, X, pre, runs, layers, hashes, want_taps):
        roles = self.config.roles
        taps = [None] * len(self.config.dspark_target_layers) if want_taps else None
        layers = list(layers)
        pending: tuple[torch.Tensor, ...] = ()  # a block's FFN output not yet in X (_block)
        for i, layer in enumerate(layers):
            role = roles[layer]
            if pending and not self._takes_pending(role, want_taps):
                X, pending = self._expanded(X, pending), ()
            if role.engram_slot is not None:
                X = self._engram(role, X, hashes, runs)
            if want_taps and role.tap_slot is not None:
                taps[role.tap_slot] = X.mean(dim=1).float()  # (bf16 streams: the mean rounded once, as stored)
            defer = (i + 1 < len(layers) and self._takes_pending(roles[layers[i + 1]], want_taps)
                     and self.ops.defers_expand(X))
            streams, X, pending = [X, *pending], None, ()  # (handed over: _block)
            X, pre, *pending = self._block(role, streams, pre, runs, defer=defer)
            pending = tuple(pending)  # (the list goes: nothing else holds the output through the next block)
        X = self._expanded(X, pending)
        return X, pre, (torch.cat(taps, dim=-1) if want_taps and taps and all(t is not None for t in taps) else None)

    @staticmethod
    def _takes_pending(role: LayerRole, want_taps: bool) -> bool:
        """Whether a block's attention site may take the block before's FFN output into its
        streams: nothing reads them before it (an Engram site, a DSpark tap)."""
        return role.engram_slot is None and not (want_taps and role.tap_slot is not None)

    def _engram(self, role: LayerRole, X: torch.Tensor, hashes: RunHashes | None, runs: list[SeqRun]
                ) -> torch.Tensor:
        """The Engram site in one CUDA graph: eagerly ~20 launches, 1.2 ms of the host a call at
        batch 1, and the GPU waited (H200, 2026-12-02). A table on the GPU is hashed and read in
        the graph; one on the host (the release's, ~92 GiB a layer) is read eagerly there."""
        if self.graphs is None or not graph_module.HOST_BOUND_PARTS:
            return engram(self.ops, self.config, role, X, hashes.ids[:, role.engram_slot])
        if HASH_ON_DEVICE and self.ops.weights[f"{role.prefix}.engram.embed"].weight.device == X.device:
            def hashed(X, *inputs):
                return (engram(self.ops, self.config, role, X, self.hasher.on_device(*inputs, role.engram_slot)),)

            return self.graphs.run(("engram", role.index, "hashed"), hashed, (X,) + hashes.device_inputs(X.device),
                                   shared=3, unit=_rows_per_request(runs))[0]
        rows = engram_rows(self.ops, role, hashes.ids[:, role.engram_slot], X.device)
        return self.graphs.run(("engram", role.index), lambda *t: (engram_mix(self.ops, self.config, role, *t),),
                               (X, rows), unit=_rows_per_request(runs))[0]

    def _hash(self, runs: list[SeqRun], tokens: torch.Tensor) -> RunHashes | None:
        """The runs' Engram hash ids, made when an Engram site asks for them: a decode step's
        drafts may still be on their way to the host (SeqRun.host), and the layers before that
        site are on the GPU's queue meanwhile."""
        return None if self.hasher is None else RunHashes(self.hasher, runs, tokens)

    def _outputs(self, X, pre, runs, which: str, tap_rows) -> ForwardResult:
        logits: list[torch.Tensor | None] = []
        if which == "none":
            logits = [None] * len(runs)
        else:
            pick = [run.offset + run.n - 1 for run in runs] if which == "last" else None
            rows = to_device(torch.tensor(pick), X.device) if pick is not None else slice(None)
            flat = self.head(X[rows], pre[rows])
            for i, run in enumerate(runs):
                logits.append(flat[i:i + 1] if which == "last" else flat[run.rows])
        taps = [tap_rows[run.rows] if tap_rows is not None else None for run in runs]
        return ForwardResult(logits, taps)
