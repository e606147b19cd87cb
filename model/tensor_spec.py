"""Every tensor of a DeepSeek-V4.1 checkpoint, by official name, with its stored format and shape.

One table serves the loader (missing / unexpected / mis-shaped tensors), the checkpoint
writer and the tier-aware partial loads (prefill needs no DSpark stages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import ModelConfig

# Stored formats. A "quantized" entry stands for two files entries: NAME.weight and NAME.scale.
FP8 = "fp8"  # F8_E4M3 [out, in] + F8_E8M0 [ceil(out/bo), ceil(in/bi)]
FP4 = "fp4"  # I8 [out, in/2] + F8_E8M0 [out, in/32]
ROWS_FP8 = "rows_fp8"  # F8_E4M3 [rows, d] + F8_E8M0 [rows, d/32] (Engram tables)
BF16 = "bf16"
F32 = "f32"

# Bytes an element of each safetensors dtype takes.
DTYPE_BYTES = {"F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BF16": 2, "F16": 2, "F32": 4, "I64": 8}

# Checkpoint keys that text-only serving skips on purpose (vision tower, aligner, image markers).
IGNORED_PREFIXES = ("vision.", "aligner.", "image_")


@dataclass(frozen=True)
class TensorSpec:
    name: str  # for FP8/FP4/ROWS_FP8 the module name (without .weight/.scale), else the full key
    fmt: str
    shape: tuple[int, int] | tuple[int]  # logical shape (unpacked)
    group: str  # "global" | "layer" | "dspark" | "expert" (lets tiers load subsets)

    def stored(self, block: tuple[int, int]) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Checkpoint keys -> (safetensors dtype, shape) for this logical tensor."""
        if self.fmt == FP8:
            out, inp = self.shape
            return {f"{self.name}.weight": ("F8_E4M3", (out, inp)),
                    f"{self.name}.scale": ("F8_E8M0", (-(-out // block[0]), -(-inp // block[1])))}
        if self.fmt == FP4:
            out, inp = self.shape
            return {f"{self.name}.weight": ("I8", (out, inp // 2)), f"{self.name}.scale": ("F8_E8M0", (out, inp // 32))}
        if self.fmt == ROWS_FP8:
            rows, dim = self.shape
            return {f"{self.name}.weight": ("F8_E4M3", (rows, dim)), f"{self.name}.scale": ("F8_E8M0", (rows, dim // 32))}
        return {self.name: ("BF16" if self.fmt == BF16 else "F32", tuple(self.shape))}

    def nbytes(self, block: tuple[int, int]) -> int:
        """Bytes of its stored entries, as this table gives their dtypes and shapes."""
        return sum(DTYPE_BYTES[dtype] * math.prod(shape) for dtype, shape in self.stored(block).values())


def model_tensors(c: ModelConfig) -> list[TensorSpec]:
    """The full list, in a stable order: globals, backbone layers, DSpark stages."""
    specs = [
        TensorSpec("embed.weight", BF16, (c.vocab_size, c.hidden_size), "global"),
        TensorSpec("head.weight", BF16, (c.vocab_size, c.hidden_size), "global"),
        TensorSpec("norm.weight", BF16, (c.hidden_size,), "global"),
    ]
    for role in c.roles:
        specs += _block_tensors(c, role)
    if c.num_dspark_stages:
        first, last = c.roles[c.num_layers].prefix, c.roles[-1].prefix
        specs += [
            TensorSpec(f"{first}.main_proj", FP8, (c.hidden_size, c.hidden_size * len(c.dspark_target_layers)), "dspark"),
            TensorSpec(f"{first}.main_norm.weight", BF16, (c.hidden_size,), "dspark"),
            TensorSpec(f"{last}.norm.weight", BF16, (c.hidden_size,), "dspark"),
            TensorSpec(f"{last}.markov_head.embed.weight", BF16, (c.vocab_size, c.dspark_markov_rank), "dspark"),
            TensorSpec(f"{last}.markov_head.head.weight", BF16, (c.vocab_size, c.dspark_markov_rank), "dspark"),
            TensorSpec(f"{last}.confidence_head.proj.weight", BF16, (1, c.hidden_size + c.dspark_markov_rank), "dspark"),
        ]
    return specs


def _block_tensors(c: ModelConfig, role) -> list[TensorSpec]:
    p, h, hd = role.prefix, c.hidden_size, c.head_dim
    group = "dspark" if role.is_dspark else "layer"
    mix, hc_dim = c.hc_mix_dim, c.hc_mult * h
    s = [
        TensorSpec(f"{p}.hc_attn_fn", F32, (mix, hc_dim), group),
        TensorSpec(f"{p}.hc_attn_base", F32, (mix,), group),
        TensorSpec(f"{p}.hc_attn_scale", F32, (3,), group),
        TensorSpec(f"{p}.hc_ffn_fn", F32, (mix, hc_dim), group),
        TensorSpec(f"{p}.hc_ffn_base", F32, (mix,), group),
        TensorSpec(f"{p}.hc_ffn_scale", F32, (3,), group),
        TensorSpec(f"{p}.attn_norm.weight", BF16, (h,), group),
        TensorSpec(f"{p}.ffn_norm.weight", BF16, (h,), group),
        TensorSpec(f"{p}.attn.wq_a", FP8, (c.q_lora_rank, h), group),
        TensorSpec(f"{p}.attn.q_norm.weight", BF16, (c.q_lora_rank,), group),
        TensorSpec(f"{p}.attn.wq_b", FP8, (c.num_heads * hd, c.q_lora_rank), group),
        TensorSpec(f"{p}.attn.wkv", FP8, (hd, h), group),
        TensorSpec(f"{p}.attn.kv_norm.weight", BF16, (hd,), group),
        TensorSpec(f"{p}.attn.wo_a", FP8, (c.o_groups * c.o_lora_rank, c.num_heads * hd // c.o_groups), group),
        TensorSpec(f"{p}.attn.wo_b", FP8, (h, c.o_groups * c.o_lora_rank), group),
        TensorSpec(f"{p}.attn.attn_sink", F32, (c.num_heads,), group),
    ]
    if role.is_kv_source:
        s += [TensorSpec(f"{p}.attn.compressor.wkv.weight", BF16, (hd, h), group)]
        if role.ratio > 1:
            s += [TensorSpec(f"{p}.attn.compressor.wgate.weight", BF16, (hd, h), group)]
        s += [
            TensorSpec(f"{p}.attn.compressor.norm.weight", BF16, (hd,), group),
            TensorSpec(f"{p}.attn.indexer.wk.weight", BF16, (c.index_head_dim, hd), group),
            TensorSpec(f"{p}.attn.indexer.k_norm.weight", BF16, (c.index_head_dim,), group),
        ]
    if role.is_index_source:
        s += [
            TensorSpec(f"{p}.attn.indexer.wq_b", FP8, (c.index_n_heads * c.index_head_dim, c.q_lora_rank), group),
            TensorSpec(f"{p}.attn.indexer.weights_proj.weight", BF16, (c.index_n_heads, h), group),
        ]
    n_exp, inter = role.n_routed_experts, c.moe_intermediate_size
    s += [
        TensorSpec(f"{p}.ffn.gate.weight", BF16, (n_exp, h), group),
        TensorSpec(f"{p}.ffn.gate.bias", F32, (n_exp,), group),
        TensorSpec(f"{p}.ffn.gate.bias_vl", F32, (n_exp,), group),
        TensorSpec(f"{p}.ffn.shared_experts.w1", FP8, (inter, h), group),
        TensorSpec(f"{p}.ffn.shared_experts.w2", FP8, (h, inter), group),
        TensorSpec(f"{p}.ffn.shared_experts.w3", FP8, (inter, h), group),
    ]
    expert_group = "dspark" if role.is_dspark else "expert"
    for e in range(n_exp):
        s += [
            TensorSpec(f"{p}.ffn.experts.{e}.w1", FP4, (inter, h), expert_group),
            TensorSpec(f"{p}.ffn.experts.{e}.w2", FP4, (h, inter), expert_group),
            TensorSpec(f"{p}.ffn.experts.{e}.w3", FP4, (inter, h), expert_group),
        ]
    if role.engram_slot is not None:
        rows = c.engram_num_embeddings[role.engram_slot]
        s += [
            TensorSpec(f"{p}.engram.embed", ROWS_FP8, (rows, c.engram_head_dim), group),
            TensorSpec(f"{p}.engram.wkv", FP8, (h * (c.hc_mult + 1), c.engram_hash_cols * c.engram_head_dim), group),
            TensorSpec(f"{p}.engram.q_weight", BF16, (c.hc_mult, h), group),
            TensorSpec(f"{p}.engram.k_weight", BF16, (c.hc_mult, h), group),
        ]
    return s


def stored_keys(c: ModelConfig, specs: list[TensorSpec] | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for spec in specs if specs is not None else model_tensors(c):
        out.update(spec.stored(c.quant.weight_block))
    return out
