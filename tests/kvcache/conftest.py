"""Fixtures for the kvcache tests (the `redis_server` fixture lives in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"
