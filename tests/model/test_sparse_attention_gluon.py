"""Faithful prefill attention's Gluon form (model/kernels/sparse_attention_gluon.py) against
the reference and against the Triton form it replaces, on a Hopper GPU: Gluon does not run in
Triton's interpreter. On any machine: its in-place rule, and a compile for sm_90."""

import pytest
import torch

from dsflash.model.kernels import sparse_attention_gluon
from dsflash.model.kernels.sparse_attention import attend_decoded, decode_keys, sparse_attention, sparse_attention_ref

from .hopper_compile import assert_compiles_for_hopper

D = 512
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _keys(rows: int, g: torch.Generator):
    """`rows` FP8 window keys (codes, then e8m0 scales 2^-9 .. 2^-5) and `rows` FP4 entries
    (packed e2m1, then e4m3 scales 0.25 .. 1.9) as a pool's byte buffers, and both decoded."""
    codes = torch.randint(0, 0x7F, (rows, D), generator=g, dtype=torch.uint8)
    codes[codes == 0x7F] = 0  # e4m3 NaN
    codes |= torch.randint(0, 2, (rows, D), generator=g, dtype=torch.uint8) << 7
    exps = torch.randint(118, 123, (rows, D // 32), generator=g, dtype=torch.uint8)
    ring = torch.cat([codes.flatten(), exps.flatten()])
    window = codes.view(torch.float8_e4m3fn).float() * torch.exp2(exps.float() - 127).repeat_interleave(32, 1)
    packed = torch.randint(0, 256, (rows, D // 2), generator=g, dtype=torch.uint8)
    sbytes = torch.randint(0x28, 0x3F, (rows, D // 16), generator=g, dtype=torch.uint8)
    pages = torch.cat([packed.flatten(), sbytes.flatten()])
    nibbles = torch.stack([packed & 0xF, packed >> 4], -1).flatten(1).long()
    entries = E2M1[nibbles] * sbytes.view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
    return ring, window, pages, entries


def _every_key_decoded(ring: torch.Tensor, pages: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every one of _keys' `rows` window keys and entries decoded on the GPU (decode_keys): the
    decoded form's bf16 rows, row r of each being key r."""
    every = torch.arange(rows)
    window_keys = decode_keys(ring.cuda(), (every * D).cuda(), (rows * D + every * (D // 32)).cuda(), D, fp4=False)
    entry_keys = decode_keys(pages.cuda(), (every * (D // 2)).cuda(), (rows * (D // 2) + every * (D // 16)).cuda(),
                             D, fp4=True)
    return window_keys, entry_keys


def _attend_both_ways(n: int, heads: int, W: int, K: int, seed: int, monkeypatch, gather: int, base: tuple[int, int]):
    g = torch.Generator().manual_seed(seed)
    rows = 4096
    ring, window, pages, entries = _keys(rows, g)
    q = (torch.randn(n, heads, D, generator=g) * 0.5).bfloat16()
    w_rows = torch.randint(0, rows, (n, W), generator=g)
    e_rows = torch.randint(0, rows, (n, K), generator=g)
    w_valid = torch.rand(n, W, generator=g) > 0.1
    e_valid = torch.rand(n, K, generator=g) > 0.2
    w_valid[0], e_valid[0] = False, False  # a query that sees nothing: zeros
    # the window's bytes `base` further on than its offsets say (a layer's ring read through
    # layer 0's offsets): the ring shifted by base[0], its scales by base[1] more (valid
    # offsets stay >= 0, as a pool's are)
    ring = torch.cat([torch.zeros(base[0], dtype=torch.uint8), ring[: rows * D],
                      torch.zeros(base[1] - base[0], dtype=torch.uint8), ring[rows * D:]])
    w_off = torch.where(w_valid, w_rows * D, -1)
    w_soff = rows * D + w_rows * (D // 32)
    e_off = torch.where(e_valid, e_rows * (D // 2), -1)
    e_soff = rows * (D // 2) + e_rows * (D // 16)
    sink = torch.randn(heads, generator=g)
    cuda = lambda t: t.cuda()  # noqa: E731
    args = [cuda(t) for t in (q, ring, w_off, w_soff, pages, e_off, e_soff, sink)] + [D**-0.5]

    launches = []
    real = sparse_attention_gluon.prefill_attention
    monkeypatch.setattr(sparse_attention_gluon, "prefill_attention", lambda *a: launches.append(a[11]) or real(*a))
    got = sparse_attention(*args, prefill=True, tiles=dict(GLUON_GATHER=gather), window_base=base).cpu()
    triton_form = sparse_attention(*args, prefill=True, tiles=dict(GLUON=0), window_base=base).cpu()
    assert launches == [bool(gather)]  # the first launch took the Gluon form as asked, the second did not

    # every key as a selected one of its query: the reference's softmax over them all
    keys = torch.cat([window[w_rows], entries[e_rows]], 1)
    ref = sparse_attention_ref(q, torch.zeros(0, D), torch.zeros(n, 0, dtype=torch.bool), keys,
                               torch.cat([w_valid, e_valid], 1), sink, D**-0.5)
    return got, triton_form, ref


@pytest.mark.gpu
@pytest.mark.parametrize("gather, base", [(0, (0, 0)), (1, (0, 0)), (0, (1024, 1056)), (1, (1024, 1056))])
@pytest.mark.parametrize("n, heads, W, K", [(300, 64, 128, 512), (257, 40, 100, 37), (256, 128, 64, 0)])
def test_gluon_form_attends_as_the_reference(n, heads, W, K, gather, base, monkeypatch):
    """Release shapes; a partly masked head block with partial key tiles; two head blocks with
    no entries; keys read in place from the pool's buffers (with a layer's window base) or
    from gather_keys' copies. Masked keys drop out, and query 0, which sees nothing, gets
    zeros. The one-pass forms round e^(s - m) to bf16 at their running maximum, so they meet
    the reference within bf16's rounding of the probabilities, as the Triton form does."""
    if not sparse_attention_gluon.usable(torch.empty(1, device="cuda"), D):
        pytest.skip("the Gluon form is for Hopper GPUs")
    got, triton_form, ref = _attend_both_ways(n, heads, W, K, n + K, monkeypatch, gather, base)
    top = ref.abs().max()
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() < 1e-2 * top
    assert (got - triton_form).abs().max() < 1e-2 * top
    assert got[0].abs().max() == 0
    assert (got - ref).abs().mean() < 1e-3 * ref.abs().mean()


def test_keys_are_read_in_place_only_from_offsets_on_16_bytes(monkeypatch):
    """The in-place form's copies take every valid key's offsets (plus the window's base) as
    multiples of 16, a pool's layout: a pool whose first launch breaks that gathers its keys
    instead, and the answer is kept per pair of buffers (one device sync each). Masked keys'
    scale offsets do not count."""
    monkeypatch.setattr(sparse_attention_gluon, "_IN_PLACE", {})
    ring, pages, other, third = (torch.zeros(64, dtype=torch.uint8) for _ in range(4))
    codes = torch.tensor([[0, 16, -1], [32, -1, 48]])
    scales = torch.tensor([[512, 528, 3], [544, 7, 560]])
    assert sparse_attention_gluon.in_place(ring, pages, codes, scales, codes, scales, (1024, 32))
    assert not sparse_attention_gluon.in_place(ring, other, codes, scales, codes, scales, (1024, 8))
    assert not sparse_attention_gluon.in_place(ring, third, codes, scales, codes + 8, scales)
    assert sparse_attention_gluon.in_place(ring, pages, codes + 1, scales, codes, scales)  # kept for this pair
    assert len(sparse_attention_gluon._IN_PLACE) == 3


@pytest.mark.gpu
def test_gluon_form_takes_queries_before_rope(monkeypatch):
    """The model hands prefill queries over before RoPE (attention_queries.Queries): the Gluon
    form gets them rotated and rounded to bf16 in one pass (query_parts, columns in order)
    and attends bit for bit as with the rotated bf16 queries themselves."""
    from dsflash.model.kernels.attention_queries import Queries
    from dsflash.model.rope import apply_rope

    if not sparse_attention_gluon.usable(torch.empty(1, device="cuda"), D):
        pytest.skip("the Gluon form is for Hopper GPUs")
    g = torch.Generator().manual_seed(3)
    n, heads, W, K, rows, half = 260, 64, 128, 64, 1024, 32
    ring, _, pages, _ = _keys(rows, g)
    raw = torch.randn(n, heads, D, generator=g) * 0.5
    angles = torch.rand(n, half, generator=g) * 100
    cos, sin = angles.cos(), angles.sin()
    w_rows, e_rows = torch.randint(0, rows, (n, W), generator=g), torch.randint(0, rows, (n, K), generator=g)
    keys = [t.cuda() for t in (ring, w_rows * D, rows * D + w_rows * (D // 32), pages, e_rows * (D // 2),
                               rows * (D // 2) + e_rows * (D // 16), torch.randn(heads, generator=g))]
    launches = []
    real = sparse_attention_gluon.prefill_attention
    monkeypatch.setattr(sparse_attention_gluon, "prefill_attention", lambda *a: launches.append(1) or real(*a))
    want = sparse_attention(apply_rope(raw, cos, sin).bfloat16().cuda(), *keys, D**-0.5, prefill=True)
    got = sparse_attention(Queries(raw.cuda(), cos.cuda(), sin.cuda(), True), *keys, D**-0.5, prefill=True)
    assert launches == [1, 1]
    assert torch.equal(got, want)


ROWS_VARIANTS = (";GROUP_HEADS=0;HALF=0,GROUP_HEADS=0;ROW_TILES=10;ROW_TILES=10,PV_IN_FLIGHT=1;"
                 "ROW_TILES=3,PV_IN_FLIGHT=1;ROW_TILES=10,PV_IN_FLIGHT=1,PLAIN=384;ROW_TILES=10,COPY_AHEAD=1;"
                 "ROW_TILES=3,COPY_AHEAD=1")


@pytest.mark.parametrize("kernel, variants", [("attention_gluon", ";GATHERED=0"), ("attention_rows", ROWS_VARIANTS),
                                              ("attention_pingpong", ";GROUP_HEADS=0;HALF=0,GROUP_HEADS=0")])
def test_the_kernels_compile_for_hopper_anywhere(kernel, variants):
    """Gluon does not run in the interpreter, so CI compiles the kernels, every form, for sm_90
    instead (no GPU needed): the pinned Triton's Gluon API and the kernels' layouts stay in
    step. The GPU tests above check what they compute. The rows kernel's forms keep ptxas from
    serializing their wgmmas: PV_IN_FLIGHT's (and COPY_AHEAD's) weighted sum in flight over the
    loop's back edge is what ptxas gave up on with a run-time trip count (C7515, Triton 3.6 and
    3.9 alike)."""
    assert_compiles_for_hopper(kernel, variants, pipelined=kernel == "attention_rows")


def test_decode_keys_decodes_both_kinds_exactly():
    """decode_keys (the decoded form's keys, one decode a key): FP8 window keys and FP4 entries
    at their byte offsets -> bf16 rows equal to their exact values; masked keys -> zeros. Runs
    in the interpreter too."""
    g = torch.Generator().manual_seed(5)
    rows = 64
    ring, window, pages, entries = _keys(rows, g)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pick = torch.tensor([3, -1, 0, 63, 17, 17])
    live = (pick >= 0)[:, None]
    at = pick.clamp_min(0)
    got = decode_keys(ring.to(device), torch.where(pick >= 0, at * D, -1).to(device),
                      (rows * D + at * (D // 32)).to(device), D, fp4=False).cpu()
    assert got.dtype == torch.bfloat16 and torch.equal(got.float(), torch.where(live, window[at], 0.0))
    got = decode_keys(pages.to(device), torch.where(pick >= 0, at * (D // 2), -1).to(device),
                      (rows * (D // 2) + at * (D // 16)).to(device), D, fp4=True).cpu()
    assert torch.equal(got.float(), torch.where(live, entries[at], 0.0))


@pytest.mark.gpu
@pytest.mark.parametrize("rows_once, in_flight, copy_ahead", [(False, False, False), (True, False, False),
                                                               (True, True, False), (True, False, True)])
@pytest.mark.parametrize("n, heads, W, K", [(300, 64, 128, 512), (257, 40, 100, 37), (256, 128, 64, 0)])
def test_decoded_form_attends_as_the_byte_form(n, heads, W, K, rows_once, in_flight, copy_ahead, monkeypatch):
    """The decoded form (keys decoded once into bf16 rows, attend_decoded) against the form
    that decodes each query's keys from their bytes: the same keys, the same tiles and order
    of sums, so the same outputs bit for bit; masked keys and a query that sees nothing too.
    With ROWS_ONCE its rows are staged all at once before its loop, and with PV_IN_FLIGHT too
    each weighted sum stays in flight into the next tile, with COPY_AHEAD each tile's keys are
    copied a whole tile ahead: the same bits again."""
    if not sparse_attention_gluon.usable(torch.empty(1, device="cuda"), D):
        pytest.skip("the Gluon form is for Hopper GPUs")
    monkeypatch.setattr(sparse_attention_gluon, "ROWS_ONCE", rows_once)
    monkeypatch.setattr(sparse_attention_gluon, "PV_IN_FLIGHT", in_flight)
    monkeypatch.setattr(sparse_attention_gluon, "COPY_AHEAD", copy_ahead)
    monkeypatch.setattr(sparse_attention_gluon, "STAGED_TILES", range(1, 100))  # each shape's count staged
    g = torch.Generator().manual_seed(n + K)
    rows = 4096
    ring, window, pages, entries = _keys(rows, g)
    q = (torch.randn(n, heads, D, generator=g) * 0.5).bfloat16().cuda()
    w_rows = torch.where(torch.rand(n, W, generator=g) > 0.1, torch.randint(0, rows, (n, W), generator=g), -1)
    e_rows = torch.where(torch.rand(n, K, generator=g) > 0.2, torch.randint(0, rows, (n, K), generator=g), -1)
    w_rows[0], e_rows[0] = -1, -1
    sink = torch.randn(heads, generator=g).cuda()
    w_off, w_soff = torch.where(w_rows >= 0, w_rows * D, -1), rows * D + w_rows.clamp_min(0) * (D // 32)
    e_off, e_soff = torch.where(e_rows >= 0, e_rows * (D // 2), -1), rows * (D // 2) + e_rows.clamp_min(0) * (D // 16)
    byte_form = sparse_attention(q, ring.cuda(), w_off.cuda(), w_soff.cuda(), pages.cuda(), e_off.cuda(),
                                 e_soff.cuda(), sink, D**-0.5, prefill=True)
    window_keys, entry_keys = _every_key_decoded(ring, pages, rows)
    got = attend_decoded(q, window_keys, w_rows.cuda(), entry_keys, e_rows.cuda(), sink, D**-0.5)
    assert torch.equal(got, byte_form)
    assert got[0].abs().max() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("n, heads, W, K", [(300, 64, 128, 512), (257, 40, 100, 37)])
def test_decoded_form_rotates_queries_as_it_reads_them(n, heads, W, K, monkeypatch):
    """sparse_attention.ROPE_IN_ROWS: the decoded form given the queries before RoPE (the fp32
    projection's rows, strided as the model hands them over) rotates and rounds them as it
    reads them: the same outputs bit for bit as from query_parts' rotated bf16 copy, and as
    from torch's RoPE then bf16 (heads past the last masked too)."""
    from dsflash.model.kernels import sparse_attention as sa
    from dsflash.model.kernels.attention_queries import Queries
    from dsflash.model.rope import apply_rope

    if not sparse_attention_gluon.usable(torch.empty(1, device="cuda"), D):
        pytest.skip("the Gluon form is for Hopper GPUs")
    g = torch.Generator().manual_seed(n + heads)
    rows, half = 2048, 32
    ring, _, pages, _ = _keys(rows, g)
    raw = torch.randn(n, heads + 3, D, generator=g) * 0.5
    strided = raw.cuda()[:, 1:heads + 1]  # a view, as the model's: its rows strided past its heads
    raw = raw[:, 1:heads + 1]
    angles = torch.rand(n, half, generator=g) * 100
    cos, sin = angles.cos(), angles.sin()
    w_rows = torch.where(torch.rand(n, W, generator=g) > 0.1, torch.randint(0, rows, (n, W), generator=g), -1)
    e_rows = torch.where(torch.rand(n, K, generator=g) > 0.2, torch.randint(0, rows, (n, K), generator=g), -1)
    sink = torch.randn(heads, generator=g).cuda()
    window_keys, entry_keys = _every_key_decoded(ring, pages, rows)
    keys = (window_keys, w_rows.cuda(), entry_keys, e_rows.cuda(), sink, D**-0.5)
    queries = Queries(strided, cos.cuda(), sin.cuda(), True)
    rotated = []
    real = sparse_attention_gluon.prefill_attention_decoded
    monkeypatch.setattr(sparse_attention_gluon, "prefill_attention_decoded",
                        lambda *a: rotated.append(a[9] is not None) or real(*a))
    got = {}
    for on in (False, True):
        monkeypatch.setattr(sa, "ROPE_IN_ROWS", on)
        got[on] = attend_decoded(queries, *keys)
    assert rotated == [False, True]
    assert torch.equal(got[True], got[False])
    assert torch.equal(got[True], attend_decoded(apply_rope(raw, cos, sin).bfloat16().cuda(), *keys))


def _queries_before_rope(n: int, heads: int, W: int, K: int, seed: int):
    """A prefill chunk's attention as the decoded form takes it on the GPU: fp32 queries before
    RoPE (attention_queries.Queries) and the keys' arguments of attend_decoded (decoded keys,
    rows with ~10% / 20% masked, the sink, the scale); query 0 sees nothing. Skips off Hopper."""
    from dsflash.model.kernels.attention_queries import Queries

    if not sparse_attention_gluon.usable(torch.empty(1, device="cuda"), D):
        pytest.skip("the Gluon form is for Hopper GPUs")
    g = torch.Generator().manual_seed(seed)
    rows, half = 2048, 32
    ring, _, pages, _ = _keys(rows, g)
    raw = (torch.randn(n, heads, D, generator=g) * 0.5).cuda()
    angles = torch.rand(n, half, generator=g) * 100
    cos, sin = angles.cos().cuda(), angles.sin().cuda()
    w_rows = torch.where(torch.rand(n, W, generator=g) > 0.1, torch.randint(0, rows, (n, W), generator=g), -1)
    e_rows = torch.where(torch.rand(n, K, generator=g) > 0.2, torch.randint(0, rows, (n, K), generator=g), -1)
    w_rows[0], e_rows[0] = -1, -1  # a query that sees nothing: zeros, encoded at the scales' floor
    w_rows[1, :64] = -1  # one whose first key tile is all masked
    window_keys, entry_keys = _every_key_decoded(ring, pages, rows)
    keys = (window_keys, w_rows.cuda(), entry_keys, e_rows.cuda(), torch.randn(heads, generator=g).cuda(), D**-0.5)
    return Queries(raw, cos, sin, True), keys


@pytest.mark.gpu
@pytest.mark.parametrize("n, heads, groups, W, K", [(300, 64, 8, 128, 512), (257, 40, 5, 100, 37)])
def test_decoded_form_writes_its_outputs_as_wo_as_operand(n, heads, groups, W, K, monkeypatch):
    """sparse_attention.ENCODE_IN_ROWS: the decoded form, given the queries before RoPE and
    wo_a's groups, writes its outputs as that product's FP8 operand: the codes and scales
    that the fast path's inverse RoPE launch, then rows_1x128 with faithful mode's rounding
    inside, make of its fp32 outputs, bit for bit (group g's heads g * heads / groups ..,
    heads past the last masked); the rows past n, up to the product's row alignment, zeros;
    with ROWS_ONCE and PV_IN_FLIGHT the same operand again."""
    from dsflash.model.kernels import fp8_blockwise
    from dsflash.model.kernels import sparse_attention as sa
    from dsflash.model.kernels.rope import rope

    queries, keys = _queries_before_rope(n, heads, W, K, n + groups)
    cos, sin = queries.cos, queries.sin
    monkeypatch.setattr(sa, "ROPE_IN_ROWS", True)
    monkeypatch.setattr(sa, "ENCODE_IN_ROWS", True)
    monkeypatch.setattr(sparse_attention_gluon, "ROWS_ONCE", False)  # the rotating form first
    monkeypatch.setattr(sparse_attention_gluon, "PV_IN_FLIGHT", False)
    monkeypatch.setattr(sparse_attention_gluon, "STAGED_TILES", range(1, 100))  # then each shape's count staged
    plain = attend_decoded(queries, *keys)
    got = attend_decoded(queries, *keys, operand_groups=groups)
    assert isinstance(plain, torch.Tensor) and isinstance(got, fp8_blockwise.Operand) and got.m == n
    codes, scales = fp8_blockwise.rows_1x128(rope(plain, cos, sin, inverse=True).reshape(n, -1), groups,
                                             round_first=True)
    blocks = heads * D // 128
    assert got.codes.shape == codes.shape and got.scales.shape == scales.shape
    assert torch.equal(got.codes[:, :n], codes[:, :n])
    assert torch.equal(got.scales.view(blocks, -1)[:, :n], scales.view(blocks, -1)[:, :n])
    assert not got.codes[:, n:].any()
    # ROWS_ONCE, PV_IN_FLIGHT, COPY_AHEAD: the same bits
    for rows_once, in_flight, ahead in ((True, False, False), (True, True, False), (True, False, True)):
        monkeypatch.setattr(sparse_attention_gluon, "ROWS_ONCE", rows_once)
        monkeypatch.setattr(sparse_attention_gluon, "PV_IN_FLIGHT", in_flight)
        monkeypatch.setattr(sparse_attention_gluon, "COPY_AHEAD", ahead)
        again = attend_decoded(queries, *keys, operand_groups=groups)
        assert torch.equal(again.codes, got.codes) and torch.equal(again.scales, got.scales), (rows_once, in_flight,
                                                                                               ahead)
    monkeypatch.setattr(sa, "ENCODE_IN_ROWS", False)  # the switch off: the fp32 rows
    assert torch.equal(attend_decoded(queries, *keys, operand_groups=groups), plain)


@pytest.mark.gpu
@pytest.mark.parametrize("n, heads, groups, W, K", [(300, 64, 8, 128, 512), (257, 40, 5, 100, 37)])
def test_decoded_form_takes_queries_in_halves(n, heads, groups, W, K, monkeypatch):
    """attention_queries.SPLIT_QUERIES: the queries in halves (each head's first 384 channels in
    bf16, the others in fp32 before RoPE, strided as a view of the whole) go to the decoded form
    as they are, and give the fp32 outputs and wo_a's operand of the whole fp32 queries whose
    first channels are those bf16 values, bit for bit."""
    from dsflash.model.kernels import fp8_blockwise
    from dsflash.model.kernels import sparse_attention as sa
    from dsflash.model.kernels.attention_queries import Queries, QueryHalves

    queries, keys = _queries_before_rope(n, heads, W, K, n + heads)
    monkeypatch.setattr(sa, "ROPE_IN_ROWS", True)
    monkeypatch.setattr(sa, "ENCODE_IN_ROWS", True)
    plain, tail = queries.raw[..., :384].bfloat16(), queries.raw[..., 384:]
    whole = Queries(torch.cat([plain.float(), tail], -1), queries.cos, queries.sin, True)
    halves = Queries.of(QueryHalves(plain, tail), queries.cos, queries.sin, True)
    tails = []
    real = sparse_attention_gluon.prefill_attention_decoded
    monkeypatch.setattr(sparse_attention_gluon, "prefill_attention_decoded",
                        lambda *a: tails.append(a[10] is not None) or real(*a))
    for operand_groups in (0, groups):
        want = attend_decoded(whole, *keys, operand_groups=operand_groups)
        got = attend_decoded(halves, *keys, operand_groups=operand_groups)
        if operand_groups:
            assert isinstance(got, fp8_blockwise.Operand)
            assert torch.equal(got.codes, want.codes) and torch.equal(got.scales, want.scales)
        else:
            assert torch.equal(got, want)
    assert tails == [False, True] * 2


def _exact_attention(q: torch.Tensor, window_keys: torch.Tensor, window_rows: torch.Tensor, entry_keys: torch.Tensor,
                     entry_rows: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """attend_decoded's attention in float64 (no rounding of the probabilities): the bar for
    how far a form's bf16 probabilities may take it."""
    keys = torch.cat([window_keys[window_rows.clamp_min(0)], entry_keys[entry_rows.clamp_min(0)]], 1).double()
    valid = torch.cat([window_rows >= 0, entry_rows >= 0], 1)
    if keys.shape[1] == 0:
        return torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    logits = torch.einsum("nhd,nkd->nhk", q.double(), keys) * scale
    logits = logits.masked_fill(~valid[:, None], float("-inf"))
    sinks = sink.double().view(1, -1, 1)
    top = torch.maximum(logits.amax(-1, keepdim=True), sinks)
    weights = torch.exp(logits - top)
    return torch.einsum("nhk,nkd->nhd", weights, keys) / (weights.sum(-1, keepdim=True) + torch.exp(sinks - top))


@pytest.mark.gpu
@pytest.mark.parametrize("n, heads, groups, W, K", [(300, 64, 8, 128, 512), (257, 40, 5, 100, 37), (64, 64, 8, 128, 0),
                                                   (64, 64, 8, 0, 0)])
def test_the_warp_specialized_form_agrees_with_the_rows_kernel(n, heads, groups, W, K, monkeypatch):
    """sparse_attention.PINGPONG_ROWS (sparse_attention_pingpong): the same attention as the
    rows kernel's, summed in another order, so within fp32 rounding of its outputs (bf16
    probabilities under other maxima: 1e-2 of the largest output) and no farther from the
    float64 attention than twice the rows kernel's distance, for the queries before RoPE and
    for bf16 ones rotated; a query that sees nothing gets zeros; its wo_a operand is rows_1x128
    of its own fp32 outputs after the inverse RoPE, bit for bit, its rows past n zeros. Odd
    tile counts (100 + 37 keys: three tiles, a pair's second empty), a query whose first tile
    is all masked, no keys at all and a head block short of 64 included."""
    from dsflash.model.kernels import fp8_blockwise, sparse_attention_pingpong
    from dsflash.model.kernels import sparse_attention as sa
    from dsflash.model.kernels.rope import rope
    from dsflash.model.rope import apply_rope

    queries, keys = _queries_before_rope(n, heads, W, K, n + heads)
    cos, sin = queries.cos, queries.sin
    monkeypatch.setattr(sa, "ROPE_IN_ROWS", True)
    monkeypatch.setattr(sa, "ENCODE_IN_ROWS", True)
    launched = []
    real = sparse_attention_pingpong.prefill_attention_pingpong
    monkeypatch.setattr(sparse_attention_pingpong, "prefill_attention_pingpong",
                        lambda *a: launched.append(a[9] is not None) or real(*a))
    rotated = apply_rope(queries.raw, cos, sin).bfloat16()
    for q in (queries, rotated):
        monkeypatch.setattr(sa, "PINGPONG_ROWS", False)
        rows_kernel = attend_decoded(q, *keys)
        monkeypatch.setattr(sa, "PINGPONG_ROWS", True)
        got = attend_decoded(q, *keys)
        assert got.shape == rows_kernel.shape and torch.isfinite(got).all()
        assert not got[0].any()
        assert (got - rows_kernel).abs().max() <= 1e-2 * rows_kernel.abs().max()
        # as close to the exact attention as the rows kernel is: its error, not a new one
        exact = _exact_attention(rotated, *keys)
        errors = [((out - exact).abs().max() / exact.abs().max().clamp_min(1e-30)).item() for out in (got, rows_kernel)]
        assert errors[0] <= 2 * errors[1] + 1e-6, errors
    assert launched == [True, False]  # the new form ran, with the queries before RoPE, then bf16 ones
    operand = attend_decoded(queries, *keys, operand_groups=groups)
    plain = attend_decoded(queries, *keys)
    codes, scales = fp8_blockwise.rows_1x128(rope(plain, cos, sin, inverse=True).reshape(n, -1), groups,
                                             round_first=True)
    blocks = heads * D // 128
    assert torch.equal(operand.codes[:, :n], codes[:, :n]) and not operand.codes[:, n:].any()
    assert torch.equal(operand.scales.view(blocks, -1)[:, :n], scales.view(blocks, -1)[:, :n])


def test_the_rows_kernels_launch_takes_the_fp32_outputs_or_wo_as_operand(monkeypatch):
    """The decoded form's launch as attend_decoded makes it, recorded on any machine (the
    kernel runs on Hopper only; the GPU tests above check what it writes): fp32 outputs go to
    o_ptr under their strides; with the queries before RoPE, operand_groups and ENCODE_IN_ROWS,
    wo_a's operand goes to codes and scales, with its aligned rows and each group's heads, and
    attend_decoded returns it; the switch off, the fp32 outputs again."""
    from dsflash.model.kernels import fp8_blockwise
    from dsflash.model.kernels import sparse_attention as sa
    from dsflash.model.kernels.attention_queries import Queries

    names = sparse_attention_gluon._attention_rows_kernel.arg_names
    launches = []

    class Recorded:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, {**dict(zip(names, args)), **kw}))

    monkeypatch.setattr(sparse_attention_gluon, "_attention_rows_kernel", Recorded())
    monkeypatch.setattr(sa, "ROPE_IN_ROWS", True)
    monkeypatch.setattr(sparse_attention_gluon, "ROWS_ONCE", False)  # the rotating form first, then staged once
    monkeypatch.setattr(sparse_attention_gluon, "PV_IN_FLIGHT", False)
    n, heads, groups, half = 20, 40, 5, 32
    g = torch.Generator().manual_seed(7)
    queries = Queries(torch.randn(n, heads, D, generator=g), torch.rand(n, half, generator=g),
                      torch.rand(n, half, generator=g), True)
    keys = (torch.zeros(16, D, dtype=torch.bfloat16), torch.zeros(n, 8, dtype=torch.long),
            torch.zeros(16, D, dtype=torch.bfloat16), torch.zeros(n, 4, dtype=torch.long), torch.zeros(heads), 0.1)
    results = {}
    for encode in (True, False):
        monkeypatch.setattr(sa, "ENCODE_IN_ROWS", encode)
        results[encode] = attend_decoded(queries, *keys, operand_groups=groups)
    operand, plain = results[True], results[False]
    assert isinstance(operand, fp8_blockwise.Operand) and operand.m == n and operand.codes.shape == (groups, 32, 8 * D)
    assert plain.shape == (n, heads, D) and plain.dtype == torch.float32
    (grid, encoded), (_, fp32) = launches
    assert grid == (n, 1) and encoded["HALF"] == fp32["HALF"] == half
    assert encoded["codes_ptr"] is operand.codes and encoded["scales_ptr"] is operand.scales
    assert (encoded["ROWS"], encoded["GROUP_HEADS"], encoded["son"], encoded["soh"]) == (32, 8, 0, 0)
    assert fp32["o_ptr"] is plain and (fp32["son"], fp32["soh"], fp32["GROUP_HEADS"]) == (heads * D, D, 0)
    assert encoded["q_ptr"].dtype == torch.float32 and encoded["scn"] == half
    assert encoded["ROW_TILES"] == fp32["ROW_TILES"] == 0  # ROWS_ONCE off
    assert not encoded["PV_IN_FLIGHT"] and not fp32["PV_IN_FLIGHT"]
    monkeypatch.setattr(sparse_attention_gluon, "ROWS_ONCE", True)
    monkeypatch.setattr(sparse_attention_gluon, "PV_IN_FLIGHT", True)
    attend_decoded(queries, *keys, operand_groups=groups)
    assert launches[-1][1]["ROW_TILES"] == 0 and not launches[-1][1]["PV_IN_FLIGHT"]  # 2 tiles: not a full query's
    monkeypatch.setattr(sparse_attention_gluon, "STAGED_TILES", (1, 2))
    attend_decoded(queries, *keys, operand_groups=groups)
    assert (launches[-1][1]["ROW_TILES"], launches[-1][1]["PV_IN_FLIGHT"]) == (2, True)  # a tile of 8 rows, one of 4
    attend_decoded(queries, keys[0], keys[1], keys[2], keys[3][:, :0], *keys[4:], operand_groups=groups)
    assert (launches[-1][1]["ROW_TILES"], launches[-1][1]["PV_IN_FLIGHT"]) == (1, False)  # one tile: nothing to overlap
    assert not any(kw["COPY_AHEAD"] for _, kw in launches)  # off
    monkeypatch.setattr(sparse_attention_gluon, "COPY_AHEAD", True)
    attend_decoded(queries, *keys, operand_groups=groups)
    assert launches[-1][1]["COPY_AHEAD"] and launches[-1][1]["ROW_TILES"] == 2
    attend_decoded(queries, keys[0], keys[1], keys[2], keys[3][:, :0], *keys[4:], operand_groups=groups)
    assert not launches[-1][1]["COPY_AHEAD"]  # one tile


def test_rows_once_stages_a_full_querys_every_tile_up_to_its_cap(monkeypatch):
    """ROW_TILES: 0 while ROWS_ONCE is off; with it a query's window tiles and entry tiles (64
    keys a tile) where their count is a full query's (STAGED_TILES: the release's prefill
    queries, a compile each), 0 for a short prompt's other counts (the rotating form, one
    compile) and where there are none or more than MAX_ROW_TILES (shared memory)."""
    rows = lambda width: torch.zeros(3, width, dtype=torch.long)  # noqa: E731
    monkeypatch.setattr(sparse_attention_gluon, "ROWS_ONCE", False)
    assert sparse_attention_gluon.row_tiles(rows(128), rows(512)) == 0
    monkeypatch.setattr(sparse_attention_gluon, "ROWS_ONCE", True)
    assert sparse_attention_gluon.row_tiles(rows(128), rows(512)) == 10
    assert sparse_attention_gluon.row_tiles(rows(128), rows(1024)) == 18
    assert sparse_attention_gluon.row_tiles(rows(128), rows(1)) == 3  # a sliding-window layer's
    assert sparse_attention_gluon.row_tiles(rows(128), rows(300)) == 0  # a short prompt's query
    assert sparse_attention_gluon.row_tiles(rows(100), rows(100)) == 0
    assert all(0 < tiles <= sparse_attention_gluon.MAX_ROW_TILES for tiles in sparse_attention_gluon.STAGED_TILES)
    monkeypatch.setattr(sparse_attention_gluon, "STAGED_TILES", range(1, 100))  # every count, as the GPU tests take
    assert sparse_attention_gluon.row_tiles(rows(100), rows(100)) == 4
    assert sparse_attention_gluon.row_tiles(rows(0), rows(0)) == 0
    cap = sparse_attention_gluon.MAX_ROW_TILES
    assert sparse_attention_gluon.row_tiles(rows(64), rows(64 * cap)) == 0
    assert sparse_attention_gluon.row_tiles(rows(64), rows(64 * (cap - 1))) == cap


@pytest.mark.gpu
def test_the_attention_output_projects_alike_from_the_kernels_operand(monkeypatch):
    """The model's route for a prefill chunk's attention output (1,040 rows, 64 heads, wo_a in 8
    groups of 128 rows, then wo_b) through TritonOps (layers/attention.grouped_output): the
    same bits from the rows kernel's operand (ENCODE_IN_ROWS) as from its fp32 outputs after
    the inverse RoPE launch, the way attention_kernel.attend_updated hands either over; and
    ops.takes_operand asks for the operand there."""
    from types import SimpleNamespace

    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.kernels import fp8_blockwise
    from dsflash.model.kernels import sparse_attention as sa
    from dsflash.model.kernels.attention_queries import Queries
    from dsflash.model.layers.attention import grouped_output
    from dsflash.model.quant import quantize_fp8_weight
    from dsflash.model.weights import Fp8Weight

    if not sparse_attention_gluon.usable(torch.empty(1, device="cuda"), D):
        pytest.skip("the Gluon form is for Hopper GPUs")
    g = torch.Generator().manual_seed(11)
    n, heads, groups, rank, hidden, rows, half = 1040, 64, 8, 128, 256, 1024, 32
    ring, _, pages, _ = _keys(rows, g)
    angles = torch.rand(n, half, generator=g) * 100
    cos, sin = angles.cos().cuda(), angles.sin().cuda()
    queries = Queries((torch.randn(n, heads, D, generator=g) * 0.5).cuda(), cos, sin, True)
    window_keys, entry_keys = _every_key_decoded(ring, pages, rows)
    keys = (window_keys, torch.randint(0, rows, (n, 128), generator=g).cuda(), entry_keys,
            torch.randint(0, rows, (n, 64), generator=g).cuda(), torch.randn(heads, generator=g).cuda(), D**-0.5)
    weights = {"l.attn.wo_a": Fp8Weight(*quantize_fp8_weight(torch.randn(groups * rank, heads * D // groups,
                                                                         generator=g) * 0.02), (32, 32)),
               "l.attn.wo_b": Fp8Weight(*quantize_fp8_weight(torch.randn(hidden, groups * rank, generator=g) * 0.05),
                                        (32, 32))}
    ops = TritonOps(weights, act_quant=True, device="cuda")
    config, role = SimpleNamespace(o_groups=groups), SimpleNamespace(prefix="l")
    monkeypatch.setattr(sa, "ROPE_IN_ROWS", True)
    monkeypatch.setattr(sa, "ENCODE_IN_ROWS", True)
    assert ops.takes_operand("l.attn.wo_a", n, groups)
    plain = sa.attend_decoded(queries, *keys)
    operand = sa.attend_decoded(queries, *keys, operand_groups=groups)
    assert isinstance(operand, fp8_blockwise.Operand)
    want = grouped_output(ops, config, role, ops.rope(plain, cos, sin, inverse=True, overwrite=True))
    got = grouped_output(ops, config, role, operand)
    assert got.shape == (n, hidden) and torch.isfinite(got).all()
    assert torch.equal(got, want)
