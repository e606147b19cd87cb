"""Where a worker's KV pool lives (`--kv-pool`): CPU workers keep the transfer segments as their
pool, exactly as before; a device pool is only what was asked for, or a GPU model's."""

from __future__ import annotations

import pytest
import torch

from dsflash.cli import build_parser
from dsflash.commands import worker_settings
from dsflash.serving.worker import WorkerSettings, pool_device


def test_a_cpu_worker_keeps_its_pool_in_the_transfer_segments_unless_told():
    cpu = torch.device("cpu")
    assert pool_device("auto", cpu, 1 << 20) is None
    assert pool_device("host", cpu, 1 << 20) is None
    assert pool_device("device", cpu, 1 << 20) == cpu  # a separate copy: tests of the staging
    assert pool_device("host", torch.device("cuda:0"), 1 << 20) is None  # asks nothing of CUDA


def test_the_flag_reaches_the_settings_and_is_checked(monkeypatch):
    args = build_parser().parse_args(["decode", "--checkpoint", "ckpt"])
    assert worker_settings(args, "decode").kv_pool == "auto"
    monkeypatch.setenv("DSFLASH_KV_POOL", "host")
    args = build_parser().parse_args(["prefill", "--checkpoint", "ckpt"])
    assert worker_settings(args, "prefill").kv_pool == "host"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["prefill", "--checkpoint", "ckpt", "--kv-pool", "gpu"])
    with pytest.raises(ValueError, match="kv_pool"):
        WorkerSettings(role="decode", checkpoint="ckpt", kv_pool="gpu")
