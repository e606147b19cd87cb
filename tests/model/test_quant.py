"""The number formats, bit for bit against values worked out by hand."""

import torch

from dsflash.model import quant


def test_e4m3_codes_and_e8m0_scales_decode_by_hand():
    # e4m3: sign | 4 exponent bits (bias 7) | 3 mantissa bits
    codes = torch.tensor([[0x38, 0x40, 0xB8, 0x3C]], dtype=torch.uint8)  # 1.0, 2.0, -1.0, 1.5
    scale = torch.tensor([[130]], dtype=torch.uint8)  # 2^(130-127) = 8
    w = quant.dequantize_fp8_weight(codes, scale, (32, 32))
    assert w.tolist() == [[8.0, 16.0, -8.0, 12.0]]


def test_fp8_weight_blocks_cover_32x32_tiles():
    codes = torch.full((33, 40), 0x38, dtype=torch.uint8)  # all 1.0
    scale = torch.tensor([[127, 128], [129, 126]], dtype=torch.uint8)
    w = quant.dequantize_fp8_weight(codes, scale, (32, 32))
    assert w[0, 0] == 1.0 and w[31, 31] == 1.0 and w[0, 32] == 2.0 and w[32, 0] == 4.0 and w[32, 39] == 0.5


def test_fp4_nibbles_low_first_and_lut():
    codes = torch.tensor([1, 2, 15, 7], dtype=torch.uint8)  # 0.5, 1.0, -6.0, 6.0
    packed = quant.pack_nibbles(codes)
    assert packed.tolist() == [0x21, 0x7F]
    assert quant.unpack_nibbles(packed).tolist() == [1, 2, 15, 7]
    w = quant.dequantize_fp4_weight(torch.tensor([[0x21, 0x7F] * 16], dtype=torch.uint8).view(torch.int8),
                                    torch.tensor([[128]], dtype=torch.uint8))
    assert w[0, :4].tolist() == [1.0, 2.0, -12.0, 12.0]


def test_e8m0_bytes_are_never_cast_numerically():
    raw = torch.tensor([120, 127, 1], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    assert quant.as_uint8(raw).tolist() == [120, 127, 1]
    assert quant.e8m0_to_float(raw).tolist() == [2.0**-7, 1.0, 2.0**-126]


def test_e2m1_rounds_to_nearest_even_at_every_midpoint():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, 0.26, 2.51, 7.0])
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -1.0, -4.0, 0.5, 3.0, 6.0]
    got = quant.e2m1_decode(quant.e2m1_encode(mids.clamp(-6, 6)))
    assert got.tolist() == expected


def test_fp8_fake_quant_by_hand():
    x = torch.zeros(32)
    x[0], x[1], x[2] = 1.0, 0.3, -0.001
    # amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8; 0.3*256 = 76.8 -> e4m3 step 8 in [64,128) -> 80 -> 0.3125;
    # -0.001*256 = -0.256 -> e4m3 step 2^-5 in [0.25, 0.5) -> -0.25 -> -0.25/256
    y = quant.fake_quant_fp8(x)
    assert y[0] == 1.0 and y[1] == 0.3125
    assert y[2] == -0.25 / 256
    codes, scales = quant.fp8_quantize(x)
    assert scales.tolist() == [127 - 8]


def test_fp4_fake_quant_both_scale_kinds_by_hand():
    x = torch.zeros(32)
    x[0], x[1], x[2] = 3.0, 1.3, -0.2
    # block 16, e4m3 scale = e4m3(3/6) = 0.5: 1.3/0.5 = 2.6 -> 3 -> 1.5; -0.2/0.5 = -0.4 -> -0.5 -> -0.25
    y16 = quant.fake_quant_fp4(x, 16, e4m3_scales=True)
    assert y16[:3].tolist() == [3.0, 1.5, -0.25]
    # block 32, pow2 scale = 2^ceil(log2(0.5)) = 0.5: same grid here
    y32 = quant.fake_quant_fp4(x, 32)
    assert y32[:3].tolist() == [3.0, 1.5, -0.25]
    # e4m3 scale that is not a power of two: amax 4.5 -> 0.75 -> 1.3/0.75 = 1.733 -> 1.5 -> 1.125
    x[0] = 4.5
    assert quant.fake_quant_fp4(x, 16, e4m3_scales=True)[1].item() == 1.125


def test_weight_quantize_dequantize_round_trips_exactly():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(70, 96, generator=g)
    codes, scale = quant.quantize_fp8_weight(w)
    once = quant.dequantize_fp8_weight(codes, scale)
    assert scale.shape == (3, 3)
    codes2, scale2 = quant.quantize_fp8_weight(once)
    assert torch.equal(codes, codes2) and torch.equal(scale, scale2)  # values on the grid stay put
    assert (once - w).abs().max() <= w.abs().max() / 8  # 3 mantissa bits
    packed, s4 = quant.quantize_fp4_weight(w[:, :64])
    back = quant.dequantize_fp4_weight(packed, s4)
    # FP4 re-quantization may pick a smaller scale (amax can round down), so check the codes
    # against the stored scale: every value sits on its block's grid, at the nearest point.
    scale = quant.e8m0_to_float(s4).repeat_interleave(32, dim=1)
    assert torch.equal(quant.pack_nibbles(quant.e2m1_encode(back / scale)), packed)
    assert ((back - w[:, :64]).abs() <= scale).all()  # within one grid step (2 * scale at most)


def test_storage_formats_hold_the_fake_quant_values_exactly():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 512, generator=g) * 3
    assert torch.equal(quant.fp8_dequantize(*quant.fp8_quantize(x)), quant.fake_quant_fp8(x))
    assert torch.equal(quant.fp4_dequantize(*quant.fp4_quantize(x, 16, True), 16, True),
                       quant.fake_quant_fp4(x, 16, e4m3_scales=True))
    assert torch.equal(quant.fp4_dequantize(*quant.fp4_quantize(x, 32), 32), quant.fake_quant_fp4(x, 32))
