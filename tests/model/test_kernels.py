"""Every Triton kernel against the plain-torch reference it replaces. On CPU they run under
TRITON_INTERPRET=1 (tests/conftest.py sets it); with a GPU the same tests run on the device."""

from __future__ import annotations

import copy

import pytest
import torch
import triton
import triton.language as tl

from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.paged import PagedCache
from dsflash.kvcache.pool import CachePool, plain_allocator
from dsflash.model.fast_ops import TritonOps
from dsflash.model.graphs import GraphCache
from dsflash.model.kernels import common
from dsflash.model.kernels.common import (QUAD_PLACES, bf16_parts, bf16_parts_kernel, e2m1_quads, interpreting,
                                          quad_scales, quad_units)
from dsflash.model.kernels.fp4_moe import RoutePlan, fp4_moe, fp4_moe_ref, quad_experts
from dsflash.model.kernels.fp4_moe import block_height as fp4_moe_block_height
from dsflash.model.kernels.fp8_gemm import bf16_gemm, fp32_gemm, fp8_gemm, fp8_gemm_ref, grouped_fp8_gemm
from dsflash.model.kernels import hc_streams
from dsflash.model.kernels import rms_norm as norm_kernel
from dsflash.model.kernels import swiglu
from dsflash.model.kernels.hc_gates import hc_gates
from dsflash.model.kernels.ring_write import write_rows
from dsflash.model.kernels.quantize import fp8_grid_bf16
from dsflash.model.kernels.top_experts import top_experts, top_experts_ref
from dsflash.model.kernels.top_k import top_k_ascending_ref
from dsflash.model.kernels.indexer_score import indexer_scores, indexer_scores_ref
from dsflash.model.kernels.sparse_attention import (DECODE_KEY_SPLITS, launch_plan, sparse_attention,
                                                     sparse_attention_ref)
from dsflash.model.layers import mhc
from dsflash.model.layers.norm import rms_norm
from dsflash.model.quant import (dequantize_fp4_weight, dequantize_fp8_weight, fake_quant_fp4, fake_quant_fp8,
                                 quantize_fp4_weight, quantize_fp8_weight)
from dsflash.model.runner import prompt_logits, step
from dsflash.model.weights import Fp8Weight

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REL = 1e-4 if DEVICE == "cpu" else 5e-3  # GPU: hardware exp and fp8 conversion, split-K sums


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("m, n, k", [(1, 96, 64), (6, 64, 96), (16, 80, 160), (37, 128, 64)])
@pytest.mark.parametrize("act_quant", [False, True])
def test_fp8_gemm(m, n, k, act_quant):
    g = _g(m)
    codes, scales = quantize_fp8_weight(torch.randn(n, k, generator=g))
    # each block of 32 columns at its own magnitude, so that faithful mode's block scales differ
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.arange(k) // 32 * 3.0 - 4.0)
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(DEVICE, dtype)
        got = fp8_gemm(xd, codes.to(DEVICE), scales.to(DEVICE), act_quant).cpu()
        ref = fp8_gemm_ref(xd.cpu(), codes, scales, act_quant)
        assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-5


@pytest.mark.parametrize("m, n, k", [(6, 300, 256), (37, 128, 128)])
def test_split_k_parts_are_summed_inside_the_launch(m, n, k, monkeypatch):
    """K split over programs (on the GPU to fill the SMs; here forced): the last program of
    each output tile adds the parts, and leaves the tile counts at 0 for the next launch."""
    from dsflash.model.kernels import fp8_gemm as gemm

    monkeypatch.setattr(gemm, "INTERPRETER_SPLITS", 3)
    g = _g(m)
    codes, scales = quantize_fp8_weight(torch.randn(n, k, generator=g))
    weight = torch.randn(n, k, generator=g).to(torch.bfloat16)
    x = torch.randn(m, k, generator=g)
    xd = x.to(DEVICE)
    assert gemm._split_k(k, 32, 1, xd.device)[0] > 1
    for _ in range(2):
        got = fp8_gemm(xd, codes.to(DEVICE), scales.to(DEVICE)).cpu()
        ref = fp8_gemm_ref(x, codes, scales)
        assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-5
        got = bf16_gemm(xd, weight.to(DEVICE)).cpu()
        ref = x @ weight.float().T
        assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-5
    assert not gemm.tile_counts(xd.device).any()


def test_split_parts_read_eight_at_once_sum_to_the_same_bits(monkeypatch):
    """The last program of a tile reads the split parts one at a time or 8 at once
    (fp8_gemm._sum_group, parts past the count masked): the same additions in the same order."""
    from dsflash.model.kernels import fp8_gemm as gemm

    monkeypatch.setattr(gemm, "INTERPRETER_SPLITS", 3)
    g = _g(21)
    codes, scales = quantize_fp8_weight(torch.randn(300, 256, generator=g))
    xd = torch.randn(6, 256, generator=g).to(DEVICE)
    got = {}
    for from_splits in (16, 2):
        monkeypatch.setattr(gemm, "GROUPED_SUM_SPLITS", from_splits)
        assert gemm._sum_group(gemm._split_k(256, 64, 1, xd.device)[0]) == (1 if from_splits == 16 else 8)
        got[from_splits] = fp8_gemm(xd, codes.to(DEVICE), scales.to(DEVICE)).cpu()
    assert torch.equal(got[16], got[2])
    assert not gemm.tile_counts(xd.device).any()


@pytest.mark.parametrize("m", [1, 5, 6, 16])
def test_split_parts_start_every_16_elements_at_any_row_count(m, monkeypatch):
    """A router's 8-column split parts start every whole 16 elements at any row count, so Triton
    meets one stride kind (fp8_gemm._outputs), and the product over them is right."""
    from dsflash.model.kernels import fp8_gemm as gemm

    monkeypatch.setattr(gemm, "INTERPRETER_SPLITS", 3)
    _, parts, _ = gemm._outputs(m, 8, 3, 1, torch.device(DEVICE))
    assert parts.shape == (3, m, 8) and parts.stride() == (-(-m * 8 // 16) * 16, 8, 1)
    g = _g(m)
    weight, x = torch.randn(8, 256, generator=g).to(DEVICE), torch.randn(m, 256, generator=g).to(DEVICE)
    assert gemm._split_k(256, 64, 1, x.device)[0] > 1
    got = fp32_gemm(x, weight).cpu()
    assert (got - x.cpu() @ weight.cpu().T).abs().max() < REL * 30
    assert not gemm.tile_counts(x.device).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [12, 40])
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(dtype, rows, monkeypatch):
    """Up to 8 rows take 8-column tiles in the decode kernel, up to 16 take 16 (fp8_gemm.NARROW_ROWS),
    and up to SKINNY_ROWS 16 a program: a request's verify block alone (6 rows) and in a batch
    (12, 40) must give the same sums, bit for bit on the GPU (each column's MMAs run the same K order)."""
    from dsflash.model.kernels import fp8_gemm as gemm

    monkeypatch.setattr(gemm, "SKINNY_ROWS", 64)
    g = _g(5)
    codes, scales = quantize_fp8_weight(torch.randn(320, 256, generator=g))
    codes, scales = codes.to(DEVICE), scales.to(DEVICE)
    x = torch.randn(rows, 256, generator=g).to(DEVICE, dtype)
    alone, batch = fp8_gemm(x[:6], codes, scales).cpu(), fp8_gemm(x, codes, scales).cpu()
    if DEVICE == "cuda":
        assert torch.equal(alone, batch[:6])
    else:  # the interpreter's dots are numpy's, whose order may follow the shape
        assert (alone - batch[:6]).abs().max() <= 1e-6 * alone.abs().max()


@pytest.mark.parametrize("act_quant", [False, True])
def test_weights_of_one_input_run_as_one_gemm(act_quant):
    """TritonOps.linear_many: FP8 weights of one input width as one GEMM whose output splits
    into each weight's (up to the order of the sums: tiles and split-K follow the output
    width), each weight then a view of its rows in the merged bytes; a bf16 weight among them
    keeps them apart."""
    g = _g(11)
    weights = {name: Fp8Weight(*quantize_fp8_weight(torch.randn(rows, 96, generator=g)), (32, 32))
               for name, rows in (("a", 64), ("b", 32), ("c", 96))}
    weights["d"] = torch.randn(16, 96, generator=g).to(torch.bfloat16)
    ops = TritonOps(weights, act_quant=act_quant, device=DEVICE)
    x = torch.randn(6, 96, generator=g).to(DEVICE)
    alone = [ops.linear(x, name).cpu() for name in ("a", "b", "c")]
    together = ops.linear_many(x, ("a", "b", "c"))
    for one, merged in zip(alone, together):
        assert merged.shape == one.shape and (merged.cpu() - one).abs().max() <= 1e-6 * one.abs().max()
    merged_bytes = ops._merged[("a", "b", "c")][0]
    assert ops._fp8("b")[0].weight.data_ptr() == merged_bytes.data_ptr() + 64 * 96
    if DEVICE == "cpu":  # a store on the kernels' device holds views too: no second copy anywhere
        assert weights["b"].weight.data_ptr() == merged_bytes.data_ptr() + 64 * 96
    assert torch.equal(ops.linear(x, "b").cpu(), ops.linear_many(x, ("b",))[0].cpu())  # one weight: as it is
    mixed = ops.linear_many(x, ("a", "d"))
    assert ops._merged[("a", "d")] is False and torch.equal(mixed[1].cpu(), ops.linear(x, "d").cpu())


@pytest.mark.parametrize("m", [1, 6, 37])
def test_bf16_gemm_matches_the_fp32_product_of_the_upcast_weight(m):
    g = _g(m)
    weight = torch.randn(96, 160, generator=g).to(torch.bfloat16)
    x = torch.randn(m, 160, generator=g) * torch.logspace(-3, 3, 160)  # parts of very different size
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        got = bf16_gemm(xd.to(DEVICE), weight.to(DEVICE)).cpu()
        ref = xd.float() @ weight.float().T
        assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-5


@pytest.mark.parametrize("m, rows", [(1, 32), (6, 32), (37, 64)])  # 37: the tile kernel
def test_grouped_fp8_gemm_is_block_diagonal(m, rows):
    """Group g's rows see only x's g-th 64 columns: the attention output's wo_a."""
    g = _g(m)
    codes, scales = quantize_fp8_weight(torch.randn(4 * rows, 64, generator=g))
    x = torch.randn(m, 4 * 64, generator=g)
    got = grouped_fp8_gemm(x.to(DEVICE), codes.to(DEVICE), scales.to(DEVICE), 4).cpu()
    dense = dequantize_fp8_weight(codes, scales).view(4, rows, 64)
    ref = torch.einsum("tgi,gri->tgr", x.view(m, 4, 64), dense).reshape(m, -1)
    assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-5


def test_grouped_fp8_gemm_declines_groups_no_tile_fits():
    codes, scales = quantize_fp8_weight(torch.randn(4 * 32, 64, generator=_g()))
    assert grouped_fp8_gemm(torch.randn(17, 4 * 64).to(DEVICE), codes.to(DEVICE), scales.to(DEVICE), 4) is None


@pytest.mark.parametrize("T, H", [(5, 300), (3, 5120)])  # a masked row block; the release's width
def test_the_engram_gate_in_one_launch_matches_the_reference(T, H, monkeypatch):
    """engram_gate.engram_gated (one launch) against layers/engram_gate.py's torch ops, with the
    key and value as views of one projection's rows (as engram_mix takes them): to fp32's
    accuracy, a key of zeros among them (its dot exactly 0: the gate of copysign's +0; a sum of
    zeros is +0 in both forms); TritonOps takes it only with FUSED."""
    from dsflash.model.kernels import engram_gate
    from dsflash.model.layers.engram_gate import engram_gated

    g = _g(T)
    S = 4
    X = torch.randn(T, S, H, generator=g) * 2
    kv = torch.randn(T, (S + 1) * H, generator=g)
    kv[1, :H] = 0.0  # token 1's first key: its dot +0
    key, value = kv[:, : S * H].view(T, S, H), kv[:, S * H:]
    wqk = torch.randn(S, H, generator=g)
    want = engram_gated(X, key, value, wqk, 1e-6)
    dev = kv.to(DEVICE)
    args = (X.to(DEVICE), dev[:, : S * H].view(T, S, H), dev[:, S * H:], wqk.to(DEVICE), 1e-6)
    got = engram_gate.engram_gated(*args).cpu()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    calls = []
    monkeypatch.setattr(engram_gate, "engram_gated", lambda *a: calls.append(1) or want.to(DEVICE))
    ops = TritonOps({}, device=DEVICE)
    for fused in (False, True):
        monkeypatch.setattr(engram_gate, "FUSED", fused)
        ops.engram_gated(*args)
    assert calls == [1]


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("N", [48, 130])  # a router's outputs; two column blocks, the second partly masked
def test_tall_bf16_product_keeps_fp32_accuracy(N, raw, monkeypatch):
    """tall_bf16.product (a prefill chunk's fp32 rows times a bf16 weight: the routers', the
    compressors') against the float64 product: within fp32's accuracy over 5,000 columns, rows
    and columns past a tile masked. `raw`: its two TF32 passes put together as on the GPU (the
    interpreter computes a TF32 dot in full fp32, so it checks the passes' sum there)."""
    from dsflash.model.kernels import tall_bf16

    if raw and interpreting():
        monkeypatch.setattr(common, "_SPLIT_ONE", tl.constexpr(True))
    g = _g(N)
    x = torch.randn(200, 5000, generator=g) * 3  # (5,000 columns: a partly masked last K step)
    weight = (torch.randn(N, 5000, generator=g) / 70).to(torch.bfloat16)
    want = x.double() @ weight.double().T
    got = tall_bf16.product(x.to(DEVICE), weight.to(DEVICE), dict(BLOCK_M=64)).cpu().double()
    assert (got - want).abs().max() < 2e-6 * want.abs().max()


def test_prefill_rows_against_a_small_bf16_weight_take_the_tall_kernel(monkeypatch):
    """TritonOps.linear: from tall_bf16.ROWS rows on a GPU, fp32 rows against a bf16 weight of
    up to tall_bf16.OUTPUTS outputs take tall_bf16.product; bf16 rows and wider weights do not.
    (Under the interpreter `takes` says no: the GPU's test is the device's.)"""
    from dsflash.model.kernels import tall_bf16

    if DEVICE == "cpu":
        pytest.skip("needs a CUDA device (tall_bf16.takes: the model's rows take it on a GPU only)")
    monkeypatch.setattr(tall_bf16, "ROWS", 32)
    calls = []
    product = tall_bf16.product
    monkeypatch.setattr(tall_bf16, "product", lambda *a, **k: calls.append(a[1].shape) or product(*a, **k))
    g = _g(13)
    weights = {"router": torch.randn(48, 256, generator=g).to(torch.bfloat16),
               "wide": torch.randn(2048, 256, generator=g).to(torch.bfloat16)}
    ops = TritonOps(weights, device=DEVICE)
    x = torch.randn(2, 20, 256, generator=g)
    got = ops.linear(x.to(DEVICE), "router").cpu()
    assert calls == [(48, 256)] and got.shape == (2, 20, 48)
    assert torch.allclose(got, x @ weights["router"].float().T, rtol=1e-5, atol=1e-4)
    ops.linear(x[:1, :20].to(DEVICE), "router")  # 20 rows
    ops.linear(x.to(DEVICE).to(torch.bfloat16), "router")
    ops.linear(x.to(DEVICE), "wide")
    assert calls == [(48, 256)]


@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("m", [1, 16, 40])
def test_fp32_gemm_matches_the_fp32_product(m, heads, monkeypatch):
    """The decode rows' fp32 product (the mHC mixes: the skinny kernel), its dots in Triton's
    tf32x3 or in common.dot_fp32's masked heads (common.TF32_HEADS): to fp32's accuracy."""
    monkeypatch.setattr(common, "TF32_HEADS", heads)
    g = _g(m)
    weight, x = torch.randn(24, 2048, generator=g), torch.randn(m, 2048, generator=g)
    got = fp32_gemm(x.to(DEVICE), weight.to(DEVICE)).cpu()
    ref = x.double() @ weight.double().T
    assert (got - ref).abs().max() < 2e-6 * ref.abs().max()


@pytest.mark.parametrize("m", [6, 40])  # the skinny kernel, the tile kernel
def test_exact_fp8_products_keep_fp32_accuracy_over_long_rows(m):
    """Exact mode's FP8-weight products (fp32 activations as three bf16 parts, each part's dot
    chained into the running sum on the tensor cores) over 16,384 columns, against the float64
    product: within fp32's accuracy. In a numpy model of these sums (16 columns a step, each
    part's step added to the fp32 sum) adds that round to nearest leave 1.6e-6 of the largest
    result, adds that truncate 6.7e-5 (a bias)."""
    g = _g(m + 100)
    codes, scales = quantize_fp8_weight(torch.randn(64, 16384, generator=g))
    x = torch.randn(m, 16384, generator=g) * 3
    got = fp8_gemm(x.to(DEVICE), codes.to(DEVICE), scales.to(DEVICE)).cpu().double()
    want = x.double() @ dequantize_fp8_weight(codes, scales).double().T
    assert (got - want).abs().max() < 1e-5 * want.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_weight_gemms_give_a_row_the_same_bits_at_any_row_count(monkeypatch, dtype):
    """The mHC mixes (fp32 weights) and the routers (bf16) of a decode batch: 16 rows a
    program, and each row summed as when alone (a batch equals its requests run alone); past
    FP32_SKINNY_ROWS torch takes the fp32 ones, past BF16_SKINNY_ROWS the tile kernel the bf16."""
    from dsflash.model.kernels import fp8_gemm as gemm

    monkeypatch.setattr(gemm, "INTERPRETER_SPLITS", 3)  # the split parts' sum too
    g = _g(48)
    weight, x = torch.randn(24, 640, generator=g).to(DEVICE, dtype), torch.randn(40, 640, generator=g).to(DEVICE)
    product = gemm.fp32_gemm if dtype == torch.float32 else gemm.bf16_gemm
    together = product(x, weight)
    alone = torch.cat([product(x[i:i + 6], weight) for i in range(0, 40, 6)])
    if DEVICE == "cuda":
        assert torch.equal(together, alone)
    else:  # the interpreter's dots are numpy's, whose order may follow the shape
        assert (together - alone).abs().max() <= 1e-6 * alone.abs().max()
    assert not gemm.tile_counts(x.device).any()
    monkeypatch.setattr(gemm, "FP32_SKINNY_ROWS", 16)
    monkeypatch.setattr(gemm, "BF16_SKINNY_ROWS", 16)
    ref = x @ weight.float().T
    if dtype == torch.float32:
        assert torch.equal(product(x, weight), ref)
    else:
        assert (product(x, weight) - ref).abs().max() < REL * ref.abs().max() + 1e-5


def test_byte_words_views_whole_aligned_words_only():
    t = torch.arange(48, dtype=torch.uint8).view(4, 12)
    words = common.byte_words(t)
    assert words.shape == (4, 3) and words[1, 0].item() == 12 | 13 << 8 | 14 << 16 | 15 << 24
    assert common.byte_words(t[:, :10].contiguous()) is None  # 10 bytes a row: not whole words
    assert common.byte_words(t[:, 1:9]) is None  # starts off a word
    assert common.byte_words(t[:, 4:12]).shape == (4, 2)


def test_fp8_gemm_of_no_rows_is_empty():
    codes, scales = quantize_fp8_weight(torch.randn(64, 64, generator=_g()))
    assert fp8_gemm(torch.zeros(0, 64, device=DEVICE), codes.to(DEVICE), scales.to(DEVICE)).shape == (0, 64)


@pytest.mark.parametrize("scale", [130, 140])  # 140: past the one-multiply decoder's range
@pytest.mark.parametrize("rows", [32, 16, 8])  # 16, 8: the transposed decode kernel
def test_fp8_gemm_decodes_every_code_exactly(scale, rows):
    codes = torch.arange(256, dtype=torch.uint8).view(8, 32).repeat_interleave(4, 0)
    codes[(codes == 0x7F) | (codes == 0xFF)] = 0  # the two NaN codes
    scales = torch.tensor([[scale]], dtype=torch.uint8)
    eye = torch.eye(32)
    got = torch.cat([fp8_gemm(eye[r:r + rows].to(DEVICE), codes.to(DEVICE), scales.to(DEVICE)).cpu()
                     for r in range(0, 32, rows)])
    assert torch.equal(got, fp8_gemm_ref(eye, codes, scales))


@triton.jit
def _decode_quads_kernel(units_ptr, exps_ptr, out_ptr, PTX: tl.constexpr, SMALL: tl.constexpr):
    at = tl.arange(0, 8)[:, None] * 32 + tl.arange(0, 32)[None, :]
    values = e2m1_quads(tl.load(units_ptr + at), quad_scales(tl.load(exps_ptr + at), PTX, SMALL), PTX, SMALL)
    for t in tl.static_range(4):
        tl.store(out_ptr + at * 4 + t, values[t].to(tl.float32))


def test_quad_units_hold_every_code_of_their_bytes_once():
    """Each code's four bits go to their own places (QUAD_PLACES covers the 16 bits once), and
    reading them back gives the checkpoint's bytes: the same bytes, rearranged."""
    assert sorted(p for places in QUAD_PLACES for p in places) == list(range(16))
    packed = torch.randint(0, 256, (3, 5, 40), generator=_g(8), dtype=torch.uint8)
    units = quad_units(packed).to(torch.int32) & 0xFFFF
    assert units.shape == (3, 5, 20)
    codes = torch.stack([sum(((units >> p) & 1) << bit for bit, p in enumerate(places)) for places in QUAD_PLACES], -1)
    codes = codes.reshape(3, 5, 40, 2)
    assert torch.equal((codes[..., 0] | codes[..., 1] << 4).to(torch.uint8), packed)


@pytest.mark.parametrize("small", [True, False])
def test_e2m1_quads_decode_every_code_at_every_scale_range(small):
    """Every code at every place of a unit, times scales from 2^-127 (e = 0 reads as 0) to 2^73
    (2^-126 to 2 with small, the one-multiply decoder): exactly the reference dequantization
    (on the GPU through the PTX decoder, whose code 1 passes through a subnormal)."""
    exps = torch.tensor([0 if not small else 3, 1, 2, 60, 119, 127, 128, 200 if not small else 126], dtype=torch.uint8)
    codes = (torch.arange(32 * 4).view(32, 4) * 3 + torch.arange(4)) % 16  # each place sees every code
    packed = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8).reshape(1, 64)  # columns 4c + t
    units = quad_units(packed).repeat(8, 1)
    per_unit = exps[:, None].expand(8, 32).to(torch.int32).contiguous()
    out = torch.empty(8, 32 * 4, device=DEVICE)
    _decode_quads_kernel[(1,)](units.to(DEVICE), per_unit.to(DEVICE), out, PTX=not interpreting(), SMALL=small)
    ref = torch.stack([dequantize_fp4_weight(packed, exps[r:r + 1, None].repeat(1, 4))[0] for r in range(8)])
    if not small:
        ref[0] = 0.0
    assert torch.equal(out.cpu(), ref)


