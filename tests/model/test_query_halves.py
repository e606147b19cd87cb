"""Faithful prefill's attention queries in halves (attention_queries.SPLIT_QUERIES): wq_b's
product written as each head's first PLAIN channels in bf16 and its others in fp32
(prefill_gemms.query_halves_product), which the Gluon rows kernel reads as they are and every
other form joins first. The halves are the whole product's channels, rounded where RoPE leaves
them alone; a faithful prefill's logits do not move. On CPU the products run in fp32 (the FP8
path's CPU form) at a few rows; on a GPU at a prefill chunk's, through cuBLAS and the Gluon
rows kernel."""

from __future__ import annotations

import pytest
import torch

from dsflash.model.kernels import attention_queries, fp8_blockwise, prefill_gemms
from dsflash.model.kernels.attention_queries import Queries, QueryHalves
from dsflash.model.kernels.fp8_gemm import fp8_gemm
from dsflash.model.quant import quantize_fp8_weight
from tests.model.test_fp8_blockwise import _switch
from tests.model.test_kernels import DEVICE, _g

ROWS = prefill_gemms.ROWS + 67 if DEVICE == "cuda" else 37


def _prefill_rows(monkeypatch) -> None:
    """Faithful prefill's FP8 tensor-core path at ROWS rows (on CPU: its fp32 form from 16)."""
    _switch(monkeypatch, True)
    if DEVICE == "cpu":
        monkeypatch.setattr(prefill_gemms, "takes_rows", lambda rows, device: rows >= 16)


def test_the_halves_are_the_whole_products_channels(monkeypatch):
    """query_halves_product against fp8_gemm's faithful product: the first PLAIN channels of each
    head are its fp32 sums rounded to bf16, the others its fp32 sums, with the weight encoded
    each time or kept (EncodedWeights, twice: the reordered encoding comes back kept); other
    plain widths or head counts are not taken."""
    _prefill_rows(monkeypatch)
    heads, dim, plain, k = 2, 512, 384, 256
    x = (torch.randn(ROWS, k, generator=_g(1)) * 3).to(DEVICE)
    codes, scales = [t.to(DEVICE) for t in quantize_fp8_weight(torch.randn(heads * dim, k, generator=_g(2)) / 16)]
    whole = fp8_gemm(x, codes, scales, act_quant=True).view(ROWS, heads, dim)
    assert prefill_gemms.takes_query_halves(x, codes, heads, plain)
    kept = prefill_gemms.EncodedWeights(1 << 30)
    for cache in (None, kept, kept):
        first, rest = prefill_gemms.query_halves_product(x, codes, scales, heads, plain, kept=cache)
        assert first.dtype == torch.bfloat16 and rest.dtype == torch.float32
        assert torch.equal(first, whole[..., :plain].bfloat16()) and torch.equal(rest, whole[..., plain:])
    assert kept.used == codes.numel() + codes.numel() // 128 ** 2 * 4  # one reordered encoding kept
    # the reordered scales keep the rows' padding cuBLAS reads them with, whatever strides torch gets
    whole_scales = fp8_blockwise.fp8_weight_128(codes, scales)[1]
    order = prefill_gemms._plain_blocks_first(heads, dim // 128, plain // 128, codes.device)
    ordered = prefill_gemms._weight_128(codes, scales, None, order)[1]
    assert ordered.stride() == whole_scales.stride() and torch.equal(ordered, whole_scales[order])
    for other in ((heads, 0), (heads, dim), (heads, 320), (3, plain)):
        assert not prefill_gemms.takes_query_halves(x, codes, *other)
    assert not prefill_gemms.takes_query_halves(x[:8], codes, heads, plain)  # decode rows


def test_joined_halves_attend_as_the_whole_queries():
    """Queries.of(QueryHalves): shape, rows taken from both halves, rotated() and joined() as the
    whole fp32 queries' where the plain channels are their bf16 values (faithful mode)."""
    n, heads, dim, half = 5, 3, 512, 32
    whole = torch.randn(n, heads, dim, generator=_g(3)).to(DEVICE)
    angles = (torch.rand(n, half, generator=_g(4)) * 50).to(DEVICE)
    halves = QueryHalves(whole[..., :384].bfloat16(), whole[..., 384:].clone())
    q = Queries.of(halves, angles.cos(), angles.sin(), True)
    assert q.shape == halves.shape == (n, heads, dim) and q.tail is not None
    assert torch.equal(q.rotated(), Queries(whole, angles.cos(), angles.sin(), True).rotated())
    assert torch.equal(q.joined().raw, halves.whole()) and q.joined().tail is None
    rows = q.take(lambda t: t[1:4])
    assert rows.shape == (3, heads, dim) and torch.equal(rows.joined().raw, halves.whole()[1:4])


@pytest.mark.slow
def test_a_faithful_prefill_with_its_queries_in_halves_gives_the_same_logits(monkeypatch):
    """The tiny preset with the release's 512-channel heads (64 rotated) on the kernel path, a
    prompt of ROWS tokens in a paged cache: every layer's queries come in halves (counted) and
    every position's logits are those of the whole queries, bit for bit."""
    from dsflash.kvcache.layout import CacheLayout
    from dsflash.kvcache.paged import PagedCache
    from dsflash.kvcache.pool import CachePool, plain_allocator
    from dsflash.model.checkpoint_writer import preset_config, random_weight_store, tokenizer_dir
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.runner import step

    _prefill_rows(monkeypatch)
    config = preset_config("tiny")
    config["text_config"].update(head_dim=512, qk_rope_head_dim=64, index_head_dim=128, q_lora_rank=128)
    model = DeepseekV41(random_weight_store(config, seed=5), tokenizer_json=tokenizer_dir() / "tokenizer.json",
                        act_quant=True, device=DEVICE)
    model.use_kernels()
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=64), 400, 1, plain_allocator(DEVICE))
    prompt = torch.randint(3, model.config.vocab_size, (ROWS,), generator=_g(6))
    made = []
    product = prefill_gemms.query_halves_product
    monkeypatch.setattr(prefill_gemms, "query_halves_product", lambda *a, **kw: made.append(1) or product(*a, **kw))
    logits = {}
    for on in (False, True):
        monkeypatch.setattr(attention_queries, "SPLIT_QUERIES", on)
        cache = PagedCache(pool, model.config)
        with torch.inference_mode():
            logits[on] = step(model, [cache], [prompt], logits="all").logits[0].float().cpu()
        cache.release()
    assert len(made) == model.config.num_layers
    assert torch.equal(logits[True], logits[False]) and logits[True].abs().max() > 0
