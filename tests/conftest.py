"""Shared fixtures: a private buffer pool per test, so pool counters start from zero; the
garbage collector off for a test (tests/garbage.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tensorgate.tensor import BufferPool


@pytest.fixture
def pool() -> BufferPool:
    return BufferPool(limit_bytes=64 << 20)


@pytest.fixture
def collector_off() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
