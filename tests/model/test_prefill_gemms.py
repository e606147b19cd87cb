"""Prefill's products on cuBLAS (model/kernels/prefill_gemms.py) and the weight decoders they
use (dequantize.py), against the references the kernels answer to. On CPU the decoders run
under TRITON_INTERPRET=1 and the products in fp32 (cuBLAS's bf16-in, fp32-out GEMM has no CPU
form); the GPU test sends prefill-sized calls of the shipped entry points through cuBLAS."""

from __future__ import annotations

import pytest
import torch

from dsflash.model.kernels import hc_streams, prefill_gemms, tall_bf16
from dsflash.model.kernels.common import quad_units
from dsflash.model.kernels.dequantize import fp4_quads_bf16, fp8_weight_bf16
from dsflash.model.kernels.fp4_moe import fp4_moe_ref
from dsflash.model.kernels.fp8_gemm import fp8_gemm, fp8_gemm_ref, grouped_fp8_gemm
from dsflash.model.quant import (dequantize_fp4_weight, dequantize_fp8_weight, fake_quant_fp8, quantize_fp8_weight)
from dsflash.model.weights import Checkpoint
from tests.model.test_kernels import DEVICE, REL, _device_experts, _g, _moe_case


def test_fp8_weights_decode_to_bf16_exactly():
    """Every e4m3 code at scales from 2^-20 to 2^7, ragged edges (rows and columns no multiple of 32)."""
    g = _g(1)
    codes = torch.randint(0, 256, (70, 100), dtype=torch.uint8, generator=g)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # not NaN
    codes[0, :] = torch.arange(100, dtype=torch.uint8)
    scales = torch.randint(107, 134, (3, 4), dtype=torch.uint8, generator=g)
    got = fp8_weight_bf16(codes.to(DEVICE), scales.to(DEVICE)).cpu()
    assert got.dtype == torch.bfloat16 and torch.equal(got.float(), dequantize_fp8_weight(codes, scales))


