"""Faithful mode's streams stored in bf16 (layers/mhc.BF16_STREAMS): each stream kernel reads
bf16 streams into fp32 and rounds the streams it makes once, as stored, before anything it
computes reads them; the torch forms do the same; in the model the kernel path then leaves the
reference path only where an fp32 sum's last bit moves a value across a bf16 rounding tie."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dsflash.model.kernels import engram_gate, hc_streams
from dsflash.model.kernels.common import as_stored
from dsflash.model.kernels.hc_gates import hc_gates_from_parts
from dsflash.model.layers import mhc
from dsflash.model.layers.engram_gate import engram_gated

from .hopper_compile import assert_compiles_for_hopper

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _site(T: int, H: int, seed: int = 0) -> tuple:
    """A site's inputs, bf16 streams (as fp32 values) among them: (X, y, post, comb, pre, fn, weight)."""
    g = torch.Generator().manual_seed(seed)
    S, N = 4, 24
    X = (torch.randn(T, S, H, generator=g) * 3).bfloat16().float()
    y = torch.randn(T, H, generator=g)
    post, pre = 2 * torch.rand(T, S, generator=g), torch.rand(T, S, generator=g) + 0.1
    comb = torch.softmax(torch.randn(T, S, S, generator=g), dim=-1)
    fn = torch.randn(N, S * H, generator=g) / (S * H) ** 0.5
    return X, y, post, comb, pre, fn, torch.rand(H, generator=g) + 0.5


