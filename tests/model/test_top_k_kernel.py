"""The top-k kernels against top_k_ascending_ref, bit for bit (CPU interpreter; the large
shapes on the GPU). Small blocks and several chunks per row make the interpreter walk the
paths a long row takes on the GPU: chunk boundaries, partial blocks, ties split across chunks;
a small sample and few places a chunk, those of the filtered form (floor, kept scores, the
whole-row select where the floor misjudged a row)."""

import pytest
import torch
import triton
import triton.language as tl

from dsflash.model.kernels.top_k import (_collapsed_key, _keys, _signed_floor, _signed_keys, sample_columns,
                                         top_k_ascending_kernel, top_k_ascending_ref)

INF, NAN = float("inf"), float("nan")
SMALL_PLAN = dict(chunks=3, block=128)  # at N = 600: chunks of 256, 256 and 88
SMALL_FILTER = dict(sample=64, capacity=256)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU


def _check(scores: torch.Tensor, k: int, filter_plan: dict = SMALL_FILTER, **plan) -> None:
    """The given plan (None: the default one), unfiltered and filtered (with filter_plan), and
    one chunk a row (every pass in one program) with the same blocks."""
    want = top_k_ascending_ref(scores, k).cpu()
    variants = [dict(plan, chunks=1)]
    if plan.get("chunks") != 1:
        variants += [dict(plan, filtered=False), dict(plan, filtered=True, **filter_plan)]
    for variant in variants:
        got = top_k_ascending_kernel(scores.to(DEVICE), k, **variant).cpu()
        assert got.dtype == want.dtype == torch.long and got.shape == want.shape
        assert torch.equal(got, want), (variant, got, want)


def _ordered_keys(x: torch.Tensor) -> torch.Tensor:
    """fp32 scores -> their uint32 keys in the scores' order as int64, _keys before its collapses
    (of -0.0, -inf and NaNs)."""
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(bits >= 2**31, bits ^ 0xFFFFFFFF, bits | 2**31)


def test_random_rows_several_chunks():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 2500, generator=g) * torch.tensor([1.0, 1e-30, 1e30, -1.0])[:, None]
    _check(scores, 100, chunks=3, block=256)  # chunks of 1024, 1024 and 452
    _check(scores, 100)  # the default plan: one chunk, a block longer than a row


@pytest.mark.parametrize("k", [1, 40, 333, 600])
def test_heavy_ties(k):
    """Scores from four values: the threshold value has hundreds of equal scores, some taken,
    some not, spread over every chunk; rows differ in where the threshold falls."""
    g = torch.Generator().manual_seed(k)
    values = torch.tensor([-1.0, 0.0, 1.0, 2.0])
    weights = torch.tensor([[1, 1, 1, 1], [0, 1, 8, 1], [5, 1, 0, 0], [1, 1, 1, 30]], dtype=torch.float)
    picks = torch.multinomial(weights, 600, replacement=True, generator=g)
    _check(values[picks], k, **SMALL_PLAN)


def test_minus_inf_signed_zeros_and_negatives():
    N = 600
    g = torch.Generator().manual_seed(1)
    rows = torch.full((6, N), -INF)
    rows[0, torch.randperm(N, generator=g)[:20]] = torch.randn(20, generator=g)  # 20 finite: pads k - 20
    # rows[1] stays all -inf
    rows[2] = torch.where(torch.rand(N, generator=g) < 0.5, -0.0, 0.0)  # all zeros, either sign
    rows[3] = -torch.rand(N, generator=g) - 1.0  # all negative
    rows[4, ::7] = torch.tensor([-0.0, 0.0, -2.0, 5.0])[torch.arange(0, N, 7) % 4]
    rows[5] = torch.linspace(-3.0, 3.0, N)
    rows[5, 500:] = -INF  # the best scores are -inf: the finite ones below them come first
    _check(rows, 50, **SMALL_PLAN)
    _check(rows, N, **SMALL_PLAN)  # k = N: every finite score, -1 after


