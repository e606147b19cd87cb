"""Host <-> device copies that leave the GPU's queue alone (model/device.py)."""

from __future__ import annotations

import pytest
import torch

import numpy as np

from dsflash.model.device import HostCopy, tables_to_device

gpu = pytest.mark.gpu


def test_a_host_copy_of_a_host_tensor_is_the_tensor():
    t = torch.arange(6)
    assert HostCopy(t).get() is t


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_tables_built_on_the_host_arrive_whole_in_one_copy(device):
    rng = np.random.default_rng(0)
    tables = (rng.integers(-5, 1 << 40, (3, 7)), rng.random((5, 3)) > 0.5, rng.integers(0, 9, (2, 2, 3)),
              np.arange(5, dtype=np.int32), rng.random(1) > 0.5)  # odd byte counts between int64 tables
    moved = tables_to_device(device, *tables)
    for host, there in zip(tables, moved):
        assert there.device.type == device and tuple(there.shape) == host.shape
        assert torch.equal(there.cpu(), torch.from_numpy(host))


@gpu
def test_a_host_copy_waits_for_its_copy_and_not_for_the_work_queued_after_it():
    t = torch.arange(12, device="cuda").view(3, 4) * 7
    copy = HostCopy(t)
    torch.cuda._sleep(4_000_000_000)  # ~2 s of the GPU's clock, queued behind the copy
    assert torch.equal(copy.get(), torch.arange(12).view(3, 4) * 7)
    # the sleep still runs: get() waited for the copy's event, not for the stream
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