def _dev(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(DEVICE) for t in tensors]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two launches' sums over the same values: to the bit in the interpreter; on the GPU two
    kernels compiled apart may order a dot's sums apart (the rounding of the streams moves
    them ~1e-3, far more)."""
    a, b = a.cpu(), b.cpu()
    return torch.equal(a, b) if DEVICE == "cpu" else torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_torch_forms_store_the_streams_they_make_rounded_once():
    X, y, post, comb, *_ = _site(5, 64)
    want = mhc.hc_expand(y, X, post, comb)
    got = mhc.hc_expand(y, X.bfloat16(), post, comb)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.bfloat16())
    key, value, wqk = torch.randn(5, 4, 64), torch.randn(5, 64), torch.randn(4, 64)
    gated = engram_gated(X.bfloat16(), key, value, wqk, 1e-6)
    assert gated.dtype == torch.bfloat16 and torch.equal(gated, engram_gated(X, key, value, wqk, 1e-6).bfloat16())
    assert mhc.stream_dtype(True) == torch.float32 and mhc.stream_dtype(False) == torch.float32


def test_only_faithful_mode_stores_bf16_streams(monkeypatch):
    monkeypatch.setattr(mhc, "BF16_STREAMS", True)
    assert mhc.stream_dtype(True) == torch.bfloat16 and mhc.stream_dtype(False) == torch.float32


@pytest.mark.parametrize("T, H", [(6, 64), (40, 300)])  # 40 rows, H 300: partly masked token and column blocks
def test_the_stream_kernels_round_the_streams_they_make_before_reading_them(T, H):
    """Each kernel on bf16 streams against itself on the same values in fp32: the streams it
    makes are the fp32 ones rounded to nearest bf16 (ties to even), to the bit; what it computes
    from them (mixes, a site's input) is what it computes from those rounded streams in fp32."""
    X, y, post, comb, pre, fn, weight = _site(T, H)
    half = X.bfloat16()
    d = _dev(y, post, comb)
    made = hc_streams.hc_expand(d[0], X.to(DEVICE), *d[1:]).cpu()
    got = hc_streams.hc_expand(d[0], half.to(DEVICE), *d[1:]).cpu()
    assert got.dtype == torch.bfloat16 and torch.equal(got, made.bfloat16())
    rounded = made.bfloat16().float()

    streams, parts, squares = hc_streams.hc_expand_mix_parts(d[0], half.to(DEVICE), *d[1:], fn.to(DEVICE))
    assert torch.equal(streams.cpu(), got)
    # the parts are the rounded streams' (an expand with nothing new in it: post 0, comb the identity)
    keep = _dev(torch.zeros(T, H), torch.zeros(T, 4), torch.eye(4).expand(T, 4, 4).contiguous())
    _, want_parts, want_squares = hc_streams.hc_expand_mix_parts(keep[0], rounded.to(DEVICE), *keep[1:], fn.to(DEVICE))
    assert _same(parts, want_parts) and _same(squares, want_squares)
    gates = hc_gates_from_parts(parts, squares, fn.shape[0], fn.shape[1], *_dev(torch.randn(24), torch.ones(3)),
                                20, 1e-6, 1e-6)
    assert all(torch.isfinite(g).all() for g in gates)

    tiles = hc_streams.SITE_TILES[True]  # (both launches' sums in one order)
    for expand in (None, tuple(d)):
        bf16 = hc_streams.hc_site(half.to(DEVICE), fn.to(DEVICE), 1e-6, pre.to(DEVICE), weight.to(DEVICE), 1e-6,
                                  expand=expand, tiles=tiles)
        source = rounded if expand else X  # (a site without the expand reads X as it is)
        fp32 = hc_streams.hc_site(source.to(DEVICE), fn.to(DEVICE), 1e-6, pre.to(DEVICE), weight.to(DEVICE), 1e-6,
                                  tiles=tiles)
        assert bf16[0].dtype == torch.bfloat16 and torch.equal(bf16[0].float().cpu(), source)
        assert _same(bf16[1], fp32[1]) and _same(bf16[2], fp32[2])

    assert _same(hc_streams.hc_mixes(half.to(DEVICE), fn.to(DEVICE), 1e-6),
                 hc_streams.hc_mixes(X.to(DEVICE), fn.to(DEVICE), 1e-6))
    assert _same(hc_streams.hc_collapse_norm(half.to(DEVICE), pre.to(DEVICE), weight.to(DEVICE), 1e-6),
                 hc_streams.hc_collapse_norm(X.to(DEVICE), pre.to(DEVICE), weight.to(DEVICE), 1e-6))


@pytest.mark.parametrize("kernel, variants", [("hc_site_bf16", ";FN_PARTS=1;EXPAND=0,FN_PARTS=1,TB=32,num_stages=2"),
                                              ("hc_site", ";EXPAND=0,TB=16,num_stages=2;TB=16,num_stages=2")])
def test_the_site_forms_compile_for_hopper_anywhere(kernel, variants):
    """The interpreter computes a bf16 dot in fp32 (its own is wrong), so CI compiles the site's
    forms for sm_90 instead (no GPU needed): on bf16 streams with and without fn's bf16 parts,
    and the fp32 sites at 16 tokens a program."""
    assert_compiles_for_hopper(kernel, variants)


@triton.jit
def _stored(x_ptr, out_ptr, BF16: tl.constexpr):
    i = tl.arange(0, 16)
    tl.store(out_ptr + i, as_stored(tl.load(x_ptr + i), BF16))


def test_a_stored_value_is_rounded_to_nearest_even_and_a_nan_stays_a_nan():
    """common.as_stored on bit patterns: ties either way, the largest finite values, infinities
    and NaNs (0x7FFFFFFF, the GPU's, whose rounding carry would wrap to -0.0 on the bits)."""
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F808001, 0xBF818000, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F800000,
                         0xFF800000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x00000001, 0x80000000, 0x00400000,
                         0x3EAAAAAB, 0x42F6E979], dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    out = torch.empty(16, device=DEVICE)
    _stored[(1,)](x.to(DEVICE), out, True)
    got, want = out.cpu(), x.bfloat16().float()
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 3
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])
    _stored[(1,)](x.to(DEVICE), out, False)
    assert torch.equal(out.cpu().view(torch.int32), bits)