def test_fp4_quad_units_decode_to_bf16_exactly():
    """Stacked experts' quad units (as fp4_moe keeps them), every code, scales 0 (gives 0) to 2^7."""
    g = _g(2)
    packed = torch.randint(0, 256, (3, 40, 96), dtype=torch.uint8, generator=g)
    scales = torch.randint(100, 135, (3, 40, 6), dtype=torch.uint8, generator=g)
    scales[0, 0, 0] = 0
    got = fp4_quads_bf16(quad_units(packed).to(DEVICE), scales.to(DEVICE)).cpu()
    ref = torch.stack([dequantize_fp4_weight(packed[e], scales[e]) for e in range(3)])
    ref[0, 0, :32] = 0.0
    assert got.shape == (3, 40, 192) and torch.equal(got.float(), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_product_equals_the_gemm_reference(dtype):
    """An fp32 input goes in as three bf16 parts (the sum keeps fp32's accuracy), a bf16 one
    (faithful mode's FP8 grid) as itself."""
    g = _g(3)
    codes, scales = quantize_fp8_weight(torch.randn(96, 160, generator=g))
    x = (torch.randn(40, 160, generator=g) * torch.exp2(torch.arange(160) // 32 * 3.0 - 4.0)).to(dtype)
    got = prefill_gemms.fp8_product(x.to(DEVICE), codes.to(DEVICE), scales.to(DEVICE)).cpu()
    ref = fp8_gemm_ref(x, codes, scales)
    assert (got - ref).abs().max() < 1e-6 * ref.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_fp8_product_is_block_diagonal(dtype):
    g = _g(4)
    codes, scales = quantize_fp8_weight(torch.randn(4 * 32, 64, generator=g))
    x = torch.randn(9, 4 * 64, generator=g).to(dtype)
    got = prefill_gemms.grouped_fp8_product(x.to(DEVICE), codes.to(DEVICE), scales.to(DEVICE), 4).cpu()
    dense = dequantize_fp8_weight(codes, scales).view(4, 32, 64)
    ref = torch.einsum("tgi,gri->tgr", x.float().view(9, 4, 64), dense).reshape(9, -1)
    assert (got - ref).abs().max() < 1e-6 * ref.abs().max()


def test_grouped_fp8_product_takes_its_operand_encoded_already():
    """wo_a's operand made by the launch that computed its rows (fp8_blockwise.Operand, as
    sparse_attention.ENCODE_IN_ROWS makes it) gives what the fp32 rows rounded in the
    product's own encode give, bit for bit; the operand's rows past m (empty_operand's zeros
    under unit scales) are cut off."""
    from dsflash.model.kernels import fp8_blockwise

    g = _g(6)
    m, groups, k = 21, 4, 256
    codes, scales = quantize_fp8_weight(torch.randn(groups * 128, k, generator=g))
    x = (torch.randn(m, groups * k, generator=g) * torch.exp2(torch.arange(groups * k) // 128 * 2.0 - 6.0)).to(DEVICE)
    codes, scales = codes.to(DEVICE), scales.to(DEVICE)
    want = prefill_gemms.grouped_fp8_product(x, codes, scales, groups, round_first=True)
    a, a_scales = fp8_blockwise.rows_1x128(x, groups, round_first=True)
    operand = fp8_blockwise.empty_operand(m, groups * k, groups, x.device)
    rows = operand.codes.shape[1]
    operand.codes[:, :m] = a[:, :m]
    operand.scales.view(-1, rows)[:, :m] = a_scales.view(-1, rows)[:, :m]
    assert operand.shape == (m, groups * k) and not operand.codes[:, m:].any()
    got = prefill_gemms.grouped_fp8_product(operand, codes, scales, groups)
    assert got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("act_quant, decode_experts", [(False, 64), (True, 64), (True, 2)])
def test_experts_on_cublas_equal_the_reference(act_quant, decode_experts, monkeypatch):
    """fp4_moe's arguments, fp4_moe_ref's result: exact mode (fp32 x, three parts), faithful mode
    (x on the FP8 grid as bf16, the down projection's input rounded onto it too); the experts
    decoded all at once or two at a time."""
    monkeypatch.setattr(prefill_gemms, "DECODE_EXPERTS", decode_experts)
    stack, x, idx, weights = _moe_case(_g(5), 23, E=5, H=64, inter=64, k=3)
    if act_quant:
        x = fake_quant_fp8(x).to(torch.bfloat16)
    ref = fp4_moe_ref(x, idx, weights, *stack, 0.7, act_quant=act_quant)
    got = prefill_gemms.fp4_experts(x.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7,
                                    act_quant=act_quant).cpu()
    assert (got - ref).abs().max() < REL * ref.abs().max()
    # the routing weights and the FP8 rounding in the SwiGLU's launch, or after it: the same bits
    monkeypatch.setattr(prefill_gemms, "SWIGLU_EPILOGUE", False)
    apart = prefill_gemms.fp4_experts(x.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7,
                                      act_quant=act_quant).cpu()
    assert torch.equal(apart, got)


def test_experts_kept_encoded_are_the_encoded_experts():
    """EncodedWeights: an encoder gives fp4_weight_128's codes and scales, keeps them up to its
    budget (a second call returns the kept tensors) and past it encodes them each time; and
    fp4_experts with kept encoders gives the same bits as without, first and second time (on the
    GPU the FP8 tensor cores take these widths and fill the cache; on the CPU the bf16 path runs,
    which encodes nothing)."""
    from dsflash.model.kernels import fp8_blockwise

    stack, x, idx, weights = _moe_case(_g(8), 300, E=3, H=128, inter=128, k=2)
    experts = _device_experts(stack)
    units, scales, batch = experts[0], experts[1], slice(0, prefill_gemms.DECODE_EXPERTS)
    want = fp8_blockwise.fp4_weight_128(units[batch], scales[batch])
    size = sum(t.numel() * t.element_size() for t in want)
    kept = prefill_gemms.EncodedWeights(budget=size)
    encode = kept.experts(("layer", "w13"))
    first = encode(batch, units, scales)
    assert all(torch.equal(a, b) for a, b in zip(first, want)) and kept.used == size
    assert all(a is b for a, b in zip(encode(batch, units, scales), first))
    over = prefill_gemms.EncodedWeights(budget=size - 1)
    again = [over.experts(("layer", "w13"))(batch, units, scales) for _ in range(2)]
    assert again[0][0] is not again[1][0] and torch.equal(again[0][0], again[1][0]) and over.used == 0
    xq = fake_quant_fp8(x).to(torch.bfloat16).to(DEVICE)
    args = (idx.to(DEVICE), weights.to(DEVICE), *experts, 0.7)
    plain = prefill_gemms.fp4_experts(xq, *args, act_quant=True)
    cache = prefill_gemms.EncodedWeights(budget=1 << 30)
    encoders = (cache.experts(("layer", "w13")), cache.experts(("layer", "w2")))
    for _ in range(2):
        assert torch.equal(prefill_gemms.fp4_experts(xq, *args, act_quant=True, encoded=encoders), plain)
    assert (cache.used > 0) == prefill_gemms._tensor_cores(xq, 2 * 128, 128)


def test_other_ranks_experts_are_left_to_them():
    """Ids past this rank's last expert (TritonOps.routed_experts marks other ranks' pairs so)
    add nothing; the rank's own pairs are as if alone."""
    stack, x, idx, weights = _moe_case(_g(6), 17, E=4, H=64, inter=32, k=2)
    mine = idx < 3
    ref = fp4_moe_ref(x, torch.where(mine, idx, 0), weights * mine, *stack, 0.7)
    got = prefill_gemms.fp4_experts(x.to(DEVICE), torch.where(mine, idx, 3).to(DEVICE), weights.to(DEVICE),
                                    *[t[:3] for t in _device_experts(stack)], 0.7).cpu()
    assert (got - ref).abs().max() < REL * ref.abs().max()
    none = prefill_gemms.fp4_experts(x.to(DEVICE), torch.full_like(idx, 2).to(DEVICE), weights.to(DEVICE),
                                     *[t[:2] for t in _device_experts(stack)], 0.7).cpu()
    assert not none.any()  # a rank none of whose experts were picked


def test_the_shared_experts_output_joins_the_pair_sums_to_the_bit():
    """fp4_experts(plus=...) (the shared expert's output, added inside the pair sums where a
    prefill chunk's MoE adds it: moe.moe) gives the bits of adding it after them, also where
    every pair is another rank's."""
    stack, x, idx, weights = _moe_case(_g(7), 17, E=4, H=64, inter=32, k=2)
    plus = torch.randn(17, 64, generator=_g(8)).to(DEVICE)
    args = (x.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7)
    assert torch.equal(prefill_gemms.fp4_experts(*args, plus=plus), prefill_gemms.fp4_experts(*args) + plus)
    elsewhere = (args[0], torch.full_like(args[1], 2), *args[2:3], *[t[:2] for t in args[3:7]], 0.7)
    assert torch.equal(prefill_gemms.fp4_experts(*elsewhere, plus=plus), plus)


def test_only_prefill_rows_on_the_gpu_take_cublas():
    """Dense products from ROWS rows; the experts from EXPERT_PAIRS pairs an expert."""
    rows = prefill_gemms.ROWS
    assert not prefill_gemms.takes(torch.zeros(rows, 8))  # the CPU: no cuBLAS here
    if torch.cuda.is_available():
        assert prefill_gemms.takes(torch.zeros(rows, 8, device="cuda"))
        assert not prefill_gemms.takes(torch.zeros(rows - 1, 8, device="cuda"))
        x = torch.zeros(max(rows, 2048), 8, device="cuda")
        pairs = prefill_gemms.EXPERT_PAIRS * 4
        assert prefill_gemms.takes_experts(x.bfloat16(), pairs, 4)
        assert not prefill_gemms.takes_experts(x.bfloat16(), pairs - 1, 4)
        assert prefill_gemms.takes_experts(x, pairs, 4) == prefill_gemms.EXACT_EXPERTS  # exact mode's fp32


@pytest.mark.gpu
def test_nothing_takes_cublas_inside_a_graph_capture():
    """A decode batch past the thresholds keeps the kernels while a CUDA graph captures it: a
    graph would keep every decoded weight in its pool, and fp4_experts reads its row counts on
    the host."""
    x = torch.zeros(max(prefill_gemms.ROWS, 1024), 8, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inside = prefill_gemms.takes(x), prefill_gemms.takes_experts(x, 1 << 30, 1)
        x.mul_(1)  # a graph with a kernel in it
    assert prefill_gemms.takes(x) and prefill_gemms.takes_experts(x, 1 << 30, 1) and inside == (False, False)


@pytest.mark.gpu
def test_prefill_sized_gemms_take_cublas_and_match_the_references():
    """The shipped entry points at a prefill chunk's rows, on the GPU: fp8_gemm (both modes),
    grouped_fp8_gemm, against the references, and against the kernels they replace."""
    g = _g(7)
    rows = prefill_gemms.ROWS + 64
    codes, scales = quantize_fp8_weight(torch.randn(512, 1024, generator=g))
    x = torch.randn(rows, 1024, generator=g)
    for act_quant in (False, True):
        ref = fp8_gemm_ref(x, codes, scales, act_quant)
        got = fp8_gemm(x.cuda(), codes.cuda(), scales.cuda(), act_quant).cpu()
        # faithful mode on the FP8 tensor cores: 128-column scale blocks round (test_fp8_blockwise.py)
        bound = 1e-3 if act_quant and prefill_gemms.FP8_TENSOR_CORES else 1e-5
        assert (got - ref).abs().max() < bound * ref.abs().max()
    codes, scales = quantize_fp8_weight(torch.randn(4 * 128, 256, generator=g))  # 4 groups of 128 rows
    got = grouped_fp8_gemm(x.cuda(), codes.cuda(), scales.cuda(), 4).cpu()
    dense = dequantize_fp8_weight(codes, scales).view(4, 128, 256)
    ref = torch.einsum("tgi,gri->tgr", x.view(rows, 4, 256), dense).reshape(rows, -1)
    assert (got - ref).abs().max() < 1e-5 * ref.abs().max()
    weight = torch.randn(384, 1024, generator=g).to(torch.bfloat16)
    ref = x @ weight.float().T
    got = prefill_gemms.bf16_product(x.cuda(), weight.cuda()).cpu()
    assert (got - ref).abs().max() < 1e-5 * ref.abs().max()


def kernel_path_prefill(checkpoint_dir, act_quant: bool):
    """A checkpoint on the kernel path (TritonOps) -> prefill(prompt, which), which gives a fresh
    cache's logits `which` of prompt (returned on the CPU)."""
    from dsflash.kvcache.layout import CacheLayout
    from dsflash.kvcache.paged import PagedCache
    from dsflash.kvcache.pool import CachePool, plain_allocator
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.runner import step

    model = DeepseekV41.from_checkpoint(checkpoint_dir, device=DEVICE)
    model.ops = TritonOps(model.ops.weights, act_quant=act_quant, device=DEVICE)
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=64), 400, 2, plain_allocator(DEVICE))

    def prefill(prompt: torch.Tensor, which: str) -> torch.Tensor:
        cache = PagedCache(pool, model.config)
        with torch.inference_mode():
            logits = step(model, [cache], [prompt], logits=which).logits[0].float().cpu()
        cache.release()
        return logits
    return prefill


def _logits_both_ways(golden_dir, act_quant: bool, prompt: torch.Tensor, send, which: str) -> dict:
    """The tiny checkpoint's kernel-path prefill of `prompt` (logits `which`), with send(True)
    routing its products through prefill_gemms and send(False) keeping them on the kernels."""
    prefill = kernel_path_prefill(golden_dir, act_quant)
    logits = {}
    for on in (True, False):
        send(on)
        logits[on] = prefill(prompt, which)
    return logits


@pytest.mark.gpu
@pytest.mark.parametrize("act_quant", [False, True])
def test_a_prefill_chunk_on_cublas_gives_the_kernels_logits(golden_dir, act_quant, monkeypatch):
    """The tiny checkpoint on the kernel path, a prompt of a prefill chunk's size, with its FP8
    and FP4 products on cuBLAS, its mHC sites in one pass (hc_streams.hc_mixes, hc_site) and its
    routers' products on tall_bf16, and with all on the decode rows' kernels: every position's
    logits as near as the fp32 sums' reordering leaves them.

    That is far from their last bits. At this length the tiny checkpoint sits on near-ties
    everywhere: a router's or the indexer's top-k that flips, and in faithful mode an input
    whose last bit moves it by a whole FP8 step. bench/order_sensitivity.py --jitter --positions
    moves every product's output at random by 2^-20 of itself (fifty-seventh session, seed 11,
    4 draws): in exact mode the median position's largest change is 0.8-5.2e-3 of its largest
    logit and the argmax stays at 94-99% of positions; in faithful mode 0.29-0.31 and 46-48%.
    Faithful mode's products (short FP8 mantissas) often sum exactly in any order, so a real
    reordering moves it less than that jitter: on the H100 (call AR) exact mode 4.7e-4 and
    99.5% the same, faithful mode 5.8e-2 and 84%. One routed expert's product 1% off moves
    exact mode by 3.3-5.9e-2 (77-86% the same) and faithful mode by 0.18-0.29 (47-61%), so
    these bounds tell that apart; in faithful mode mostly by the argmaxes kept (its median
    bound is 1.2x under that error's least; both bounds from one H100 run, none on an H200).
    One position alone is not a test: seed 10's last faithful logits moved 8.7e-2 on the H100,
    seed 11's flipped its argmax there (fifty-sixth and fifty-seventh sessions)."""
    monkeypatch.setattr(prefill_gemms, "EXPERT_PAIRS", 1)  # the tiny checkpoint's few pairs too
    rows = prefill_gemms.ROWS
    vocab = Checkpoint(golden_dir).config.vocab_size
    prompt = torch.randint(3, vocab, (rows + 100,), generator=_g(11))

    def send(on):
        monkeypatch.setattr(prefill_gemms, "ROWS", rows if on else 1 << 62)
        monkeypatch.setattr(hc_streams, "MIXES_ROWS", rows if on else 1 << 62)
        monkeypatch.setattr(hc_streams, "SITE_ROWS", rows if on else 0)
        monkeypatch.setattr(tall_bf16, "ROWS", rows if on else 1 << 62)

    logits = _logits_both_ways(golden_dir, act_quant, prompt, send, "all")
    a, b = logits[False], logits[True]
    median_change = ((a - b).abs().amax(-1) / a.abs().amax(-1)).median().item()
    same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(f"median position's change {median_change:.3g} of its largest logit, argmax the same at {same:.4f}")
    assert median_change < (0.15 if act_quant else 1.5e-2), f"the median position moved {median_change:.3g}"
    assert same > (0.7 if act_quant else 0.9), f"the argmax is the same at only {same:.1%} of positions"


def test_the_models_products_through_this_path_give_the_kernels_logits(golden_dir, golden, monkeypatch):
    """The tiny checkpoint on the kernel path in faithful mode with every FP8 and FP4 product
    sent through prefill_gemms (its row thresholds lowered to the prompt's rows; on CPU the
    products in fp32, on a GPU cuBLAS) and the mHC mixes through hc_streams.hc_mixes: the
    dispatch from TritonOps and fp8_gemm (dense, merged, grouped, the routed experts) gives
    the decode rows' kernels' logits. (Exact mode's parts are held by the tests above; a
    kernel-path forward takes ~20 s under the interpreter. 16 rows: the least the lowered
    thresholds take.)"""
    monkeypatch.setattr(prefill_gemms, "EXPERT_PAIRS", 1)

    def send(on):
        monkeypatch.setattr(prefill_gemms, "takes", lambda x: on and x.shape[0] >= 16)
        monkeypatch.setattr(hc_streams, "MIXES_ROWS", 16 if on else 1 << 62)

    logits = _logits_both_ways(golden_dir, True, golden[2]["input_ids"][:16], send, "all")
    assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
    assert (logits[True] - logits[False]).abs().max() < 1e-3 * logits[False].abs().max()


def test_a_prefill_sites_streams_read_once_give_the_same_logits(golden_dir, golden, monkeypatch):
    """hc_streams.SITE_ROWS lowered to every row: each mHC site's mixes and input come from one
    pass over its streams (the attention site's, and the FFN site's with the attention's expand),
    on the tiny checkpoint's kernel path in exact mode: the logits of the separate launches
    within the sums' reordering, the same next tokens, and the pass taken at both sites of every
    layer (each block's FFN output taken into the streams in its own pass: DEFER_FFN_EXPAND off)."""
    monkeypatch.setattr(hc_streams, "DEFER_FFN_EXPAND", False)
    prefill = kernel_path_prefill(golden_dir, False)
    passes = []
    one_pass = hc_streams.hc_site
    monkeypatch.setattr(hc_streams, "hc_site",
                        lambda *a, **kw: passes.append(kw.get("expand") is not None) or one_pass(*a, **kw))
    prompt = golden[2]["input_ids"][:16]
    logits = {}
    for rows in (0, 1):
        monkeypatch.setattr(hc_streams, "SITE_ROWS", rows)
        passes.clear()
        logits[rows] = prefill(prompt, "all")
        if rows:
            layers = Checkpoint(golden_dir).config.num_layers
            assert passes.count(False) == layers and passes.count(True) == layers, passes
        else:
            assert not passes
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))
    assert (logits[0] - logits[1]).abs().max() < 1e-4 * logits[0].abs().max()


def test_the_engram_gate_in_one_launch_matches_torch_at_the_models_sites(golden_dir, monkeypatch):
    """engram_gate.FUSED at the tiny checkpoint's Engram sites: on each site's own inputs (a
    faithful kernel-path prefill) the one launch gives the torch form's streams to fp32's
    accuracy at every site, and exact mode's logits move within the sums' reordering with the
    same next tokens. Faithful mode's logits test nothing here: a reordered fp32 sum may move an
    FP8 step, and a random model's later rows then go their own way (an H100 in the fifty-first
    session: a 4e-8 change at the sites moved rows 15-23 of this prompt by up to 1.8)."""
    from dsflash.model.kernels import engram_gate
    from dsflash.model.layers.engram_gate import engram_gated as torch_form

    prompt = torch.randint(3, Checkpoint(golden_dir).config.vocab_size, (24,), generator=_g(12))
    fused, errors = engram_gate.engram_gated, []

    def both(*args):
        want, got = torch_form(*args), fused(*args)
        errors.append(((got - want).abs().max() / want.abs().max()).item())
        return got
    monkeypatch.setattr(engram_gate, "engram_gated", both)
    monkeypatch.setattr(engram_gate, "FUSED", True)
    kernel_path_prefill(golden_dir, True)(prompt, "last")
    assert len(errors) == len(Checkpoint(golden_dir).config.engram_layers) and max(errors) < 1e-6, errors
    launches = []
    monkeypatch.setattr(engram_gate, "engram_gated", lambda *a: launches.append(1) or fused(*a))
    prefill, logits = kernel_path_prefill(golden_dir, False), {}
    for on in (False, True):
        monkeypatch.setattr(engram_gate, "FUSED", on)
        logits[on] = prefill(prompt, "all")
        assert bool(launches) == on  # (exact mode's tensors take it too)
    assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
    assert (logits[True] - logits[False]).abs().max() < 1e-3 * logits[False].abs().max()  # (H100: 6.5e-4)


def test_a_blocks_ffn_output_taken_into_the_next_sites_pass_gives_the_same_bits(golden_dir, golden, monkeypatch):
    """hc_streams.DEFER_FFN_EXPAND with SITE_ROWS lowered to every row: each block's FFN output
    goes into the streams inside the next block's attention site (its one pass with the expand)
    where nothing reads the streams before that site (an Engram site does: there, and after the
    last layer, its own hc_expand), in faithful mode (where any reordering moves whole FP8
    steps): the logits of the separate expands to the bit, and the deferred sites those that
    can take it."""
    from dsflash.model.deepseek_v41 import DeepseekV41

    monkeypatch.setattr(hc_streams, "SITE_ROWS", 1)
    prefill = kernel_path_prefill(golden_dir, True)
    passes, expands = [], []
    one_pass, expand = hc_streams.hc_site, hc_streams.hc_expand
    monkeypatch.setattr(hc_streams, "hc_site",
                        lambda *a, **kw: passes.append(kw.get("expand") is not None) or one_pass(*a, **kw))
    monkeypatch.setattr(hc_streams, "hc_expand", lambda *a: expands.append(1) or expand(*a))
    prompt = golden[2]["input_ids"][:16]
    logits, counts = {}, {}
    for on in (False, True):
        monkeypatch.setattr(hc_streams, "DEFER_FFN_EXPAND", on)
        passes.clear()
        expands.clear()
        logits[on] = prefill(prompt, "all")
        counts[on] = passes.count(True), len(expands)
    config = Checkpoint(golden_dir).config
    roles = config.roles
    taking = sum(DeepseekV41._takes_pending(roles[i], want_taps=False) for i in range(1, config.num_layers))
    assert 0 < taking < config.num_layers - 1  # (the Engram layers do not take it)
    assert counts[False] == (config.num_layers, config.num_layers)
    assert counts[True] == (config.num_layers + taking, config.num_layers - taking)
    assert torch.equal(logits[True], logits[False])
