"""Faithful mode (`--act-quant`) as a serving option: the flag reaches the model every worker
loads, and workers that compute caches differently refuse to share them (the transfer's
compatibility check), so a mixed prefill/decode pair recomputes rather than mixing bytes."""

from __future__ import annotations

import asyncio

import pytest

from dsflash.cli import build_parser
from dsflash.commands import worker_settings
from dsflash.kvcache.transport import IncompatiblePeer
from dsflash.serving.worker import WorkerRuntime, WorkerSettings


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
