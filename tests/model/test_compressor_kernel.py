"""The compressor's kernels (model/kernels/compressor.py) against their torch forms, at the
widths of the tiny golden config (latent 64, 16 rope dims, index keys 32) and of the release
(512, 64, 128). RoPE + FP4 must give the same bits as the ops chain; the pooled, normalized
latent is held to a few ulps (its sums run in another order than torch's). On CPU under
TRITON_INTERPRET=1 (tests/conftest.py); with a GPU, on the device."""

from __future__ import annotations

import pytest
import torch

from dsflash.model.kernels.compressor import norm_rope_fp4, norm_rope_fp4_ref, pool_norm, pool_norm_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LATENT_REL = 1e-6 if DEVICE == "cpu" else 1e-5  # GPU: hardware exp
EPS = 1e-20  # rms_norm_eps of V4.1
# (row width, rotated pairs, block, e4m3 scales): entries and index keys, tiny and release
ROWS = {"tiny-entries": (64, 8, 16, True), "tiny-keys": (32, 8, 32, False),
        "entries": (512, 32, 16, True), "keys": (128, 32, 32, False)}


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _gates(groups: int, ratio: int, D: int, g: torch.Generator) -> torch.Tensor:
    """Each group's gates at its own size: equal (0), tiny, ordinary, and so large that exp
    overflows fp32 unless the softmax subtracts the maximum first."""
    size = torch.tensor([0.0, 1e-3, 1.0, 30.0, 1e3, -1e4])[torch.arange(groups) % 6]
    return (torch.randn(groups, ratio, D, generator=g) * size[:, None, None]).view(groups * ratio, D)


@pytest.mark.parametrize("D", [64, 512])
@pytest.mark.parametrize("ratio", [1, 2])
def test_pool_norm_matches_the_torch_form(D, ratio):
    g = _g(D + ratio)
    groups = 7
    kv = torch.randn(groups * ratio, D, generator=g) * 3
    gate = None if ratio == 1 else _gates(groups, ratio, D, g)
    weight = torch.rand(D, generator=g) + 0.5
    got = pool_norm(kv.to(DEVICE), None if gate is None else gate.to(DEVICE), weight.to(DEVICE), ratio, EPS).cpu()
    want = pool_norm_ref(kv, gate, weight, ratio, EPS)
    assert got.shape == (groups, D) and torch.isfinite(got).all()
    assert (got - want).abs().max() <= LATENT_REL * want.abs().max()


def _assert_same_bits(got, want):
    values, (codes, scales) = got
    want_values, (want_codes, want_scales) = want
    assert torch.equal(values.cpu().view(torch.int32), want_values.view(torch.int32))  # -0.0 is not 0.0
    assert torch.equal(codes.cpu(), want_codes)
    assert torch.equal(scales.cpu(), want_scales)


def _rows(n: int, g: torch.Generator, on_grid: bool) -> torch.Tensor:
    """[6, n]: rows at powers of two from 2^-20 to 2^8 and one of +values and -0.0 in turn (a
    pair that does not rotate keeps its -0.0); on_grid: multiples of 1/8 up to 8, whose squares
    sum exactly in any order, so a norm in the kernel rounds as torch's does."""
    if on_grid:
        return torch.randint(-64, 65, (6, n), generator=g).float() / 8
    x = torch.randn(6, n, generator=g) * torch.exp2(torch.tensor([-20.0, -3.0, 0.0, 4.0, 8.0, 0.0]))[:, None]
    x[5, 0::2] = x[5, 0::2].abs()
    x[5, 1::2] = -0.0
    return x


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("norm", [False, True])
def test_norm_rope_fp4_is_the_ops_chain_bit_for_bit(row, norm):
    n, half, block, e4m3 = ROWS[row]
    g = _g(n + norm)
    x = _rows(n, g, on_grid=norm)
    weight = torch.randint(1, 32, (n,), generator=g).float() / 16 if norm else None
    angles = torch.rand(x.shape[0], half, generator=g) * 1000
    cos, sin = angles.cos(), angles.sin()
    got = norm_rope_fp4(x.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), block, e4m3,
                        None if weight is None else weight.to(DEVICE), EPS)
    _assert_same_bits(got, norm_rope_fp4_ref(x, cos, sin, block, e4m3, weight, EPS))


def test_each_group_and_row_is_computed_as_alone():
    """One program per group or row: a batch's results are each one's alone, bit for bit."""
    g = _g(3)
    D, half = 64, 8
    kv, gate = torch.randn(10, D, generator=g).to(DEVICE), _gates(5, 2, D, g).to(DEVICE)
    weight = (torch.rand(D, generator=g) + 0.5).to(DEVICE)
    angles = torch.rand(5, half, generator=g).to(DEVICE) * 100
    latent = pool_norm(kv, gate, weight, 2, EPS)
    entries = norm_rope_fp4(latent, angles.cos(), angles.sin(), 16, True)
    keys = norm_rope_fp4(latent[:, :32], angles.cos(), angles.sin(), 32, False, weight[:32], EPS)
    for j in range(5):
        alone = pool_norm(kv[2 * j:2 * j + 2], gate[2 * j:2 * j + 2], weight, 2, EPS)
        assert torch.equal(latent[j], alone[0])
        c, s = angles[j:j + 1].cos(), angles[j:j + 1].sin()
        _assert_same_bits(norm_rope_fp4(alone, c, s, 16, True), _row_of(entries, j))
        _assert_same_bits(norm_rope_fp4(alone[:, :32], c, s, 32, False, weight[:32], EPS), _row_of(keys, j))


def _row_of(result, j: int):
    """Row j of (values, (codes, scales)), kept 2-D, on the CPU."""
    values, (codes, scales) = result
    return values[j:j + 1].cpu(), (codes[j:j + 1].cpu(), scales[j:j + 1].cpu())