def test_nan_ranks_as_topk_over_the_bits():
    """A positive NaN takes a place above +inf and leaves a -1; a negative one ranks below -inf."""
    rows = torch.tensor([[1.0, NAN, 3.0, -NAN, INF, 2.0, NAN, 0.0], [NAN] * 6 + [1.0, 2.0],
                         [-NAN, -INF, 1.0, -NAN, -1.0, -INF, 4.0, -NAN]])
    for k in (1, 3, 8):
        _check(rows, k, chunks=2, block=32)


def test_radix_widths():
    g = torch.Generator().manual_seed(2)
    scores = torch.randint(-4, 4, (3, 600), generator=g) * torch.rand(3, 600, generator=g).round(decimals=2)
    for bits in (5, 11):  # 7 passes of 5 bits (the last one 2), 3 of 11 (the last one 10)
        _check(scores, 77, radix_bits=bits, **SMALL_PLAN)


def test_filtered_rows_the_floor_misjudges():
    """Rows the filtered form must select whole: the sampled scores are the row's best, so the
    floor keeps fewer than k; a chunk keeps more than its places; and rows whose floor lets
    every returnable score through (few finite ones), where fewer than k are right."""
    N, k, sample = 600, 100, 64
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(4, N, generator=g)
    rows[0, sample_columns(N, torch.device("cpu"), sample)] = 100.0 + torch.arange(sample, dtype=torch.float)  # 64 < k
    rows[1, :300] = rows[1, :300].round()  # heavy ties, and the floor mid-row
    rows[2, 40:] = -INF  # 40 returnable scores: every one kept, the rest of k pads
    rows[3, ::3] = NAN  # positive NaNs take places
    for capacity in (256, 16):  # 16: chunks overflow, the whole row is selected in the program
        _check(rows, k, dict(sample=sample, capacity=capacity), **SMALL_PLAN)


@pytest.mark.parametrize("run", [1, 8])
def test_the_floor_is_the_rank_th_best_of_its_sampled_runs(monkeypatch, run):
    """top_k.SAMPLE_RUN: the floor's sample is sample_columns' ids (SAMPLE / run runs of `run`
    consecutive ids spread evenly, within the row), and the floor the rank-th best key among
    them, at long and short rows; the filtered form picks as the reference with that sample."""
    from dsflash.model.kernels import top_k

    monkeypatch.setattr(top_k, "SAMPLE_RUN", run)
    g = torch.Generator().manual_seed(15)
    for N, sample, k in ((70_000, 256, 40), (600, 64, 77), (40, 64, 3)):
        columns = sample_columns(N, torch.device("cpu"), sample)
        assert columns.shape == (sample,) and 0 <= int(columns.min()) and int(columns.max()) < N
        runs = columns.view(-1, top_k.sample_run(sample))
        if N >= sample:  # (shorter rows' runs overlap)
            assert bool((columns.diff() > 0).all()) and bool((runs.diff(dim=1) == 1).all())
        rows = torch.randn(3, N, generator=g)
        rows[1] = rows[1].round()
        floors = top_k.sample_floors(rows.to(DEVICE), k, N, sample=sample).cpu()
        rank = top_k.floor_rank(k, N, sample)
        keys = _ordered_keys(rows[:, columns])  # _keys' own (no special values here to collapse)
        want = keys.sort(dim=1, descending=True).values[:, rank - 1]
        assert torch.equal(floors.to(torch.int64) & 0xFFFFFFFF, want)
    rows = torch.randn(4, 600, generator=g)
    rows[1] = rows[1].round()
    rows[2, ::4] = torch.tensor([-0.0, 0.0, INF, NAN])[torch.arange(0, 600, 4) % 4]
    for capacity in (256, 16):
        _check(rows, 77, dict(sample=64, capacity=capacity), **SMALL_PLAN)


