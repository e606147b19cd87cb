"""The one-launch FP8/FP4 round trips (model/kernels/quantize.py) against model/quant.py, bit for
bit: values (compared as raw fp32 bits, so -0.0 is not 0.0), codes and scale bytes. On CPU the
kernels run under TRITON_INTERPRET=1 (tests/conftest.py); with a GPU, on the device."""

from __future__ import annotations

import pytest
import torch

from dsflash.model import quant
from dsflash.model.fast_ops import TritonOps
from dsflash.model.kernels.quantize import fp4_round_trip, fp8_grid_bf16, fp8_round_trip

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (kernel, reference, block, extra args): window KV, index keys and queries, compressed entries
FORMATS = {
    "fp8-e8m0-32": (fp8_round_trip, quant.fp8_round_trip, 32, ()),
    "fp4-e8m0-32": (fp4_round_trip, quant.fp4_round_trip, 32, ()),
    "fp4-e4m3-16": (fp4_round_trip, quant.fp4_round_trip, 16, (True,)),
}
E4M3_POSITIVE = quant.e4m3_decode(torch.arange(0x7F, dtype=torch.uint8))  # 0 .. 448, ascending
E4M3_MIDPOINTS = (E4M3_POSITIVE[:-1] + E4M3_POSITIVE[1:]) / 2  # exact in fp32: ties of the e4m3 rounding
E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def _random_signs(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.where(torch.rand(t.shape, generator=g) < 0.5, -t, t)


def _neighbours(value: float) -> list[torch.Tensor]:
    """value and the fp32 numbers on either side of it."""
    t = torch.tensor(value)
    return [t.nextafter(torch.tensor(0.0)), t, t.nextafter(torch.tensor(float("inf")))]


def _edge_blocks(block: int, g: torch.Generator) -> torch.Tensor:
    """[blocks, block]: each block's first element sets its amax (and so its scale), the rest
    lie on the ties of both roundings, at the clamps, or below the amax floors."""
    fills = []
    for exponent in (-30, -3, 0, 7, 40):  # power-of-two block scales 2^exponent: the ties stay exact
        pow2 = 2.0**exponent
        fills.append(torch.cat([torch.tensor([448.0]), _random_signs(E4M3_MIDPOINTS[:block - 1], g)]) * pow2)
        fills.append(torch.cat([torch.tensor([448.0]), _random_signs(E4M3_MIDPOINTS[-(block - 1):], g)]) * pow2)
        fills.append(torch.cat([torch.tensor([6.0]), _random_signs(E2M1_MIDPOINTS, g)]) * pow2)
    for scale in E4M3_POSITIVE[1::7]:  # e4m3 block scales; x / scale on an e2m1 tie or an ulp away
        ties = E2M1_MIDPOINTS * scale
        for x in (ties, ties.nextafter(torch.zeros(7)), ties.nextafter(torch.full((7,), float("inf")))):
            fills.append(torch.cat([6 * scale.view(1), _random_signs(x, g)]))
    # amax / 6 on (or an ulp from) an e4m3 tie: only true division rounds these scales as the reference
    amaxes = [a for m in E4M3_MIDPOINTS[E4M3_MIDPOINTS > 2.0**-9] for a in _neighbours(6 * m.item())]
    # the clamps at 448 and 6, the e4m3 scale's saturation (amax / 6 past 464), the largest scales
    amaxes += [a for v in (448.0, 448.0 * 2.0**20, 6.0, 6.0 * 2.0**-9, 2784.0, 1e4, 1e38) for a in _neighbours(v)]
    for a in amaxes:
        fills.append(torch.cat([a.view(1), -a.view(1), _random_signs(torch.rand(block - 2, generator=g) * a, g)]))
    tiny = torch.tensor([1e-6, 2.0**-130, -(2.0**-140), 3e-3])  # under the amax floors; fp32 subnormals
    fills += [torch.zeros(1), -torch.zeros(1), tiny, _random_signs(tiny, g)]
    blocks = torch.stack([f.repeat(block)[:block] for f in fills])
    if block == 16:  # e4m3 scales saturate from amax 2784 = 6 * 464 on (test_e4m3_scales_saturate_at_448)
        blocks = blocks[blocks.abs().amax(dim=1) < 2784.0]
    return blocks


def _random(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Normal values, each row scaled by its own power of two from 2^-40 to 2^14."""
    row_scale = torch.exp2(torch.randint(-40, 15, shape[:-1], generator=g).float())
    return torch.randn(shape, generator=g) * row_scale[..., None]


def _assert_same(got, ref):
    values, (codes, scales) = got
    ref_values, (ref_codes, ref_scales) = ref
    assert values.dtype == torch.float32 and codes.dtype == scales.dtype == torch.uint8
    assert torch.equal(values.cpu().view(torch.int32), ref_values.view(torch.int32))
    assert torch.equal(codes.cpu(), ref_codes)
    assert torch.equal(scales.cpu(), ref_scales)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_matches_quant_bit_for_bit(fmt):
    kernel, reference, block, extra = FORMATS[fmt]
    g = torch.Generator().manual_seed(block)
    kv = _random((5, 512), g)  # a window-KV / compressed-entry row
    index_keys = _random((6, 128), g)
    queries = _random((3, 8, 128), g)
    cases = [kv, index_keys, queries, queries.transpose(0, 1), _edge_blocks(block, g), torch.zeros(0, 128),
             kv.bfloat16()]
    if extra:  # e4m3 scales: below the saturation that torch's cast handles differently by version
        cases = [x.clamp(-2783.0, 2783.0) for x in cases]
    for x in cases:
        ref = reference(x, block, *extra)
        _assert_same(kernel(x.to(DEVICE), block, *extra), ref)


def test_fp8_grid_in_bf16_holds_the_fake_quantized_values_exactly():
    """Faithful mode's GEMM inputs (TritonOps.gemm_input): fake_quant_fp8's values, as bf16."""
    g = torch.Generator().manual_seed(3)
    for x in (_random((5, 512), g), _edge_blocks(32, g), _random((2, 3, 64), g).bfloat16()):
        got = fp8_grid_bf16(x.to(DEVICE))
        assert got.dtype == torch.bfloat16
        assert torch.equal(got.float().cpu().view(torch.int32), quant.fake_quant_fp8(x.float()).view(torch.int32))
    odd = _random((2, 48), g)  # no whole blocks: as it is, as fake_quant_fp8 leaves it
    assert fp8_grid_bf16(odd) is odd


def test_e4m3_scales_saturate_at_448():
    """An entry block whose amax / 6 passes e4m3's 464 gets the largest finite scale, 448
    (0x7E). torch's own fp32 -> e4m3 cast differs here between versions (2.11 gives the NaN
    byte 0x7F, 2.13 saturates), so the reference is not asked."""
    x = torch.tensor([[2784.0, 1.0] + [0.0] * 14, [1e38, -3.0] + [0.0] * 14, [2783.0, 0.0] + [0.0] * 14])
    values, (packed, scales) = fp4_round_trip(x.to(DEVICE), 16, True)
    assert scales.cpu().tolist() == [[0x7E], [0x7E], [0x7E]]
    assert values.cpu()[:2, 0].tolist() == [6 * 448.0, 6 * 448.0]


def test_ops_route_the_round_trips_through_the_kernels():
    ops = TritonOps({}, device=DEVICE)
    x = _random((4, 2, 128), torch.Generator().manual_seed(1))
    _assert_same(ops.fp8_round_trip(x.to(DEVICE)), quant.fp8_round_trip(x))
    _assert_same(ops.fp4_round_trip(x.to(DEVICE), 16, e4m3_scales=True), quant.fp4_round_trip(x, 16, True))
    assert torch.equal(ops.fake_quant_fp4(x.to(DEVICE), 32).cpu(), quant.fake_quant_fp4(x, 32))
    odd = x[..., :24].to(DEVICE)
    assert ops.fake_quant_fp4(odd, 32) is odd  # widths the blocks cannot tile stay unquantized
