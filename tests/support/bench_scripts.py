"""A bench script (bench/*.py, bench/device/*.py) loaded as a module by its path: the scripts
are not a package, and tests check the arithmetic and kernels they hold."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_script(relative: str, name: str | None = None) -> ModuleType:
    """bench/<relative> (e.g. "h200.py", "device/triton_kit.py") executed as a fresh module."""
    path = BENCH / relative
    spec = importlib.util.spec_from_file_location(name or f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
