"""Faithful prefill's FP8 tensor-core operands (model/kernels/fp8_blockwise.py): activations and
weights re-encoded under 128-wide scale blocks, against quant.py's references and the bounds
the module states; on CPU under TRITON_INTERPRET=1 with the product in fp32, on the GPU through
torch._scaled_mm and the prefill entry points that use it."""

from __future__ import annotations

import pytest
import torch

from dsflash.model import quant
from dsflash.model.kernels import fp8_blockwise, prefill_gemms
from dsflash.model.kernels.common import quad_units
from dsflash.model.kernels.fp4_moe import fp4_moe_ref
from dsflash.model.kernels.fp8_gemm import fp8_gemm_ref
from dsflash.model.quant import dequantize_fp8_weight, fake_quant_fp8, quantize_fp8_weight
from tests.model.test_kernels import DEVICE, _device_experts, _g, _moe_case


def _on_grid(rows: int, k: int, seed: int) -> torch.Tensor:
    """Faithful mode's GEMM input: bf16 rows on the 1 x 32 FP8 grid, each 32 columns at their own
    magnitude (so that a 128-block's four scales differ)."""
    g = _g(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-6, 6, (k // 32,), generator=g).float()
                                                      ).repeat_interleave(32)
    return fake_quant_fp8(x).to(torch.bfloat16)


# the encode's program shapes (fp8_blockwise.ROW_TILE): a row's blocks, a block's rows, and a
# tile that cuts both the rows (12 of 16 aligned rows) and the blocks unevenly
TILES = [(1, 8), (32, 1), (8, 4)]


@pytest.mark.parametrize("tile", TILES)
def test_rows_are_the_round_trips_codes_under_128_column_blocks(tile, monkeypatch):
    """Codes and scales as quant.fp8_round_trip gives them with 128-column blocks, the rows padded
    to ROW_ALIGN with zeros; groups' codes laid out a group at a time; each run's scales
    together, as segment_scales reads them; rows taken from other rows' places (sources)."""
    monkeypatch.setattr(fp8_blockwise, "ROW_TILE", tile)
    x = _on_grid(12, 768, 1)
    _, (ref_codes, ref_bytes) = quant.fp8_round_trip(x.float(), block=128)
    ref_scales = torch.exp2(ref_bytes.float() - 127)  # [12, 6]
    rows = fp8_blockwise.ROW_ALIGN
    codes, scales = fp8_blockwise.rows_1x128(x.to(DEVICE))
    assert codes.shape == (1, rows, 768) and torch.equal(codes[0, :12].cpu(), ref_codes) and not codes[0, 12:].any()
    assert torch.equal(fp8_blockwise.segment_scales(scales, 6, 0, rows)[:12].cpu(), ref_scales)
    codes, scales = fp8_blockwise.rows_1x128(x.to(DEVICE), groups=2)
    assert torch.equal(codes[:, :12].cpu(), ref_codes.view(12, 2, 384).transpose(0, 1))
    for g in range(2):
        got = fp8_blockwise.segment_scales(scales, 3, 0, rows, 3 * g, 6)[:12].cpu()
        assert torch.equal(got, ref_scales[:, 3 * g:3 * g + 3])
    counts = [5, 0, 7]
    codes, scales = fp8_blockwise.rows_1x128(x.to(DEVICE), counts=counts)
    assert torch.equal(codes[0].cpu(), ref_codes)
    for start, count in ((0, 5), (5, 7)):
        got = fp8_blockwise.segment_scales(scales, 6, start, count)
        assert got.stride() == (1, count) and torch.equal(got.cpu(), ref_scales[start:start + count])
    # rows read where they lie (the routed experts' tokens, repeats and all): as if gathered first
    sources = torch.tensor([3, 0, 3, 11, 7, 7, 2, 9, 1, 0, 5, 4])
    got = fp8_blockwise.rows_1x128(x.to(DEVICE), counts=counts, sources=sources.to(DEVICE))
    want = fp8_blockwise.rows_1x128(x[sources].to(DEVICE), counts=counts)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    got = fp8_blockwise.rows_1x128(x.to(DEVICE), sources=sources[:9].to(DEVICE))  # rows padded to ROW_ALIGN
    want = fp8_blockwise.rows_1x128(x[sources[:9]].to(DEVICE))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_fp8_weights_under_128_blocks_lose_only_bits_below_their_grid():
    """Each 128 x 128 block under its largest 32 x 32 scale: a block whose scales are equal keeps
    every value; elsewhere a value moves by at most half of 2^-9 times the block's scale."""
    g = _g(2)
    codes = torch.randint(0, 256, (256, 384), dtype=torch.uint8, generator=g)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # not NaN
    scales = torch.randint(110, 130, (8, 12), dtype=torch.uint8, generator=g)
    scales[:4, :4] = 120  # block (0, 0): one scale
    w, w_scales = fp8_blockwise.fp8_weight_128(codes.to(DEVICE), scales.to(DEVICE))
    w, w_scales = w.cpu(), w_scales.cpu()
    ref = dequantize_fp8_weight(codes, scales)
    assert torch.equal(w_scales, torch.exp2(scales.view(2, 4, 3, 4).amax((1, 3)).float() - 127))
    got = fp8_blockwise.weight_values(w, w_scales)
    assert torch.equal(got[:128, :128], ref[:128, :128])
    bound = w_scales.repeat_interleave(128, 0).repeat_interleave(128, 1) * 2.0**-10
    assert ((got - ref).abs() <= bound).all()
    assert (got != ref).any()  # the spread scales did move some values


def test_fp4_experts_under_128_blocks_are_exact_within_eight_binades():
    """e2m1 codes (2 significant bits, 0.5 and up) shifted down by up to 8 binades stay on e4m3's
    grid."""
    g = _g(3)
    packed = torch.randint(0, 256, (2, 128, 128), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 127, (2, 128, 8), dtype=torch.uint8, generator=g)
    scales[1, :, 4:] = torch.randint(110, 118, (128, 4), dtype=torch.uint8, generator=g)  # a block of its own
    w, w_scales = fp8_blockwise.fp4_weight_128(quad_units(packed).to(DEVICE), scales.to(DEVICE))
    w, w_scales = w.cpu(), w_scales.cpu()
    ref = torch.stack([quant.dequantize_fp4_weight(packed[e], scales[e]) for e in range(2)])
    got = fp8_blockwise.weight_values(w, w_scales)
    assert torch.equal(w_scales, torch.exp2(scales.view(2, 128, 2, 4).amax((1, 3)).float() - 127).view(2, 1, 2))
    assert torch.equal(got, ref)


def test_the_product_stays_within_the_regrids_rounding():
    """rows_1x128 and fp8_weight_128 into product (torch._scaled_mm on the GPU, fp32 on the CPU)
    against the exact product of the same FP8-grid values: what moved is the regrids' rounding
    and, on the GPU, the FP8 MMAs' sums."""
    x = _on_grid(40, 384, 4)
    codes, scales = quantize_fp8_weight(torch.randn(256, 384, generator=_g(5)))
    a, a_scales = fp8_blockwise.rows_1x128(x.to(DEVICE))
    w, w_scales = fp8_blockwise.fp8_weight_128(codes.to(DEVICE), scales.to(DEVICE))
    got = fp8_blockwise.product(a[0], fp8_blockwise.segment_scales(a_scales, 3, 0, 48), w, w_scales)[:40].cpu()
    ref = fp8_gemm_ref(x, codes, scales)
    assert (got - ref).abs().max() < 1e-3 * ref.abs().max()


def _switch(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(prefill_gemms, "FP8_TENSOR_CORES", on)
    if DEVICE == "cpu":  # the FP8 path with its products in fp32 (product's CPU form)
        monkeypatch.setattr(fp8_blockwise, "runs_on", lambda device, n, k: n % 128 == 0 and k % 128 == 0)


def test_prefill_products_on_the_fp8_tensor_cores_match_the_exact_ones(monkeypatch):
    """The prefill entry points with bf16 (faithful) input, FP8 tensor cores against the exact
    bf16 path: fp8_product (K of 10 and 40 blocks, rows no multiple of ROW_ALIGN),
    grouped_fp8_product, fp4_experts with both projections (one expert's run 3 rows long among
    runs of dozens or hundreds); exact mode's fp32 rows keep the exact path. On a GPU at a
    prefill chunk's rows through cuBLAS, on CPU at a few rows (the products in fp32)."""
    rows = prefill_gemms.ROWS + 67 if DEVICE == "cuda" else 37
    for n, k in ((512, 1280), (256, 5120)):
        x = _on_grid(rows, k, 6).to(DEVICE)
        codes, scales = [t.to(DEVICE) for t in quantize_fp8_weight(torch.randn(n, k, generator=_g(7)))]
        _switch(monkeypatch, False)
        ref = prefill_gemms.fp8_product(x, codes, scales)
        _switch(monkeypatch, True)
        if DEVICE == "cuda" and torch.cuda.get_device_capability() >= (9, 0):
            assert fp8_blockwise.fits(x, n, k)  # Hopper: the FP8 path runs (its check at first use passed)
        got = prefill_gemms.fp8_product(x, codes, scales)
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-3 * ref.abs().max(), (n, k)
        assert not fp8_blockwise.fits(x.float(), n, k)  # exact mode's fp32 rows keep the exact products
    x = _on_grid(rows, 4 * 256, 8).to(DEVICE)
    codes, scales = [t.to(DEVICE) for t in quantize_fp8_weight(torch.randn(4 * 128, 256, generator=_g(9)))]
    _switch(monkeypatch, False)
    ref = prefill_gemms.grouped_fp8_product(x, codes, scales, 4)
    _switch(monkeypatch, True)
    got = prefill_gemms.grouped_fp8_product(x, codes, scales, 4)
    assert got.shape == ref.shape and (got - ref).abs().max() < 1e-3 * ref.abs().max()
    if DEVICE == "cuda" and torch.cuda.get_device_capability() >= (9, 0):
        assert fp8_blockwise._writes_column_slices()  # (so the groups above went straight to their columns)
    # six experts: five share the tokens, the sixth takes 3 (a short run among long ones)
    stack, xe, _, weights = _moe_case(_g(10), rows, E=6, H=256, inter=128, k=3)
    idx = torch.stack([torch.randperm(5, generator=_g(11 + t))[:3] for t in range(rows)])
    idx[:3, 0] = 5
    xe = fake_quant_fp8(xe).to(torch.bfloat16)
    ref = fp4_moe_ref(xe, idx, weights, *stack, 0.7, act_quant=True)
    got = prefill_gemms.fp4_experts(xe.to(DEVICE), idx.to(DEVICE), weights.to(DEVICE), *_device_experts(stack), 0.7,
                                    act_quant=True).cpu()
    assert (got - ref).abs().max() < 2e-2 * ref.abs().max()


def _gate_up(rows: int, inter: int, seed: int) -> torch.Tensor:
    """A gate/up product's fp32 output [rows, 2 * inter]: 32-column stretches at their own
    magnitudes, some past the SwiGLU's clamp."""
    g = _g(seed)
    return torch.randn(rows, 2 * inter, generator=g) * torch.exp2(
        torch.randint(-8, 4, (2 * inter // 32,), generator=g).float()).repeat_interleave(32)


@pytest.mark.parametrize("tile", TILES)
def test_the_rounding_in_the_encode_is_the_round_trip_then_the_encode(tile, monkeypatch):
    """rows_1x128 of fp32 rows with round_first gives, to the bit, the codes and scales it makes
    of quantize.fp8_grid_bf16's rounding of them (faithful mode's GEMM input): alone (rows
    padded), in groups (wo_a's) and in runs."""
    from dsflash.model.kernels.quantize import fp8_grid_bf16

    monkeypatch.setattr(fp8_blockwise, "ROW_TILE", tile)
    x = _gate_up(40, 384, 30).to(DEVICE)
    on_grid = fp8_grid_bf16(x)
    for options in ({}, {"groups": 2}, {"counts": [15, 0, 25]}):
        got = fp8_blockwise.rows_1x128(x, round_first=True, **options)
        want = fp8_blockwise.rows_1x128(on_grid, **options)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), options
    # (here rounding first changes codes: a test that the rounding happens)
    assert not torch.equal(fp8_blockwise.rows_1x128(x)[0], fp8_blockwise.rows_1x128(on_grid)[0])


@pytest.mark.parametrize("tile", TILES)
def test_the_swiglu_in_the_encode_is_the_swiglu_then_the_encode(tile, monkeypatch):
    """swiglu_rows_1x128 gives, to the bit, the codes and scales rows_1x128 makes of the
    SwiGLU launch's output (routing weights, the 1 x 32 FP8 grid): runs of rows with their
    weights (zeros among them, as the padding rows'), and rows without weights, padded."""
    from dsflash.model.kernels.swiglu import clamped_swiglu

    monkeypatch.setattr(fp8_blockwise, "ROW_TILE", tile)

    gate_up = _gate_up(12, 256, 20).to(DEVICE)
    gate, up = gate_up[:, :256], gate_up[:, 256:]
    weights = torch.rand(12, generator=_g(21))
    weights[[2, 9]] = 0
    weights = weights.to(DEVICE)
    counts = [5, 0, 7]
    got = fp8_blockwise.swiglu_rows_1x128(gate, up, 7.0, weights, counts=counts)
    want = fp8_blockwise.rows_1x128(clamped_swiglu(gate, up, 7.0, row_weights=weights, fp8_grid=True), counts=counts)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[0].any() and not (got[0][0, 2] & 0x7F).any()  # (a weight of 0: its row's codes are +-0)
    got = fp8_blockwise.swiglu_rows_1x128(gate[:9], up[:9], 7.0)
    want = fp8_blockwise.rows_1x128(clamped_swiglu(gate[:9], up[:9], 7.0, fp8_grid=True))
    assert got[0].shape[1] == fp8_blockwise.ROW_ALIGN and all(torch.equal(a, b) for a, b in zip(got, want))


def _prefill_moe_case(monkeypatch, seed: int) -> tuple:
    """Six experts (H 256, inter 128) and the rows of a prefill chunk's 3 pairs a token on the
    FP8 path (on CPU a few rows, the products in fp32): (rows, stack, x, weights, idx on the device)."""
    _switch(monkeypatch, True)
    if DEVICE == "cpu":
        monkeypatch.setattr(prefill_gemms, "takes", lambda x: x.shape[0] >= 16)
    rows = prefill_gemms.ROWS + 67 if DEVICE == "cuda" else 37
    stack, xe, _, weights = _moe_case(_g(seed), rows, E=6, H=256, inter=128, k=3)
    idx = torch.stack([torch.randperm(6, generator=_g(seed + 1 + t))[:3] for t in range(rows)]).to(DEVICE)
    return rows, stack, xe, weights, idx


def test_the_swiglu_in_the_encode_gives_the_same_products(monkeypatch):
    """prefill_gemms.SWIGLU_ENCODE changes no bit: the routed experts (fp4_experts) and the
    shared expert's down projection, called directly and through TritonOps.swiglu_linear (the
    shared expert's dispatch; exact mode and the reference path keep linear of the SwiGLU). On
    CPU at a few rows with the products in fp32; on a GPU at a prefill chunk's rows."""
    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.kernels.swiglu import clamped_swiglu
    from dsflash.model.kernels.quantize import fp8_grid_bf16
    from dsflash.model.ops import ReferenceOps
    from dsflash.model.weights import Fp8Weight

    rows, stack, xe, weights, idx = _prefill_moe_case(monkeypatch, 22)
    xe = fake_quant_fp8(xe).to(torch.bfloat16).to(DEVICE)
    experts = (xe, idx, weights.to(DEVICE), *_device_experts(stack), 0.7)
    got = {}
    for on in (False, True):
        monkeypatch.setattr(prefill_gemms, "SWIGLU_ENCODE", on)
        got[on] = prefill_gemms.fp4_experts(*experts, act_quant=True)
    assert torch.equal(got[True], got[False]) and got[True].abs().max() > 0

    gate_up = _gate_up(rows, 256, 24).to(DEVICE)
    gate, up = gate_up[:, :256], gate_up[:, 256:]
    codes, scales = quantize_fp8_weight(torch.randn(384, 256, generator=_g(25)))
    want = prefill_gemms.fp8_product(fp8_grid_bf16(clamped_swiglu(gate, up, 7.0)), codes.to(DEVICE), scales.to(DEVICE))
    assert torch.equal(prefill_gemms.swiglu_fp8_product(gate, up, 7.0, codes.to(DEVICE), scales.to(DEVICE)), want)
    store = {"w2": Fp8Weight(codes, scales, (32, 32))}
    monkeypatch.setattr(prefill_gemms, "SWIGLU_ENCODE", True)
    fused = {"w2": 0}
    real = prefill_gemms.swiglu_fp8_product
    monkeypatch.setattr(prefill_gemms, "swiglu_fp8_product",
                        lambda *a: fused.__setitem__("w2", fused["w2"] + 1) or real(*a))
    faithful = TritonOps(store, act_quant=True, device=DEVICE).swiglu_linear(gate, up, 7.0, "w2")
    assert fused["w2"] == 1 and torch.equal(faithful, want)
    TritonOps(store, act_quant=False, device=DEVICE).swiglu_linear(gate, up, 7.0, "w2")
    reference = ReferenceOps(store, act_quant=True, device=DEVICE).swiglu_linear(gate, up, 7.0, "w2")
    assert fused["w2"] == 1  # exact mode and the reference path: linear of the SwiGLU
    assert (reference - want).abs().max() < 1e-3 * want.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("streams", [2, 3])
def test_products_in_turns_on_several_streams_give_the_same_bits(monkeypatch, streams):
    """prefill_gemms.PRODUCT_STREAMS changes no bit: the routed experts' runs (fp4_experts) on
    the FP8 tensor cores (faithful mode's rows) and in bf16 parts (exact mode's fp32 rows), and
    wo_a's groups (grouped_fp8_product), each product launched on one of `streams` streams in
    turn (stream_turns.in_turns), against all on the current stream; and the turns do run on
    that many streams, the current one's waiting for them all at the end."""
    from dsflash.model.kernels import stream_turns

    _, stack, xe, weights, idx = _prefill_moe_case(monkeypatch, 22)
    held = (idx, weights.to(DEVICE), *_device_experts(stack), 0.7)
    x = _on_grid(prefill_gemms.ROWS + 67, 4 * 256, 23).float().to(DEVICE)
    codes, scales = (t.to(DEVICE) for t in quantize_fp8_weight(torch.randn(4 * 256, 256, generator=_g(24))))
    got = {}
    for count in (1, streams):
        monkeypatch.setattr(prefill_gemms, "PRODUCT_STREAMS", count)
        got[count] = (prefill_gemms.fp4_experts(fake_quant_fp8(xe).to(torch.bfloat16).to(DEVICE), *held,
                                                act_quant=True),
                      prefill_gemms.fp4_experts(xe.to(DEVICE), *held),
                      prefill_gemms.grouped_fp8_product(x, codes, scales, 4, round_first=True))
    for one, several in zip(got[1], got[streams]):
        assert torch.equal(one, several) and one.abs().max() > 0
    main = torch.cuda.current_stream()
    with stream_turns.in_turns(main.device, streams) as turns:
        used = []
        for _, turn in zip(range(2 * streams), turns):
            with turn:
                used.append(torch.cuda.current_stream())
    assert used[:streams] == used[streams:] and len(set(used)) == streams and used[0] == main
    assert torch.cuda.current_stream() == main


def test_a_prefill_chunks_ffn_rows_are_encoded_once_for_the_shared_and_the_routed_experts(monkeypatch):
    """moe() in faithful prefill on one rank (SHARED_EXPERT_OPERAND with EXPERT_ROWS_ENCODED_ONCE):
    the rows encoded once (TritonOps.ffn_operand) for the shared expert's gate/up product and the
    routed experts' pairs, the layer's output the bits of each encoding its own; the operand's
    product the bits of the rows'. On CPU at a few rows with the products in fp32; on a GPU at a
    prefill chunk's."""
    from types import SimpleNamespace

    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.layers.moe import moe
    from dsflash.model.weights import Fp4Weight, Fp8Weight

    rows, stack, xe, _, _ = _prefill_moe_case(monkeypatch, 34)
    monkeypatch.setattr(prefill_gemms, "EXPERT_PAIRS", 1)
    monkeypatch.setattr(prefill_gemms, "SHARED_EXPERT_OPERAND", True)
    x = (xe * 3).to(DEVICE)
    store = {}
    for e in range(6):
        store[f"L.ffn.experts.{e}.w1"] = Fp4Weight(stack[0][e, :128], stack[1][e, :128])
        store[f"L.ffn.experts.{e}.w3"] = Fp4Weight(stack[0][e, 128:], stack[1][e, 128:])
        store[f"L.ffn.experts.{e}.w2"] = Fp4Weight(stack[2][e], stack[3][e])
    for i, (name, shape) in enumerate((("w1", (128, 256)), ("w3", (128, 256)), ("w2", (256, 128)))):
        store[f"L.ffn.shared_experts.{name}"] = Fp8Weight(
            *quantize_fp8_weight(torch.randn(*shape, generator=_g(35 + i)) / 8), (32, 32))
    store["L.ffn.gate.weight"] = (torch.randn(6, 256, generator=_g(38)) / 16).to(torch.bfloat16)
    store["L.ffn.gate.bias"] = torch.zeros(6)
    cfg = SimpleNamespace(swiglu_limit=0.7, gate_temp=1.0, norm_topk_prob=True, routed_scaling_factor=1.5)
    role = SimpleNamespace(prefix="L", n_routed_experts=6, num_experts_per_tok=3)
    shared = ("L.ffn.shared_experts.w1", "L.ffn.shared_experts.w3")
    encodes, encode = [], fp8_blockwise.rows_1x128
    monkeypatch.setattr(fp8_blockwise, "rows_1x128", lambda *a, **kw: encodes.append(kw) or encode(*a, **kw))
    out, rounding_encodes = {}, {}
    for on in (False, True):
        monkeypatch.setattr(prefill_gemms, "EXPERT_ROWS_ENCODED_ONCE", on)
        ops = TritonOps(dict(store), act_quant=True, device=DEVICE)
        operand = ops.ffn_operand(x, "L.ffn.experts", range(6), 3, shared)
        assert (operand is not None) == on
        if on:
            parts = zip(ops.linear_many(operand, shared), ops.linear_many(x, shared))
            assert all(torch.equal(a, b) for a, b in parts)
        encodes.clear()
        out[on] = moe(ops, cfg, role, x)
        rounding_encodes[on] = sum(bool(kw.get("round_first")) for kw in encodes)
    assert torch.equal(out[True], out[False]) and out[True].abs().max() > 0
    assert rounding_encodes == {False: 1, True: 1}  # the shared expert's, or the one both take
    # the FFN site's pass encoding its input for both (hc_streams.SITE_OPERAND): no encode of x
    # left in the layer, the same bits
    from dsflash.model.kernels import hc_streams
    from dsflash.model.layers.moe import shared_input_weights
    from tests.model.test_kernels import _mhc_site

    monkeypatch.setattr(hc_streams, "SITE_ROWS", 1)
    monkeypatch.setattr(hc_streams, "SITE_OPERAND", True)
    if DEVICE == "cpu":
        monkeypatch.setattr(prefill_gemms, "takes_rows", lambda rows, device: rows >= 16)
    S, N, X, y, post, comb, fn, base, hc_scale = [t.to(DEVICE) if torch.is_tensor(t) else t
                                                  for t in _mhc_site(_g(48), rows, 256)]
    pre = (torch.rand(rows, S, generator=_g(49)) + 0.1).to(DEVICE)
    ops = TritonOps(dict(store), act_quant=True, device=DEVICE)
    _, _, xf = ops.hc_expand_mix_collapse(y, X, post, comb, fn, base, hc_scale, 2, 1e-6, 1e-6, pre, None,
                                          encode_for=shared_input_weights("L"))
    encodes.clear()
    got = moe(ops, cfg, role, xf)
    assert sum(bool(kw.get("round_first")) for kw in encodes) == 0 and ops.encoded_input(xf) is None
    for switch in ("SITE_OPERAND", "SHARED_EXPERT_OPERAND", "EXPERT_ROWS_ENCODED_ONCE"):  # each encodes its own
        monkeypatch.setattr(hc_streams if switch == "SITE_OPERAND" else prefill_gemms, switch, False)
    assert torch.equal(got, moe(TritonOps(dict(store), act_quant=True, device=DEVICE), cfg, role, xf))


def test_an_attention_sites_pass_encodes_its_input_for_wq_a_and_wkv(monkeypatch):
    """hc_streams.SITE_OPERAND through TritonOps: a one-pass site (with and without the expand)
    asked to encode for the merged wq_a and wkv (attention.input_weights) hands its input's
    operand out once, to that input only (encoded_input), their products from it the bits of
    theirs from the input; attention.project takes it, to the same bits; off, None. On CPU at a
    few rows with the products in fp32; on a GPU at a prefill chunk's."""
    from types import SimpleNamespace

    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.kernels import hc_streams
    from dsflash.model.layers.attention import input_weights, project
    from dsflash.model.weights import Fp8Weight
    from tests.model.test_kernels import _mhc_site

    _switch(monkeypatch, True)
    if DEVICE == "cpu":
        monkeypatch.setattr(prefill_gemms, "takes_rows", lambda rows, device: rows >= 16)
    monkeypatch.setattr(hc_streams, "SITE_ROWS", 1)
    monkeypatch.setattr(hc_streams, "SITE_OPERAND", True)
    T, H = (prefill_gemms.ROWS + 67 if DEVICE == "cuda" else 20), 256
    S, N, X, y, post, comb, fn, base, scale = [t.to(DEVICE) if torch.is_tensor(t) else t
                                               for t in _mhc_site(_g(40), T, H)]
    names = input_weights("L")
    store = {name: Fp8Weight(*quantize_fp8_weight(torch.randn(n, H, generator=_g(41 + n)) / 16), (32, 32))
             for name, n in zip(names, (128, 256))}
    store["L.attn.wq_b"] = Fp8Weight(*quantize_fp8_weight(torch.randn(128, 128, generator=_g(45)) / 16), (32, 32))
    store["L.attn.q_norm.weight"] = torch.rand(128, generator=_g(46)) + 0.5
    store["L.attn.kv_norm.weight"] = torch.rand(256, generator=_g(47)) + 0.5
    ops = TritonOps(store, act_quant=True, device=DEVICE)
    pre = (torch.rand(T, S, generator=_g(43)) + 0.1).to(DEVICE)
    site = (fn, base, scale, 2, 1e-6, 1e-6, pre, (torch.rand(H, generator=_g(44)) + 0.5).to(DEVICE))
    for expand in (False, True):
        if expand:
            _, _, xa = ops.hc_expand_mix_collapse(y, X, post, comb, *site, encode_for=names)
        else:
            _, xa = ops.hc_mix_collapse(X, *site, encode_for=names)
        operand = ops.encoded_input(xa)
        assert operand is not None and ops.encoded_input(xa) is None  # (once)
        assert all(torch.equal(a, b) for a, b in zip(ops.linear_many(operand, names), ops.linear_many(xa, names)))
    _, xa = ops.hc_mix_collapse(X, *site, encode_for=names)
    assert ops.encoded_input(xa.clone()) is None
    cfg = SimpleNamespace(rms_norm_eps=1e-6, head_dim=64, rope_head_dim=16, num_heads=2)
    role = SimpleNamespace(prefix="L")
    taken, many = [], ops.linear_many
    monkeypatch.setattr(ops, "linear_many", lambda x, n: taken.append(type(x).__name__) or many(x, n))
    _, xa = ops.hc_mix_collapse(X, *site, encode_for=names)
    got = project(ops, cfg, role, xa)
    want = project(ops, cfg, role, xa)  # (handed out once: now the input's own encode)
    assert taken == ["Operand", "Tensor"] and all(torch.equal(a, b) for a, b in zip(got[:3], want[:3]))
    # an input only the projections read (keep_input False): with UNREAD_INPUT_LEFT, the operand
    # comes in its place, to project's same bits; without it, the input as before
    def site_input(expand: bool, keep_input: bool):
        if expand:
            return ops.hc_expand_mix_collapse(y, X, post, comb, *site, encode_for=names, keep_input=keep_input)[2]
        return ops.hc_mix_collapse(X, *site, encode_for=names, keep_input=keep_input)[1]

    for left in (True, False):
        monkeypatch.setattr(hc_streams, "UNREAD_INPUT_LEFT", left)
        for expand in (False, True):
            want = project(ops, cfg, role, site_input(expand, True))
            xa = site_input(expand, False)
            assert isinstance(xa, fp8_blockwise.Operand) == left
            assert all(torch.equal(a, b) for a, b in zip(project(ops, cfg, role, xa)[:3], want[:3]))
    monkeypatch.setattr(hc_streams, "SITE_OPERAND", False)
    _, xa = ops.hc_mix_collapse(X, *site, encode_for=names)
    assert ops.encoded_input(xa) is None


@pytest.mark.parametrize("tile", TILES)
def test_an_operands_rows_gathered_are_the_encode_of_the_gathered_rows(tile, monkeypatch):
    """gathered_1x128 of fp32 rows encoded once (rounded inside) gives, to the bit, the codes and
    scales rows_1x128 makes of the rounding launch's bf16 rows gathered (the routed experts'
    pairs: runs with an empty one, a token taken by several pairs, rows in any order)."""
    from dsflash.model.kernels.quantize import fp8_grid_bf16

    monkeypatch.setattr(fp8_blockwise, "ROW_TILE", tile)
    x = _gate_up(13, 192, 31).to(DEVICE)  # 13 rows (padded to 16 in the operand), 384 columns
    operand = fp8_blockwise.Operand(*fp8_blockwise.rows_1x128(x, round_first=True), 13)
    sources = torch.tensor([3, 0, 12, 3, 7, 7, 1, 0, 5, 11, 12], device=DEVICE)
    counts = [4, 0, 7]
    got = fp8_blockwise.gathered_1x128(operand, counts, sources)
    want = fp8_blockwise.rows_1x128(fp8_grid_bf16(x), counts=counts, sources=sources)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and got[0].any()


def test_the_experts_rows_encoded_once_give_the_same_products(monkeypatch):
    """prefill_gemms.EXPERT_ROWS_ENCODED_ONCE changes no bit: fp4_experts of the tokens' fp32
    rows encoded once (expert_rows_operand) against fp4_experts of the rounding launch's bf16
    rows, and TritonOps.routed_experts with the switch off and on. On CPU at a few rows with
    the products in fp32; on a GPU at a prefill chunk's rows."""
    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.kernels.quantize import fp8_grid_bf16
    from dsflash.model.weights import Fp4Weight

    rows, stack, xe, weights, idx = _prefill_moe_case(monkeypatch, 32)
    x = (xe * 3).to(DEVICE)
    experts = (idx, weights.to(DEVICE), *_device_experts(stack), 0.7)
    monkeypatch.setattr(prefill_gemms, "EXPERT_PAIRS", 1)
    want = prefill_gemms.fp4_experts(fp8_grid_bf16(x), *experts, act_quant=True)
    monkeypatch.setattr(prefill_gemms, "EXPERT_ROWS_ENCODED_ONCE", False)
    assert prefill_gemms.expert_rows_operand(x, idx.numel(), 6, stack[0]) is None
    monkeypatch.setattr(prefill_gemms, "EXPERT_ROWS_ENCODED_ONCE", True)
    operand = prefill_gemms.expert_rows_operand(x, idx.numel(), 6, stack[0].to(DEVICE))
    assert operand is not None and torch.equal(prefill_gemms.fp4_experts(operand, *experts, act_quant=True), want)
    assert prefill_gemms.expert_rows_operand(x.to(torch.bfloat16), idx.numel(), 6, stack[0]) is None
    store = {}
    for e in range(6):  # the experts as a checkpoint holds them: w1 and w3 the halves of w13
        store[f"e.{e}.w1"] = Fp4Weight(stack[0][e, :128], stack[1][e, :128])
        store[f"e.{e}.w3"] = Fp4Weight(stack[0][e, 128:], stack[1][e, 128:])
        store[f"e.{e}.w2"] = Fp4Weight(stack[2][e], stack[3][e])
    got, gathers = {}, []
    gathered = fp8_blockwise.gathered_1x128
    monkeypatch.setattr(fp8_blockwise, "gathered_1x128", lambda *a: gathers.append(1) or gathered(*a))
    for on in (False, True):
        monkeypatch.setattr(prefill_gemms, "EXPERT_ROWS_ENCODED_ONCE", on)
        got[on] = TritonOps(store, act_quant=True, device=DEVICE).routed_experts("e", range(6), x, idx,
                                                                                 weights.to(DEVICE), 0.7)
        assert len(gathers) == on  # (the switch took the operand's path)
    assert torch.equal(got[True], got[False]) and torch.equal(got[True], want)


def test_the_rounding_in_the_encode_gives_the_same_products(monkeypatch):
    """prefill_gemms.ROUND_IN_ENCODE changes no bit of faithful mode's dense products on fp32
    prefill rows: fp8_gemm (TritonOps.linear's) and grouped_fp8_gemm through TritonOps.
    grouped_linear (wo_a's, which now rounds its input itself, as linear does, on the reference
    path too); exact mode's rows are never rounded. On CPU at a few rows with the products in
    fp32; on a GPU at a prefill chunk's rows."""
    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.kernels.fp8_gemm import fp8_gemm, grouped_fp8_gemm
    from dsflash.model.ops import ReferenceOps
    from dsflash.model.weights import Fp8Weight

    _switch(monkeypatch, True)
    if DEVICE == "cpu":
        monkeypatch.setattr(prefill_gemms, "takes", lambda x: x.shape[0] >= 16)
    rows = prefill_gemms.ROWS + 67 if DEVICE == "cuda" else 37
    x = _gate_up(rows, 384, 31).to(DEVICE)  # [rows, 768] fp32, 32-column stretches at their own magnitudes
    codes, scales = quantize_fp8_weight(torch.randn(256, 768, generator=_g(32)))
    wo_a = Fp8Weight(*quantize_fp8_weight(torch.randn(3 * 128, 256, generator=_g(33))), (32, 32))
    rounded = []
    encode = fp8_blockwise.rows_1x128
    monkeypatch.setattr(fp8_blockwise, "rows_1x128",
                        lambda *a, **kw: rounded.append(kw.get("round_first", False)) or encode(*a, **kw))
    got = {}
    for on in (False, True):
        monkeypatch.setattr(prefill_gemms, "ROUND_IN_ENCODE", on)
        rounded.clear()
        got[on] = (fp8_gemm(x, codes.to(DEVICE), scales.to(DEVICE), act_quant=True),
                   TritonOps({"wo_a": wo_a}, act_quant=True, device=DEVICE).grouped_linear(x, "wo_a", 3))
        assert rounded == [on, on]  # both took the FP8 path, rounding in the encode where it is on
    assert all(torch.equal(a, b) for a, b in zip(got[False], got[True])) and got[True][1].abs().max() > 0
    rounded.clear()
    fp8_gemm(x, codes.to(DEVICE), scales.to(DEVICE))
    grouped_fp8_gemm(x, wo_a.weight.to(DEVICE), wo_a.scale.to(DEVICE), 3)
    assert rounded == []  # exact mode: fp32 rows keep the exact products
    reference = {a: ReferenceOps({"wo_a": wo_a}, act_quant=a, device=DEVICE).grouped_linear(x, "wo_a", 3)
                 for a in (False, True)}
    scale = got[True][1].abs().max()
    assert (reference[True] - got[True][1]).abs().max() < 1e-3 * scale
    assert (reference[False] - got[True][1]).abs().max() > 1e-2 * scale  # (the reference path rounds too)


def test_dense_weights_kept_encoded_give_the_same_products(monkeypatch):
    """TritonOps.keep_encoded_weights: faithful prefill's dense products (linear_many's merged
    weights, linear, grouped_linear's wo_a, swiglu_linear's shared expert) give the same bits
    with their weights' FP8 tensor-core forms kept as encoded each chunk. Kept, a second chunk
    encodes no weight; a budget that holds only the first weight met keeps that one; a weight
    that goes away takes its bytes off the budget. On CPU at a few rows with the products in
    fp32; on a GPU at a prefill chunk's rows."""
    import gc

    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.weights import Fp8Weight

    _switch(monkeypatch, True)
    if DEVICE == "cpu":
        monkeypatch.setattr(prefill_gemms, "takes", lambda x: x.shape[0] >= 16)
    rows = prefill_gemms.ROWS + 67 if DEVICE == "cuda" else 37
    x = _gate_up(rows, 128, 41).to(DEVICE)  # [rows, 256] fp32: rounded onto the FP8 grid in the encode
    shapes = {"wq_a": (128, 256), "wkv": (128, 256), "wo_b": (384, 256), "wo_a": (256, 128), "w2": (256, 128)}
    encodes = []
    encode = fp8_blockwise.fp8_weight_128
    monkeypatch.setattr(fp8_blockwise, "fp8_weight_128", lambda *a: encodes.append(a[0].shape) or encode(*a))

    def ops(budget: int) -> TritonOps:
        store = {name: Fp8Weight(*quantize_fp8_weight(torch.randn(*shape, generator=_g(42 + i))), (32, 32))
                 for i, (name, shape) in enumerate(shapes.items())}
        made = TritonOps(store, act_quant=True, device=DEVICE)
        made.keep_encoded_weights(budget)
        return made

    def chunk(on: TritonOps) -> list[torch.Tensor]:
        encodes.clear()
        return [*on.linear_many(x, ("wq_a", "wkv")), on.linear(x, "wo_b"), on.grouped_linear(x, "wo_a", 2),
                on.swiglu_linear(x[:, :128], x[:, 128:], 7.0, "w2")]

    want = chunk(ops(0))
    assert encodes == [(256, 256), (384, 256), (256, 128), (256, 128)]  # each product on the FP8 path
    merged = 256 * 256 + 2 * 2 * 4  # the first weight met: its codes and fp32 128-block scales
    everything = merged + 384 * 256 + 3 * 2 * 4 + 2 * (256 * 128 + 2 * 1 * 4)
    for budget, encoded_again, used in ((1 << 30, 0, everything), (merged, 3, merged)):
        kept = ops(budget)
        assert all(torch.equal(a, b) for a, b in zip(chunk(kept), want)) and len(encodes) == 4
        assert all(torch.equal(a, b) for a, b in zip(chunk(kept), want)) and len(encodes) == encoded_again
        assert kept.weight_cache.used == used
    cache = prefill_gemms.EncodedWeights(1 << 20)
    codes, scales = [t.to(DEVICE) for t in quantize_fp8_weight(torch.randn(128, 128, generator=_g(47)))]
    first = cache.dense(codes, scales)
    assert cache.dense(codes, scales) is first and cache.used == 128 * 128 + 4
    del codes, first
    gc.collect()
    assert cache.used == 0


def test_the_check_at_first_use_holds_the_product_to_its_values(monkeypatch):
    """_runs_right (fits asks it once a GPU) compares a small product with the same codes' fp32
    product and says no where they differ or the product raises: those GPUs keep the bf16 path.
    On a GPU the check itself runs there; on CPU its GPU calls are turned into CPU ones, the
    first product standing for cuBLAS's."""
    import contextlib

    if DEVICE == "cpu":
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
        monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    elif torch.cuda.get_device_capability(0) < (8, 9):
        pytest.skip("no FP8 tensor cores on this GPU (before sm_89)")
    check = fp8_blockwise._runs_right.__wrapped__
    assert check(0)
    product = fp8_blockwise.product
    calls = []

    def off_on_the_gpu(*args, **kwargs):
        calls.append(1)
        out = product(*args, **kwargs)
        return out * 1.01 if len(calls) == 1 else out

    monkeypatch.setattr(fp8_blockwise, "product", off_on_the_gpu)
    assert not check(0)

    def raising(*args, **kwargs):
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")

    monkeypatch.setattr(fp8_blockwise, "product", raising)
    assert not check(0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not check(0)  # no FP8 tensor cores


def _both_ways(entry, shares: list, took: list, encodes: list):
    """A prefill_gemms entry point that computes its product on the FP8 tensor cores and on the
    bf16 path, records the distance (share of the largest output) and whether the first call
    reached the FP8 product, and returns the FP8 path's result."""
    def run(*args, **kwargs):
        before = len(encodes)
        got = entry(*args, **kwargs)
        took.append(len(encodes) > before)
        prefill_gemms.FP8_TENSOR_CORES = False
        try:
            ref = entry(*args, **kwargs)
        finally:
            prefill_gemms.FP8_TENSOR_CORES = True
        shares.append(((got - ref).abs().max() / ref.abs().max()).item())
        return got
    return run


@pytest.mark.gpu
def test_every_product_of_a_faithful_chunk_on_the_fp8_tensor_cores_keeps_its_bound(tmp_path, monkeypatch):
    """The small preset (its widths multiples of 128: every FP8 and FP4 product takes the FP8
    path) prefilling a chunk in faithful mode: each product it makes, on the inputs it meets
    there, on the FP8 tensor cores against the bf16 path's exact one, within the bounds of
    test_prefill_products_on_the_fp8_tensor_cores_match_the_exact_ones. The chunk's logits
    cannot bound this: on random weights the small preset's faithful prefill is chaotic (every
    FP8 rounding of a GEMM input turns a last-bit change into a whole FP8 step): on the CPU
    reference path, float64 sums move its last logits by 0.31 of the largest (0.41 in exact
    mode), the 128-blocks' rounding emulated by 0.20 (bench/order_sensitivity.py --fp8-blocks),
    and the H200 measured 0.49 between the two paths (thirty-eighth session). On the CPU each
    product of a 64-token chunk stayed within 3.5e-6 of the bf16 path's. The experts' bound is
    wider than the products test's 2e-2: their SwiGLU output is rounded to FP8 before the down
    projection, so a last-bit change in a sum can move a value by a whole FP8 step, and at this
    chunk's 1,124 tokens the H200 measured 0.028 of the largest output (forty-second session;
    the dense products stayed under 1e-3 there)."""
    from dsflash.model.checkpoint_writer import write_checkpoint
    from tests.model.test_prefill_gemms import kernel_path_prefill

    write_checkpoint(tmp_path, "small")
    monkeypatch.setattr(prefill_gemms, "EXPERT_PAIRS", 1)  # 1,124 tokens' 281 pairs an expert too
    monkeypatch.setattr(prefill_gemms, "FP8_TENSOR_CORES", True)
    encodes = []
    product = fp8_blockwise.product
    monkeypatch.setattr(fp8_blockwise, "product", lambda *args, **kwargs: encodes.append(1) or product(*args, **kwargs))
    bounds = {"fp8_product": 1e-3, "grouped_fp8_product": 1e-3, "fp4_experts": 5e-2}
    shares = {name: [] for name in bounds}
    took = {name: [] for name in bounds}
    for name in bounds:
        monkeypatch.setattr(prefill_gemms, name, _both_ways(getattr(prefill_gemms, name), shares[name], took[name],
                                                            encodes))
    prompt = torch.randint(3, 6000, (prefill_gemms.ROWS + 100,), generator=_g(12))
    kernel_path_prefill(tmp_path, True)(prompt, "last")
    for name, bound in bounds.items():
        assert took[name] and all(took[name]), (name, took[name])
        assert max(shares[name]) < bound, (name, max(shares[name]))


@pytest.mark.gpu
def test_the_sites_operands_give_a_faithful_chunks_logits_to_the_bit(tmp_path, monkeypatch):
    """hc_streams.SITE_OPERAND through the model (the small preset: H 512, whole 128-blocks): a
    faithful chunk's every mHC site writes its input's operand and every one is taken (the
    attention's by project, the FFN's by ffn_operand), and the last logits are the bits of the
    chunk where each product encodes its own input (the same operand bits, the same products)."""
    from dsflash.model.checkpoint_writer import write_checkpoint
    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.kernels import hc_streams
    from tests.model.test_prefill_gemms import kernel_path_prefill

    write_checkpoint(tmp_path, "small")
    monkeypatch.setattr(prefill_gemms, "EXPERT_PAIRS", 1)  # (the chunk's pairs take the encoded-once path)
    monkeypatch.setattr(hc_streams, "SITE_ROWS", 1)
    made, taken = [], []
    site, handed = hc_streams.hc_site, TritonOps.encoded_input
    monkeypatch.setattr(hc_streams, "hc_site", lambda *a, **kw: made.append(kw.get("operand") is not None)
                        or site(*a, **kw))
    monkeypatch.setattr(TritonOps, "encoded_input", lambda self, x: taken.append(handed(self, x)) or taken[-1])
    prefill = kernel_path_prefill(tmp_path, True)
    prompt = torch.randint(3, 6000, (prefill_gemms.ROWS + 100,), generator=_g(13))
    logits = {}
    for on in (False, True):
        monkeypatch.setattr(hc_streams, "SITE_OPERAND", on)
        monkeypatch.setattr(hc_streams, "UNREAD_INPUT_LEFT", False)
        made.clear(), taken.clear()
        logits[on] = prefill(prompt, "last")
        assert made and all(made) == on and sum(t is not None for t in taken) == sum(made), (made, taken)
    assert torch.equal(logits[True], logits[False])
    # the attention sites of layers that are no source leave their fp32 input out (UNREAD_INPUT_LEFT):
    # their operands go to project directly, the same bits again
    monkeypatch.setattr(hc_streams, "UNREAD_INPUT_LEFT", True)
    made.clear(), taken.clear()
    left = []
    monkeypatch.setattr(hc_streams, "hc_site", lambda *a, **kw: made.append(kw.get("operand") is not None)
                        or left.append(not kw.get("keep_input", True)) or site(*a, **kw))
    assert torch.equal(prefill(prompt, "last"), logits[False])
    assert any(left) and sum(t is not None for t in taken) == sum(made) - sum(left), (made, taken, left)
