"""DeepSeek-V4.1 configuration: the official nested config.json -> one typed, validated object.

Layer roles are derived here once, so the rest of the code never re-derives them:
- `swa`      ratio 0: sliding window only (layers 0-1 and the DSpark stages);
- `full`     a KV source: owns a compressor and the indexer keys of its group;
- `reindex`  an index source that is not a KV source: rescoring inside the candidate pool;
- `reuse`    reads the KV entries and top-k lists of the latest sources at or before it.
CED: layers before the last KV source are the causal encoder; the last KV source (layer 20
in the release) and everything after it form the decoder.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config.json value that dsflash cannot serve, naming the offending key."""


@dataclass(frozen=True)
class YarnConfig:
    factor: float
    beta_fast: float
    beta_slow: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class QuantConfig:
    weight_block: tuple[int, int] = (32, 32)
    expert_block: int = 32
    expert_dtype: str = "fp4"


@dataclass(frozen=True)
class LayerRole:
    """What one layer (backbone or DSpark stage) does, derived from the config."""

    index: int
    prefix: str  # checkpoint prefix: "layers.L" or "mtp.K"
    kind: str  # swa | full | reindex | reuse
    ratio: int
    kv_source: int | None  # latest KV source <= this layer (None for ratio 0)
    index_source: int | None  # latest index source <= this layer
    is_candidate_source: bool
    uses_candidates: bool  # an index source after the candidate source
    rope: str  # local (rope_theta) | yarn (compress_rope_theta + YaRN)
    is_encoder: bool  # CED: runs over every prompt token
    engram_slot: int | None  # index into engram_layer_ids
    tap_slot: int | None  # index into dspark_target_layer_ids
    is_dspark: bool
    n_routed_experts: int
    num_experts_per_tok: int

    @property
    def is_kv_source(self) -> bool:
        return self.kv_source == self.index and self.ratio > 0

    @property
    def is_index_source(self) -> bool:
        return self.index_source == self.index and self.ratio > 0


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    gate_temp: float
    swiglu_limit: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    yarn: YarnConfig | None
    max_position_embeddings: int
    sliding_window: int
    compress_ratios: tuple[int, ...]
    kv_source_layers: tuple[int, ...]
    index_source_layers: tuple[int, ...]
    candidate_source_layer: int  # -1 disables the two-level top-k
    candidate_topk_blocks: int
    candidate_block_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    engram_layers: tuple[int, ...]
    engram_num_embeddings: tuple[int, ...]
    engram_max_ngram_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_token_id: int
    engram_compressed_vocab_size: int
    num_dspark_stages: int
    dspark_block_size: int
    dspark_noise_token_id: int
    dspark_target_layers: tuple[int, ...]
    dspark_markov_rank: int
    dspark_n_routed_experts: int
    dspark_num_experts_per_tok: int
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    quant: QuantConfig = field(default_factory=QuantConfig)
    roles: tuple[LayerRole, ...] = ()

    # ------------------------------------------------------------ derived sizes

    @property
    def num_all_layers(self) -> int:
        """Backbone layers plus DSpark stages (each owns a window ring)."""
        return self.num_layers + self.num_dspark_stages

    @property
    def ced_split(self) -> int:
        """First decoder layer of the causal encoder-decoder: the last KV source."""
        return self.kv_source_layers[-1] if self.kv_source_layers else self.num_layers

    @property
    def hc_mix_dim(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def engram_hash_cols(self) -> int:
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    def source_ratio(self, source: int) -> int:
        return self.compress_ratios[source]

    @property
    def entries_per_token(self) -> float:
        return sum(1.0 / self.compress_ratios[s] for s in self.kv_source_layers)

    def layer_prefix(self, layer: int) -> str:
        return self.roles[layer].prefix

    # ------------------------------------------------------------ loading

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> "ModelConfig":
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"{path}: no config.json") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        return _parse(raw)


# ------------------------------------------------------------------ parsing

