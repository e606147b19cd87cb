"""CUDA graphs replay the dense parts of a forward bit for bit (model/graphs.py), and a batch
padded up to its bucket reuses the bucket's graphs. GPU only (but for the bucket arithmetic)."""

from __future__ import annotations

import pytest
import torch

from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.paged import PagedCache
from dsflash.kvcache.pool import CachePool, plain_allocator
from dsflash.model.fast_ops import TritonOps
from dsflash.model.graphs import GraphCache, batch_bucket
from dsflash.model.runner import step

gpu = pytest.mark.gpu


def test_batch_buckets():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33)] == [1, 2, 4, 4, 8, 8, 16, 16, 24, 40]


def _twins(golden_dir, golden, requests: int, model=None, pages: int = 300):
    """A kernel-path model (or `model`) and eager/graph twins of `requests` prefilled caches in
    a new pool of `pages` pages."""
    from dsflash.model.deepseek_v41 import DeepseekV41

    if model is None:
        model = DeepseekV41.from_checkpoint(golden_dir, device="cuda")
        model.ops = TritonOps(model.ops.weights, device="cuda")
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), pages, 10, plain_allocator("cuda"))
    prompts = [golden[i % 4]["input_ids"][:20 + 3 * i] for i in range(requests)]
    twins = {mode: [PagedCache(pool, model.config) for _ in prompts] for mode in ("eager", "graphs")}
    with torch.inference_mode():
        for mode, caches in twins.items():
            step(model, caches, prompts, logits="none")
    return model, twins


def _verify_steps(model, twins, graphs, count: int, g: torch.Generator, each_mode=None) -> dict:
    """`count` verify-shaped steps (6 tokens a request) in both modes: their logits by mode.
    each_mode(mode), if given, runs before each mode's step (a switch set for one of them)."""
    got = {"eager": [], "graphs": []}
    with torch.inference_mode():
        for _ in range(count):
            blocks = [torch.randint(3, model.config.vocab_size, (6,), generator=g) for _ in twins["eager"]]
            for mode, caches in twins.items():
                if each_mode:
                    each_mode(mode)
                model.graphs = graphs if mode == "graphs" else None
                got[mode] += [t.cpu() for t in step(model, caches, blocks, logits="all").logits]
    model.graphs = None
    return got


@gpu
def test_a_padded_batch_replays_its_buckets_graphs(golden_dir, golden):
    """Three requests run the graphs of four (the last row repeated), then four requests
    replay those same graphs: nothing new is captured, and the tokens are the eager ones."""
    model, twins = _twins(golden_dir, golden, 4)
    fourth = {mode: caches.pop() for mode, caches in twins.items()}
    graphs = GraphCache()
    g = torch.Generator().manual_seed(1)
    got = _verify_steps(model, twins, graphs, 3, g)  # 3 requests: eager, capture, replay
    captured = graphs.captured()
    assert captured > 0 and any(key[-1][0] == 24 for key in graphs._entries)  # 18 rows ran as 24
    for mode, caches in twins.items():
        caches.append(fourth[mode])
    more = _verify_steps(model, twins, graphs, 2, g)
    assert graphs.captured() == captured
    for mode in got:
        got[mode] += more[mode]
    for eager, replayed in zip(got["eager"], got["graphs"]):
        assert torch.equal(eager.argmax(-1), replayed.argmax(-1))
        assert (eager - replayed).abs().max() <= 1e-3 * eager.abs().max()
    graphs.release()


@gpu
def test_a_new_pool_captures_its_own_graphs(golden_dir, golden):
    """Graphs that write a pool's buffers are keyed by the pool's serial: after one pool is
    freed, the next one (of another size, so at other addresses, perhaps with the freed one's
    id) captures its own graphs, and its steps are the eager ones."""
    import gc

    model, twins = _twins(golden_dir, golden, 2, pages=200)
    graphs = GraphCache()
    g = torch.Generator().manual_seed(3)
    _verify_steps(model, twins, graphs, 3, g)
    first = graphs.captured()
    del twins
    gc.collect()
    torch.cuda.empty_cache()
    model, twins = _twins(golden_dir, golden, 2, model=model, pages=400)
    got = _verify_steps(model, twins, graphs, 3, g)
    assert graphs.captured() > first
    for eager, replayed in zip(got["eager"], got["graphs"]):
        assert torch.equal(eager, replayed)
    graphs.release()


