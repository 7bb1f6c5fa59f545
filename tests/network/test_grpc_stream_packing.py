"""A compressed stream's responses go in the order they were finished: a large one
compressed a slice a turn is not overtaken by a small one finished after it, and one given
up (its request cancelled) does not hold up those after it."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from tensorgate.network.grpc_messages import CallHeaders
from tensorgate.network.grpc_stream import StreamCall
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.pool import BufferPool

_LARGE = bytes(range(256)) * 4096  # 1 MiB: four slices of 256 KiB, a turn each


class _Connection:
    """What StreamCall writes through: each message sent, in order."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def begin_response(self, stream: Any, headers: bytes) -> None:
        pass

    def send(self, stream: Any, parts: list[Any], trailers: bytes | None = None) -> None:
        if parts:
            self.messages.append(b"".join(bytes(part) for part in parts))


class _Stream:
    pending_bytes = 0


def _call(connection: _Connection) -> StreamCall:
    return StreamCall(None, BufferPool(limit_bytes=1 << 20), 1 << 20,  # type: ignore[arg-type]
                      connection, _Stream(),  # type: ignore[arg-type]
                      CallHeaders("/inference.GRPCInferenceService/ModelStreamInfer",
                                  "identity", None), set(), None, "deflate")


def _body(message: bytes) -> bytes:
    assert message[0] == 1 and int.from_bytes(message[1:5], "big") == len(message) - 5
    return zlib.decompress(message[5:])


def test_a_small_response_waits_for_a_large_one_finished_before_it() -> None:
    async def scenario() -> None:
        connection = _Connection()
        call = _call(connection)
        large = asyncio.ensure_future(call._send([_LARGE], CopyLedger()))
        await asyncio.sleep(0)  # its first slice compressed
        small = asyncio.ensure_future(call._send([b"small"], CopyLedger()))
        await asyncio.gather(large, small)
        assert [_body(m) for m in connection.messages] == [_LARGE, b"small"]
    asyncio.run(scenario())


def test_a_response_given_up_does_not_hold_up_the_next() -> None:
    async def scenario() -> None:
        connection = _Connection()
        call = _call(connection)
        large = asyncio.ensure_future(call._send([_LARGE], CopyLedger()))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(call._send([b"small"], CopyLedger()))
        await asyncio.sleep(0)
        large.cancel()
        await asyncio.wait_for(small, 5.0)
        assert [_body(m) for m in connection.messages] == [b"small"]
    asyncio.run(scenario())
