"""Shared fixtures: a private buffer pool per test, so pool counters start from zero."""

from __future__ import annotations

import pytest

from tensorgate.tensor import BufferPool


@pytest.fixture
def pool() -> BufferPool:
    return BufferPool(limit_bytes=64 << 20)