@pytest.mark.parametrize("skips", [True, False])
def test_filtered_rows_whose_kept_keys_share_their_leading_digits(monkeypatch, skips):
    """Kept scores in a narrow range share their keys' leading digits with the floor, so the
    pick takes those digits without counting (PICK_SKIPS_SHARED_DIGITS): one pass (1 + 2^-10
    spread), two (a spread of ulps), every pass (all equal: the ties settle by id), or a
    negative range; the same picks with the skips off."""
    from dsflash.model.kernels import top_k

    monkeypatch.setattr(top_k, "PICK_SKIPS_SHARED_DIGITS", skips)
    g = torch.Generator().manual_seed(6)
    N = 600
    rows = torch.stack([1.0 + torch.rand(N, generator=g) * 2**-10,
                        1.0 + torch.randint(0, 300, (N,), generator=g) * 2**-23,
                        torch.full((N,), 0.75),
                        -2.0 - torch.rand(N, generator=g) * 2**-6])
    for k in (1, 77, 450):
        _check(rows, k, **SMALL_PLAN)


def test_filtered_form_with_atomic_places(monkeypatch):
    """The filtering launch's other way to place kept scores (each plan's switched: an atomic
    count in any order where it takes a prefix sum, and the other way round): the same picks,
    ties to the lower id, and the same whole-row fallback on overflow."""
    from dsflash.model.kernels import top_k

    for name, plan in top_k.FILTER_PLANS.items():
        monkeypatch.setitem(top_k.FILTER_PLANS, name, plan._replace(atomic=not plan.atomic))
    g = torch.Generator().manual_seed(5)
    rows = torch.tensor([-1.0, 0.0, 1.0, 2.0])[torch.randint(0, 4, (3, 600), generator=g)]  # heavy ties
    rows[1, 100:] = -INF
    rows[2, ::5] = NAN
    for capacity in (256, 16):
        _check(rows, 77, dict(sample=64, capacity=capacity), **SMALL_PLAN)


@pytest.mark.parametrize("atomic", [False, True])
def test_the_filtering_launchs_programs_take_its_row_chunks_in_turn(monkeypatch, atomic):
    """top_k.FILTER_PROGRAMS: a filtering launch of a few programs an SM (2 SMs on the CPU),
    each taking (row, chunk) pairs in turn, picks what one program a pair picks, with either
    way of placing the kept scores and the whole-row fallback where a chunk overflows."""
    from dsflash.model.kernels import top_k

    monkeypatch.setattr(top_k, "FILTER_PROGRAMS", 1)
    for name, plan in top_k.FILTER_PLANS.items():
        monkeypatch.setitem(top_k.FILTER_PLANS, name, plan._replace(atomic=atomic))
    g = torch.Generator().manual_seed(11)
    rows = torch.randn(5, 600, generator=g)
    rows[1] = rows[1].round()  # heavy ties
    rows[3, 50:] = -INF
    for capacity in (256, 16):
        _check(rows, 77, dict(sample=64, capacity=capacity), **SMALL_PLAN)


def test_filtered_form_by_default_on_long_rows():
    """Rows of FILTER_SHARE k scores and more are filtered; in launches of PREFILL_FILTER_ROWS
    rows and more (a prefill chunk's score slices) from PREFILL_FILTER_SHARE k already."""
    from dsflash.model.kernels.top_k import FILTER_SHARE, PREFILL_FILTER_ROWS, PREFILL_FILTER_SHARE, filters

    assert filters(512, 512 * FILTER_SHARE) and not filters(512, 512 * FILTER_SHARE - 1)
    assert filters(512, 512 * FILTER_SHARE, 6) and not filters(512, 512 * FILTER_SHARE - 1, PREFILL_FILTER_ROWS - 1)
    assert filters(512, 512 * PREFILL_FILTER_SHARE, PREFILL_FILTER_ROWS)
    assert not filters(512, 512 * PREFILL_FILTER_SHARE - 1, 1 << 14)
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 4096, generator=g)
    want = top_k_ascending_ref(scores, 16)
    got = top_k_ascending_kernel(scores.to(DEVICE), 16, chunks=2, block=512, sample=256, capacity=512).cpu()
    assert torch.equal(got, want)