@gpu
@pytest.mark.parametrize("tables", ["host", "device"])
@pytest.mark.parametrize("requests", [1, 2])
def test_replayed_steps_equal_eager_steps(golden_dir, golden, requests, tables):
    """Graphs against eager steps, bit for bit. With the Engram tables on the GPU the graphs
    also hash on the GPU, where the eager steps hash on the host."""
    from dsflash.model.deepseek_v41 import DeepseekV41

    model = DeepseekV41.from_checkpoint(golden_dir, device="cuda")
    if tables == "device":
        assert model.ops.weights.engram_tables_to("cuda", 1 << 30)
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
    # layers without compressor or indexer ran as one graph each (their entry lists are full),
    # the others as two, the attention in the second
    assert graphs.captured("block") > 0 and graphs.captured("attn_in") > 0 and graphs.captured("attn_ffn") > 0
    assert graphs.captured("engram") > 0
    assert any(key[0] == "engram" and (key[2] == "hashed") == (tables == "device") for key in graphs._entries)
    graphs.release()  # frees them at once (a process group's teardown waits on live ones)
    assert graphs.captured() == 0


@gpu
def test_the_drafters_graphs_equal_its_eager_runs(golden_dir, golden):
    """DSpark's absorb and its stages and greedy head (the Markov loop included) replay from graphs: the
    drafts, their logits and confidences are the eager ones, bit for bit, step after step."""
    from dsflash.model.dspark import DSparkDrafter

    model, twins = _twins(golden_dir, golden, 2)
    drafter, graphs = DSparkDrafter(model), GraphCache()
    g = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for _ in range(4):  # eager, capture, then replays
            ys = torch.randint(3, model.config.vocab_size, (2,), generator=g).tolist()
            blocks = [torch.randint(3, model.config.vocab_size, (6,), generator=g) for _ in ys]
            got = {}
            for mode, caches in twins.items():
                model.graphs = graphs if mode == "graphs" else None
                proposal = drafter.propose(list(zip(caches, ys)))
                got[mode] = [t.cpu() for t in (proposal.drafts, proposal.logits, proposal.confidence)]
                starts = [cache.num_tokens for cache in caches]
                taps = step(model, caches, blocks, logits="none", taps=True).taps
                drafter.absorb_many([(cache, start, t[:4]) for cache, start, t in zip(caches, starts, taps)])
            for eager, replayed in zip(got["eager"], got["graphs"]):
                assert torch.equal(eager, replayed)
    model.graphs = None
    # the stages and the head in one graph (their attention is one fixed launch here)
    assert graphs.captured("propose") > 0 and graphs.captured("absorb") > 0
    graphs.release()


@gpu
def test_work_on_the_side_stream_changes_no_bit(golden_dir, golden, monkeypatch):
    """The shared expert and the index and KV sources' projections on a side stream
    (TritonOps.beside: beside the routed experts and wq_b), replayed from graphs, against them
    on the main stream, eager: bit for bit."""
    from dsflash.model import fast_ops

    model, twins = _twins(golden_dir, golden, 2)
    graphs = GraphCache()
    rows = {"eager": 0, "graphs": 256}
    got = _verify_steps(model, twins, graphs, 3, torch.Generator().manual_seed(7),  # eager, capture, replay
                        lambda mode: monkeypatch.setattr(fast_ops, "SIDE_STREAM_ROWS", rows[mode]))
    assert graphs.captured() > 0 and model.ops._side is not None
    for eager, beside in zip(got["eager"], got["graphs"]):
        assert torch.equal(eager, beside)
    graphs.release()


def test_gemms_on_a_side_stream_take_their_own_split_counts():
    from dsflash.model.kernels.fp8_gemm import counts_lane, tile_counts

    device = torch.device("cpu")
    main = tile_counts(device)
    with counts_lane(1):
        side = tile_counts(device)
    assert side is not main and side is tile_counts(device, 1) and tile_counts(device) is main