# Keys of text_config that carry no information dsflash needs (documented, not an error).
_IGNORED_TEXT_KEYS = {
    "model_type", "num_key_value_heads", "attention_bias", "attention_dropout", "initializer_range",
    "use_cache", "tie_word_embeddings", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "n_shared_experts", "topk_method", "scoring_func", "hidden_act", "layer_types", "rope_parameters",
    "rope_scaling", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "image_token_id", "first_k_dense_replace", "engram_pad_id",
}
_IGNORED_TOP_KEYS = {
    "architectures", "model_type", "dtype", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id",
    "image_token_id", "tie_word_embeddings", "quantization_config", "text_config", "vision_config",
    "transformers_version", "auto_map",
}


class _Reader:
    """Reads keys from one dict, remembering which were consumed, naming keys in errors."""

    def __init__(self, data: dict, where: str):
        self.data, self.where, self.used = data, where, set()

    def get(self, key: str, default: Any = ..., kind: type | tuple = (int, float, str, bool, list, dict)) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise ConfigError(f"{self.where}.{key} is missing")
            return default
        value = self.data[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{self.where}.{key} must be an integer, got {value!r}")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{self.where}.{key} must be a number, got {value!r}")
        if kind not in (int, float) and not isinstance(value, kind):
            raise ConfigError(f"{self.where}.{key} has the wrong type: {value!r}")
        return value

    def positive(self, key: str, default: Any = ...) -> int:
        value = self.get(key, default, int)
        if value <= 0:
            raise ConfigError(f"{self.where}.{key} must be positive, got {value}")
        return value

    def int_list(self, key: str, default: Any = ...) -> tuple[int, ...]:
        value = self.get(key, default, list)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{self.where}.{key} must be a list of integers, got {value!r}")
        return tuple(value)

    def choice(self, key: str, allowed: tuple, default: Any = ...) -> Any:
        value = self.get(key, default)
        if value not in allowed:
            raise ConfigError(f"{self.where}.{key} = {value!r} is not supported (expected one of {list(allowed)})")
        return value

    def unknown(self, ignored: set[str]) -> list[str]:
        return sorted(k for k in self.data if k not in self.used and k not in ignored)


