"""argmax_rows (two stages) against torch's one-stage argmax: ties, NaNs, -inf rows, widths
it leaves to torch."""

import pytest
import torch

from dsflash.model import ops
from dsflash.model.ops import argmax_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_two_stages_equal_torchs_argmax_on_ties_and_nans():
    width = 128 * 1010  # an LM head's 129,280
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(8, width, generator=g)
    rows[1, [5_000, 70_000, 129_279]] = 9.0  # equal maxima in three parts: the first
    rows[2, [4_000, 4_001]] = 9.0  # in one part
    rows[3, [60_000, 3]] = float("nan")  # NaNs rank above all: the first of them
    rows[4] = float("-inf")  # nothing finite: index 0
    rows[5] = 0.0  # every entry ties
    rows[6, 129_279] = float("inf")  # the last entry
    rows[7, ::1010] = 5.0  # each part's first entry holds the max
    rows = rows.to(DEVICE)
    want = rows.argmax(-1)
    got = argmax_rows(rows)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert got.tolist()[1:4] == [5_000, 4_000, 3]
    assert torch.equal(argmax_rows(rows[:, None]), want[:, None])  # leading dims kept


@pytest.mark.parametrize("width", [100, 128 * 3 + 1, 128])
def test_widths_the_stages_do_not_divide_take_torchs_argmax(width, monkeypatch):
    rows = torch.randn(3, width, generator=torch.Generator().manual_seed(width)).to(DEVICE)
    assert torch.equal(argmax_rows(rows), rows.argmax(-1))
    monkeypatch.setattr(ops, "ARGMAX_PARTS", 0)
    assert torch.equal(argmax_rows(rows), rows.argmax(-1))
