"""CUDA graphs replay the dense parts of a forward bit for bit (model/graphs.py). GPU only."""

from __future__ import annotations

import pytest
import torch

from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.paged import PagedCache
from dsflash.kvcache.pool import CachePool, plain_allocator
from dsflash.model.fast_ops import TritonOps
from dsflash.model.graphs import GraphCache
from dsflash.model.runner import step

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("requests", [1, 2])
def test_replayed_steps_equal_eager_steps(golden_dir, golden, requests):
    from dsflash.model.deepseek_v41 import DeepseekV41

    model = DeepseekV41.from_checkpoint(golden_dir, device="cuda")
    model.ops = TritonOps(model.ops.weights, device="cuda")
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), 200, 4, plain_allocator("cuda"))
    prompts = [golden[1]["input_ids"][:30], golden[2]["input_ids"][:23]][:requests]
    twins = {mode: [PagedCache(pool, model.config) for _ in prompts] for mode in ("eager", "graphs")}
    graphs = GraphCache()
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for mode, caches in twins.items():
            model.graphs = graphs if mode == "graphs" else None
            step(model, caches, prompts, logits="none")
        # verify-shaped steps of 6 tokens per request: the 2nd captures, the rest replay
        for _ in range(4):
            blocks = [torch.randint(3, model.config.vocab_size, (6,), generator=g) for _ in prompts]
            got = {}
            for mode, caches in twins.items():
                model.graphs = graphs if mode == "graphs" else None
                got[mode] = [t.cpu() for t in step(model, caches, blocks, logits="all").logits]
            for eager, replayed in zip(got["eager"], got["graphs"]):
                assert torch.equal(eager, replayed)
    # layers without compressor or indexer ran as one graph each (their entry lists are full)
    assert graphs.captured("block") > 0 and graphs.captured("attn_in") > 0
    graphs.release()  # frees them at once (a process group's teardown waits on live ones)
    assert graphs.captured() == 0
