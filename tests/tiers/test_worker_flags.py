"""Flags checked where the configuration is read (dsflash/cli.py _add, dsflash/commands.py worker_settings):
a bad value stops the command with its reason, before anything loads."""

from __future__ import annotations

import pytest

from dsflash.cli import build_parser
from dsflash.commands import worker_settings
from dsflash.model import deepseek_v41


def _settings(role: str, *flags: str):
    return worker_settings(build_parser().parse_args([role, "--checkpoint", "ckpt", *flags]), role)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_prefill_token_budget_the_kernels_cannot_take_is_refused(role):
    def settings(*flags: str):
        return _settings(role, *flags)

    most = deepseek_v41.MAX_KERNEL_ROWS
    assert settings("--gpus", "0", "--prefill-token-budget", str(most)).prefill_token_budget == most
    assert settings("--prefill-token-budget", str(2 * most)).prefill_token_budget == 2 * most  # CPU: no such limit
    with pytest.raises(SystemExit, match="at most"):
        settings("--gpus", "0", "--prefill-token-budget", str(most + 1))
    with pytest.raises(SystemExit, match="at least 1"):
        settings("--prefill-token-budget", "0")


def test_a_prefill_workers_weight_cache_is_its_flag_in_bytes():
    """--weight-cache-bytes (prefill workers only) reaches WorkerSettings in bytes; 0 by default."""
    assert _settings("prefill").weight_cache_bytes == 0
    assert _settings("prefill", "--weight-cache-bytes", "36GiB").weight_cache_bytes == 36 << 30
    assert _settings("decode").weight_cache_bytes == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["decode", "--checkpoint", "ckpt", "--weight-cache-bytes", "1GiB"])


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_drain_grace_is_a_flag_with_its_environment_twin(role, monkeypatch):
    assert _settings(role).drain_grace_s == 30.0
    assert _settings(role, "--drain-grace-s", "600").drain_grace_s == 600.0
    monkeypatch.setenv("DSFLASH_DRAIN_GRACE_S", "90")
    assert _settings(role).drain_grace_s == 90.0
    with pytest.raises(SystemExit, match="drain-grace-s"):
        _settings(role, "--drain-grace-s", "-1")


def test_an_environment_twin_outside_a_flags_choices_is_refused(monkeypatch):
    """argparse checks choices on the command line only: a twin's value is checked by _add."""
    monkeypatch.setenv("DSFLASH_REASONING_FIELD", "reasoning")
    assert build_parser().parse_args(["gateway"]).reasoning_field == "reasoning"
    monkeypatch.setenv("DSFLASH_REASONING_FIELD", "Reasoning_Content")
    with pytest.raises(SystemExit, match="DSFLASH_REASONING_FIELD='Reasoning_Content': must be one of"):
        build_parser()
