"""compare_wire.sequential_exchanges with a call between the exchanges (compare.PAIRED):
one timed after each measured exchange, and its CPU is not the client's."""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import network_floor  # noqa: E402
from compare_servers import free_port  # noqa: E402
from compare_wire import OIP_BINARY, raw_request, sequential_exchanges  # noqa: E402


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
