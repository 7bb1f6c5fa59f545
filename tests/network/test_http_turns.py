"""An HTTP/1.1 connection lets the event loop turn every 16 requests it answers in a row:
answered inline, the requests a client pipelined ran one after another, up to ~190 a turn
on uvloop (libuv reads a busy socket 32 times a turn), while every other connection waited
(bench/flood_bench.py, pipeline: another client's health check 2 ms at P50). Shut down
between two such turns, the connection closes lingering: closed at once with the client's
requests unread, it was reset, and the client lost the answers it had been given.

The front end runs in this test's own uvloop loop, so that a task there can count, at each
turn of the loop, how many of a pipelining client's requests the server has answered."""

from __future__ import annotations

import asyncio
import pathlib
import socket
import threading

import pytest

from tensorgate.dataplane import DataPlane
from tensorgate.network import http_answers
from tests.network.served_http import served_http

uvloop = pytest.importorskip("uvloop")

READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
READY_BODY = b'{"ready":true}'


class _CountingPlane(DataPlane):
    """The data plane, counting the readiness checks it answers."""

    answered = 0

    def ready(self) -> bool:
        self.answered += 1
        return super().ready()


def _pipeline(port: int, count: int, answers: list[bytes]) -> None:
    """`count` readiness checks in one write, then read until every answer has come."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(READY * count)
        got = b""
        while got.count(b"HTTP/1.1 200") < count:
            data = sock.recv(1 << 16)
            if not data:
                break
            got += data
        answers.append(got)


def _whole(answers: bytes) -> int:
    """How many whole readiness answers `answers` holds, all of it being such answers."""
    parts = answers.split(b"HTTP/1.1 200")
    assert parts[0] == b"" and all(part.endswith(b"\r\n\r\n" + READY_BODY)
                                   for part in parts[1:]), answers[-200:]
    return len(parts) - 1


async def _answered_by_turn(tmp_path: pathlib.Path, count: int) -> tuple[list[int], bytes]:
    """The checks answered in each turn of the loop while a client pipelines `count`."""
    async with served_http(tmp_path, _CountingPlane) as (plane, _, port):
        answers: list[bytes] = []
        client = threading.Thread(target=_pipeline, args=(port, count, answers))
        client.start()
        seen, by_turn = 0, []
        for _ in range(100_000):  # turns; bounded, the client's own timeout is 30 s
            await asyncio.sleep(0)
            if plane.answered > seen:
                by_turn.append(plane.answered - seen)
                seen = plane.answered
            if not client.is_alive():
                break
        client.join(timeout=30)
        return by_turn, answers[0] if answers else b""


def test_a_pipelining_client_gets_16_requests_answered_a_turn(tmp_path: pathlib.Path) -> None:
    count = 2000
    by_turn, answers = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
        _answered_by_turn(tmp_path, count))
    assert _whole(answers) == count  # all answered, in one connection
    assert sum(by_turn) == count
    assert max(by_turn) <= http_answers._REQUESTS_IN_A_ROW == 16, by_turn


def test_a_pipelining_client_closed_between_turns_gets_whole_answers_then_eof(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """Shutting down while a connection waits for its next turn: the answers already given
    come whole, then the end of the connection (not a reset); no request is read after the
    connection began to close; nothing is logged as an error."""
    async def scenario() -> tuple[bytes, int, int]:
        async with served_http(tmp_path, _CountingPlane) as (plane, front, port):
            answers: list[bytes] = []
            client = threading.Thread(target=_pipeline, args=(port, 2000, answers))
            client.start()
            for _ in range(100_000):  # turns, until some have been answered
                await asyncio.sleep(0)
                if plane.answered >= 100:
                    break
            front.stop_accepting()
            for connection in list(front.connections):
                connection.close_when_idle()
            at_close = plane.answered
            for _ in range(100):
                await asyncio.sleep(0)
            after = plane.answered
            client.join(timeout=30)
            return answers[0] if answers else b"", at_close, after

    answers, at_close, after = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
        scenario())
    assert 100 <= at_close < 2000 and after == at_close
    assert _whole(answers) == at_close  # (a reset: the client's recv raised, no answers)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
