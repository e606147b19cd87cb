"""The top-k kernels against top_k_ascending_ref, bit for bit (CPU interpreter; the large
shapes on the GPU). Small blocks and several chunks per row make the interpreter walk the
paths a long row takes on the GPU: chunk boundaries, partial blocks, ties split across chunks."""

import pytest
import torch

from dsflash.model.kernels.top_k import top_k_ascending_kernel, top_k_ascending_ref

INF, NAN = float("inf"), float("nan")
SMALL_PLAN = dict(chunks=3, block=128)  # at N = 600: chunks of 256, 256 and 88
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU


def _check(scores: torch.Tensor, k: int, **plan) -> None:
    """The given plan, and one chunk a row (every pass in one program) with the same blocks."""
    want = top_k_ascending_ref(scores, k).cpu()
    for chunks in {plan.get("chunks"), 1}:
        got = top_k_ascending_kernel(scores.to(DEVICE), k, **{**plan, "chunks": chunks}).cpu()
        assert got.dtype == want.dtype == torch.long and got.shape == want.shape
        assert torch.equal(got, want), (chunks, got, want)


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


def test_empty_shapes():
    assert top_k_ascending_kernel(torch.zeros(2, 5, device=DEVICE), 0).shape == (2, 0)
    assert top_k_ascending_kernel(torch.zeros(0, 5, device=DEVICE), 3).shape == (0, 3)
    _check(torch.tensor([[3.0], [-INF]]), 1)


@pytest.mark.gpu
@pytest.mark.parametrize("n, N, k", [(128, 1 << 20, 512), (48, 1 << 16, 2048), (6, 1 << 18, 512)])
def test_large_shapes_on_the_gpu(n, N, k):
    g = torch.Generator(device="cuda").manual_seed(n)
    scores = torch.randn(n, N, device="cuda", generator=g)
    scores[: n // 2, N // 3:] = -INF  # half the rows see a third of the entries
    scores[1] = scores[1].round(decimals=1)  # heavy ties at the threshold
    _check(scores, k)