def _parse(raw: dict[str, Any]) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ConfigError("config.json must hold a JSON object")
    top = _Reader(raw, "config")
    top.choice("model_type", ("deepseek_v41",), "deepseek_v41")
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError("config.text_config is missing (the nested DeepSeek-V4.1 layout is expected)")
    t = _Reader(text, "text_config")
    t.choice("model_type", ("deepseek_v41_text",), "deepseek_v41_text")
    t.choice("hidden_act", ("silu",), "silu")
    t.choice("scoring_func", ("sqrtsoftplus",), "sqrtsoftplus")
    t.choice("topk_method", ("noaux_tc",), "noaux_tc")
    t.choice("n_shared_experts", (1,), 1)
    t.choice("num_key_value_heads", (1,), 1)
    t.choice("attention_bias", (False,), False)

    quant = _parse_quant(raw.get("quantization_config"))
    num_layers = t.positive("num_hidden_layers")
    num_stages = t.get("num_nextn_predict_layers", 0, int)
    hidden = t.positive("hidden_size")
    heads = t.positive("num_attention_heads")
    head_dim = t.positive("head_dim")
    rope_dim = t.positive("qk_rope_head_dim")
    if rope_dim > head_dim or rope_dim % 2:
        raise ConfigError(f"text_config.qk_rope_head_dim = {rope_dim} must be even and <= head_dim ({head_dim})")
    o_groups = t.positive("o_groups")
    if heads % o_groups:
        raise ConfigError(f"text_config.o_groups = {o_groups} must divide num_attention_heads ({heads})")

    ratios = t.int_list("compress_ratios")
    if len(ratios) < num_layers:
        raise ConfigError(f"text_config.compress_ratios has {len(ratios)} entries, needs num_hidden_layers = {num_layers}")
    if len(ratios) > num_layers + num_stages:
        raise ConfigError(
            f"text_config.compress_ratios has {len(ratios)} entries but num_hidden_layers + "
            f"num_nextn_predict_layers = {num_layers + num_stages}"
        )
    if any(r != 0 for r in ratios[num_layers:]):
        raise ConfigError("text_config.compress_ratios: DSpark stage entries (after the backbone) must be 0")
    backbone = tuple(ratios[:num_layers])
    if any(r < 0 for r in backbone):
        raise ConfigError(f"text_config.compress_ratios has a negative ratio: {list(backbone)}")

    kv_sources = t.int_list("kv_source_layer_ids", ())
    index_sources = t.int_list("index_source_layer_ids", kv_sources)
    _check_sources(backbone, kv_sources, index_sources)
    candidate = t.get("candidate_source_layer_id", kv_sources[-1] if kv_sources else -1, int)
    if candidate >= 0 and candidate not in index_sources:
        raise ConfigError(f"text_config.candidate_source_layer_id = {candidate} is not in index_source_layer_ids")

    yarn = _parse_yarn(t.get("rope_scaling", None, dict))
    engram_layers = t.int_list("engram_layer_ids", ())
    engram_rows = t.int_list("engram_num_embeddings", (0,) * len(engram_layers))
    if len(engram_rows) != len(engram_layers):
        raise ConfigError("text_config.engram_num_embeddings must have one entry per engram_layer_ids entry")
    if any(not 0 <= layer < num_layers for layer in engram_layers):
        raise ConfigError(f"text_config.engram_layer_ids out of range: {list(engram_layers)}")
    pad_key = "engram_pad_token_id" if "engram_pad_token_id" in text else "engram_pad_id"

    targets = t.int_list("dspark_target_layer_ids", ())
    if num_stages and len(targets) == 0:
        raise ConfigError("text_config.dspark_target_layer_ids is required when num_nextn_predict_layers > 0")
    if any(not 0 <= layer < num_layers for layer in targets):
        raise ConfigError(f"text_config.dspark_target_layer_ids out of range: {list(targets)}")

    values = dict(
        vocab_size=t.positive("vocab_size"),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        head_dim=head_dim,
        rope_head_dim=rope_dim,
        q_lora_rank=t.positive("q_lora_rank"),
        o_lora_rank=t.positive("o_lora_rank"),
        o_groups=o_groups,
        moe_intermediate_size=t.positive("moe_intermediate_size"),
        n_routed_experts=t.positive("n_routed_experts"),
        num_experts_per_tok=t.positive("num_experts_per_tok"),
        routed_scaling_factor=float(t.get("routed_scaling_factor", 1.0, float)),
        norm_topk_prob=bool(t.get("norm_topk_prob", True, bool)),
        gate_temp=float(t.get("gate_temp", 1.0, float)),
        swiglu_limit=float(t.get("swiglu_limit", 0.0, float)),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-20, float)),
        rope_theta=float(t.get("rope_theta", 10000.0, float)),
        compress_rope_theta=float(t.get("compress_rope_theta", 160000.0, float)),
        yarn=yarn,
        max_position_embeddings=t.positive("max_position_embeddings", 1048576),
        sliding_window=t.positive("sliding_window"),
        compress_ratios=backbone,
        kv_source_layers=kv_sources,
        index_source_layers=index_sources,
        candidate_source_layer=candidate,
        candidate_topk_blocks=t.positive("candidate_topk_blocks", 2048),
        candidate_block_size=t.positive("candidate_block_size", 8),
        index_n_heads=t.positive("index_n_heads"),
        index_head_dim=t.positive("index_head_dim"),
        index_topk=t.positive("index_topk"),
        hc_mult=t.positive("hc_mult", 4),
        hc_sinkhorn_iters=t.positive("hc_sinkhorn_iters", 20),
        hc_eps=float(t.get("hc_eps", 1e-6, float)),
        engram_layers=engram_layers,
        engram_num_embeddings=engram_rows,
        engram_max_ngram_size=t.get("engram_max_ngram_size", 4, int),
        engram_vocab_size=t.get("engram_vocab_size", 0, int),
        engram_n_heads=t.get("engram_n_heads", 0, int),
        engram_head_dim=t.get("engram_head_dim", 0, int),
        engram_pad_token_id=t.get(pad_key, 2, int),
        engram_compressed_vocab_size=t.get("engram_compressed_vocab_size", 0, int),
        num_dspark_stages=num_stages,
        dspark_block_size=t.get("dspark_block_size", 5, int),
        dspark_noise_token_id=t.get("dspark_noise_token_id", 0, int),
        dspark_target_layers=targets,
        dspark_markov_rank=t.get("dspark_markov_rank", 0, int),
        dspark_n_routed_experts=t.get("dspark_n_routed_experts", 0, int),
        dspark_num_experts_per_tok=t.get("dspark_num_experts_per_tok", 0, int),
        bos_token_id=top.get("bos_token_id", 0, int),
        eos_token_id=top.get("eos_token_id", 1, int),
        pad_token_id=top.get("pad_token_id", 2, int),
        quant=quant,
    )
    _check_values(values, num_stages)
    for reader, ignored in ((t, _IGNORED_TEXT_KEYS), (top, _IGNORED_TOP_KEYS)):
        extra = reader.unknown(ignored)
        if extra:
            log.warning("%s: ignoring keys dsflash does not read: %s", reader.where, ", ".join(extra))
    partial = ModelConfig(**values)
    return ModelConfig(**values, roles=_derive_roles(partial))


