"""The decode worker's graph warm-up (decode_worker/warmup.py)."""

from __future__ import annotations

import pytest
import torch

from dsflash.decode_worker.engine import DecodeEngine, DecodeEngineConfig
from dsflash.decode_worker.warmup import partial_context, warm_up, warm_up_context, warm_up_sizes
from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig

from .conftest import make_pool


def test_one_batch_size_per_bucket_up_to_the_engines_limit():
    assert warm_up_sizes(32, 256, 6) == [1, 2, 4, 8, 16, 24, 32]
    assert warm_up_sizes(10, 256, 6) == [1, 2, 4, 8, 10]  # 9 and 10 requests pad to 16: 10 warms it
    assert warm_up_sizes(64, 256, 6) == [1, 2, 4, 8, 16, 24, 32, 40, 42]  # 256 rows hold 42 requests
    assert warm_up_sizes(3, 256, 1) == [1, 2, 3]


def test_the_partial_context_leaves_the_largest_ratios_lists_partial_and_odd_in_16():
    config = _bench_config()  # k = 512, ratios 1 and 2, as the release
    assert partial_context(config) == 1000 and warm_up_context(config) == 2048
    for k in (100, 140, 1024):
        entries = partial_context(_bench_config(index_topk=k)) // 2
        assert entries < k and entries % 16, (k, entries)


def _bench_config(**text) -> ModelConfig:
    """The bench preset's config, with `text` over its text config."""
    raw = preset_config("bench")
    raw["text_config"].update(text)
    return ModelConfig.from_dict(raw)


def test_warm_up_runs_each_size_and_leaves_the_engine_and_pool_as_it_found_them(golden_model, monkeypatch):
    from dsflash.decode_worker import warmup

    pool = make_pool(golden_model, pages=400, slots=8)
    engine = DecodeEngine(golden_model, pool, DecodeEngineConfig(max_running=4))
    pages, slots = pool.free_page_count, pool.free_slot_count
    context = warm_up_context(golden_model.config)
    assert context >= 2 * golden_model.config.index_topk
    assert warm_up(engine) == []  # no CUDA graphs on this device: nothing to warm
    made = []  # each size at the full lists' context, then at the partial ones'
    request = warmup.synthetic_request
    monkeypatch.setattr(warmup, "synthetic_request", lambda e, i, held, *a: made.append(held) or request(e, i, held, *a))
    assert warm_up(engine, sizes=[1, 3]) == [1, 3]
    partial = partial_context(golden_model.config)
    assert made == [context, partial] + [context] * 3 + [partial] * 3 and partial < context
    assert not engine.has_work() and engine.num_running == 0
    assert (pool.free_page_count, pool.free_slot_count) == (pages, slots)
    tight = make_pool(golden_model, pages=pool.layout.pages_for(context + 64) * 2, slots=8)
    assert warm_up(DecodeEngine(golden_model, tight, DecodeEngineConfig(max_running=4)), sizes=[1, 2, 4]) == [1, 2]


@pytest.mark.gpu
def test_after_the_warm_up_a_request_replays_graphs_without_capturing(golden_dir):
    from dsflash.decode_worker.warmup import synthetic_request
    from dsflash.kvcache.layout import CacheLayout
    from dsflash.kvcache.pool import CachePool, plain_allocator
    from dsflash.model.deepseek_v41 import DeepseekV41

    model = DeepseekV41.from_checkpoint(golden_dir, device="cuda")
    model.use_kernels(keep_unpacked=False)
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), 600, 8, plain_allocator("cuda"))
    engine = DecodeEngine(model, pool, DecodeEngineConfig(max_running=4))
    assert warm_up(engine) == [1, 2, 4]
    captured = model.graphs.captured()
    assert captured > 0 and model.graphs.captured("block") > 0 and model.graphs.captured("absorb") > 0
    generator = torch.Generator(device="cuda").manual_seed(1)
    for batch in (1, 3):
        ids = [f"r{batch}-{i}" for i in range(batch)]
        for request_id in ids:
            engine.add(synthetic_request(engine, request_id, warm_up_context(model.config), generator))
        with torch.inference_mode():
            for _ in range(4):
                engine.step()
        for request_id in ids:
            engine.abort(request_id)
    assert model.graphs.captured() == captured
    model.release_graphs()
