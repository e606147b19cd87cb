"""Each rank's kernel warm-ups (serving/kernel_warm_ups.py): what a tier warms, and that a
worker's other ranks run them too (without, a multi-GPU worker's followers met the indexer's
and the route plan's kernels first inside a user's long prompt)."""

from __future__ import annotations

import contextlib
import inspect
from types import SimpleNamespace

import pytest
import torch

from dsflash.serving import kernel_warm_ups, ranks


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(kernel_warm_ups.indexer, "warm_up", lambda device, cfg, layout, faithful: seen.append(
        ("indexer", device, layout, faithful)))
    monkeypatch.setattr(kernel_warm_ups.moe, "warm_up_launches", lambda ops, cfg: ["plan-a", "plan-b"])
    monkeypatch.setattr(kernel_warm_ups, "launch_all", lambda device, launches: seen.append(("launch_all", device,
                                                                                            launches)))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())  # no GPU here
    return seen


def _model(device: str, act_quant: bool = True):
    return SimpleNamespace(device=torch.device(device), config=object(), ops=SimpleNamespace(act_quant=act_quant))


def test_a_prefill_rank_warms_the_indexer_and_every_route_plan(calls):
    model = _model("cuda:1")
    kernel_warm_ups.warm_up_kernels(model, "layout", "prefill")
    assert calls == [("indexer", model.device, "layout", True), ("launch_all", model.device, ["plan-a", "plan-b"])]


def test_a_decode_rank_warms_the_indexer_only(calls):
    model = _model("cuda:0", act_quant=False)
    kernel_warm_ups.warm_up_kernels(model, "layout", "decode")
    assert calls == [("indexer", model.device, "layout", False)]


def test_nothing_runs_on_a_cpu_and_an_unknown_tier_is_refused(calls):
    kernel_warm_ups.warm_up_kernels(_model("cpu"), "layout", "prefill")
    assert calls == []
    with pytest.raises(AssertionError):
        kernel_warm_ups.warm_up_kernels(_model("cuda:0"), "layout", "gateway")


def test_the_other_ranks_and_both_tiers_call_the_same_warm_ups():
    """A rank's main, the prefill worker's and the decode worker's start all take this one function."""
    from dsflash.decode_worker import server as decode_server
    from dsflash.prefill_worker import server as prefill_server

    assert "warm_up_kernels(model, layout, tier)" in inspect.getsource(ranks._rank_main)
    assert 'warm_up_kernels(model, self.runtime.pool.layout, "prefill")' in inspect.getsource(prefill_server)
    assert 'warm_up_kernels(model, self.runtime.pool.layout, "decode")' in inspect.getsource(decode_server)