def test_long_rows_take_two_filtered_plans_which_the_warm_up_compiles():
    """Prefill slices (many rows) and decode rows take their own plans' chunks a row (or a few
    fewer where the rounded chunk length leaves them: the same pick kernel, whose integer
    arguments are not specialized) and blocks; the warm-up's rows take the same two plans, so a
    worker compiles them at start."""
    from dsflash.model.kernels.top_k import FILTER_PLANS, FILTER_SHARE, MANY_ROWS, launch_plan, pick_chunks

    def plan(n, N):
        filtered, chunks, _, block = launch_plan(n, N, 512)
        return filtered, triton.next_power_of_2(chunks), block

    many, few = ((True, FILTER_PLANS[rows].chunks, FILTER_PLANS[rows].block) for rows in ("many rows", "few rows"))
    assert plan(128, 1 << 20) == plan(256, 1 << 19) == plan(512, 262144 + 4096) == many
    assert plan(6, 1 << 20) == plan(6, 1_000_001) == plan(1, 250_000) == few
    warm = 2 * FILTER_SHARE * 512  # the warm-up's filtered rows
    assert plan(MANY_ROWS, warm) == many and plan(1, warm) == few
    assert launch_plan(6, 1 << 14, 512)[:2] == (False, 1)  # decode at short context: one program a row
    # a prefill chunk's slices at 64K to 256K tokens of context (2^27 scores a slice) are filtered
    for n, N in ((8192, 16384), (4096, 32767), (2048, 65535)):
        filtered, chunks, _, block = launch_plan(n, N, 512)
        assert filtered and (pick_chunks(n, chunks), block) == many[1:]
    assert launch_plan(16384, 8191, 512)[:2] == (False, 1) and not launch_plan(192, 65535, 512)[0]


@pytest.mark.parametrize("longest", [{512: 1 << 20, 2048: 1 << 17}, {64: 20000, 16: 15000}])
def test_the_warm_up_covers_every_plan_prompts_and_decode_steps_meet(longest):
    """Each launch a prefill slice (4,096 or 128 rows), the candidate blocks (48) or a decode
    step (6) makes, at any row length up to the longest, compiles kernels the warm-up compiled: the
    same form, the same power of two of chunks (the write and pick kernels' constexpr), the
    same places a chunk (the filtered form's), and the same divisibility of the row length by
    16 (the kernels' specialization)."""
    from dsflash.model.kernels.top_k import launch_plan, pick_chunks, places, warm_up_rows

    def key(n, N, k, chunks=None, filtered=None):
        filtered, chunks, chunk_len, block = launch_plan(n, N, k, chunks, filtered=filtered)
        if chunks == 1:
            return ("select", N % 16 == 0)
        if filtered:
            return ("filtered", pick_chunks(n, chunks), block, places(chunk_len), N % 16 == 0)
        return ("radix", triton.next_power_of_2(chunks), N % 16 == 0)

    warmed = {key(*launch) for launch in warm_up_rows(longest)}
    for k, most in longest.items():
        for n in (4096, 128, 48, 6):
            for N in list(range(k + 1, most, 997)) + [most]:
                assert key(n, N, k) in warmed, (n, N, k)