def _parse_quant(q: Any) -> QuantConfig:
    if q is None:
        raise ConfigError("config.quantization_config is missing (FP8/FP4 checkpoints only)")
    if not isinstance(q, dict):
        raise ConfigError("config.quantization_config must be an object")
    r = _Reader(q, "quantization_config")
    r.choice("quant_method", ("fp8",))
    r.choice("activation_scheme", ("dynamic",), "dynamic")
    r.choice("scale_fmt", ("ue8m0",), "ue8m0")
    r.choice("fmt", ("e4m3",), "e4m3")
    expert_dtype = r.choice("expert_dtype", ("fp4",), "fp4")
    block = r.int_list("weight_block_size", (32, 32))
    if len(block) != 2 or min(block) <= 0:
        raise ConfigError(f"quantization_config.weight_block_size must be two positive integers, got {list(block)}")
    return QuantConfig(weight_block=(block[0], block[1]), expert_block=32, expert_dtype=expert_dtype)


def _parse_yarn(scaling: dict | None) -> YarnConfig | None:
    if not scaling:
        return None
    r = _Reader(scaling, "text_config.rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type"))
    r.used.update({"rope_type", "type", "mscale", "mscale_all_dim", "attention_factor", "truncate"})
    if kind != "yarn":
        raise ConfigError(f"text_config.rope_scaling.rope_type = {kind!r} is not supported (expected 'yarn')")
    for key in ("mscale", "mscale_all_dim"):
        if scaling.get(key) not in (None, 0, 1, 1.0):
            raise ConfigError(f"text_config.rope_scaling.{key} = {scaling[key]!r}: V4.1 applies no YaRN mscale")
    if scaling.get("attention_factor") not in (None, 1, 1.0):
        raise ConfigError("text_config.rope_scaling.attention_factor must be 1.0 (V4.1 applies no YaRN mscale)")
    factor = float(r.get("factor", kind=float))
    if factor < 1:
        raise ConfigError(f"text_config.rope_scaling.factor = {factor} must be >= 1")
    return YarnConfig(
        factor=factor,
        beta_fast=float(r.get("beta_fast", 32, float)),
        beta_slow=float(r.get("beta_slow", 1, float)),
        original_max_position_embeddings=r.positive("original_max_position_embeddings"),
    )


def _check_sources(ratios: tuple[int, ...], kv_sources: tuple[int, ...], index_sources: tuple[int, ...]) -> None:
    n = len(ratios)
    for key, ids in (("kv_source_layer_ids", kv_sources), ("index_source_layer_ids", index_sources)):
        if list(ids) != sorted(set(ids)):
            raise ConfigError(f"text_config.{key} must be strictly increasing, got {list(ids)}")
        bad = [i for i in ids if not 0 <= i < n or ratios[i] == 0]
        if bad:
            raise ConfigError(f"text_config.{key}: layers {bad} are out of range or have compress ratio 0")
    for layer in range(n):
        if ratios[layer] == 0:
            continue
        src = [s for s in kv_sources if s <= layer]
        if not src:
            raise ConfigError(f"text_config.kv_source_layer_ids: layer {layer} has ratio {ratios[layer]} but no KV source at or before it")
        if ratios[src[-1]] != ratios[layer]:
            raise ConfigError(
                f"text_config.compress_ratios: layer {layer} (ratio {ratios[layer]}) reads KV source "
                f"{src[-1]} of ratio {ratios[src[-1]]}"
            )
        if not [s for s in index_sources if s <= layer]:
            raise ConfigError(f"text_config.index_source_layer_ids: layer {layer} has no index source at or before it")


