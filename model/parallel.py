"""Tensor parallel attention and expert parallel MoE across the ranks of one worker.

The split (world W must divide num_heads, o_groups and every layer's routed experts):
- attention: rank r keeps heads [r*h/W, (r+1)*h/W): its rows of wq_b, its sinks, its o_groups/W
  groups of wo_a and the matching columns of wo_b. Each rank's wo_b product is a partial sum
  of the output: one all-reduce per attention sublayer.
- MoE: rank r keeps routed experts [r*E/W, (r+1)*E/W) and computes the pairs routed to them;
  the (small) shared expert stays whole on every rank and each rank computes every W-th row.
  The partial outputs meet in one all-reduce per MoE sublayer.
- everything else (embeddings, head, norms, mHC, compressor, indexer, Engram, router) is
  replicated; every rank computes it identically, so every rank holds the same KV cache.
The all-reduce changes only the order of the fp32 sums; tests/model/test_parallel.py checks
that W ranks reproduce one rank's logits and greedy tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ModelConfig
from .tensor_spec import ROWS_FP8, TensorSpec, model_tensors
from .weights import ENGRAM_ON_DEVICE_BYTES, Fp8Weight, WeightStore, select_for_tier

_EXPERT = re.compile(r"^(?P<prefix>.+)\.ffn\.experts\.(?P<expert>\d+)$")
# A layer's attention tensors that shard_attention cuts into W equal parts (heads or groups).
_HEAD_SPLIT = re.compile(r"\.attn\.(wq_b|attn_sink|wo_a|wo_b)$")


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    world: int = 1
    group: object | None = None  # a torch.distributed process group; None: the default one

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial result (in place)."""
        if self.world > 1:
            dist.all_reduce(partial, group=self.group)
        return partial

    def split(self, n: int) -> range:
        """This rank's share of n heads, groups or experts (contiguous)."""
        if n % self.world:
            raise ValueError(f"{n} does not split over {self.world} ranks")
        share = n // self.world
        return range(self.rank * share, (self.rank + 1) * share)

    def rows(self, n: int) -> slice:
        """This rank's rows of a replicated computation: every world-th row."""
        return slice(self.rank, n, self.world)


SINGLE = Parallel()


def check_divisible(config: ModelConfig, world: int) -> None:
    """Refuse a world size the checkpoint cannot be split over, before anything loads."""
    counts = {"attention heads": config.num_heads, "o_groups": config.o_groups}
    counts.update({f"{r.prefix} routed experts": r.n_routed_experts for r in config.roles if r.n_routed_experts})
    bad = [f"{name} ({n})" for name, n in counts.items() if n % world]
    if bad:
        raise ValueError(f"--gpus: {world} ranks do not divide " + ", ".join(bad))


def keeps_spec(config: ModelConfig, parallel: Parallel):
    """A checkpoint selection that leaves out the routed experts other ranks own."""
    experts = {r.prefix: r.n_routed_experts for r in config.roles}

    def keep(spec: TensorSpec) -> bool:
        m = _EXPERT.match(spec.name.rsplit(".", 1)[0])
        if m is None or parallel.world == 1:
            return True
        return int(m["expert"]) in parallel.split(experts[m["prefix"]])

    return keep


def rank_tensors(config: ModelConfig, parallel: Parallel, tier: str):
    """What a rank of a `tier` worker loads: the tier's tensors less other ranks' experts."""
    of_rank, of_tier = keeps_spec(config, parallel), select_for_tier(tier)
    return lambda spec: of_rank(spec) and (of_tier is None or of_tier(spec))


@dataclass(frozen=True)
class RankBytes:
    device: int  # a rank's weights on its GPU: its heads' and experts' share, a copy of the rest
    host: int  # the Engram tables, mapped from the checkpoint: one page-cache copy for all ranks


