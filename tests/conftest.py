"""Shared fixtures: the golden reference data, random checkpoints, device markers.

The golden data lives outside the repository: $DSFLASH_GOLDEN, else ../shared/golden next
to the clone. Tests that need it skip with that reason when neither exists.
"""

from __future__ import annotations

import os
import pathlib
import platform

# The interpreter's tl.dot is numpy's matmul. OpenBLAS's AVX-512 kernels (SkylakeX, on a Zen 4
# EPYC too) round a row's sum differently by the rows beside it, so tests that ask two paths
# for the same bits failed there (sixty-second session: 4, bits no GPU run differs on); its
# AVX2 kernels gave the same bits. Set before torch imports numpy, which loads OpenBLAS.
if platform.machine() in ("x86_64", "AMD64"):
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton kernels run on the CPU interpreter (set before anything imports triton).
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.support.interpreter_speed import patch_once_per_launch, skip_overflow_checks

    patch_once_per_launch()
    skip_overflow_checks()

REPO = pathlib.Path(__file__).resolve().parents[1]


def golden_root() -> pathlib.Path | None:
    env = os.environ.get("DSFLASH_GOLDEN")
    for candidate in ([pathlib.Path(env)] if env else []) + [REPO.parent / "shared" / "golden"]:
        if (candidate / "v41-tiny-a" / "golden.safetensors").exists():
            return candidate
    return None


@pytest.fixture(scope="session")
def golden_dir() -> pathlib.Path:
    root = golden_root()
    if root is None:
        pytest.skip("golden data not found: set DSFLASH_GOLDEN or place shared/golden beside the clone")
    return root / "v41-tiny-a"


@pytest.fixture(scope="session")
def golden(golden_dir):
    from safetensors.torch import load_file

    tensors = load_file(str(golden_dir / "golden.safetensors"))
    prompts = sorted({k.split(".")[0] for k in tensors})
    return [{key.split(".", 1)[1]: tensors[key] for key in tensors if key.startswith(p + ".")} for p in prompts]


@pytest.fixture(scope="session")
def golden_model(golden_dir):
    from dsflash.model.deepseek_v41 import DeepseekV41

    return DeepseekV41.from_checkpoint(golden_dir)


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server on a free loopback port (skips when the binary is absent)."""
    from tests.support.redis_server import start_redis

    server = start_redis(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> pathlib.Path:
    from dsflash.model.checkpoint_writer import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=7)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    from dsflash.model.deepseek_v41 import DeepseekV41

    return DeepseekV41.from_checkpoint(tiny_checkpoint)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
