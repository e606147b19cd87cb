"""bench/moe_fp8_dots.py's spike (faithful decode experts on FP8 MMAs) is right before it is
timed: its byte layout and e2m1 -> e4m3 rule give the checkpoint's values, and its kernel
(under the interpreter on CPU) gives the float64 products of the same values."""

from __future__ import annotations

import pytest
import torch

from dsflash.model.kernels import fp4_moe as moe
from tests.support.bench_scripts import bench_script

from .hopper_compile import assert_compiles_for_hopper

E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


@pytest.fixture(scope="module")
def spike():
    return bench_script("moe_fp8_dots.py")


@pytest.fixture(scope="module")
def gluon_form():
    return bench_script("moe_fp8_gluon.py")


def test_every_code_is_its_value_times_2_to_the_minus_6(spike):
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(spike.e4m3_of_e2m1(codes).view(torch.float8_e4m3fn).float() * 64, E2M1)


def test_a_group_byte_holds_codes_j_and_j_plus_32(spike):
    packed = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8)  # 128 codes a row
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(3, 5, 128)
    grouped = spike.split_groups(packed)
    low, high = (grouped & 0xF).view(3, 5, 2, 32), (grouped >> 4).view(3, 5, 2, 32)
    assert torch.equal(torch.cat([low, high], -1).reshape(3, 5, 128), codes)


def test_the_bit_layout_decodes_by_its_masks_and_shifts(spike):
    """split_bits: the low code of a byte is its AND with 0x9C, the high one two shifted ANDs."""
    packed = torch.randint(0, 256, (4, 64), dtype=torch.uint8)
    grouped, bits = spike.split_groups(packed), spike.split_bits(packed)
    assert torch.equal(bits & 0x9C, spike.e4m3_of_e2m1(grouped & 0xF))
    assert torch.equal(((bits << 2) & 0x8C) | ((bits >> 2) & 0x10), spike.e4m3_of_e2m1(grouped >> 4))


@pytest.mark.parametrize("bits,f16", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("block_m", [2, 4])
def test_the_kernel_gives_the_float64_products(spike, block_m, expanded, bits, f16):
    """Blocks of 2 and 4 pairs (chunks of 8 and 4 blocks), the activations gathered in the
    kernel or laid out by expand_columns; one expert takes 3 pairs (two blocks)."""
    packed, scales, plan, a, a_scales = _products(spike, block_m, N=64, K=512)
    layout = spike.split_bits(packed) if bits else spike.split_groups(packed)
    out = spike.fp8_products(a, a_scales, plan.tokens, plan.block_expert, layout, scales, block_m, dict(BLOCK_N=64),
                             spike.expand_columns(a, plan.tokens, block_m) if expanded else None, bits, f16)
    _assert_float64_products(spike, out, packed, scales, plan, a, a_scales, block_m)


E, T, TOP_K = 3, 4, 2  # experts, tokens, experts a token: one expert takes 3 pairs


def _products(spike, block_m: int, N: int, K: int, device: str = "cpu"):
    """Random experts (checkpoint bytes, scales) and T tokens' e4m3 activations routed to TOP_K of
    the E experts each, planned in blocks of block_m pairs: (packed, scales, plan, a, a_scales)."""
    torch.manual_seed(0)
    packed = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8)
    scales = torch.randint(112, 122, (E, N, K // 32), dtype=torch.uint8)
    idx = torch.stack([torch.randperm(E)[:TOP_K] for _ in range(T)])
    plan = moe.RoutePlan(idx.to(device), torch.rand(T, TOP_K).to(device), E, block_m)  # (on a GPU: its kernel)
    plan.tokens, plan.block_expert = plan.tokens.cpu(), plan.block_expert.cpu()
    return (packed, scales, plan, *spike.random_activations(T, K, "cpu"))


def _assert_float64_products(spike, out, packed, scales, plan, a, a_scales, block_m):
    """Every routed pair's row within 1e-6 of the largest float64 product (fp32 sums of exact products)."""
    ref = spike.reference(a, a_scales, plan.tokens, packed, scales, plan.block_expert, block_m)
    live = plan.tokens >= 0
    assert live.sum() == T * TOP_K
    assert (out[live].double() - ref[live]).abs().max() <= 1e-6 * ref[live].abs().max()


def test_the_f16_layout_decodes_by_its_masks_and_shifts(spike, gluon_form):
    """split_f16: a byte's AND with 0x8E is the high byte of its low code's f16 (the value times
    2^-14), and its right shift by 3 masked by 0x0E with its left shift by 7 masked by 0x80 that
    of its high code (_F16_PTX's rule, a byte at a time: the shifts' spill into the next byte is
    masked off)."""
    packed = torch.randint(0, 256, (4, 64), dtype=torch.uint8)
    grouped, byte = spike.split_groups(packed), gluon_form.split_f16(packed).to(torch.int32)
    for high_byte, codes in ((byte & 0x8E, grouped & 0xF), (((byte >> 3) & 0x0E) | ((byte << 7) & 0x80), grouped >> 4)):
        halves = (high_byte << 8).to(torch.int16).view(torch.float16).float()
        assert torch.equal(halves * 2.0 ** 14, E2M1[codes.long()])


def test_the_gluon_form_compiles_for_hopper():
    """bench/moe_fp8_gluon.py (Gluon does not run in the interpreter): its tiles and dot widths
    compile for sm_90, F8 too (mma.sync's e4m3 form, which ptxas lowers to f16 conversions and
    MMAs), F16_BITS (split_f16's codes decoded straight to f16) and the loop without its prefetch."""
    assert_compiles_for_hopper("experts_gluon", ";BLOCK_N=64;NW=16;F8=1;F16_BITS=1;PREFETCH=0")


@pytest.mark.gpu
@pytest.mark.parametrize("f8,f16_bits,prefetch", [(False, False, False), (False, False, True), (True, False, True),
                                                  (False, True, True)])
@pytest.mark.parametrize("block_m,columns", [(2, 8), (2, 16), (4, 8), (4, 16)])
def test_the_gluon_form_gives_the_float64_products(spike, gluon_form, block_m, columns, f8, f16_bits, prefetch):
    """Chunks of 2 to 8 blocks (20, 10 or 5 of them: an odd count ends the prefetched loop); one
    expert takes 3 pairs (two blocks at 2 pairs a block); the f16 MMAs' fp32 sums of exact
    products (2^-6 e4m3 weights, e4m3 activations)."""
    packed, scales, plan, a, a_scales = _products(spike, block_m, N=192, K=1280, device="cuda")
    codes = (gluon_form.split_f16 if f16_bits else spike.split_bits)(packed).cuda()
    out = gluon_form.products(a.cuda(), a_scales.cuda(), plan.tokens.cuda(), plan.block_expert.cuda(), codes,
                              scales.cuda(), block_m, dict(BLOCK_N=64, num_warps=4), columns, f8=f8,
                              f16_bits=f16_bits, prefetch=prefetch).cpu()
    _assert_float64_products(spike, out, packed, scales, plan, a, a_scales, block_m)
