"""bench/compare.py's concurrency points: each is measured after an unmeasured warm-up at
its own connection count, which is kept beside it and never pooled into it."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import compare  # noqa: E402
from compare_wire import NothingAnswered  # noqa: E402


def _point(connections: int, seconds: float, p99_us: int) -> dict[str, Any]:
    return {"connections": connections, "seconds": seconds, "qps": 100.0 * connections,
            "p50_us": p99_us // 2, "p99_us": p99_us, "max_us": p99_us * 2, "requests": 100,
            "bad": 0, "errors": 0, "client_cpu_share": 0.1}


def test_each_point_follows_a_warm_up_at_its_own_connections() -> None:
    calls: list[tuple[int, float]] = []

    def measure(connections: int, seconds: float) -> dict[str, Any]:
        calls.append((connections, seconds))
        first = len(calls) % 2 == 1  # the warm-up: slow, as a fresh concurrency is
        return _point(connections, seconds, 118_000 if first else 25_000)

    found = compare.points("identity", "", compare.FULL, measure)
    # FULL: 3 s identity points, a third of that (1 s) before each
    assert calls == [(1, 1.0), (1, 3.0), (4, 1.0), (4, 3.0), (16, 1.0), (16, 3.0),
                     (64, 1.0), (64, 3.0)]
    assert [p["p99_us"] for p in found] == [25_000] * 4
    assert all(p["warmup"]["p99_us"] == 118_000 and p["warmup"]["seconds"] == 1.0
               for p in found)


def test_a_long_point_warms_for_a_third_of_it_and_a_silent_warm_up_is_no_error() -> None:
    """resnet50 at 64 connections lasts 64 × 0.16 s; a warm-up in which nothing finished
    is recorded as such, the point is still measured."""
    calls: list[tuple[int, float]] = []

    def measure(connections: int, seconds: float) -> dict[str, Any]:
        calls.append((connections, seconds))
        if len(calls) == 1:
            raise NothingAnswered("no request finished")
        return _point(connections, seconds, 2_000_000)

    plan = dataclasses.replace(compare.FULL, levels={**compare.FULL.levels, "resnet50": (64,)})
    found = compare.points("resnet50", "", plan, measure)
    assert calls == [(64, pytest.approx(64 * 0.16 / 3)), (64, pytest.approx(64 * 0.16))]
    assert found[0]["warmup"] is None and found[0]["p99_us"] == 2_000_000


def test_no_warm_up_where_the_plan_has_none() -> None:
    calls: list[float] = []
    plan = dataclasses.replace(compare.QUICK, warm_share=0.0)
    compare.points("identity", "", plan,
                   lambda c, seconds: calls.append(seconds) or _point(c, seconds, 1000))
    assert calls == [1.0, 1.0]  # QUICK: two 1 s points, nothing before them
