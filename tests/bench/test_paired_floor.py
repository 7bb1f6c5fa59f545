"""The floors measured in the same seconds as the servers: compare_wire.sequential_exchanges
with a call after each exchange (compare.PAIRED: one timed after each measured exchange, its
CPU not the client's), and compare_wire.interleaved_exchanges (compare.interleaved)."""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import network_floor  # noqa: E402
from compare_servers import free_port  # noqa: E402
from compare_wire import (OIP_BINARY, interleaved_exchanges, raw_request,  # noqa: E402
                          sequential_exchanges)


def test_the_call_between_is_timed_after_each_exchange_and_its_cpu_is_not_the_clients(
        ) -> None:
    shapes = {"small": (16,)}
    port = free_port()
    answerer = network_floor.start(port, shapes)
    try:
        path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", "small",
                                               np.zeros((1, 16), np.float32))
        raw = raw_request(port, path, headers, body)
        calls = []

        def spin() -> None:  # 3 ms of this process's CPU
            calls.append(None)
            end = time.process_time() + 0.003
            while time.process_time() < end:
                pass

        out = sequential_exchanges(port, raw, 25, 3, OIP_BINARY.min_body(16), "small", spin)
        plain = sequential_exchanges(port, raw, 20, 3, OIP_BINARY.min_body(16), "small")
    finally:
        answerer.kill()
        answerer.wait(timeout=10)
    assert len(calls) == 25  # none in the warm-up
    assert len(out["us"]) == len(out["paired_us"]) == 25
    assert min(out["paired_us"]) >= 3000
    assert out["client_cpu_us"] < 3000  # the spin's CPU is left out
    assert "paired_us" not in plain


def test_interleaved_exchanges_time_each_target_and_the_floor_every_round_and_check_answers(
        ) -> None:
    """compare.interleaved's client: every target and the floor once a round, n rounds after
    the warm-up; an answer shorter than its target's smallest fails, naming the target."""
    shapes = {"small": (16,)}
    ports = [free_port(), free_port()]
    answerers = [network_floor.start(port, shapes) for port in ports]
    try:
        path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", "small",
                                               np.zeros((1, 16), np.float32))
        targets = {name: (port, raw_request(port, path, headers, body), OIP_BINARY.min_body(16))
                   for name, port in zip(("one", "two"), ports)}
        calls = []
        found = interleaved_exchanges(targets, 30, 4, lambda: calls.append(None))
        assert sorted(found) == ["floor", "one", "two"]
        assert all(len(us) == 30 and min(us) > 0 for us in found.values())
        assert len(calls) == 4 + 30
        port, raw, _ = targets["two"]
        targets["two"] = (port, raw, 1 << 20)  # more than any answer of 16 floats
        with pytest.raises(RuntimeError, match="two: bad answer 200"):
            interleaved_exchanges(targets, 5, 0)
    finally:
        for answerer in answerers:
            answerer.kill()
            answerer.wait(timeout=10)
