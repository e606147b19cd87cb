"""The physical limits bench/h200.py prints beside its decode figures: the bytes a step must
read (weights aside, its KV) and its matrix FLOPs, on the bench preset's config."""

from __future__ import annotations

import pytest

from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig
from tests.support.bench_scripts import bench_script

MILLION = 1 << 20


@pytest.fixture(scope="module")
def h200():
    return bench_script("h200.py")


@pytest.fixture(scope="module")
def config():
    return ModelConfig.from_dict(preset_config("bench"))


def test_each_requests_kv_is_counted_once_whatever_the_batch(h200, config):
    """A request's rows share its window and its index keys: 32 requests read 32 times one
    request's KV (the count before the thirty-ninth session grew with the batch's rows over 16
    times the batch: 229.6 GB a step at 1M and batch 32, where 66 is right)."""
    one = h200.kv_bytes(config, 1, MILLION)
    assert h200.kv_bytes(config, 32, MILLION) == 32 * one
    index_keys = sum(MILLION // role.ratio * 68 for role in config.roles[:config.num_layers] if role.is_index_source)
    assert index_keys == (3 * MILLION // 2 + 5 * MILLION) * 68  # three index sources at ratio 2, five at 1
    assert index_keys < one < index_keys + 40 * 6 * 512 * 288 + 40 * 128 * 528


def test_a_steps_flops_grow_with_its_rows_and_its_context(h200, config):
    """The FLOP floor: the products and LM head of every verify row, plus the indexer and the
    attention, which at 1M and batch 32 take longer at the bf16 rate than the step's bytes."""
    assert h200.step_flops(config, 32, MILLION) == pytest.approx(32 * h200.step_flops(config, 1, MILLION))
    assert h200.step_flops(config, 1, MILLION) > h200.step_flops(config, 1, 4096)
    products = 6 * (h200.layer_token_flops(config) * 40 + 2 * config.vocab_size * config.hidden_size)
    assert h200.step_flops(config, 1, 0) == pytest.approx(products + 40 * 4 * 6 * 64 * 512 * 128)
    assert h200.step_flops(config, 32, MILLION) / h200.BF16_FLOPS > h200.kv_bytes(config, 32, MILLION) / h200.HBM_BPS


def test_a_faithful_prefill_is_held_to_the_fp8_rate_of_its_products(h200, config, monkeypatch):
    """The prefill floor: exact mode's products at the bf16 rate; faithful mode's on the FP8
    tensor cores at the FP8 rate (its indexer's too where TALL_FP8 is on), the attention at
    bf16. At 1M: 24.04 PFLOP, 34.6 s all at bf16, 24.3 s with FP8 products."""
    from dsflash.model.kernels import indexer_score, prefill_gemms

    parts = h200.prefill_flop_parts(config, MILLION)
    assert sum(parts.values()) == pytest.approx(24.04e15, rel=1e-3)
    everything_bf16 = sum(parts.values()) / h200.BF16_FLOPS
    assert h200.prefill_limit_s(config, MILLION, act_quant=False) == pytest.approx(everything_bf16)
    monkeypatch.setattr(prefill_gemms, "FP8_TENSOR_CORES", True)
    monkeypatch.setattr(indexer_score, "TALL_FP8", False)
    faithful = h200.prefill_limit_s(config, MILLION, act_quant=True)
    assert faithful == pytest.approx(everything_bf16 - parts["products"] * (1 / h200.BF16_FLOPS - 1 / h200.FP8_FLOPS))
    assert 24 < faithful < 25
    monkeypatch.setattr(indexer_score, "TALL_FP8", True)
    assert h200.prefill_limit_s(config, MILLION, act_quant=True) < faithful


def test_a_steps_weights_count_the_heads_as_the_step_reads_them(h200):
    """The tiny preset's store: the embedding's rows only (not its table), the LM head twice
    (the verify rows', the drafts'), the Markov head once a draft, every other dense weight
    once; at batch 1 and no context, the KV is the window's."""
    from dsflash.model.checkpoint_writer import preset_config, random_weight_store
    from dsflash.model.weights import Fp4Weight, weight_nbytes

    store = random_weight_store(preset_config("tiny"))
    config = store.config

    def size(name):
        return weight_nbytes(store[name])
    once = sum(size(n) for n in store.names()
               if not isinstance(store[n], Fp4Weight) and ".engram.embed" not in n and n != "embed.weight")
    markov = sum(size(n) for n in store.names() if n.endswith(".markov_head.head.weight"))
    want = once + size("head.weight") + (config.dspark_block_size - 1) * markov
    got = h200.step_bytes(h200.step_weights(store, config), config, 1, 0) - h200.kv_bytes(config, 1, 0)
    experts = got - want
    assert 0 < experts < sum(size(n) for n in store.names() if isinstance(store[n], Fp4Weight))


def test_holding_the_experts_once_keeps_the_steps_weights_as_loaded(h200):
    """The bench holds the routed experts stacked once, as a worker does, so the bench
    preset's decode fits an 80 GB H100: the per-expert tensors leave the store, and the
    step's weights are the ones read before they left."""
    from dsflash.model.checkpoint_writer import preset_config, random_weight_store, tokenizer_dir
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.weights import Fp4Weight

    store = random_weight_store(preset_config("tiny"))
    model = DeepseekV41(store, tokenizer_json=tokenizer_dir() / "tokenizer.json")
    model.use_kernels()
    loaded = h200.step_weights(store, model.config)
    assert sum(loaded.experts.values()) > 0
    assert h200.hold_experts_once(model) == loaded
    assert not any(isinstance(store[name], Fp4Weight) for name in store.names())
    assert h200.step_weights(store, model.config).experts == {}


def test_a_prefill_run_starts_where_its_estimate_fits_the_budget(h200, monkeypatch):
    """bench/h200.py's prefill runs under --budget-s: the first needs 90 s left; a later one
    1.3x the last run's seconds scaled up to its length, plus 10 (four 32K runs of ~15 s fit
    a 140 s budget after a 45 s first; a 1M run after a 32K one does not fit 100 s)."""
    monkeypatch.setattr(h200, "PREFILL_RUNS", [])
    assert not h200.prefill_fits(32768, 89) and h200.prefill_fits(32768, 90)
    h200.PREFILL_RUNS.append((32768, 45.0))
    assert h200.prefill_fits(32768, 95) and not h200.prefill_fits(32768, 60)
    h200.PREFILL_RUNS.append((32768, 15.0))
    assert h200.prefill_fits(32768, 30) and not h200.prefill_fits(32768, 28)
    assert h200.prefill_fits(16384, 30)  # a shorter run is held to the last one's seconds
    assert not h200.prefill_fits(1 << 20, 100)


def test_the_gpus_idle_time_counts_overlapping_streams_once(h200):
    """gpu_idle: busy is the union of the GPU's work (a side stream's kernel under the main
    one's counts once), a gap is idle time over MIN_GAP_US, named by the work that ends it."""
    def event(name, ts, dur, cat="kernel"):
        return {"name": name, "cat": cat, "ts": ts, "dur": dur}

    trace = {"traceEvents": [
        event("scores", 0, 100), event("top_k", 50, 80),  # overlapping: busy 0-130
        event("aten::item", 60, 5, cat="cpu_op"),  # host work is not the GPU's
        event("gemm", 130.5, 20),  # a gap under MIN_GAP_US: the switch between kernels
        event("gemm", 200, 50),  # 49.5 us idle before it
        event("Memcpy HtoD", 260, 10, cat="gpu_memcpy"),  # 10 us idle before it
    ]}
    idle = h200.gpu_idle(trace, wall_s=300e-6)
    assert idle["gpu_busy_ms"] == round((130 + 20 + 50 + 10) / 1e3, 2)
    assert idle["first_to_last_gpu_ms"] == 0.27 and idle["gaps"] == 2
    assert idle["idle_before_ms"] == {"gemm": [0.05, 1], "Memcpy HtoD": [0.01, 1]}
    assert idle["wall_ms"] == 0.3 and idle["gpu_work_ms"] == 0.26  # 50 us of top_k under scores