def test_the_one_multiply_expert_decoder_takes_scales_of_2_to_the_minus_126_to_2():
    """small_scales: bytes 1..128. A byte of 0 (read as 0) or past 128 takes the two-multiply
    decoder: the one-multiply one has no test for 0, and 2^(e-1) would overflow bf16's range."""
    from dsflash.model.kernels.fp4_moe import small_scales

    assert small_scales(torch.tensor([1, 60, 128], dtype=torch.uint8), torch.tensor([], dtype=torch.uint8))
    assert not small_scales(torch.tensor([0, 60], dtype=torch.uint8))
    assert not small_scales(torch.tensor([60], dtype=torch.uint8), torch.tensor([129], dtype=torch.uint8))


def test_bf16_parts_sum_to_the_fp32_values():
    x = torch.randn(7, 64, generator=_g(3)) * torch.logspace(-20, 20, 64)
    assert torch.equal(bf16_parts(x, 3).double().sum(0), x.double())


@triton.jit
def _bf16_heads_kernel(x_ptr, out_ptr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    head = common.bf16_head(x)
    middle = common.bf16_head(x - head)
    tl.store(out_ptr + tl.arange(0, N), head)  # three stores: Triton's compiler has no enumerate
    tl.store(out_ptr + N + tl.arange(0, N), middle)
    tl.store(out_ptr + 2 * N + tl.arange(0, N), x - head - middle)


def test_bf16_heads_cut_fp32_values_into_three_exact_bf16_parts():
    """The decode kernel's cut of its activations (fp8_gemm._three_bf16_parts): two bf16_heads
    and the rest, each exact in bf16, summing to the value exactly, at any magnitude and sign."""
    x = torch.randn(256, generator=_g(4)) * torch.logspace(-30, 30, 256)
    x[:4] = torch.tensor([0.0, -0.0, 1.0 + 2.0 ** -23, -(2.0 - 2.0 ** -23)])
    out = torch.empty(3, 256, device=DEVICE)
    _bf16_heads_kernel[(1,)](x.to(DEVICE), out, N=256)
    parts = out.cpu()
    assert torch.equal(parts.to(torch.bfloat16).float(), parts)
    assert torch.equal(parts.double().sum(0), x.double())


@pytest.mark.parametrize("splits, interleave", [(3, 1), (2, 2), (3, 8)])
def test_bf16_parts_kernel_equals_the_torch_form(splits, interleave):
    """The one-launch split (the GPU's) against torch's, bit for bit, columns regrouped alike."""
    x = torch.randn(5, 3, 64, generator=_g(4)) * torch.logspace(-8, 8, 64)
    x = x[:, 1:]  # rows not end to end
    got = bf16_parts_kernel(x.to(DEVICE), splits, interleave).cpu()
    ref = bf16_parts(x, splits, interleave)
    assert got.shape == ref.shape == (splits, 5, 2, 64) and torch.equal(got.view(torch.int16), ref.view(torch.int16))
    column = torch.arange(64).view(-1, interleave).T.reshape(-1)  # where each regrouped column came from
    assert torch.equal(ref.double().sum(0), x.double()[..., column]) or splits < 3


def _moe_case(g, T, E, H, inter, k):
    """E random FP4 experts (stacked w13 codes, scales, w2 codes, scales: the checkpoint's
    bytes), T tokens and their k experts each with routing weights."""
    w13 = [quantize_fp4_weight(torch.randn(2 * inter, H, generator=g) / 6) for _ in range(E)]
    w2 = [quantize_fp4_weight(torch.randn(H, inter, generator=g) / 6) for _ in range(E)]
    stack = [torch.stack([w[i] for w in ws]) for ws in (w13, w2) for i in (0, 1)]
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    return stack, x, idx, torch.rand(T, k, generator=g)


def _device_experts(stack):
    """_moe_case's experts as fp4_moe takes them, on the device."""
    return quad_experts(*[t.to(DEVICE) for t in stack])


# Block heights: 2, 4, 8 and 16 pairs (their parts as columns; 8 chosen for 11 x 3 pairs over
# 5 experts), 64 tall rows; small: the one-multiply decoder (these scales allow it) or the general one.
@pytest.mark.parametrize("T, block_m, small", [(1, None, None), (11, 4, True), (11, 2, True), (11, None, False),
                                               (11, 16, True), (30, 64, None)])
def test_fp4_moe(T, block_m, small):
    stack, x, idx, weights = _moe_case(_g(1), T, E=5, H=64, inter=96, k=3)
    ref = fp4_moe_ref(x, idx, weights, *stack, 0.7)
    got = fp4_moe(x.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7,
                  block_m=block_m, small=small).cpu()
    assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-6


@pytest.mark.parametrize("block_m", [None, 64])
def test_fp4_moe_leaves_out_the_pairs_of_another_ranks_experts(block_m):
    """Ids from E on are another rank's experts (fast_ops.routed_experts): those pairs add
    nothing, as if their routing weight were 0, though no row of theirs is ever written."""
    stack, x, idx, weights = _moe_case(_g(8), 11, E=5, H=64, inter=96, k=3)
    elsewhere = torch.rand(idx.shape, generator=_g(9)) < 0.3
    ref = fp4_moe_ref(x, idx, torch.where(elsewhere, 0.0, weights), *stack, 0.7)
    got = fp4_moe(x.to(DEVICE), torch.where(elsewhere, 5, idx).to(DEVICE), weights.to(DEVICE),
                  *_device_experts(stack), 0.7, block_m=block_m).cpu()
    assert elsewhere.any() and (got - ref).abs().max() < REL * ref.abs().max() + 1e-6


def test_pair_sums_add_a_tokens_rows_in_pair_order_and_skip_the_rest():
    """own_pair_sums: token t's row t*k + j where its id is below the expert count; the rows of
    the others (never written: here NaN) are not read into the sum. pair_sums: rows by place."""
    from dsflash.model.kernels.pair_sums import own_pair_sums, pair_sums

    g = _g(10)
    T, k, H = 5, 3, 1100  # H past one 1,024-column block
    rows = torch.randn(T * k, H, generator=g)
    ids = torch.randint(0, 6, (T, k), generator=g)
    ids[0] = 7  # a token with every pair elsewhere: zeros
    kept = ids < 6
    rows[~kept.reshape(-1)] = float("nan")
    want = torch.zeros(T, H)
    for j in range(k):  # in pair order, as the kernel adds them
        want += torch.where(kept[:, j, None], rows.view(T, k, H)[:, j], 0.0)
    assert torch.equal(own_pair_sums(rows.to(DEVICE), ids.to(DEVICE), 6).cpu(), want)
    place = torch.where(kept, torch.arange(T * k).view(T, k), -1)
    assert torch.equal(pair_sums(rows.to(DEVICE), place.to(DEVICE)).cpu(), want)
    plus = torch.randn(T, H, generator=g)  # the shared expert's output, added after the pairs: its add's bits
    assert torch.equal(pair_sums(rows.to(DEVICE), place.to(DEVICE), plus.to(DEVICE)).cpu(), want + plus)


@pytest.mark.parametrize("T, block_m, step", [(11, 64, 8), (30, 64, 32)])
def test_tall_expert_blocks_read_their_scales_as_words_or_bytes_alike(T, block_m, step, monkeypatch):
    """Tile shapes marked SCALE_WORDS (faithful prefill's) read their scales as int32 words
    (loads the pipeliner prefetches): one word holds a step's scale (8 units a step) or four
    of them (32). The same sums as byte loads, and the reference's."""
    from dsflash.model.kernels import fp4_moe as moe

    tiles = dict(BLOCK_N=64, BLOCK_KU=step, SCALE_WORDS=True)
    monkeypatch.setitem(moe.TILES, "interpreter", tiles)
    stack, x, idx, weights = _moe_case(_g(5), T, E=3, H=128, inter=128, k=2)
    stack[1] = (stack[1].int() + torch.randint(-3, 4, stack[1].shape, generator=_g(6))).to(torch.uint8)
    got = {}
    for words in (True, False):
        monkeypatch.setattr(moe, "SCALE_WORDS", words)
        got[words] = fp4_moe(x.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7,
                             block_m=block_m).cpu()
    ref = fp4_moe_ref(x, idx, weights, *stack, 0.7)
    for words in (True, False):
        assert (got[words] - ref).abs().max() < REL * ref.abs().max() + 1e-6
    assert torch.equal(got[True], got[False]) or DEVICE == "cuda"


@pytest.mark.parametrize("vectors", [True, False])
def test_expert_steps_without_column_masks_match_the_reference(vectors, monkeypatch):
    """K of whole steps and 16-byte aligned activation columns drop the column masks
    (fp4_moe.VECTOR_LOADS); where K is not whole steps the masks stay, and both are right."""
    from dsflash.model.kernels import fp4_moe as moe

    monkeypatch.setattr(moe, "VECTOR_LOADS", vectors)
    assert moe._vectors(16, 4, 384, 16, 8) == vectors and not moe._vectors(18, 4, 384, 16, 8)
    assert not moe._vectors(16, 4, 384, 12, 8)  # a column off 16 bytes
    stack, x, idx, weights = _moe_case(_g(7), 1, E=4, H=128, inter=96, k=3)
    got = fp4_moe(x.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7).cpu()
    ref = fp4_moe_ref(x, idx, weights, *stack, 0.7)
    assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-6


def test_mma_sync_sets_the_compile_switch_only_for_the_kernels_named(monkeypatch):
    """DISABLE_MMA_V3 inside the block for a named kernel, and gone after it (also on an
    error); other kernels, and a variable the user set, are left alone."""
    import os

    monkeypatch.delenv("DISABLE_MMA_V3", raising=False)
    monkeypatch.setattr(common, "MMA_SYNC", frozenset({"decode_gemm"}))
    with common.mma_sync("decode_gemm"):
        assert os.environ["DISABLE_MMA_V3"] == "1"
    with common.mma_sync("short_experts"):
        assert "DISABLE_MMA_V3" not in os.environ
    with common.mma_sync("a_bench_form", on=True):  # `on` decides in place of the names
        assert os.environ["DISABLE_MMA_V3"] == "1"
    with common.mma_sync("decode_gemm", on=False):
        assert "DISABLE_MMA_V3" not in os.environ
    assert "DISABLE_MMA_V3" not in os.environ
    with pytest.raises(ValueError), common.mma_sync("decode_gemm"):
        raise ValueError
    assert "DISABLE_MMA_V3" not in os.environ
    monkeypatch.setenv("DISABLE_MMA_V3", "0")
    with common.mma_sync("decode_gemm"):
        assert os.environ["DISABLE_MMA_V3"] == "0"
    assert os.environ["DISABLE_MMA_V3"] == "0"


def test_expert_blocks_grow_later_where_every_dot_runs_three_times():
    """2-row blocks below 1 pair an expert (batch 1); three activation parts (exact mode) take
    4-row ones below 4, short blocks of 8 pairs, of 16 from 8 pairs an expert and 64 tall rows
    from 32; one part (faithful mode's FP8-grid inputs) the same heights from 1 pair an expert
    but tall blocks of 8 where three take 4."""
    from dsflash.model.kernels.fp4_moe import parts_as_columns

    pairs = (36, 72, 144, 192, 288, 384, 1152, 1536)
    assert [fp4_moe_block_height(p, 48, 3) for p in pairs] == [2, 4, 4, 8, 8, 16, 16, 64]
    assert [fp4_moe_block_height(p, 48, 1) for p in (36, 144, 192, 288, 768, 1536, 2304)] == [2, 8, 8, 8, 16, 64, 64]
    assert [parts_as_columns(m, 3) for m in (2, 4, 8, 16, 64)] == [True] * 4 + [False]
    assert [parts_as_columns(m, 1) for m in (2, 4, 8, 16, 64)] == [True, True, False, False, False]


@pytest.mark.parametrize("on_grid", [False, True])
@pytest.mark.parametrize("T", [1, 11, 30])
def test_fp4_moe_rounds_the_down_projections_input_in_faithful_mode(T, on_grid):
    """act_quant: the expert's activation (weighted SwiGLU) is rounded onto the FP8 grid in
    blocks of 32 before w2, as the reference's faithful mode does. on_grid: x comes as
    TritonOps.gemm_input gives it (FP8 values in bf16), which takes the one-part dots."""
    stack, x, idx, weights = _moe_case(_g(2), T, E=4, H=64, inter=64, k=2)
    if on_grid:
        x = fake_quant_fp8(x).to(torch.bfloat16)
    faithful, plain = (fp4_moe_ref(x, idx, weights, *stack, 0.7, act_quant=a) for a in (True, False))
    got = fp4_moe(x.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7,
                  act_quant=True).cpu()
    scale = faithful.abs().max()
    assert (faithful - plain).abs().max() > 1e-3 * scale  # the rounding shows
    # An activation within rounding noise of an FP8 midpoint may round the other way (it did
    # once at 30 tokens: one token's outputs moved by 2e-4): one token at most, by one FP8 step.
    off = (got - faithful).abs().amax(-1) >= REL * scale + 1e-6
    assert off.sum() <= 1 and (got - faithful).abs().max() < 2e-3 * scale


@pytest.mark.parametrize("T", [1, 11])
def test_fp4_moe_rounding_its_own_input_gives_the_same_bits(T):
    """round_input (faithful mode's decode rows): fp4_moe rounds fp32 x onto the FP8 grid in the
    launch that lays out its pieces (fp8_grid_bf16 with pieces), where TritonOps took
    gemm_input's launch and then bf16_parts' copy: the same values, so the same bits."""
    from dsflash.model.kernels.common import group_columns

    stack, x, idx, weights = _moe_case(_g(3), T, E=4, H=64, inter=64, k=2)
    xd, experts = x.to(DEVICE), _device_experts(stack)
    assert torch.equal(fp8_grid_bf16(xd, pieces=4), group_columns(fp8_grid_bf16(xd), 4))
    args = (idx.to(DEVICE), weights.to(DEVICE), *experts, 0.7)
    assert torch.equal(fp4_moe(xd, *args, act_quant=True, round_input=True),
                       fp4_moe(fp8_grid_bf16(xd), *args, act_quant=True))


def test_hc_gates_match_the_sinkhorn_reference():
    g = _g(4)
    S, T = 4, 9
    mixes = torch.randn(T, (2 + S) * S, generator=g) * 3
    base, scale = torch.randn((2 + S) * S, generator=g), torch.rand(3, generator=g) + 0.5
    ref = mhc.hc_gates(mixes, base, scale, 20, 1e-6)
    got = hc_gates(mixes.to(DEVICE), base.to(DEVICE), scale.to(DEVICE), 20, 1e-6)
    for r, o in zip(ref, got):
        assert torch.allclose(o.cpu(), r, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got[2].sum(-2).cpu(), torch.ones(T, S), atol=1e-4)  # columns of comb sum to 1


@pytest.mark.parametrize("H", [64, 300])  # 300: a partial column block, and a row shorter than its block
def test_hc_stream_kernels_match_the_torch_forms(H):
    g = _g(5)
    T, S = 7, 4
    X = torch.randn(T, S, H, generator=g) * 3
    y, weight = torch.randn(T, H, generator=g), torch.rand(H, generator=g) + 0.5
    pre, post = torch.rand(T, S, generator=g), 2 * torch.rand(T, S, generator=g)
    comb = torch.softmax(torch.randn(T, S, S, generator=g), dim=-1)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    got = hc_streams.hc_expand(dev(y), dev(X), dev(post), dev(comb)).cpu()
    assert torch.allclose(got, mhc.hc_expand(y, X, post, comb), rtol=1e-5, atol=1e-5)
    for w in (weight, None):
        got = hc_streams.hc_collapse_norm(dev(X), dev(pre), None if w is None else dev(w), 1e-20).cpu()
        assert torch.allclose(got, rms_norm(mhc.hc_collapse(X, pre), w, 1e-20), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T, H", [(7, 64), (40, 300)])  # 40 rows: a partly masked second row block
def test_hc_mixes_kernel_projects_the_streams_then_scales(T, H):
    """The mixes in one pass over the streams ((flat(X) @ fn^T) * rsqrt(mean(flat(X)^2) + eps),
    the spec's order) agree with RMSNorm then the projection (layers/mhc.py) to fp32's accuracy,
    and a common scale of the streams leaves them unchanged. (The model-level dispatch:
    test_prefill_gemms.py.)"""
    g = _g(9)
    S, N = 4, 24
    X = torch.randn(T, S, H, generator=g) * 3
    fn = torch.randn(N, S * H, generator=g) / (S * H) ** 0.5
    want = mhc.hc_mixes(X, fn, 1e-6)
    got = hc_streams.hc_mixes(X.to(DEVICE), fn.to(DEVICE), 1e-6).cpu()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    split = hc_streams.hc_mixes(X.to(DEVICE), fn.to(DEVICE), 1e-6, dict(SPLITS=3, BLOCK_K=32)).cpu()
    assert torch.allclose(split, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(hc_streams.hc_mixes((X * 1024).to(DEVICE), fn.to(DEVICE), 1e-6).cpu(), got, rtol=1e-5,
                          atol=1e-5)


def _mhc_site(g: torch.Generator, T: int, H: int) -> tuple:
    """An mHC site's inputs, 4 streams and 24 mixes: (S, N, X, y, post, comb, fn, base, scale)."""
    S, N = 4, 24
    X = torch.randn(T, S, H, generator=g) * 3
    y = torch.randn(T, H, generator=g)
    post = 2 * torch.rand(T, S, generator=g)
    comb = torch.softmax(torch.randn(T, S, S, generator=g), dim=-1)
    fn = torch.randn(N, S * H, generator=g) / (S * H) ** 0.5
    return S, N, X, y, post, comb, fn, torch.randn(N, generator=g), torch.rand(3, generator=g) + 0.5


FP32_DOTS = ["tf32x3", "heads", "raw"]


def _fp32_dots(monkeypatch, form: str) -> None:
    """The mixes' dots in Triton's tf32x3, common.dot_fp32's three TF32 passes of masked heads
    (TF32_HEADS) or dot_fp32_raw's of the operands as they lie (RAW_HEADS); in the interpreter,
    which computes a TF32 dot in full fp32, the latter two check how the passes are put
    together (on the GPU the tensor cores round as they do in serving)."""
    monkeypatch.setattr(common, "TF32_HEADS", form == "heads")
    monkeypatch.setattr(common, "RAW_HEADS", form == "raw")
    monkeypatch.setattr(hc_streams, "RAW_HEADS_AT_DECODE", form == "raw")
    if form != "tf32x3" and interpreting():
        monkeypatch.setattr(common, "_SPLIT_ONE", tl.constexpr(True))


@pytest.mark.parametrize("form", ["tf32x3", "raw"])
@pytest.mark.parametrize("T, H", [(6, 64), (20, 300)])  # 20 rows: a partly masked second token block
def test_an_expand_with_the_next_sites_mixes_matches_expand_then_mix(T, H, form, monkeypatch):
    """hc_streams.hc_expand_mix_parts then hc_gates_from_parts (a decode row's FFN site: two
    launches) against hc_expand, then RMSNorm, the projection and the gates (layers/mhc.py);
    each token's gates do not depend on the other tokens of the launch. Its dots in Triton's
    tf32x3 and in the raw heads (_fp32_dots)."""
    from dsflash.model.kernels.hc_gates import hc_gates_from_parts

    _fp32_dots(monkeypatch, form)
    g = _g(10)
    S, N, X, y, post, comb, fn, base, scale = _mhc_site(g, T, H)
    want_X = mhc.hc_expand(y, X, post, comb)
    want = mhc.hc_mix(want_X, fn, base, scale, 20, 1e-6, 1e-6)
    dev = lambda t: t.to(DEVICE)  # noqa: E731

    def fused(rows):
        streams, parts, squares = hc_streams.hc_expand_mix_parts(dev(y[rows]), dev(X[rows]), dev(post[rows]),
                                                                 dev(comb[rows]), dev(fn))
        gates = hc_gates_from_parts(parts, squares, N, S * H, dev(base), dev(scale), 20, 1e-6, 1e-6)
        return streams.cpu(), [g.cpu() for g in gates]
    got_X, got = fused(slice(None))
    assert torch.allclose(got_X, want_X, rtol=1e-5, atol=1e-5)
    for r, o in zip(want, got):
        assert torch.allclose(o, r, rtol=1e-5, atol=1e-6)
    alone_X, alone = fused(slice(2, 3))
    assert torch.equal(alone_X, got_X[2:3]) and all(torch.equal(a, o[2:3]) for a, o in zip(alone, got))


@pytest.mark.parametrize("form", FP32_DOTS)
def test_the_mixes_dots_in_tf32_passes_give_the_fp32_mixes(monkeypatch, form):
    """hc_streams.hc_mixes with its dots in each form (_fp32_dots) against the float64 product,
    at a release row's 20,480 columns: within fp32's accuracy each way."""
    _fp32_dots(monkeypatch, form)
    g = _g(12)
    X = torch.randn(40, 4, 5120, generator=g) * 3
    fn = torch.randn(24, 4 * 5120, generator=g) / (4 * 5120) ** 0.5
    x = X.flatten(-2).double()
    want = (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)) @ fn.double().T
    got = hc_streams.hc_mixes(X.to(DEVICE), fn.to(DEVICE), 1e-6).cpu().double()
    assert (got - want).abs().max() < 2e-6 * want.abs().max()


@pytest.mark.parametrize("form", FP32_DOTS)
@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("T, H", [(6, 64), (40, 300)])  # 40 rows: a partly masked last token block
def test_a_site_in_one_pass_gives_its_streams_mixes_and_input(T, H, expand, form, monkeypatch):
    """hc_streams.hc_site (a prefill site: its streams read once), with and without the expand
    before it, against hc_expand, hc_mixes and hc_collapse_norm of the same streams
    (layers/mhc.py): the new streams to the bit of the expand kernel; the mixes and the input
    within their sums' reordering (by column block); each token's results do not depend on the
    other tokens of the launch, and other tiles give them within the same reordering. Each
    form of the mixes' dots (_fp32_dots)."""
    _fp32_dots(monkeypatch, form)
    g = _g(11)
    S, N, X, y, post, comb, fn, _, _ = _mhc_site(g, T, H)
    pre = torch.rand(T, S, generator=g) + 0.1
    weight = torch.rand(H, generator=g) + 0.5
    want_X = mhc.hc_expand(y, X, post, comb) if expand else X
    want_mixes = mhc.hc_mixes(want_X, fn, 1e-6)
    want_input = rms_norm(mhc.hc_collapse(want_X, pre), weight, 1e-6)
    dev = lambda t: t.to(DEVICE)  # noqa: E731

    def one_pass(rows, tiles=None, w=weight):
        outs = hc_streams.hc_site(dev(X[rows]), dev(fn), 1e-6, dev(pre[rows]), None if w is None else dev(w), 1e-6,
                                  expand=(dev(y[rows]), dev(post[rows]), dev(comb[rows])) if expand else None,
                                  tiles=tiles)
        return [o.cpu() for o in outs]
    got_X, got_mixes, got_input = one_pass(slice(None))
    if expand:
        assert torch.equal(got_X, hc_streams.hc_expand(dev(y), dev(X), dev(post), dev(comb)).cpu())
    assert torch.allclose(got_X, want_X, rtol=1e-5, atol=1e-5)
    assert torch.allclose(got_mixes, want_mixes, rtol=1e-5, atol=1e-5)
    assert torch.allclose(got_input, want_input, rtol=1e-5, atol=1e-5)
    alone = one_pass(slice(2, 3))
    assert all(torch.equal(a, o[2:3]) for a, o in zip(alone, (got_X, got_mixes, got_input)))
    small = one_pass(slice(None), dict(TB=16, BLOCK=16, num_warps=4))  # (the shipped tiles' BLOCK is 32)
    assert torch.allclose(small[1], got_mixes, rtol=1e-5, atol=1e-6)
    assert torch.allclose(small[2], got_input, rtol=1e-5, atol=1e-6)
    unweighted = one_pass(slice(None), w=None)[2]
    assert torch.allclose(unweighted, rms_norm(mhc.hc_collapse(want_X, pre), None, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("tiles", [None, dict(TB=16, BLOCK=16, num_warps=4)])
def test_a_sites_pass_writes_its_inputs_fp8_operand(expand, tiles, monkeypatch):
    """hc_streams.SITE_OPERAND: hc_site filling an empty operand gives its input's FP8 operand to
    the bit of rows_1x128(input, round_first=True), its rows past the tokens zeros under unit
    scales (20 tokens: a partly masked token block, 32 aligned rows), and its other outputs
    unchanged; the shipped tiles and one of 16 tokens."""
    from dsflash.model.kernels import fp8_blockwise

    monkeypatch.setattr(hc_streams, "SITE_OPERAND", True)
    T, H = 20, 256
    g = _g(12)
    S, N, X, y, post, comb, fn, _, _ = _mhc_site(g, T, H)
    pre = torch.rand(T, S, generator=g) + 0.1
    weight = torch.rand(H, generator=g) + 0.5
    X[3] *= 1e-3  # a token of small values: its blocks' scales differ from the others'
    args = [t.to(DEVICE) for t in (X, fn)] + [1e-6, pre.to(DEVICE), weight.to(DEVICE), 1e-6]
    before = [t.to(DEVICE) for t in (y, post, comb)] if expand else None
    assert hc_streams.encodes_input(H) and not hc_streams.encodes_input(300)
    operand = fp8_blockwise.empty_operand(T, H, 1, torch.device(DEVICE))
    got = hc_streams.hc_site(*args, expand=before, tiles=tiles, operand=operand)
    plain = hc_streams.hc_site(*args, expand=before, tiles=tiles)
    assert all(torch.equal(a, b) for a, b in zip(got, plain))
    codes, scales = fp8_blockwise.rows_1x128(got[2], round_first=True)
    assert torch.equal(operand.codes, codes) and operand.codes[:, T:].eq(0).all() and operand.codes.any()
    rows = codes.shape[1]
    assert torch.equal(operand.scales.view(H // 128, rows)[:, :T], scales.view(H // 128, rows)[:, :T])
    assert operand.scales.view(H // 128, rows)[:, T:].eq(1.0).all()
    # the input left out (keep_input, hc_streams.UNREAD_INPUT_LEFT): the same operand, streams and mixes
    alone = fp8_blockwise.empty_operand(T, H, 1, torch.device(DEVICE))
    streams, mixes, none = hc_streams.hc_site(*args, expand=before, tiles=tiles, operand=alone, keep_input=False)
    assert none is None and torch.equal(streams, got[0]) and torch.equal(mixes, got[1])
    assert torch.equal(alone.codes, operand.codes) and torch.equal(alone.scales, operand.scales)
    with pytest.raises(AssertionError, match="goes somewhere"):
        hc_streams.hc_site(*args, expand=before, tiles=tiles, keep_input=False)


@pytest.mark.parametrize("H", [64, 300, 20480])  # 20480: an mHC mix's S*H row in the release
def test_rms_norm_kernel_matches_the_torch_form(H):
    g = _g(6)
    x = torch.randn(2, 3, H, generator=g) * torch.logspace(-2, 2, H)
    weight = torch.rand(H, generator=g) + 0.5
    for w in (weight, None):
        got = norm_kernel.rms_norm(x.to(DEVICE), None if w is None else w.to(DEVICE), 1e-20).cpu()
        assert got.shape == x.shape and got.dtype == torch.float32
        assert torch.allclose(got, rms_norm(x, w, 1e-20), rtol=1e-5, atol=1e-6)
    assert norm_kernel.rms_norm(torch.zeros(0, H, device=DEVICE), weight.to(DEVICE), 1e-20).shape == (0, H)


@pytest.mark.parametrize("limit", [7.0, 0.0])  # 0: no clamp
def test_clamped_swiglu_kernel_matches_the_torch_form(limit):
    g = _g(7)
    merged = torch.randn(5, 2 * 1300, generator=g) * 6  # the halves of one GEMM's output: row stride 2I
    gate, up = merged[:, :1300], merged[:, 1300:]
    got = swiglu.clamped_swiglu(merged.to(DEVICE)[:, :1300], merged.to(DEVICE)[:, 1300:], limit).cpu()
    assert torch.allclose(got, swiglu.clamped_swiglu_ref(gate, up, limit), rtol=1e-5, atol=1e-6)


def test_clamped_swiglu_takes_row_weights_and_rounds_onto_the_fp8_grid():
    """The routed experts' prefill form (prefill_gemms.fp4_experts): the SwiGLU times each row's
    routing weight, then (faithful mode) each 32 columns on the FP8 grid, in one launch: bit for
    bit the kernel's SwiGLU, torch's product and fp8_grid_bf16 in turn. 1,056 columns: the
    last column tile is partly masked."""
    g = _g(9)
    merged = (torch.randn(6, 2 * 1056, generator=g) * 6).to(DEVICE)
    gate, up = merged[:, :1056], merged[:, 1056:]
    weights = (torch.rand(6, generator=g) * 2).to(DEVICE)
    weights[2] = 0.0  # a pair with no weight
    weighted = swiglu.clamped_swiglu(gate, up, 7.0) * weights[:, None]
    got = swiglu.clamped_swiglu(gate, up, 7.0, row_weights=weights)
    assert got.dtype == torch.float32 and torch.equal(got, weighted)
    got = swiglu.clamped_swiglu(gate, up, 7.0, row_weights=weights, fp8_grid=True)
    want = fp8_grid_bf16(weighted)
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert not torch.equal(got.float(), weighted)  # the rounding is there to see


@pytest.mark.parametrize("E, k", [(48, 6), (256, 8), (5, 1)])
def test_top_experts_pick_as_the_stable_sort(E, k):
    """The router after its GEMM: the same experts in the same order as the stable descending
    sort (ties, planted here, to the lower id) and the same weights, normalized or not, from
    logits in every range softplus treats apart (far below 0, around it, past 20)."""
    g = _g(E)
    logits = torch.randn(9, E, generator=g) * 3
    logits[0, :] = 0.5  # every expert tied
    logits[1, 3] = logits[1, E - 1] = 2.0  # a tie at the top
    logits[2] = torch.linspace(-40, 40, E)
    bias = torch.randn(E, generator=g) * 0.1
    bias[E - 1] = bias[3]
    for normalize in (True, False):
        weights, ids = top_experts(logits.to(DEVICE), 1.5, bias.to(DEVICE), k, normalize, 2.5)
        ref_weights, ref_ids = top_experts_ref(logits, 1.5, bias, k, normalize, 2.5)
        assert ids.dtype == torch.int64 and torch.equal(ids.cpu(), ref_ids)
        assert torch.allclose(weights.cpu(), ref_weights, rtol=2e-6, atol=0)


def test_ring_rows_are_written_at_their_offsets_plus_the_layer_bases():
    g = _g(8)
    buf = torch.randint(0, 256, (4096,), generator=g, dtype=torch.uint8)
    codes_at = (torch.randperm(60, generator=g)[:5] * 64)[:, None] + torch.arange(64)  # rows of 64 code bytes
    scales_at = 3900 + torch.arange(5 * 2).view(5, 2) * 3  # and their scale bytes, apart
    codes = torch.randint(0, 256, (5, 64), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (5, 2), generator=g, dtype=torch.uint8)
    want = buf.clone()
    want[codes_at + 17] = codes
    want[scales_at + 5] = scales
    got = buf.to(DEVICE)
    write_rows(got, codes_at.to(DEVICE), scales_at.to(DEVICE), (17, 5), codes.to(DEVICE), scales.to(DEVICE))
    assert torch.equal(got.cpu(), want)


@pytest.fixture(scope="module")
def paged(golden_model, golden):
    pool = CachePool(CacheLayout.for_model(golden_model.config, page_entries=16), 100, 2,
                     plain_allocator(DEVICE if DEVICE == "cpu" else "cpu"))
    cache = PagedCache(pool, golden_model.config)
    with torch.inference_mode():
        step(golden_model, [cache], [golden[2]["input_ids"]])
    yield cache
    cache.release()


# one program per query and head block, or flash decoding, or the tensor-core form (every head
# in one block; on the GPU the queries and probabilities go in as bf16 parts), whole or with
# each query's keys split over programs (2 splits of 1 window tile and 2 entry tiles: one split
# reads both kinds), or in two passes (the logits, then the weighted sums), whole or in splits
# of SPLIT2 16-key tiles (1 window tile and 3 entry tiles: 3 a split reads both kinds); 32 heads
# a program (DECODE_HEAD_BLOCK) as two blocks, the second partly masked
@pytest.mark.parametrize("entry_splits, head_block, prefill, gather, two_pass",
                         [(0, 16, False, 0, 0), (3, 16, False, 0, 0), (0, 32, False, 0, 0), (0, None, True, 0, 0),
                          (0, None, True, 1, 0), (2, None, True, 1, 0), (3, None, True, 0, 0), (0, None, True, 0, 1),
                          (0, None, True, 1, 1), (0, None, True, 0, dict(SPLIT2=1, KT2=16)),
                          (0, None, True, 1, dict(SPLIT2=3, KT2=16)), (2, 32, True, 1, 0),
                          (0, 32, True, 0, dict(SPLIT2=1, KT2=16))])
def test_sparse_attention_on_a_paged_cache(paged, entry_splits, head_block, prefill, gather, two_pass):
    g = _g(2)
    cache, layer, source = paged, 8, 7
    n, heads, dim, window = 5, 40, 64, 8  # 40 heads: the last head block is partly masked
    q = torch.randn(n, heads, dim, generator=g)
    positions = torch.arange(100 - window, 100)
    win = positions.expand(n, -1).clone()
    win[0, :3] = -1
    idx = torch.randint(0, cache.num_entries(source), (n, 40), generator=g)
    idx[1, 2] = -1
    idx[2, 20:] = -1
    w_off, w_soff = cache.ring_offsets(layer, win.clamp_min(0))
    e_off, e_soff = cache.entry_offsets(source, idx)
    sink = torch.randn(heads, generator=g)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    def attend(window_codes, window_scales, window_base=(0, 0)):
        return sparse_attention(dev(q), dev(cache.pool.slots_buffer), dev(torch.where(win >= 0, window_codes, -1)),
                                dev(window_scales), dev(cache.pool.pages_buffer), dev(torch.where(idx >= 0, e_off, -1)),
                                dev(e_soff), dev(sink), dim**-0.5, entry_splits=entry_splits, head_block=head_block,
                                prefill=prefill, tiles=_two_pass_tiles(gather, two_pass),
                                window_base=window_base).cpu()

    got = attend(w_off, w_soff)
    ref = sparse_attention_ref(q, cache.ring_read(layer, positions), win >= 0,
                               cache.entries_gather(source, idx.clamp_min(0)), idx >= 0, sink, dim**-0.5)
    assert (got - ref).abs().max() < REL * ref.abs().max() + 1e-5
    # the layer's ring through layer 0's offsets and the layer's bytes past them: the same keys
    codes0, scales0 = cache.ring_offsets(0, win.clamp_min(0))
    strides = cache.ring_layer_stride
    assert torch.equal(attend(codes0, scales0, (layer * strides[0], layer * strides[1])), got)


def _two_pass_tiles(gather: int, two_pass: int | dict) -> dict:
    """tiles for sparse_attention: two_pass 0 or 1, or a dict of the two-pass form's tiles."""
    if isinstance(two_pass, dict):
        return dict(GATHER=gather, TWO_PASS=1, **two_pass)
    return dict(GATHER=gather, TWO_PASS=two_pass)


@pytest.mark.parametrize("gather", [0, 1])
def test_a_querys_two_pass_splits_do_not_follow_the_launchs_width(paged, gather):
    """A decode batch's two-pass launch is as wide as its widest query's entries: the splits
    are counted from each query's first key tile, so a query's output has the same bits with
    its entries padded (masked) to more tiles and more splits."""
    g = _g(3)
    cache, layer, source = paged, 8, 7
    n, heads, dim = 3, 40, 64
    q = torch.randn(n, heads, dim, generator=g)
    positions = torch.arange(92, 100)
    w_off, w_soff = cache.ring_offsets(layer, positions.expand(n, -1))
    idx = torch.randint(0, cache.num_entries(source), (n, 40), generator=g)
    e_off, e_soff = cache.entry_offsets(source, idx)
    sink = torch.randn(heads, generator=g)
    dev = lambda t: t.to(DEVICE)  # noqa: E731

    def attend(codes, scales):
        return sparse_attention(dev(q), dev(cache.pool.slots_buffer), dev(w_off), dev(w_soff),
                                dev(cache.pool.pages_buffer), dev(codes), dev(scales), dev(sink), dim**-0.5,
                                entry_splits=0, prefill=True,
                                tiles=_two_pass_tiles(gather, dict(SPLIT2=1, KT2=16))).cpu()

    pad = torch.full((n, 50), -1, dtype=e_off.dtype)
    wide = attend(torch.cat([e_off, pad], 1), torch.cat([e_soff, pad.clamp_min(0)], 1))
    assert torch.equal(attend(e_off, e_soff), wide)


def _window_and_entries(cache, n: int, heads: int, dim: int, g: torch.Generator, window: int = 8):
    """n queries' window (the last `window` positions) and 24 random entries of a paged cache:
    attend(query on DEVICE, **sparse_attention options) and the keys sparse_attention_ref takes
    after the query."""
    layer, source = 8, 7
    positions = torch.arange(100 - window, 100)
    idx = torch.randint(0, cache.num_entries(source), (n, 24), generator=g)
    w_off, w_soff = cache.ring_offsets(layer, positions.expand(n, -1))
    e_off, e_soff = cache.entry_offsets(source, idx)
    sink = torch.randn(heads, generator=g)
    dev = lambda t: t.to(DEVICE)  # noqa: E731

    def attend(query, **options):
        return sparse_attention(query, dev(cache.pool.slots_buffer), dev(w_off), dev(w_soff),
                                dev(cache.pool.pages_buffer), dev(e_off), dev(e_soff), dev(sink), dim**-0.5,
                                **options).cpu()

    keys = (cache.ring_read(layer, positions), positions.expand(n, -1) >= 0, cache.entries_gather(source, idx),
            idx >= 0, sink, dim**-0.5)
    return attend, keys


@pytest.mark.parametrize("prefill, two_pass", [(False, 0), (True, 0), (True, 1)])
def test_bf16_queries_attend_in_bf16(paged, prefill, two_pass):
    """A bf16 query (faithful mode's) attends as the reference's kernel does: the weighted sum
    of the values takes e^(s - m) rounded to bf16 (sparse_attention_ref), in the decode form,
    the tensor-core form (one part of the query and of the probabilities) and its two-pass
    form. The one-pass forms round at their running maximum, so they agree with the reference
    within bf16's rounding; the two-pass form rounds at the keys' maximum, as the reference,
    and agrees to fp32's. The rounding is there to see against fp32 attention."""
    g = _g(5)
    n, heads, dim = 5, 16, 64
    q = torch.randn(n, heads, dim, generator=g).bfloat16()
    attend, keys = _window_and_entries(paged, n, heads, dim, g)
    run = lambda query: attend(query.to(DEVICE), prefill=prefill, tiles=dict(TWO_PASS=two_pass))  # noqa: E731
    got, exact = run(q), run(q.float())
    ref, ref_exact = sparse_attention_ref(q, *keys), sparse_attention_ref(q.float(), *keys)
    top = ref_exact.abs().max()
    assert (got - ref).abs().max() < (REL if two_pass else 1e-2) * top
    assert (exact - ref_exact).abs().max() < REL * top + 1e-5
    assert (got - exact).abs().max() > 1e-5 * top and (ref - ref_exact).abs().max() > 1e-5 * top


@pytest.mark.parametrize("prefill, two_pass", [(False, 0), (True, 0), (True, 1)])
@pytest.mark.parametrize("bf16", [False, True])
def test_queries_before_rope_attend_as_the_rotated_ones(paged, prefill, two_pass, bf16):
    """Queries handed over before RoPE (attention_queries.Queries: the GPU's prefill form
    rotates them as it cuts their parts) attend bit for bit as the rotated queries do."""
    from dsflash.model.kernels.attention_queries import Queries
    from dsflash.model.rope import apply_rope

    g = _g(8)
    n, heads, dim, half = 5, 16, 64, 8
    raw = torch.randn(n, heads, dim, generator=g)
    angles = torch.rand(n, half, generator=g) * 100
    cos, sin = angles.cos(), angles.sin()
    rotated = apply_rope(raw, cos, sin)
    attend, _ = _window_and_entries(paged, n, heads, dim, g)
    run = lambda query: attend(query, prefill=prefill, tiles=dict(TWO_PASS=two_pass))  # noqa: E731
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    want = run(dev(rotated.bfloat16() if bf16 else rotated))
    assert torch.equal(run(Queries(dev(raw), dev(cos), dev(sin), bf16)), want)


@pytest.mark.parametrize("splits", [0, 2])
@pytest.mark.parametrize("bf16", [False, True])
def test_one_program_for_both_column_halves_attends_as_two(paged, splits, bf16):
    """The one-pass prefill form with both column halves in one program (BOTH: each logit
    once) gives the two parity programs' output: bit for bit in the interpreter, where the
    dots' orders are the same, within the GPU's tolerance there (8 warps lay them out anew)."""
    g = _g(10)
    n, heads, dim = 5, 40, 64  # 40 heads: a partly masked head block
    q = torch.randn(n, heads, dim, generator=g)
    q = q.bfloat16() if bf16 else q
    attend, _ = _window_and_entries(paged, n, heads, dim, g)
    def run(**tiles):
        return attend(q.to(DEVICE), prefill=True, entry_splits=splits, tiles=dict(TWO_PASS=0, **tiles))

    want, got = run(BOTH=0), run(BOTH=1)
    if DEVICE == "cpu":
        assert torch.equal(got, want)
    else:
        assert (got - want).abs().max() <= REL * want.abs().max()
        got = attend(q.to(DEVICE), prefill=True, entry_splits=splits, num_warps=8,
                     tiles=dict(TWO_PASS=0, BOTH=1, KT=64))
        assert (got - want).abs().max() <= REL * want.abs().max()


def test_faithful_prefill_rows_launch_one_program_on_its_own_warps(paged, monkeypatch):
    """bf16 (faithful) queries: a launch of PREFILL_QUERIES rows or more with unsplit keys runs
    one program for both column halves on BF16_PREFILL_TILES' warps, also where the caller
    passes its launch plan's warps (the model's _attend_planned does: they had overridden the
    tiles' 8 with 4); a decode batch's fewer rows keep the parity programs on 4 warps."""
    from dsflash.model.kernels import sparse_attention as sa

    launches = []
    real = sa._prefill_attention_kernel

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((kwargs["BOTH"], kwargs["KT"], kwargs["num_warps"]))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(sa, "PREFILL_QUERIES", 6)  # few rows stand for a chunk's thousands
    monkeypatch.setattr(sa, "INTERPRETER_DECODE", False)  # the GPU's forms
    monkeypatch.setattr(sa, "_prefill_attention_kernel", Recorder())
    g = _g(11)
    heads, dim = 16, 64
    for n in (6, 5):
        q = torch.randn(n, heads, dim, generator=g).bfloat16()
        attend, keys = _window_and_entries(paged, n, heads, dim, g)
        plan = launch_plan(n, 24, heads, dim, prefill=True)  # the batch form's plan: keys not split
        got = attend(q.to(DEVICE), prefill=True, num_warps=plan.warps)
        assert (got - sparse_attention_ref(q, *keys)).abs().max() < 1e-2 * got.abs().max()
    tiles = sa.BF16_PREFILL_TILES
    assert launches == [(1, tiles["KT"], tiles["num_warps"]), (0, sa.PREFILL_TILES["KT"], 4)], launches


def test_queries_take_the_tensor_core_form_where_it_fits(monkeypatch):
    from dsflash.model.kernels import sparse_attention as sa

    monkeypatch.setattr(sa, "INTERPRETER_DECODE", False)  # the GPU's plans
    assert launch_plan(300, 512, 64, 512) == launch_plan(300, 512, 64, 64)._replace(head_block=64)
    assert launch_plan(300, 512, 64, 512).prefill and launch_plan(300, 512, 64, 512).entry_splits == 0
    # decode-sized: each query's keys split over programs, as many whatever the batch
    for n in (1, 6, 48, 255):
        plan = launch_plan(n, 512, 64, 512)
        assert plan.prefill and plan.entry_splits == DECODE_KEY_SPLITS, plan
    assert not launch_plan(300, 512, 64, 96).prefill and not launch_plan(6, 512, 64, 32).prefill
    assert launch_plan(6, 512, 64, 96).entry_splits != launch_plan(48, 512, 64, 96).entry_splits  # flash decoding
    monkeypatch.setattr(sa, "INTERPRETER_DECODE", True)
    assert launch_plan(6, 512, 64, 512).entry_splits == (1 if interpreting() else DECODE_KEY_SPLITS)


# fp32 queries, or FP4-quantized ones (as the model's), which the GPU dots in one bf16 pass;
# the tall tiles of prefill-sized runs
@pytest.mark.parametrize("quantized, tall", [(False, False), (True, False), (True, True)])
def test_indexer_scores_on_a_paged_cache(paged, quantized, tall):
    g = _g(3)
    cache, source = paged, 7
    total = cache.num_entries(source)
    q, w = torch.randn(5, 16, 32, generator=g), torch.randn(5, 16, generator=g)
    if quantized:
        q = fake_quant_fp4(q, 32)
    visible = torch.tensor([0, 5, 50, 99, total])
    k_off, k_soff = cache.entry_offsets(source, torch.arange(total), kind="key")
    got = indexer_scores(q.to(DEVICE), w.to(DEVICE), visible.to(DEVICE), cache.pool.pages_buffer.to(DEVICE),
                         k_off.to(DEVICE), k_soff.to(DEVICE), exact_in_bf16=quantized, tall=tall).cpu()
    ref = indexer_scores_ref(q, cache.index_keys(source), w, visible)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(got))
    assert (got[finite] - ref[finite]).abs().max() < REL * ref[finite].abs().max() + 1e-5


@pytest.mark.parametrize("quantized, tall", [(False, False), (True, False), (True, True)])
def test_indexer_scores_of_several_runs_in_one_launch_equal_each_alone(paged, quantized, tall):
    """Run r's queries score row r of the key tables (its own entries, padded): the same
    values, bit for bit, as a launch for that run alone; -inf past what it sees. Tall tiles
    read a query block by TMA, past the run's rows into the next run's."""
    g = _g(4)
    cache, source = paged, 7
    total = cache.num_entries(source)
    counts, totals = [5, 3, 6], [total, 40, 77]
    q, w = torch.randn(sum(counts), 16, 32, generator=g), torch.randn(sum(counts), 16, generator=g)
    if quantized:
        q = fake_quant_fp4(q, 32)
    visible = torch.cat([torch.randint(0, t + 1, (c,), generator=g) for c, t in zip(counts, totals)])
    ids = torch.minimum(torch.arange(total)[None, :], torch.tensor(totals)[:, None] - 1)
    k_off, k_soff = cache.entry_offsets(source, ids, kind="key")
    first = torch.tensor([0, 5, 8])
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    pages = dev(cache.pool.pages_buffer)
    got = indexer_scores(dev(q), dev(w), dev(visible), pages, dev(k_off), dev(k_soff),
                         (dev(first), dev(torch.tensor(counts)), max(counts)), exact_in_bf16=quantized,
                         tall=tall).cpu()
    for r, (a, c, t) in enumerate(zip(first.tolist(), counts, totals)):
        rows = slice(a, a + c)
        alone = indexer_scores(dev(q[rows]), dev(w[rows]), dev(visible[rows]), pages, dev(k_off[r, :t]),
                               dev(k_soff[r, :t]), exact_in_bf16=quantized, tall=tall).cpu()
        assert torch.equal(got[rows, :t], alone)
        assert torch.isneginf(got[rows, t:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fp8_queries_launch_gives_the_torch_passes_bits(dtype):
    """indexer_score.fp8_queries (one launch) against fp8_queries_ref (torch): the same codes
    and scaled weights bit for bit, a head of zeros (scale 1), a head spread over 12 binades
    (its smallest block rounded), a scale ratio that is a power of two times 6 exactly, rows
    not a multiple of the launch's 32, and weights read through a stride."""
    from dsflash.model.kernels import indexer_score

    g = _g(9)
    q = fake_quant_fp4(torch.randn(45, 8, 128, generator=g), 32)
    q[3, 2] = 0
    q[5, 1, :32] *= 2.0**-12
    q[7, 4] = 0
    q[7, 4, 9] = 6 * 2.0**-3  # amax / 6 a power of two: the scale is it, not twice it
    q = q.to(dtype)
    w = torch.randn(8, 45, generator=g).to(dtype).t()  # strides (1, 45)
    got = indexer_score.fp8_queries(q.to(DEVICE), w.to(DEVICE))
    want = indexer_score.fp8_queries_ref(q.to(DEVICE), w.to(DEVICE))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.cpu().float(), b.cpu().float())
    assert (got[1][3, 2] == w[3, 2].float()).all() and got[1][7, 4] == w[7, 4].float() * 2.0**-3


@pytest.mark.parametrize("maxnreg", [0, pytest.param(160, marks=pytest.mark.gpu)])
def test_faithful_tall_tiles_on_the_fp8_tensor_cores_score_as_the_bf16_dots(paged, monkeypatch, maxnreg):
    """indexer_scores' fp8 form (faithful prefill's tall tiles, e4m3 queries under a scale a
    row and head folded into w, e4m3 keys under a scale an entry): the bf16 form's scores bit
    for bit, alone and batched, while every query's and key's block scales span at most 8
    binades (a head of zeros too); a head spread over 12 binades rounds its smallest block,
    its scores then within 2^-9 of that head's largest term. maxnreg: the FP8 tiles held to
    fewer registers a thread (TALL_FP8_MAXNREG; a launch option, so on a GPU only)."""
    from dsflash.model.kernels import indexer_score

    monkeypatch.setattr(indexer_score, "TALL_FP8", True)
    monkeypatch.setattr(indexer_score, "TALL_FP8_MAXNREG", maxnreg)
    g = _g(5)
    cache, source = paged, 7
    total = cache.num_entries(source)
    q, w = fake_quant_fp4(torch.randn(7, 16, 32, generator=g), 32), torch.randn(7, 16, generator=g)
    q[2, 3] = 0
    visible = torch.tensor([0, 5, 50, 99, total, 3, total])
    k_off, k_soff = cache.entry_offsets(source, torch.arange(total), kind="key")
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    args = (dev(visible), dev(cache.pool.pages_buffer), dev(k_off), dev(k_soff))
    runs = (dev(torch.tensor([0, 4])), dev(torch.tensor([4, 3])), 4)
    batched = (dev(torch.stack([k_off, k_off])), dev(torch.stack([k_soff, k_soff])))

    def both(q: torch.Tensor) -> list[torch.Tensor]:
        return [indexer_scores(dev(q), dev(w), *args, exact_in_bf16=True, tall=True, fp8=fp8).cpu()
                for fp8 in (True, False)] + [
                indexer_scores(dev(q), dev(w), *args[:2], *batched, runs, exact_in_bf16=True, tall=True, fp8=fp8).cpu()
                for fp8 in (True, False)]

    got, want, got_runs, want_runs = both(q)
    assert torch.equal(got, want) and torch.equal(got_runs, want_runs)
    assert torch.isfinite(want).sum() > 100
    q[1, 5, :8] *= 2.0**-12  # one block 12 binades under its head's largest
    got, want, _, _ = both(q)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)) and not torch.equal(got, want)
    keys = cache.index_keys(source).float()
    largest = (q[1, 5] @ keys.T).abs().max() * w[1, 5].abs()
    assert (got - want)[finite].abs().max() <= 2.0**-9 * largest


@pytest.mark.gpu
@pytest.mark.parametrize("heads, dim, queries, entries", [(32, 128, 64, 128), (8, 64, 64, 128), (32, 128, 64, 64),
                                                         (32, 128, 128, 64)])
def test_the_gluon_tall_tiles_score_as_the_triton_fp8_tiles(heads, dim, queries, entries, monkeypatch):
    """indexer_score.GLUON_TALL (indexer_score_gluon): faithful prefill's FP8 tall tiles with a
    head's wgmma under the previous head's epilogue give the Triton form's scores bit for bit
    (in tiles of 64 or 128 queries and 128 or 64 entries, indexer_score_gluon.QUERIES, ENTRIES):
    encoded FP4 queries (a head of zeros, a block 12 binades down), keys whose blocks' scales
    span up to 12 binades (some the e8m0 byte 0), rows past a block of 64 queries, visible
    counts from 0 to every entry, and padded rows' -inf past N."""
    from dsflash.model.kernels import indexer_score, indexer_score_gluon

    monkeypatch.setattr(indexer_score, "TALL_FP8", True)
    monkeypatch.setattr(indexer_score_gluon, "QUERIES", queries)
    monkeypatch.setattr(indexer_score_gluon, "ENTRIES", entries)
    g = _g(21)
    n, N = 150, 1000
    q = fake_quant_fp4(torch.randn(n, heads, dim, generator=g), 32)
    q[2, 3] = 0
    q[5, 1, :32] *= 2.0**-12
    w = torch.randn(n, heads, generator=g)
    code_bytes, scale_bytes = dim // 2, dim // 32
    pages = torch.randint(0, 256, (N * (code_bytes + scale_bytes),), dtype=torch.uint8, generator=g)
    scales = torch.randint(108, 121, (N * scale_bytes,), dtype=torch.uint8, generator=g)
    scales[::37] = 0
    pages[N * code_bytes:] = scales
    k_off = torch.arange(N) * code_bytes
    k_soff = N * code_bytes + torch.arange(N) * scale_bytes
    visible = torch.randint(0, N + 1, (n,), generator=g)
    visible[:3] = torch.tensor([0, 1, N])
    args = [t.to(DEVICE) for t in (visible, pages, k_off, k_soff)]
    codes, scaled = indexer_score.fp8_queries(q.to(DEVICE), w.to(DEVICE))
    launched, scores = [], indexer_score_gluon.scores
    monkeypatch.setattr(indexer_score_gluon, "scores", lambda *a: launched.append(1) or scores(*a))
    got = {}
    for on in (False, True):
        monkeypatch.setattr(indexer_score, "GLUON_TALL", on)
        got[on] = indexer_scores(codes, scaled, *args, exact_in_bf16=True, tall=True, fp8=True, encoded=True,
                                 pad=True).cpu()
    assert launched == [1] and got[True].shape == (n, indexer_score.padded_width(N))
    assert torch.equal(got[True], got[False]) and torch.isfinite(got[True]).sum() > n * N // 4


@pytest.mark.parametrize("form, block", [("tall", 4), ("tall_fp8", 4), ("short", 4), ("few", 4), ("tall", 256),
                                         ("short", 64), ("short", 128)])
def test_a_candidate_pool_masks_the_scores_where_they_are_made(form, block, paged, monkeypatch):
    """indexer_scores' kept (a candidate pool's blocks): each form's scores with the unkept
    blocks -inf, bit for bit the scores without it masked after (the tall tiles and the
    short ones in their epilogue, alone and batched, with blocks smaller than a tile, as large
    as one, and larger (two short tiles in one block); the few-query form after its launch)."""
    from dsflash.model.kernels import indexer_score

    monkeypatch.setattr(indexer_score, "TALL_FP8", form == "tall_fp8")
    g = _g(8)
    cache, source = paged, 7
    total = cache.num_entries(source)
    n = 3 if form == "few" else 70
    q, w = fake_quant_fp4(torch.randn(n, 16, 32, generator=g), 32), torch.randn(n, 16, generator=g)
    visible = torch.randint(0, total + 1, (n,), generator=g)
    pool = (torch.rand(n + 5, -(-total // block), generator=g) < 0.5).to(DEVICE)
    kept = (pool[5:], block)  # rows of a larger pool, as a slice of a run takes them
    blocks = kept[0].cpu()
    k_off, k_soff = cache.entry_offsets(source, torch.arange(total), kind="key")
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    args = (dev(visible), dev(cache.pool.pages_buffer), dev(k_off), dev(k_soff))
    kw = dict(exact_in_bf16=True, tall=form.startswith("tall"), fp8=form == "tall_fp8")
    want = indexer_scores(dev(q), dev(w), *args, **kw).cpu()
    want = want.masked_fill(~blocks.repeat_interleave(block, 1)[:, :total], float("-inf"))
    got = indexer_scores(dev(q), dev(w), *args, **kw, kept=kept).cpu()
    assert torch.equal(got, want) and torch.isfinite(want).sum() > 10 and torch.isinf(want).sum() > 10
    if form != "few":  # two runs of the same rows in one launch
        runs = (dev(torch.tensor([0, n // 2])), dev(torch.tensor([n // 2, n - n // 2])), n - n // 2)
        batched = (dev(torch.stack([k_off, k_off])), dev(torch.stack([k_soff, k_soff])))
        got = indexer_scores(dev(q), dev(w), *args[:2], *batched, runs, **kw, kept=kept).cpu()
        assert torch.equal(got, want)


@pytest.mark.parametrize("form", ["tall", "tall_fp8", "short", "few"])
def test_padded_score_rows_hold_the_scores_then_minus_inf(form, paged, monkeypatch):
    """indexer_scores' pad: rows of padded_width(N) (a multiple of 16), the unpadded scores bit
    for bit, then -inf, in every form, alone and batched, with a candidate pool too; and the
    top-k picks the same entries from the padded rows."""
    from dsflash.model.kernels import indexer_score
    from dsflash.model.layers.indexer import top_k_ascending

    monkeypatch.setattr(indexer_score, "TALL_FP8", form == "tall_fp8")
    g = _g(9)
    cache, source = paged, 7
    total = cache.num_entries(source)
    assert total % 16  # a row that pads
    n = 3 if form == "few" else 70
    q, w = fake_quant_fp4(torch.randn(n, 16, 32, generator=g), 32), torch.randn(n, 16, generator=g)
    visible = torch.randint(0, total + 1, (n,), generator=g)
    k_off, k_soff = cache.entry_offsets(source, torch.arange(total), kind="key")
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    args = (dev(q), dev(w), dev(visible), dev(cache.pool.pages_buffer), dev(k_off), dev(k_soff))
    kw = dict(exact_in_bf16=True, tall=form.startswith("tall"), fp8=form == "tall_fp8")
    width = indexer_score.padded_width(total)
    assert width % 16 == 0 and total < width < total + 16
    for kept in (None, ((torch.rand(n, -(-total // 4), generator=g) < 0.5).to(DEVICE), 4)):
        want = indexer_scores(*args, **kw, kept=kept).cpu()
        got = indexer_scores(*args, **kw, kept=kept, pad=True).cpu()
        assert got.shape == (n, width) and torch.equal(got[:, :total], want)
        assert bool((got[:, total:] == float("-inf")).all())
        assert torch.equal(top_k_ascending(got, 8), top_k_ascending(want, 8))
        # two runs of the same rows in one launch (index_runs), padded alike
        runs = (dev(torch.tensor([0, n // 2])), dev(torch.tensor([n // 2, n - n // 2])), n - n // 2)
        batched = (dev(torch.stack([k_off, k_off])), dev(torch.stack([k_soff, k_soff])))
        got = indexer_scores(*args[:4], *batched, runs, **kw, kept=kept, pad=True).cpu()
        assert torch.equal(got[:, :total], want) and bool((got[:, total:] == float("-inf")).all())
    # a query that would see past the entries scores none of the padding (its keys load as zeros)
    beyond = indexer_scores(args[0], -args[1].abs(), dev(torch.full((n,), total + 5)), *args[3:], **kw, pad=True).cpu()
    assert bool((beyond[:, total:] == float("-inf")).all()) and torch.isfinite(beyond[:, :total]).all()


@pytest.mark.parametrize("heads, columns, blocks", [(16, 256, None), (16, 64, None), (12, 64, None),
                                                    (16, 256, ((64, 4), 1))])
@pytest.mark.parametrize("rows", [1, 6, 9, 16])
def test_few_query_runs_score_as_the_short_tiles_do(paged, rows, heads, columns, blocks, monkeypatch):
    """Runs of up to FEW_QUERIES rows (decode) take the few-query form, the entries as the
    dot's rows and heads and queries as its columns: with FP4-quantized queries (the model's)
    its scores are the short tiles' bit for bit, alone and batched, at 8 and 16 query columns
    (one chunk of 8 or two), with every head in one dot, over two groups of 8 (64 columns),
    and with the last group partly past the heads (12 heads), as it sums the heads in their
    order and the dots are exact; and with one program, which then scores two blocks (the
    next one's codes loaded ahead). (Blocks of 16 entries put the heads over warps on the
    GPU, whose sum across them is not in the heads' order.)"""
    from dsflash.model.kernels import indexer_score
    from dsflash.model.kernels.indexer_score import TILES

    monkeypatch.setattr(indexer_score, "FEW_HEADS_COLUMNS", columns)
    if blocks is not None:
        monkeypatch.setattr(indexer_score, "FEW_TILES", blocks[0])
        monkeypatch.setattr(indexer_score, "FEW_PROGRAMS", blocks[1])

    g = _g(12)
    cache, source = paged, 7
    total = cache.num_entries(source)
    assert blocks is None or total > blocks[0][0] * blocks[1]  # 2 blocks or more a program
    q = fake_quant_fp4(torch.randn(2 * rows, heads, 32, generator=g), 32)
    w, visible = torch.randn(2 * rows, heads, generator=g), torch.randint(0, total + 1, (2 * rows,), generator=g)
    k_off, k_soff = cache.entry_offsets(source, torch.arange(total), kind="key")
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    pages = dev(cache.pool.pages_buffer)
    for tiles in (None, TILES["short"]):
        got = indexer_scores(dev(q[:rows]), dev(w[:rows]), dev(visible[:rows]), pages, dev(k_off), dev(k_soff),
                             exact_in_bf16=True, tiles=tiles).cpu()
        runs = (dev(torch.tensor([0, rows])), dev(torch.tensor([rows, rows])), rows)
        both = indexer_scores(dev(q), dev(w), dev(visible), pages, dev(k_off.expand(2, -1)),
                              dev(k_soff.expand(2, -1)), runs, exact_in_bf16=True, tiles=tiles).cpu()
        if tiles is None:
            few, few_both = got, both
    assert torch.equal(few, got) and torch.equal(few_both, both) and torch.equal(few, both[:rows])
    ref = indexer_scores_ref(q[:rows], cache.index_keys(source), w[:rows], visible[:rows])
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(few))
    assert (few[finite] - ref[finite]).abs().max() < REL * ref[finite].abs().max() + 1e-5


def test_few_query_form_reads_aligned_keys_as_wide_words(golden_model, monkeypatch):
    """Keys whose codes start on 16 bytes and scales on 4 (a pool of 128-dim index keys,
    CacheLayout.keys_aligned) are read as wide words when the caller says so: the same scores
    bit for bit, and the short tiles'."""
    from dsflash.model.kernels import indexer_score

    g = _g(13)
    N, n, heads, dim = 150, 6, 4, 128
    pages = torch.randint(0, 255, (N * 68,), dtype=torch.uint8, generator=g)
    pages[N * 64:] = torch.randint(118, 124, (N * 4,), dtype=torch.uint8, generator=g)
    k_off, k_soff = torch.arange(N) * 64, N * 64 + torch.arange(N) * 4
    q = fake_quant_fp4(torch.randn(n, heads, dim, generator=g), 32)
    w, visible = torch.randn(n, heads, generator=g), torch.randint(1, N + 1, (n,), generator=g)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    monkeypatch.setattr(indexer_score, "FEW_ALIGNED_CODES", True)
    got = [indexer_score.indexer_scores(dev(q), dev(w), dev(visible), dev(pages), dev(k_off), dev(k_soff),
                                        exact_in_bf16=True, tiles=tiles, keys_aligned=aligned).cpu()
           for tiles, aligned in ((None, True), (None, False), (indexer_score.TILES["short"], False))]
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    assert torch.isfinite(got[0]).sum() == visible.sum()
    assert not CacheLayout.for_model(golden_model.config, page_entries=16).keys_aligned  # 32 dims: 1 scale byte


def test_indexer_scores_launch_on_16_byte_pointers_from_any_row_slice(paged, monkeypatch):
    """A slice of a long run's rows (w and visible start at any row), and a batch's run table
    of an odd count of runs, reach the kernel on 16-byte aligned pointers, as the warm-up's
    launches do: Triton specializes on it, so other pointers would compile the kernel again
    inside a prompt or a decode step. The same scores."""
    from dsflash.model.kernels import indexer_score

    g = _g(11)
    cache, source = paged, 7
    N = cache.num_entries(source)
    q, w = torch.randn(9, 3, 32, generator=g), torch.randn(9, 3, generator=g)  # w's rows: 12 bytes
    visible = torch.randint(1, N + 1, (9,), generator=g)
    k_off, k_soff = cache.entry_offsets(source, torch.arange(N), kind="key")
    pages = cache.pool.pages_buffer.to(DEVICE)
    pointers = []

    class Recording:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kw):
                pointers.extend(a.data_ptr() for a in args if isinstance(a, torch.Tensor))
                return self.kernel[grid](*args, **kw)
            return launch

    want = indexer_score.indexer_scores(*(t.to(DEVICE) for t in (q, w, visible)), pages, k_off.to(DEVICE),
                                        k_soff.to(DEVICE)).cpu()
    for name in ("_indexer_kernel", "_indexer_few_kernel"):
        monkeypatch.setattr(indexer_score, name, Recording(getattr(indexer_score, name)))
    lo = 1  # w's rows of 3 fp32 and visible's int64 start off 16 bytes here
    for tiles in (None, indexer_score.TILES["short"]):  # the few-query form (8 rows), the short tiles
        pointers.clear()
        got = indexer_score.indexer_scores(*(t.to(DEVICE)[lo:] for t in (q, w, visible)), pages, k_off.to(DEVICE),
                                           k_soff.to(DEVICE), tiles=tiles).cpu()
        assert pointers and all(p % 16 == 0 for p in pointers)
        torch.testing.assert_close(got, want[lo:])  # (the interpreter's matmul may round per shape)
        # three runs, their first rows and counts rows of one int64 table as index_runs makes
        # it: the counts' row starts 72 bytes in
        table = torch.tensor([[0, 0, 0], [0, 0, 0], [0, 3, 6], [3, 3, 2]], device=DEVICE)
        pointers.clear()
        batched = indexer_score.indexer_scores(*(t.to(DEVICE)[lo:] for t in (q, w, visible)), pages,
                                               k_off.to(DEVICE).expand(3, -1), k_soff.to(DEVICE).expand(3, -1),
                                               (table[2], table[3], 3), tiles=tiles).cpu()
        assert table[3].data_ptr() % 16 and pointers and all(p % 16 == 0 for p in pointers)
        torch.testing.assert_close(batched, want[lo:])


def test_the_scores_warm_up_meets_every_specialization_of_its_counts():
    """The scoring tiles' warm-up launches, tall and short, with query counts of 1, of a
    multiple of 16 and of neither, each with entry counts of both kinds (what Triton
    specializes a launch on), then the short tiles' batched form (two runs) at the counts
    above 1, and every launch scores: all entries visible, zero queries, zero scores."""
    from dsflash.model.kernels import indexer_score

    def kind(count: int) -> str:
        return "one" if count == 1 else "sixteens" if count % 16 == 0 else "other"

    counts = indexer_score.warm_up_counts()
    assert {(kind(n), kind(N)) for n, N in counts} == {(a, b) for a in ("one", "sixteens", "other")
                                                        for b in ("sixteens", "other")}
    launched = []
    real = indexer_score.indexer_scores

    def scores(q, w, visible, *args, **kw):
        out = real(q, w, visible, *args, **kw)
        launched.append((q.shape[0], out.shape[1], kw.get("tall", False), len(args) > 3))  # runs: args[3]
        assert torch.equal(out.cpu(), torch.zeros(out.shape))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(indexer_score, "indexer_scores", scores)
        indexer_score.scores_warm_up(torch.device(DEVICE), 4, 32, False)
    assert sorted(launched) == sorted([(n, N, tall, False) for tall in (True, False) for n, N in counts]
                                      + [(n, N, False, True) for n, N in counts if n > 1])


@pytest.mark.parametrize("padded", [False, True])
def test_a_workers_scores_warm_up_pads_a_runs_rows_as_its_prefill_pads_them(padded, monkeypatch):
    """indexer.PADDED_ROWS reaches the warm-up: each launch pads its rows as index() and
    index_runs pad them (the padded width and row stride are what Triton specializes on)."""
    from types import SimpleNamespace

    from dsflash.model.kernels import indexer_score
    from dsflash.model.layers import indexer

    monkeypatch.setattr(indexer, "PADDED_ROWS", padded)
    pads = []
    real = indexer_score.indexer_scores

    def scores(q, w, visible, *args, **kw):
        pads.append((len(args) > 3, kw.get("pad", False)))
        return real(q, w, visible, *args, **kw)

    monkeypatch.setattr(indexer_score, "indexer_scores", scores)
    cfg = SimpleNamespace(index_n_heads=4, index_head_dim=32, candidate_source_layer=-1, candidate_block_size=8,
                          index_topk=4, max_position_embeddings=64)
    launches = indexer.warm_up_launches(torch.device(DEVICE), cfg, SimpleNamespace(keys_aligned=False))
    for launch in launches:
        launch()
    assert {pad for batched, pad in pads if not batched} == {padded}
    assert {pad for batched, pad in pads if batched} == {padded}


@pytest.mark.parametrize("keys_aligned, fp8, kept_block, keep", [(False, False, 0, False), (True, False, 0, False),
                                                                 (True, True, 0, False), (True, True, 8, False),
                                                                 (False, False, 8, False), (True, True, 8, True),
                                                                 (False, False, 0, True)])
def test_the_scores_warm_up_compiles_every_form(keys_aligned, fp8, kept_block, keep, monkeypatch):
    """The warm-up reaches each form a worker launches, alone and batched: the few-query form
    at 8 and 16 query columns (its entry counts are not specialized) with the loads and decode
    the pool's layout takes (aligned keys as words), the short tiles and the tall ones, and
    for a faithful worker (fp8) the tall ones' FP8 form too, and the queries' encode for them
    on fp32 queries, as a run's come; with a candidate pool (kept_block), the tall and short
    tiles (FP8 too) with the pool's blocks; with keep (indexer.KEEP_IN_SCORES), the mode's tall
    tiles also as they fill a top-k's kept scores."""
    from dsflash.model.kernels import indexer_score

    forms = set()

    class Recording:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kw):
                forms.add((self.name, kw.get("QN", kw.get("QB")), kw["NB"], kw["RUNS"], kw.get("ALIGNED"),
                           kw.get("FP8", False), kw.get("KEEP", False), kw.get("KEPT_BLOCK", 0)))
                return self.kernel[grid](*args, **kw)
            return launch

    for name in ("_indexer_kernel", "_indexer_few_kernel"):
        monkeypatch.setattr(indexer_score, name, Recording(name, getattr(indexer_score, name)))
    encodes = set()
    encode = indexer_score._fp8_queries_kernel

    class RecordingEncode:
        def __getitem__(self, grid):
            return lambda q, *args, **kw: encodes.add(q.dtype) or encode[grid](q, *args, **kw)

    monkeypatch.setattr(indexer_score, "_fp8_queries_kernel", RecordingEncode())
    monkeypatch.setattr(indexer_score, "TALL_FP8", True)
    indexer_score.scores_warm_up(torch.device(DEVICE), 4, 32, keys_aligned, fp8=fp8, kept_block=kept_block,
                                 keep=keep)
    assert encodes == ({torch.float32} if fp8 else set())  # as a run's queries come, and only so
    short, tall = indexer_score.TILES["short"], indexer_score.TILES["tall"]
    nb = indexer_score.FEW_TILES[0]
    few_forms = {("_indexer_few_kernel", qn, nb, runs, keys_aligned, False, False, 0) for qn in (8, 16)
                 for runs in (False, True)}
    tiles = {("_indexer_kernel", *short[:2], False, None, False, False, 0),
             ("_indexer_kernel", *short[:2], True, None, False, False, 0),
             ("_indexer_kernel", *tall[:2], False, None, False, False, 0)}
    if fp8:
        tiles.add(("_indexer_kernel", *tall[:2], False, None, True, False, 0))
    if keep:
        tiles.add(("_indexer_kernel", *tall[:2], False, None, fp8, True, 0))
    if kept_block:
        tiles |= {(*form[:-1], kept_block) for form in tiles if not form[3]}  # alone, never batched
    assert forms == few_forms | tiles


def test_a_batch_on_the_kernel_path_matches_its_runs_alone(golden_dir, golden, monkeypatch):
    """A decode step of 6 rows for caches of different lengths (different entry counts, open
    groups), batched (the compressor and indexer run once for both) and alone: batched in the
    decode form (BATCH_FORM_ROWS 48) and in the tensor-core form (at 12 rows), each run alone
    in the decode form either way (so its step runs once)."""
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.layers import attention_kernel

    model = DeepseekV41.from_checkpoint(golden_dir, device=DEVICE)
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), 200, 6, plain_allocator(DEVICE))
    prompts = [golden[1]["input_ids"][:35], golden[2]["input_ids"][:58]]
    forms = (48, 12)
    with torch.inference_mode():
        alone, batches = [], {rows: [] for rows in forms}
        for prompt in prompts:  # prefilled on the reference path (quick under the interpreter)
            cache = PagedCache(pool, model.config)
            step(model, [cache], [prompt[:-6]])
            alone.append(cache)
            for rows in forms:
                batches[rows].append(cache.copy_to(pool))
        model.ops = TritonOps(model.ops.weights, device=DEVICE)
        wants = [step(model, [cache], [prompt[-6:]], logits="all").logits[0] for cache, prompt in zip(alone, prompts)]
        for rows in forms:
            monkeypatch.setattr(attention_kernel, "BATCH_FORM_ROWS", rows)
            together = step(model, batches[rows], [p[-6:] for p in prompts], logits="all").logits
            for got, want in zip(together, wants):
                assert torch.equal(got.argmax(-1), want.argmax(-1)), rows
                assert (got - want).abs().max() < 1e-3 * want.abs().max(), rows
            for a, b in zip(alone, batches[rows]):
                assert a.counts == b.counts and a.tail_lengths == b.tail_lengths
                b.release()
        for a in alone:
            a.release()


def test_dspark_blocks_on_the_kernel_path(golden_dir, golden):
    """The drafter's block attention for a batch in one launch (attend_block_in_place): each
    run's proposal equals its proposal alone (up to the dense GEMMs' rounding at other row
    counts, as in the test above) and the reference path's closely."""
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.dspark import DSparkDrafter

    model = DeepseekV41.from_checkpoint(golden_dir, device=DEVICE)
    reference = model.ops
    drafter = DSparkDrafter(model)
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), 200, 4, plain_allocator(DEVICE))
    prompts = [golden[1]["input_ids"][:21], golden[2]["input_ids"][:6]]  # the second ring not yet full
    with torch.inference_mode():
        requests = []
        for prompt in prompts:
            cache = PagedCache(pool, model.config)
            result = step(model, [cache], [prompt], taps=True)
            drafter.absorb(cache, 0, result.taps[0])
            requests.append((cache, int(result.logits[0][-1].argmax())))
        want = [drafter.propose([r]).logits for r in requests]
        model.ops = TritonOps(reference.weights, device=DEVICE)
        together = drafter.propose(requests).logits
        alone = [drafter.propose([r]).logits for r in requests]
        if DEVICE == "cuda":  # every stage and the head as one CUDA graph: run, captured, replayed
            model.graphs = GraphCache()
            for _ in range(3):
                assert torch.equal(drafter.propose(requests).logits, together)
            assert model.graphs.captured("propose") == 1 and model.graphs.captured("block") == 0
            model.graphs.release()
    for i, (ref, one) in enumerate(zip(want, alone)):
        assert torch.equal(together[i].argmax(-1), one[0].argmax(-1))
        assert (together[i] - one[0]).abs().max() < 1e-5 * ref.abs().max()
        assert (one - ref).abs().max() < 1e-3 * ref.abs().max()
    for cache, _ in requests:
        cache.release()


def test_ced_prefill_on_the_kernel_path(golden_dir, golden):
    """CED prefill (encoder pass, then the decoder pass that skips the compressor) through the
    kernels, in chunks: the last logits agree with the reference path's CED prefill."""
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.prefill_worker.engine import PrefillEngine, PrefillEngineConfig, PrefillRequest
    from dsflash.prefill_worker.scheduler import PrefillSchedulerConfig

    model = DeepseekV41.from_checkpoint(golden_dir, device=DEVICE)
    ids = golden[1]["input_ids"][:40].tolist()
    logits = []
    for ops in (model.ops, TritonOps(model.ops.weights, device=DEVICE)):
        model.ops = ops
        pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), 100, 2, plain_allocator(DEVICE))
        engine = PrefillEngine(model, pool, PrefillEngineConfig(PrefillSchedulerConfig(token_budget=24, max_chunk=24),
                                                                ced=True))
        engine.add(PrefillRequest("r", ids, want_taps=False))
        with torch.inference_mode():
            done = []
            while engine.has_work():
                done += engine.step()
        logits.append(done[0].output.logits.cpu())
        done[0].cache.release()
    assert int(logits[0].argmax()) == int(logits[1].argmax())
    assert (logits[0] - logits[1]).abs().max() < 1e-2 * logits[0].abs().max()


def test_fast_path_reproduces_golden_logits(golden_dir, golden):
    """The model with every kernel swapped in, on a paged cache (prefill in chunks, then decode),
    as a worker serves it: loaded onto the device, the experts stacked and their per-expert
    tensors freed."""
    from dsflash.model.deepseek_v41 import DeepseekV41

    model = DeepseekV41.from_checkpoint(golden_dir, device=DEVICE)
    model.use_kernels(keep_unpacked=False)
    names = model.ops.weights.names()
    assert not [n for n in names if ".ffn.experts." in n] and "layers.0.ffn.shared_experts.w1" in names
    assert model.ops.weights["layers.0.attn.wq_a"].weight.device.type == torch.device(DEVICE).type
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), 60, 1, plain_allocator(DEVICE))
    cache = PagedCache(pool, model.config)
    ids = golden[1]["input_ids"]
    with torch.inference_mode():
        logits = prompt_logits(model, ids, "chunked:12", cache=cache).cpu()
    ref = golden[1]["logits"]
    d = (logits - ref).abs().amax(-1)
    share, agree = (d <= 1e-2).float().mean(), (logits.argmax(-1) == ref.argmax(-1)).float().mean()
    assert share >= 0.9 and agree == 1, f"max |d| {d.max():.3g}, share <= 1e-2 {share:.3f}, argmax agree {agree:.3f}"
    cache.release()


@pytest.mark.parametrize("T, k, E, block_m", [(1, 6, 48, 4), (6, 6, 48, 4), (6, 6, 48, 2), (11, 3, 5, 16),
                                               (40, 6, 48, 16), (192, 6, 48, 64), (300, 6, 48, 16)])  # several chunks
@pytest.mark.parametrize("plan_tile", [16384, 2048])
def test_route_plan_kernel_equals_the_torch_plan(T, k, E, block_m, plan_tile, monkeypatch):
    """The one-program plan (decode) and the torch one (any size) give the same rows, with
    another rank's experts (id E) left out, at any chunk of pairs."""
    from dsflash.model.kernels import fp4_moe as moe

    monkeypatch.setattr(moe, "PLAN_TILE", plan_tile)
    g = _g(T)
    idx = torch.stack([torch.randperm(E + 1, generator=g)[:k] for _ in range(T)])  # id E: not ours
    weights = torch.rand(T, k, generator=g)
    fast = RoutePlan(idx.to(DEVICE), weights.to(DEVICE), E, block_m, one_program=True)
    ref = RoutePlan(idx.to(DEVICE), weights.to(DEVICE), E, block_m, one_program=False)
    assert fast.rows == ref.rows
    for name in ("tokens", "pair_ids", "routed", "block_expert"):
        assert torch.equal(getattr(fast, name).cpu(), getattr(ref, name).cpu()), name


@pytest.mark.parametrize("E, k", [(8, 2), (256, 6)])
def test_the_route_plan_warm_up_builds_a_few_plans_that_hold(E, k, monkeypatch):
    """A prefill worker's warm-up (fp4_moe.route_plan_warm_up_launches): one plan a variant of
    the one-program kernel, far fewer than the token counts it stands for, each as torch's plan."""
    from dsflash.model.kernels import fp4_moe as moe

    launches = moe.route_plan_warm_up_launches(torch.device(DEVICE), E, k)
    assert 10 <= len(launches) <= 60 < moe.ONE_PROGRAM_PAIRS // k
    for launch in launches[:: max(1, len(launches) // 5)]:  # (the interpreter: a few of them)
        plan = launch()
        tokens, block_m = int(plan.tokens.max()) + 1, plan.rows // plan.block_expert.numel()
        idx = torch.arange(tokens * k, device=DEVICE).remainder(E).view(tokens, k)
        ref = RoutePlan(idx, torch.ones(tokens, k, device=DEVICE), E, block_m, one_program=False)
        for name in ("tokens", "pair_ids", "routed", "block_expert"):
            assert torch.equal(getattr(plan, name).cpu(), getattr(ref, name).cpu()), name
    monkeypatch.setattr(moe, "PLAN_TILE", 16 * E // 2)  # too many experts for one program: no plans to warm
    assert moe.route_plan_warm_up_launches(torch.device(DEVICE), E, k) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's compile hooks fire on a GPU only")
def test_after_the_route_plan_warm_up_no_batch_size_compiles_a_plan(monkeypatch):
    """Every batch of 1 .. ONE_PROGRAM_PAIRS / k tokens, at either block height, meets a plan
    variant the warm-up compiled."""
    import triton

    from dsflash.model.kernels import compile_watch, fp4_moe as moe

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", None)
    E, k = 48, 6
    for launch in moe.route_plan_warm_up_launches(torch.device("cuda"), E, k):
        launch()
    compiled = []
    compile_watch.watch(lambda took, launch, compile: compiled.append(compile_watch.variant(compile)))
    for tokens in range(1, moe.ONE_PROGRAM_PAIRS // k + 1):
        idx = torch.randint(0, E, (tokens, k), device="cuda")
        for parts in (1, moe.SPLITS):
            RoutePlan(idx, torch.rand(tokens, k, device="cuda"), E, moe.block_height(tokens * k, E, parts))
    torch.cuda.synchronize()
    assert compiled == []


@pytest.mark.parametrize("shape, half", [((5, 3, 64), 16), ((4, 96), 48), ((7, 2, 40), 8)])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_kernel_rounds_as_the_torch_form(shape, half, inverse):
    """One launch, the same bits as apply_rope: two rounded products, then their sum."""
    from dsflash.model.kernels.rope import rope
    from dsflash.model.rope import apply_rope

    g = _g(5)
    x = torch.randn(*shape, generator=g) * 30
    angles = torch.rand(shape[0], half, generator=g) * 1000
    cos, sin = angles.cos(), angles.sin()
    got = rope(x.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), inverse).cpu()
    want = apply_rope(x, cos, sin, inverse)
    assert torch.equal(got, want)
    back = rope(got.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), not inverse).cpu()
    assert (back - x).abs().max() < 1e-3


@pytest.mark.parametrize("shape, half", [((5, 3, 64), 16), ((4, 96), 48), ((7, 9, 40), 8)])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_in_place_writes_only_the_rotated_channels(shape, half, inverse):
    """overwrite=True rotates x itself, reading and writing its last 2*half channels alone,
    with apply_rope's bits; a view that is not one block of memory gets a new tensor."""
    from dsflash.model.kernels.rope import rope
    from dsflash.model.rope import apply_rope

    g = _g(6)
    x = torch.randn(*shape, generator=g) * 30
    angles = torch.rand(shape[0], half, generator=g) * 1000
    cos, sin = angles.cos(), angles.sin()
    want = apply_rope(x, cos, sin, inverse)
    y = x.to(DEVICE)
    got = rope(y, cos.to(DEVICE), sin.to(DEVICE), inverse, overwrite=True)
    assert got.data_ptr() == y.data_ptr() and torch.equal(y.cpu(), want)
    wide = torch.randn(shape[0], 2 * shape[-1], generator=g)
    strided = wide[:, ::2]  # not contiguous: rotated into a new tensor, the input untouched
    got = rope(strided.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), inverse, overwrite=True).cpu()
    assert torch.equal(got, apply_rope(strided, cos, sin, inverse))


@pytest.mark.parametrize("splits, interleave", [(1, 2), (2, 2), (3, 1)])
def test_query_parts_are_the_parts_of_the_rotated_queries(splits, interleave):
    """RoPE and the bf16 parts in one launch give the bits of the two launches."""
    from dsflash.model.kernels.attention_queries import Queries, query_parts
    from dsflash.model.rope import apply_rope

    g = _g(7)
    n, heads, dim, half = 6, 5, 64, 16
    raw = torch.randn(n, heads, dim, generator=g) * 30
    angles = torch.rand(n, half, generator=g) * 1000
    cos, sin = angles.cos(), angles.sin()
    queries = Queries(raw.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), bf16=splits == 1)
    got = query_parts(queries, splits, interleave).cpu()
    assert torch.equal(got, bf16_parts_kernel(apply_rope(raw, cos, sin).to(DEVICE), splits, interleave).cpu())
    assert torch.equal(queries.take(lambda t: t[2:4]).rotated().cpu(),
                       apply_rope(raw, cos, sin)[2:4].to(torch.bfloat16 if splits == 1 else torch.float32))


def test_a_prefill_tier_stacks_only_the_experts_it_loaded(golden_dir):
    """The prefill tier leaves the DSpark stages out: stacking at load skips what is not there."""
    from dsflash.model.deepseek_v41 import DeepseekV41

    model = DeepseekV41.from_checkpoint(golden_dir, tier="prefill", device=DEVICE)
    model.use_kernels(keep_unpacked=False)
    stacked = set(model.ops._experts)
    assert "layers.0.ffn.experts" in stacked and not [p for p in stacked if p.startswith("mtp.")]
    assert not [n for n in model.ops.weights.names() if ".ffn.experts." in n]


def test_faithful_mode_on_the_kernel_path_matches_the_reference_path(golden_dir, golden):
    """act_quant (every FP8/FP4 GEMM's input rounded to FP8, the routed experts' down
    projection included) gives the reference path's logits on the kernel path too, closer
    than the rounding moves them (measured on the reference path: the quick one in CI)."""
    from dsflash.model.deepseek_v41 import DeepseekV41

    ids = golden[1]["input_ids"][:12]
    model = DeepseekV41.from_checkpoint(golden_dir, device=DEVICE, act_quant=True)
    with torch.inference_mode():
        ref = prompt_logits(model, ids, "full").cpu()
        unquantized = prompt_logits(DeepseekV41.from_checkpoint(golden_dir, device=DEVICE), ids, "full").cpu()
        model.use_kernels()
        got = prompt_logits(model, ids, "full").cpu()
    d = (got - ref).abs().amax(-1)
    assert (d <= 1e-2).float().mean() >= 0.9 and torch.equal(got.argmax(-1), ref.argmax(-1)), d
    assert (unquantized - ref).abs().amax(-1).median() > 10 * d.median()  # the rounding is there to see


def test_keys_decoded_once_attend_as_their_bytes(paged):
    """Exact mode's decoded form (attend_decoded: decode_keys' bf16 rows of a paged cache's
    window and entries, the two-pass form reading each query's rows) against the form that
    decodes each query's keys from their bytes and the reference: masked keys, a partly masked
    head block, and queries handed over before RoPE."""
    from dsflash.model.kernels.attention_queries import Queries
    from dsflash.model.kernels.sparse_attention import attend_decoded, decode_keys
    from dsflash.model.rope import apply_rope

    g = _g(12)
    cache, layer, source = paged, 8, 7
    n, heads, dim, window, half = 5, 40, 64, 8, 8
    raw = torch.randn(n, heads, dim, generator=g)
    angles = torch.rand(n, half, generator=g) * 100
    cos, sin = angles.cos(), angles.sin()
    q = apply_rope(raw, cos, sin)
    positions = torch.arange(100 - window, 100)
    slots = torch.arange(window).expand(n, -1).clone()
    slots[0, :3] = -1  # query 0's first window keys masked
    idx = torch.randint(0, cache.num_entries(source), (n, 40), generator=g)
    idx[1, 2] = -1
    idx[2, 20:] = -1
    sink = torch.randn(heads, generator=g)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    w_off, w_soff = cache.ring_offsets(layer, positions)
    e_off, e_soff = cache.entry_offsets(source, torch.arange(cache.num_entries(source)))
    window_keys = decode_keys(dev(cache.pool.slots_buffer), dev(w_off), dev(w_soff), dim, fp4=False)
    entry_keys = decode_keys(dev(cache.pool.pages_buffer), dev(e_off), dev(e_soff), dim, fp4=True)
    assert torch.equal(window_keys.float().cpu(), cache.ring_read(layer, positions))
    assert torch.equal(entry_keys.float().cpu(), cache.entries_gather(source, torch.arange(cache.num_entries(source))))
    rows = (dev(slots), entry_keys, dev(idx), dev(sink), dim**-0.5)
    got = attend_decoded(dev(q), window_keys, *rows).cpu()
    assert torch.equal(attend_decoded(Queries(dev(raw), dev(cos), dev(sin), False), window_keys, *rows).cpu(), got)

    win = positions.expand(n, -1).clone()
    win[0, :3] = -1
    codes, scales = cache.ring_offsets(layer, win.clamp_min(0))
    e_off, e_soff = cache.entry_offsets(source, idx)
    byte_form = sparse_attention(dev(q), dev(cache.pool.slots_buffer), dev(torch.where(win >= 0, codes, -1)),
                                 dev(scales), dev(cache.pool.pages_buffer), dev(torch.where(idx >= 0, e_off, -1)),
                                 dev(e_soff), dev(sink), dim**-0.5, prefill=True, tiles=dict(TWO_PASS=1)).cpu()
    ref = sparse_attention_ref(q, cache.ring_read(layer, positions), win >= 0,
                               cache.entries_gather(source, idx.clamp_min(0)), idx >= 0, sink, dim**-0.5)
    top = ref.abs().max()
    assert (got - ref).abs().max() < REL * top + 1e-5
    assert (got - byte_form).abs().max() < REL * top + 1e-6


def test_a_prefill_chunk_attends_over_keys_decoded_once(golden_dir, golden, monkeypatch):
    """A prefill chunk's attention on the kernel path in exact mode (scratch_attention with
    DECODED_EXACT: its window and its source's entries decoded once, attend_decoded) gives
    every layer the byte form's output within fp32's rounding in a chunk after the first (its
    window partly in the ring, its entries in the first one's pages), and on the CPU the
    golden logits. PREFILL_QUERIES made small: a golden prompt stands for a chunk's thousands
    of rows. The first chunk runs on the reference path (quick under the interpreter)."""
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.kernels import sparse_attention as sa
    from dsflash.model.layers import attention_kernel

    model = DeepseekV41.from_checkpoint(golden_dir, device=DEVICE)
    monkeypatch.setattr(sa, "PREFILL_QUERIES", 8)
    real, decoded = attention_kernel.scratch_attention, []

    def both_forms(cfg, run, *args):
        # each call writes the chunk's keys over the ring's old window, which the other reads
        slots, spans = run.cache.pool.slots_buffer.clone(), copy.deepcopy(run.cache.ring_spans)
        monkeypatch.setitem(sa.PREFILL_TILES, "DECODED_EXACT", 0)
        byte_form = real(cfg, run, *args)
        run.cache.pool.slots_buffer.copy_(slots)
        run.cache.ring_spans[:] = spans
        monkeypatch.setitem(sa.PREFILL_TILES, "DECODED_EXACT", 1)
        got = real(cfg, run, *args)
        decoded.append(float((got - byte_form).abs().max() / byte_form.abs().max()))
        return got

    monkeypatch.setattr(attention_kernel, "scratch_attention", both_forms)
    # chunks past what the golden model's ring takes in place (13 rows) go to scratch_attention;
    # the second one's window starts in the ring, its entries in the first one's pages
    n, chunk = 28, 14
    ids = golden[1]["input_ids"]
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=16), 60, 1, plain_allocator(DEVICE))
    cache = PagedCache(pool, model.config)
    with torch.inference_mode():
        step(model, [cache], [ids[:chunk]])
        model.ops = TritonOps(model.ops.weights, device=DEVICE)
        logits = step(model, [cache], [ids[chunk:n]], logits="all").logits[0].cpu()
    cache.release()
    assert len(decoded) == model.config.num_layers and max(decoded) < 1e-5, decoded
    if DEVICE == "cpu":  # (the GPU's prefill forms at 8 rows a launch are further off the golden logits, either form)
        ref = golden[1]["logits"][chunk:n]
        d = (logits - ref).abs().amax(-1)
        assert (d <= 1e-2).float().mean() >= 0.9 and (logits.argmax(-1) == ref.argmax(-1)).all(), d


@pytest.mark.parametrize("form", ["tall", "tall_fp8"])  # (a run takes it in tall tiles only)
def test_score_tiles_keep_the_filtered_top_ks_scores_as_they_make_them(form, paged, monkeypatch):
    """indexer_scores' keep: the tiles' epilogue does the filtered top-k's filtering, against
    floors from sampled_scores (bit for bit the full scores at those entries), and pick_kept
    then gives top_k_ascending_ref's ids of the scores: in rows of several chunks, heavy ties
    (entries that share keys), rows that see few entries (every returnable score kept), a
    candidate pool, padded rows, and chunks that overflow their places (the whole-row select)."""
    from dsflash.model.kernels import indexer_score, top_k

    monkeypatch.setattr(indexer_score, "TALL_FP8", form == "tall_fp8")
    g = _g(12)
    cache, source = paged, 7
    total = cache.num_entries(source)
    n, N, k, sample = 70, 601, 20, 64
    q, w = fake_quant_fp4(torch.randn(n, 16, 32, generator=g), 32), torch.randn(n, 16, generator=g)
    visible = torch.randint(0, N + 1, (n,), generator=g)
    visible[:3] = torch.tensor([0, 5, 30])  # fewer visible entries than k, or than the floor's rank
    entries = torch.randint(0, total, (N,), generator=g)  # N entries over the cache's keys: ties
    k_off, k_soff = cache.entry_offsets(source, entries, kind="key")
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    args = (dev(q), dev(w), dev(visible), dev(cache.pool.pages_buffer), dev(k_off), dev(k_soff))
    kw = dict(exact_in_bf16=True, tall=form.startswith("tall"), fp8=form == "tall_fp8")
    width = indexer_score.padded_width(N)
    columns = top_k.sample_columns(N, torch.device(DEVICE), sample)
    for kept in (None, ((torch.rand(n, -(-N // 4), generator=g) < 0.7).to(DEVICE), 4)):
        sample = indexer_score.entry_sample(args[2], args[4], args[5], columns)
        sampled = indexer_score.sampled_scores(args[0], args[1], args[3], sample, slice(None), kept, **kw)
        full = indexer_scores(*args, **kw, kept=kept, pad=True)
        assert torch.equal(sampled.cpu(), full[:, columns].cpu())
        for capacity in (256, 8):
            work = top_k.kept_work(n, width, k, torch.device(DEVICE), chunks=3, block=128, capacity=capacity,
                                   atomic=True, floor=top_k.sample_floors(sampled, k, N))
            assert work.chunks == 3
            scores = indexer_scores(*args, **kw, kept=kept, pad=True, keep=work)
            assert torch.equal(scores.cpu(), full.cpu())
            got = top_k.pick_kept(scores, k, work).cpu()
            assert torch.equal(got, top_k_ascending_ref(scores.cpu(), k))
            counts = work.counts.cpu()
            held = (counts.amax(1) <= capacity) & (counts.sum(1) >= k)  # rows picked from their kept scores
            overflowed = counts.amax(1) > capacity  # rows selected whole
            assert (held.sum() if capacity == 256 else overflowed.sum()) > n // 2 and counts.sum() < n * N // 2