def test_the_filter_kernel_specializes_only_on_what_the_warm_up_varies():
    """Triton compiles a variant of a kernel for each divisibility by 16 of the integer arguments
    it specializes. The filtered form's are the row length (the warm-up takes it both ways), the
    row stride (a padded row's, or the warm-up's rows' own) and the chunk length (a multiple of
    the block); its chunk and pair counts, which a long prompt's slices meet both ways, are not
    specialized: a first 1M prefill compiled 11 variants of them inside its timed run (H100,
    fifty-seventh session)."""
    import inspect

    from dsflash.model.kernels import top_k

    kernel = top_k._filter_kernel
    params = inspect.signature(kernel.fn).parameters
    integers = {name for name, p in params.items()
                if not name.endswith("_ptr") and "constexpr" not in str(p.annotation)}
    assert integers - set(top_k.FILTER_UNSPECIALIZED) == {"N", "sxr", "chunk_len"}
    if hasattr(kernel, "params"):  # compiled (the interpreter keeps no specialization): what Triton takes
        assert {p.name for p in kernel.params if p.do_not_specialize} == set(top_k.FILTER_UNSPECIALIZED)
    else:
        assert "@triton.jit(do_not_specialize=FILTER_UNSPECIALIZED)\ndef _filter_kernel(" in inspect.getsource(top_k)


def test_empty_shapes():
    assert top_k_ascending_kernel(torch.zeros(2, 5, device=DEVICE), 0).shape == (2, 0)
    assert top_k_ascending_kernel(torch.zeros(0, 5, device=DEVICE), 3).shape == (0, 3)
    _check(torch.tensor([[3.0], [-INF]]), 1)


@pytest.mark.gpu
@pytest.mark.parametrize("n, N, k", [(128, 1 << 20, 512), (2048, (1 << 15) + 1, 512), (48, 1 << 16, 2048),
                                     (6, 1 << 18, 512)])
def test_large_shapes_on_the_gpu(n, N, k):
    g = torch.Generator(device="cuda").manual_seed(n)
    scores = torch.randn(n, N, device="cuda", generator=g)
    scores[: n // 2, N // 3:] = -INF  # half the rows see a third of the entries
    scores[1] = scores[1].round(decimals=1)  # heavy ties at the threshold
    _check(scores, k, {})


@triton.jit
def _reach_kernel(x_ptr, floor_ptr, keys_ptr, signed_ptr, back_ptr, N, BLOCK: tl.constexpr):
    """Program (floor f): for every score, whether _keys' key reaches floor f and whether its
    _signed_keys key reaches _signed_floor(f); and each score's key back from its signed one."""
    f = tl.program_id(0)
    floor = tl.load(floor_ptr + f).to(tl.uint32, bitcast=True)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols, mask=cols < N, other=0.0)
    tl.store(keys_ptr + f * N + cols, (_keys(x) >= floor).to(tl.int8), mask=cols < N)
    tl.store(signed_ptr + f * N + cols, (_signed_keys(x) >= _signed_floor(floor)).to(tl.int8), mask=cols < N)
    tl.store(back_ptr + cols, _collapsed_key(_signed_keys(x)).to(tl.int32, bitcast=True), mask=cols < N)


