"""Exactness properties on checkpoints other than the golden one (other sizes, layer patterns).

With the cache quantizers off the model is smooth, so one-shot, chunked (any N) and
token-by-token prefill must agree to float rounding, and a batch must equal its requests
run alone. With them on, values that sit on a rounding boundary may flip; the argmax still
agrees almost everywhere.
"""

import copy

import pytest
import torch

from dsflash.kvcache.state import DenseCache
from dsflash.model.checkpoint_writer import preset_config, write_checkpoint
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.runner import prompt_logits, step


def _variant_config():
    """A layer pattern unlike the golden one: 3 sliding layers, ratio-2 and ratio-1 groups of
    other lengths, two reindex layers, Engram on a decoder layer, taps from mixed layers."""
    raw = copy.deepcopy(preset_config("tiny"))
    t = raw["text_config"]
    t.update(num_hidden_layers=10, compress_ratios=[0, 0, 0, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0],
             kv_source_layer_ids=[3, 6], index_source_layer_ids=[3, 4, 6, 8], candidate_source_layer_id=6,
             engram_layer_ids=[2, 7], sliding_window=6, index_topk=3, candidate_topk_blocks=2,
             candidate_block_size=2, dspark_target_layer_ids=[5, 8, 9], hidden_size=96, head_dim=96,
             qk_rope_head_dim=32, num_attention_heads=2, o_groups=2, n_routed_experts=6, num_experts_per_tok=3)
    from dsflash.model.engram_hash import engram_table_rows

    t["engram_num_embeddings"] = engram_table_rows(t)
    return raw


@pytest.fixture(scope="module", params=["tiny", "variant"])
def smooth_model(request, tmp_path_factory):
    raw = preset_config("tiny") if request.param == "tiny" else _variant_config()
    path = write_checkpoint(tmp_path_factory.mktemp(request.param), config_dict=raw, seed=11)
    return DeepseekV41.from_checkpoint(path, qat=False)


def _prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 120000, (n,), generator=g)


@pytest.mark.parametrize("mode", ["incremental", "chunked:2", "chunked:5", "chunked:13"])
def test_chunked_equals_one_shot(smooth_model, mode):
    tokens = _prompt(41)
    with torch.inference_mode():
        full = prompt_logits(smooth_model, tokens, "full")
        other = prompt_logits(smooth_model, tokens, mode)
    assert (full - other).abs().max() < 1e-3


def test_batch_equals_requests_alone(smooth_model):
    prompts = [_prompt(n, seed=n) for n in (3, 17, 9)]
    with torch.inference_mode():
        alone = []
        for p in prompts:
            cache = DenseCache(smooth_model.config)
            first = step(smooth_model, [cache], [p[:-2]], logits="all").logits[0]
            rest = step(smooth_model, [cache], [p[-2:]], logits="all").logits[0]
            alone.append(torch.cat([first, rest]))
        caches = [DenseCache(smooth_model.config) for _ in prompts]
        first = step(smooth_model, caches, [p[:-2] for p in prompts], logits="all").logits
        rest = step(smooth_model, caches, [p[-2:] for p in prompts], logits="all").logits
    for a, f, r in zip(alone, first, rest):
        assert (a - torch.cat([f, r])).abs().max() < 1e-3


def test_qat_modes_agree_on_argmax(tiny_model):
    tokens = _prompt(60, seed=5)
    with torch.inference_mode():
        full = prompt_logits(tiny_model, tokens, "full")
        inc = prompt_logits(tiny_model, tokens, "incremental")
    assert (full.argmax(-1) == inc.argmax(-1)).float().mean() >= 0.95


def test_cache_is_plain_data_that_continues_elsewhere(tiny_model):
    """A cache built by one forward, deep-copied (as if moved), continues identically."""
    tokens = _prompt(30, seed=9)
    with torch.inference_mode():
        cache = DenseCache(tiny_model.config)
        step(tiny_model, [cache], [tokens[:21]])
        moved = copy.deepcopy(cache)
        a = step(tiny_model, [cache], [tokens[21:]], logits="all").logits[0]
        b = step(tiny_model, [moved], [tokens[21:]], logits="all").logits[0]
    assert torch.equal(a, b)
