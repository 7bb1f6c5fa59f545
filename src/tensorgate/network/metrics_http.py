"""The metrics port: `GET /metrics` in Prometheus text (HEAD: its headers); anything else
is 404. One response per connection (Prometheus scrapes are rare and small). Bounded as the
client ports are: a connection whose request has not arrived within the read timeout is
closed, at most _MAX_OPEN are open at once (past that a new one is closed at once), and
stopping closes those open (from Python 3.12 the listener's close waits for them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

__all__ = ["MetricsFrontEnd"]

_MAX_REQUEST = 8192
_MAX_OPEN = 64  # metrics connections open at once


class _Scrape(asyncio.Protocol):
    def __init__(self, front: MetricsFrontEnd) -> None:
        self._front = front
        self._data = b""
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # cast, not assert isinstance: uvloop's transports are not asyncio.Transport's
        # subclasses (the assert refused every scrape under --loop uvloop)
        self._transport = transport = cast(asyncio.Transport, transport)
        if len(self._front.open) >= _MAX_OPEN:
            transport.close()
            return
        self._front.open.add(self)
        # abort, not close: a close waits for a client that does not read its answer
        self._timer = asyncio.get_running_loop().call_later(self._front.read_timeout_s,
                                                            transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        self._front.open.discard(self)
        if self._timer is not None:
            self._timer.cancel()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._data += data
        if b"\r\n\r\n" not in self._data:
            if len(self._data) > _MAX_REQUEST:
                self._transport.close()
            return
        line = self._data.split(b"\r\n", 1)[0].split()
        head = len(line) >= 2 and line[0] == b"HEAD"  # GET's answer without its body
        if len(line) >= 2 and line[0] in (b"GET", b"HEAD") and \
                line[1].split(b"?")[0] == b"/metrics":
            body = self._front.render().encode()
            status, kind = b"200 OK", b"text/plain; version=0.0.4; charset=utf-8"
        else:
            body, status, kind = b"not found: use GET /metrics\n", b"404 Not Found", b"text/plain"
        self._transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind +
                              b"\r\nContent-Length: " + str(len(body)).encode() +
                              b"\r\nConnection: close\r\n\r\n" + (b"" if head else body))
        self._transport.close()


class MetricsFrontEnd:
    def __init__(self, render: Callable[[], str], read_timeout_s: float = 30.0) -> None:
        self.render = render
        self.read_timeout_s = read_timeout_s
        self.open: set[_Scrape] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Scrape(self), host, port,
                                                reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for scrape in list(self.open):
                scrape.close()
            await self._server.wait_closed()
