"""Host <-> device copies that leave the GPU's queue alone (model/device.py)."""

from __future__ import annotations

import pytest
import torch

from dsflash.model.device import HostCopy

gpu = pytest.mark.gpu


def test_a_host_copy_of_a_host_tensor_is_the_tensor():
    t = torch.arange(6)
    assert HostCopy(t).get() is t


@gpu
def test_a_host_copy_waits_for_its_copy_and_not_for_the_work_queued_after_it():
    t = torch.arange(12, device="cuda").view(3, 4) * 7
    copy = HostCopy(t)
    torch.cuda._sleep(4_000_000_000)  # ~2 s of the GPU's clock, queued behind the copy
    assert torch.equal(copy.get(), torch.arange(12).view(3, 4) * 7)
    # the sleep still runs: get() waited for the copy's event, not for the stream
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