def test_the_filters_signed_keys_reach_a_floor_as_the_keys_do():
    """The filtering launch compares _signed_keys (2 instructions a score) with _signed_floor in
    place of _keys (~9) with the floor: the same scores reach every floor, from special values
    (signed zeros, infinities, NaNs of both signs, denormals, the largest finite) and random bit
    patterns, against floors at each of their keys, one past them, and the collapsed ends; a
    kept score's key comes back from its signed one (positive NaNs collapsed), as the launch
    reports its highest."""
    g = torch.Generator().manual_seed(9)
    special = torch.tensor([0.0, -0.0, INF, -INF, NAN, -NAN, 1.0, -1.0, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38,
                            1.1754944e-38, -1.1754944e-38, 2.0, -2.0])
    bits = torch.randint(-2**31, 2**31, (200,), generator=g, dtype=torch.int64).to(torch.int32)
    x = torch.cat([special, bits.view(torch.float32), special.view(torch.int32).add(1).view(torch.float32)])
    ordered = _ordered_keys(x)
    floors = torch.cat([ordered, ordered + 1, torch.tensor([1, 2, 0x007FFFFF, 0x00800000, 0x80000000, 0x80000001,
                                                            0xFF800000, 0xFF800001, 0xFFFFFFFF])])
    floors = floors.clamp(1, 0xFFFFFFFF)
    floors = torch.where(floors >= 2**31, floors - 2**32, floors).to(torch.int32)
    n, f = x.numel(), floors.numel()
    keys, signed = torch.empty(f, n, dtype=torch.int8), torch.empty(f, n, dtype=torch.int8)
    back = torch.empty(n, dtype=torch.int32)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    outs = [dev(keys), dev(signed), dev(back)]
    _reach_kernel[(f,)](dev(x), dev(floors), *outs, n, BLOCK=triton.next_power_of_2(n))
    keys, signed, back = (o.cpu() for o in outs)
    assert torch.equal(keys, signed)
    collapsed = torch.where(ordered <= 0x007FFFFF, 0, torch.where(ordered > 0xFF800000, 0xFFFFFFFF, ordered))
    collapsed = torch.where(x.view(torch.int32) == -2**31, 0x80000000, collapsed)  # -0.0 as 0.0
    reachable = collapsed > 0  # (kept scores only: -inf and negative NaNs never reach a floor)
    want = torch.where(collapsed >= 2**31, collapsed - 2**32, collapsed).to(torch.int32)
    assert torch.equal(back[reachable], want[reachable])


def test_the_filtering_launch_in_ptx_picks_what_tritons_form_picks(monkeypatch):
    """top_k.FILTER_PTX: the atomic plan's filtering launch keeping each score in PTX (a branch
    a score; on the GPU, where the interpreter runs Triton's form): the reference's picks over
    random rows, heavy ties, signed zeros, infinities and NaNs, rows with few returnable scores,
    and chunks over their places (the whole-row select), at both plans and in several chunks."""
    from dsflash.model.kernels import top_k

    monkeypatch.setattr(top_k, "FILTER_PTX", True)
    for name, plan in top_k.FILTER_PLANS.items():
        monkeypatch.setitem(top_k.FILTER_PLANS, name, plan._replace(atomic=True))
    g = torch.Generator().manual_seed(10)
    rows = torch.randn(6, 600, generator=g)
    rows[1] = rows[1].round()  # heavy ties
    rows[2, ::4] = torch.tensor([-0.0, 0.0, INF, NAN])[torch.arange(0, 600, 4) % 4]
    rows[3, 50:] = -INF  # 50 returnable scores
    rows[4, ::7] = -NAN
    for capacity in (256, 16):
        _check(rows, 77, dict(sample=64, capacity=capacity), **SMALL_PLAN)
    _check(torch.randn(40, 1200, generator=g), 33, dict(sample=128, capacity=256), chunks=4, block=128)
    # what the launch leaves, as Triton's form leaves it: each chunk's count and highest key, and
    # where every kept score fits its places, the same scores and ids (their order is the atomics')
    x = rows.to(DEVICE)
    works = {}
    for ptx in (True, False):
        monkeypatch.setattr(top_k, "FILTER_PTX", ptx)
        works[ptx] = work = top_k.kept_work(6, 600, 77, x.device, capacity=128, **SMALL_PLAN)
        top_k.filter_rows(x, 77, work, sample=64)
    got, want = works[True], works[False]
    assert torch.equal(got.counts.cpu(), want.counts.cpu()) and torch.equal(got.tops.cpu(), want.tops.cpu())
    counts = want.counts.cpu()
    assert (counts <= 128).any() and (counts > 0).any()
    for row, chunk in (counts <= 128).nonzero().tolist():
        places = slice(0, counts[row, chunk])
        (ids, scores), (want_ids, want_scores) = [(w.ids[row, chunk, places].cpu(),
                                                   w.kept[row, chunk, places].cpu().view(torch.int32))
                                                  for w in (got, want)]
        order, want_order = ids.argsort(), want_ids.argsort()
        assert torch.equal(ids[order], want_ids[want_order]) and torch.equal(scores[order], want_scores[want_order])
