"""top_k_ascending: which entries a query keeps, exactly (ties, -inf, signed zeros)."""

import torch

from dsflash.model.layers.indexer import top_k_ascending

INF = float("inf")


def _oracle(row: list[float], k: int) -> list[int]:
    """Sort by (score descending, id ascending), keep k, drop -inf, pad with -1, ascending."""
    best = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    kept = sorted(i for i in best if row[i] > -INF)
    return kept + [-1] * (k - len(kept))


def test_ties_at_the_cut_go_to_the_lower_id():
    scores = torch.tensor([[1.0, 3.0, 1.0, 1.0, 3.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
    assert top_k_ascending(scores, 3).tolist() == [[0, 1, 4], [0, 1, 2]]


def test_minus_inf_rows_pad_with_minus_one():
    scores = torch.tensor([[-INF, 5.0, -INF, -INF], [-INF] * 4, [INF, -INF, 0.5, -1.0]])
    assert top_k_ascending(scores, 3).tolist() == [[1, -1, -1], [-1, -1, -1], [0, 2, 3]]


def test_negative_zero_ties_with_zero():
    scores = torch.tensor([[-0.0, 0.0, -1.0, -0.0], [0.0, -0.0, -0.0, 0.0]])
    assert top_k_ascending(scores, 2).tolist() == [[0, 1], [0, 1]]


def test_empty_k_and_rows():
    assert top_k_ascending(torch.zeros(2, 5), 0).shape == (2, 0)
    assert top_k_ascending(torch.zeros(0, 5), 3).shape == (0, 3)


def test_random_rows_match_the_oracle():
    g = torch.Generator().manual_seed(0)
    pool = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.5, -INF, INF, 1e-40, -1e-40, -3.5])
    for width in (1, 7, 33):
        for k in range(width + 1):
            scores = pool[torch.randint(0, len(pool), (6, width), generator=g)]
            want = [_oracle(row, k) for row in scores.tolist()]
            assert top_k_ascending(scores, k).tolist() == want
