"""Shared fixtures: a private buffer pool per test, so pool counters start from zero; the
garbage collector off for a test (tests/garbage.py).

Under CI (the environment's CI set, as CI services set it) hypothesis draws the same examples
each run: a run that lands or not must not hang on the draw. Elsewhere it draws anew, and what
a run finds is kept in .hypothesis and tried first next time (f13548c: a quote in a path,
found so); the fuzzers (tools/fuzz_front_ends.py) explore the front ends at length."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import hypothesis
import pytest

hypothesis.settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI", "").lower() not in ("", "0", "false"):
    hypothesis.settings.load_profile("ci")

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