def rank_bytes(config: ModelConfig, world: int, tier: str = "all", size=None) -> RankBytes:
    """The weights each of `world` ranks holds once loaded (the fast path's device copies of
    small Engram tables included), from the checkpoint's bytes: `size(spec)` (default: the
    tensor table's dtypes and shapes). Layouts rearranged on the device keep their bytes;
    activations, graphs and the KV pool come on top."""
    size = size or (lambda spec: spec.nbytes(config.quant.weight_block))
    keep = rank_tensors(config, Parallel(0, world), tier)
    device = host = 0
    for spec in filter(keep, model_tensors(config)):
        if spec.fmt == ROWS_FP8:
            host += size(spec)
        else:
            device += size(spec) // world if _HEAD_SPLIT.search(spec.name) else size(spec)
    if host <= ENGRAM_ON_DEVICE_BYTES:
        return RankBytes(device + host, 0)
    return RankBytes(device, host)


def check_fits(config: ModelConfig, world: int, tier: str, device: torch.device, size=None) -> None:
    """Refuse, before loading anything, a GPU whose free memory cannot hold this rank's
    weights, naming the rank counts that would fit (a load that runs out of memory part way
    has cost minutes of reading first)."""
    if device.type != "cuda":
        return
    need = rank_bytes(config, world, tier, size).device
    free, total = torch.cuda.mem_get_info(device)
    if need <= free:
        return
    more = ((w, rank_bytes(config, w, tier, size).device) for w in range(world + 1, 65) if _divides(config, w))
    fits = next(((w, held) for w, held in more if held < total), None)
    hint = f"; over {fits[0]} GPUs a rank would hold {fits[1] / 2**30:.1f} GiB" if fits else ""
    raise ValueError(f"--gpus: each of {world} rank(s) holds {need / 2**30:.1f} GiB of {tier} weights, but {device} has "
                     f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f}{hint}")


def _divides(config: ModelConfig, world: int) -> bool:
    try:
        check_divisible(config, world)
    except ValueError:
        return False
    return True


def shard_attention(store: WeightStore, parallel: Parallel) -> WeightStore:
    """Slice each layer's head-owned attention tensors down to this rank's heads and groups."""
    if parallel.world == 1:
        return store
    c = store.config
    tensors = {name: store[name] for name in store.names()}
    heads, groups = parallel.split(c.num_heads), parallel.split(c.o_groups)
    q_rows = slice(heads.start * c.head_dim, heads.stop * c.head_dim)
    o_rows = slice(groups.start * c.o_lora_rank, groups.stop * c.o_lora_rank)
    for role in c.roles:
        p = f"{role.prefix}.attn"
        if f"{p}.wq_b" not in store:
            continue
        tensors[f"{p}.wq_b"] = _fp8_slice(store[f"{p}.wq_b"], rows=q_rows)
        tensors[f"{p}.attn_sink"] = store[f"{p}.attn_sink"][heads.start: heads.stop].clone()
        tensors[f"{p}.wo_a"] = _fp8_slice(store[f"{p}.wo_a"], rows=o_rows)
        tensors[f"{p}.wo_b"] = _fp8_slice(store[f"{p}.wo_b"], cols=o_rows)
    return WeightStore(c, tensors)


def _fp8_slice(w: Fp8Weight, rows: slice = slice(None), cols: slice = slice(None)) -> Fp8Weight:
    """Rows/columns of a block-scaled FP8 weight; cuts must fall on scale-block edges."""
    bo, bi = w.block
    for cut, block in ((rows, bo), (cols, bi)):
        for edge in (cut.start, cut.stop):
            if edge is not None and edge % block:
                raise ValueError(f"a tensor-parallel cut at {edge} splits a {block}-wide FP8 scale block")
    scale_rows = slice(None if rows.start is None else rows.start // bo, None if rows.stop is None else rows.stop // bo)
    scale_cols = slice(None if cols.start is None else cols.start // bi, None if cols.stop is None else cols.stop // bi)
    return Fp8Weight(w.weight[rows, cols].contiguous(), w.scale[scale_rows, scale_cols].contiguous(), w.block)


def init_parallel(rank: int, world: int, init_method: str, device: str | torch.device = "cpu") -> Parallel:
    """Join the worker's process group: NCCL when the ranks compute on GPUs, gloo on CPU."""
    if world == 1:
        return SINGLE
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    return Parallel(rank, world)