@pytest.mark.parametrize("expand", [False, True])
def test_a_sites_mixes_as_bf16_dots_against_fns_parts_near_the_float64_mixes(expand):
    """hc_streams.BF16_DOTS: on bf16 streams a site's mixes as bf16 MMAs against fn's three bf16
    parts (fn_parts: their sum is fn) against the float64 mixes, at a release row's 20,480
    columns: within fp32's accuracy in the interpreter, ~6e-5 of the largest on the GPU's tensor
    cores (whose sums round apart from fp32's); the streams and the input the
    same bits as without the parts; the parts refused on fp32 streams."""
    T, H = 40, 5120
    X, y, post, comb, pre, fn, weight = _site(T, H, seed=3)
    parts = hc_streams.fn_parts(fn)
    assert parts.dtype == torch.bfloat16 and torch.equal(parts.float().sum(0), fn)
    args = _dev(X.bfloat16(), fn) + [1e-6] + _dev(pre, weight) + [1e-6]
    before = tuple(_dev(y, post, comb)) if expand else None
    plain = hc_streams.hc_site(*args, expand=before)
    got = hc_streams.hc_site(*args, expand=before, parts=parts.to(DEVICE))
    assert torch.equal(got[0].cpu(), plain[0].cpu()) and torch.equal(got[2].cpu(), plain[2].cpu())
    x = got[0].float().cpu().flatten(-2).double()
    want = (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)) @ fn.double().T
    assert (plain[1].cpu().double() - want).abs().max() < 2e-6 * want.abs().max()
    # the tensor cores' bf16 products are exact but their sums are not fp32's (H100: ~6e-5 of
    # the largest mix); the interpreter's dot runs in fp32, where the parts must sum to fn's
    dots = 2e-6 if DEVICE == "cpu" else 2e-4
    assert (got[1].cpu().double() - want).abs().max() < dots * want.abs().max()
    with pytest.raises(AssertionError, match="bf16 streams"):
        hc_streams.hc_site(X.to(DEVICE), *args[1:], parts=parts.to(DEVICE))
    if expand:  # (hc_streams.SPLIT_EXPAND) the expand in its own launch, then the site without it
        streams = hc_streams.hc_expand(before[0], args[0], *before[1:])
        split = hc_streams.hc_site(streams, *args[1:], parts=parts.to(DEVICE))
        assert _within_a_bf16_step(streams, got[0])
        assert torch.equal(split[2].cpu(), hc_streams.hc_site(streams, *args[1:])[2].cpu())
        x = streams.float().cpu().flatten(-2).double()
        want = (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)) @ fn.double().T
        assert (split[1].cpu().double() - want).abs().max() < dots * want.abs().max()