def _check_values(v: dict[str, Any], num_stages: int) -> None:
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"text_config.{key} {msg}")

    need(v["num_experts_per_tok"] <= v["n_routed_experts"], "num_experts_per_tok", "exceeds n_routed_experts")
    need(v["hidden_size"] % 32 == 0, "hidden_size", "must be a multiple of 32 (FP8/FP4 blocks)")
    need(v["moe_intermediate_size"] % 32 == 0, "moe_intermediate_size", "must be a multiple of 32")
    need(v["rms_norm_eps"] >= 0, "rms_norm_eps", "must be >= 0")
    if v["engram_layers"]:
        need(v["engram_max_ngram_size"] >= 2, "engram_max_ngram_size", "must be >= 2")
        need(v["engram_n_heads"] > 0, "engram_n_heads", "must be positive")
        need(v["engram_head_dim"] > 0 and v["engram_head_dim"] % 32 == 0, "engram_head_dim", "must be a positive multiple of 32")
        need(v["engram_vocab_size"] > 1, "engram_vocab_size", "must be > 1")
        need(v["engram_compressed_vocab_size"] > 0, "engram_compressed_vocab_size", "must be positive")
    if num_stages:
        need(v["dspark_block_size"] > 0, "dspark_block_size", "must be positive")
        need(0 <= v["dspark_noise_token_id"] < v["vocab_size"], "dspark_noise_token_id", "must be a valid token id")
        need(v["dspark_markov_rank"] > 0, "dspark_markov_rank", "must be positive")
        need(0 < v["dspark_num_experts_per_tok"] <= v["dspark_n_routed_experts"], "dspark_num_experts_per_tok",
             "must be in 1..dspark_n_routed_experts")
    if v["yarn"] is not None:
        need(v["max_position_embeddings"] >= v["yarn"].original_max_position_embeddings, "max_position_embeddings",
             "must be >= rope_scaling.original_max_position_embeddings")


def _derive_roles(c: ModelConfig) -> tuple[LayerRole, ...]:
    roles = []
    split = c.ced_split
    for layer in range(c.num_layers):
        ratio = c.compress_ratios[layer]
        kv = max((s for s in c.kv_source_layers if s <= layer), default=None) if ratio else None
        idx = max((s for s in c.index_source_layers if s <= layer), default=None) if ratio else None
        if ratio == 0:
            kind = "swa"
        elif kv == layer:
            kind = "full"
        elif idx == layer:
            kind = "reindex"
        else:
            kind = "reuse"
        roles.append(LayerRole(
            index=layer,
            prefix=f"layers.{layer}",
            kind=kind,
            ratio=ratio,
            kv_source=kv,
            index_source=idx,
            is_candidate_source=layer == c.candidate_source_layer and ratio > 0,
            uses_candidates=idx == layer and 0 <= c.candidate_source_layer < layer,
            rope="yarn" if ratio else "local",
            is_encoder=layer < split,
            engram_slot=c.engram_layers.index(layer) if layer in c.engram_layers else None,
            tap_slot=c.dspark_target_layers.index(layer) if layer in c.dspark_target_layers else None,
            is_dspark=False,
            n_routed_experts=c.n_routed_experts,
            num_experts_per_tok=c.num_experts_per_tok,
        ))
    for stage in range(c.num_dspark_stages):
        roles.append(LayerRole(
            index=c.num_layers + stage, prefix=f"mtp.{stage}", kind="swa", ratio=0, kv_source=None,
            index_source=None, is_candidate_source=False, uses_candidates=False, rope="local", is_encoder=False,
            engram_slot=None, tap_slot=None, is_dspark=True, n_routed_experts=c.dspark_n_routed_experts,
            num_experts_per_tok=c.dspark_num_experts_per_tok,
        ))
    return tuple(roles)


def yarn_inv_freq_bounds(rope_dim: int, base: float, yarn: YarnConfig) -> tuple[float, float]:
    """YaRN correction range (low, high) over the rope_dim/2 frequencies, truncated to integers."""

    def correction_dim(rotations: float) -> float:
        return rope_dim * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(correction_dim(yarn.beta_fast))
    high = math.ceil(correction_dim(yarn.beta_slow))
    return max(low, 0), min(high, rope_dim - 1)
