"""Faithful mode's streams stored in bf16 (layers/mhc.BF16_STREAMS): each stream kernel reads
bf16 streams into fp32 and rounds the streams it makes once, as stored, before anything it
computes reads them; the torch forms do the same; in the model the kernel path then leaves the
reference path only where an fp32 sum's last bit moves a value across a bf16 rounding tie."""

from __future__ import annotations

import pytest
import torch

from dsflash.model.kernels import engram_gate, hc_streams
from dsflash.model.kernels.hc_gates import hc_gates_from_parts
from dsflash.model.layers import mhc
from dsflash.model.layers.engram_gate import engram_gated

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
    made = hc_streams.hc_expand(*d[:1], X.to(DEVICE), *d[1:]).cpu()
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


@pytest.mark.parametrize("site_rows", [hc_streams.SITE_ROWS, 1])  # 1: the sites in one pass (a prefill chunk's)
def test_the_kernel_paths_bf16_streams_leave_the_reference_paths_only_at_rounding_ties(golden_dir, golden,
                                                                                        monkeypatch, site_rows):
    """The faithful tiny model with bf16 streams, block by block on one prompt, the kernel path
    against the reference path: the streams stay bf16, and where they first differ (fp32 sums in
    another order put a value on the other side of a tie, which the random model then spreads)
    they differ in a few values by one bf16 step. The decode rows' stream kernels, and the
    prefill rows' (hc_site)."""
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.runner import prompt_logits

    monkeypatch.setattr(mhc, "BF16_STREAMS", True)
    monkeypatch.setattr(hc_streams, "SITE_ROWS", site_rows)
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