def _within_a_bf16_step(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two launches' bf16 streams from the same values: the same bits in the interpreter; on the
    GPU each kernel's compile may fuse its products and sums apart (FMA), moving an fp32 value's
    last bit and so its bf16 rounding by one step (H100, fifty-sixth session: hc_expand against
    the site's own expand): neighbours on the bf16 grid, their bit patterns one apart."""
    a, b = a.bfloat16().cpu(), b.bfloat16().cpu()
    if DEVICE == "cpu":
        return torch.equal(a, b)
    steps = (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()
    return bool((((steps <= 1) & (torch.signbit(a) == torch.signbit(b))) | (a == b)).all())


def test_the_engram_gate_rounds_the_streams_it_makes():
    X, *_ = _site(5, 300, seed=1)
    g = torch.Generator().manual_seed(2)
    key, value, wqk = torch.randn(5, 4, 300, generator=g), torch.randn(5, 300, generator=g), torch.randn(4, 300,
                                                                                                        generator=g)
    rest = _dev(key, value, wqk)
    assert engram_gate.supported(X.bfloat16().to(DEVICE), *rest)
    made = engram_gate.engram_gated(X.to(DEVICE), *rest, 1e-6).cpu()
    got = engram_gate.engram_gated(X.bfloat16().to(DEVICE), *rest, 1e-6).cpu()
    assert got.dtype == torch.bfloat16 and torch.equal(got, made.bfloat16())


# site rows 1: the sites in one pass (a prefill chunk's), their mixes' dots as bf16 MMAs or not,
# with the expands in their own launch or not
@pytest.mark.parametrize("site_rows, bf16_dots, split", [(hc_streams.SITE_ROWS, False, False), (1, False, False),
                                                         (1, True, False), (1, True, True)])
def test_the_kernel_paths_bf16_streams_leave_the_reference_paths_only_at_rounding_ties(golden_dir, golden,
                                                                                        monkeypatch, site_rows,
                                                                                        bf16_dots, split):
    """The faithful tiny model with bf16 streams, block by block on one prompt, the kernel path
    against the reference path: the streams stay bf16, and where they first differ (fp32 sums in
    another order put a value on the other side of a tie, which the random model then spreads)
    they differ in a few values by one bf16 step. The decode rows' stream kernels, and the
    prefill rows' (hc_site)."""
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.runner import prompt_logits

    monkeypatch.setattr(mhc, "BF16_STREAMS", True)
    monkeypatch.setattr(hc_streams, "SITE_ROWS", site_rows)
    monkeypatch.setattr(hc_streams, "BF16_DOTS", bf16_dots)
    monkeypatch.setattr(hc_streams, "SPLIT_EXPAND", split)
    site, sites = hc_streams.hc_site, []  # (whether each site took fn's parts, and an expand)
    monkeypatch.setattr(hc_streams, "hc_site", lambda *a, **k: sites.append(
        (k.get("parts") is not None, k.get("expand") is not None)) or site(*a, **k))
    supported, taken = hc_streams.supported, []
    monkeypatch.setattr(hc_streams, "supported", lambda X: taken.append(X.dtype) or supported(X))
    model = DeepseekV41.from_checkpoint(golden_dir, device=DEVICE, act_quant=True)
    made: dict[str, list[torch.Tensor]] = {"reference": [], "kernels": []}
    block, path = model._block, "reference"

    def recorded(*args, **kwargs):
        out = block(*args, **kwargs)
        # (a block whose FFN output waits for the next site, ops.defers_expand, has no streams to compare)
        made[path].append(None if kwargs.get("defer") else out[0].cpu())
        return out
    monkeypatch.setattr(model, "_block", recorded)
    ids = golden[1]["input_ids"][:12]
    with torch.inference_mode():
        prompt_logits(model, ids, "full")
        model.use_kernels()
        path = "kernels"
        prompt_logits(model, ids, "full")
    assert taken and set(taken) == {torch.bfloat16}  # the stream kernels took bf16 streams
    assert bool(sites) == (site_rows == 1) and all(parted == bf16_dots for parted, _ in sites)
    if bf16_dots:  # split: the expands in their own launch, none in a site's
        assert any(expanded for _, expanded in sites) != split
    assert len(made["reference"]) == len(made["kernels"]) and None not in made["reference"]
    pairs = [(a, b) for a, b in zip(made["reference"], made["kernels"]) if b is not None]
    assert len(pairs) >= 3 and all(a.dtype == b.dtype == torch.bfloat16 for a, b in pairs)
    first = next((i for i, (a, b) in enumerate(pairs) if not torch.equal(a, b)), None)
    assert first is None or first >= 1, "the first block's streams differ"
    if first is not None:
        a, b = (t.float() for t in pairs[first])
        moved = a != b
        step = torch.finfo(torch.bfloat16).eps * a.abs().clamp_min(torch.finfo(torch.float32).tiny)
        assert moved.sum() <= max(1, moved.numel() // 200) and ((a - b).abs()[moved] <= step[moved] * 1.0001).all()
