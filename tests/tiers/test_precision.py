"""Faithful mode (`--act-quant`) as a serving option: the flag reaches the model every worker
loads, and workers that compute caches differently refuse to share them (the transfer's
compatibility check), so a mixed prefill/decode pair recomputes rather than mixing bytes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from dsflash.cli import build_parser
from dsflash.commands import worker_settings
from dsflash.kvcache.transport import IncompatiblePeer
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.runner import greedy
from dsflash.serving.worker import WorkerRuntime, WorkerSettings

from .cluster import Worker, generate


def test_the_flag_reaches_the_settings():
    for role in ("prefill", "decode"):
        plain = build_parser().parse_args([role, "--checkpoint", "ckpt"])
        faithful = build_parser().parse_args([role, "--checkpoint", "ckpt", "--act-quant"])
        assert not worker_settings(plain, role).act_quant and worker_settings(faithful, role).act_quant
    assert build_parser().parse_args(["serve", "--act-quant"]).act_quant


def _runtime(checkpoint, role: str, act_quant: bool) -> WorkerRuntime:
    """A worker's runtime as it opens: the model from its settings, pool and transports."""
    settings = WorkerSettings(role=role, checkpoint=str(checkpoint), host="127.0.0.1", kv_transports=("tcp",),
                              act_quant=act_quant, pool_bytes=32 << 20, max_requests=2)
    runtime = WorkerRuntime(settings)
    runtime.open("all")
    return runtime


def test_workers_share_caches_only_in_the_same_precision(tiny_checkpoint):
    async def check():
        prefill = _runtime(tiny_checkpoint, "prefill", act_quant=True)
        exact, faithful = (_runtime(tiny_checkpoint, "decode", act_quant=a) for a in (False, True))
        try:
            assert prefill.model.ops.act_quant and not exact.model.ops.act_quant  # loaded as the settings say
            with pytest.raises(IncompatiblePeer):
                await exact.transfer.connect(prefill.transfer.endpoint(), timeout_s=5.0)
            peer = await faithful.transfer.connect(prefill.transfer.endpoint(), timeout_s=5.0)
            peer.close()
        finally:
            for runtime in (prefill, exact, faithful):
                await runtime.close()

    asyncio.run(check())


@pytest.mark.slow
def test_served_faithful_mode_matches_the_in_process_model_and_a_mixed_pair_recomputes(tiny_checkpoint, tiny_model,
                                                                                       tmp_path):
    """Real processes: a faithful prefill worker hands its caches to a faithful decode worker,
    whose tokens are the faithful in-process model's; an exact decode worker asking the same
    prefill worker is refused the transfer and recomputes, with the exact model's tokens."""
    prefill = Worker("prefill", tiny_checkpoint, tmp_path, extra=["--act-quant"])
    faithful = Worker("decode", tiny_checkpoint, tmp_path, extra=["--act-quant", "--prefill", prefill.address])
    exact = Worker("decode", tiny_checkpoint, tmp_path, extra=["--prefill", prefill.address])
    try:
        for worker in (prefill, faithful, exact):
            worker.wait_ready()
        prompt = [(11 * i + 5) % 1000 + 7 for i in range(30)]
        out, finished = generate(faithful.address, prompt, ignore_eos=True, temperature=0)
        assert finished.stats.prefill_worker == prefill.address and finished.stats.cache_source == "none"
        model = DeepseekV41.from_checkpoint(tiny_checkpoint, act_quant=True)
        with torch.inference_mode():
            assert out == greedy(model, torch.tensor(prompt), 8)
        out, finished = generate(exact.address, prompt, ignore_eos=True, temperature=0)
        assert finished.stats.cache_source == "recompute" and finished.usage.computed_tokens == len(prompt)
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
        assert exact.status().handoff_failures_total == 1
    finally:
        for worker in (prefill, faithful, exact):
            worker.stop()
