"""Answers written straight to a plain socket, so that no transport holds pooled memory.

A transport keeps what its socket did not take. asyncio's before Python 3.12 copies that
into a bytearray; uvloop's and 3.12's keep the views they were handed, and with them the
pooled buffer an answer's tensor bytes live in, until they let them go: after `abort()` a
loop turn or more later (uvloop frees a write request in its callback once the handle has
closed). An unread answer dropped to make room in a full pool (network.PoolRelief) then
freed nothing in time and the request it was dropped for was refused: on uvloop,
`test_unread_answers_give_way_when_the_pool_is_full` of tests/e2e/test_http_client.py and of
test_grpc_wire.py failed.

So on a plain socket, while its transport holds nothing, we send with os.writev on the
socket's descriptor (what a transport does first itself), vectored, and hand the transport
only what the socket did not take: as the views to a transport that copies them anyway,
as one joined copy to one that would keep them. Either way that rest is copied once, and
`send` says how many bytes, for the copy ledger. An error is left for the transport to
meet on its own write, as it would have met it on ours.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

__all__ = ["SocketSender", "copies_what_it_keeps"]

_IOV_MAX = 1024  # buffers one writev takes (Linux's IOV_MAX)


def copies_what_it_keeps(transport: asyncio.BaseTransport) -> bool:
    """Whether `transport` copies what it cannot send at once (asyncio before 3.12). The
    same change (CPython gh-91166) made 3.12's selector transport keep views and send a
    writelines vectored; before it, writelines was WriteTransport's, which joins."""
    return getattr(type(transport), "writelines", None) is asyncio.WriteTransport.writelines


class SocketSender:
    """Writes one connection's buffers to its socket (module docstring)."""

    __slots__ = ("_fd", "_transport", "_copies")

    def __init__(self, fd: int, transport: asyncio.Transport) -> None:
        self._fd = fd
        self._transport = transport
        self._copies = copies_what_it_keeps(transport)

    @classmethod
    def for_transport(cls, transport: asyncio.Transport) -> SocketSender | None:
        """A sender for a plain socket's transport; None over TLS (the ssl layer encrypts
        into its own buffers) or without a socket or os.writev."""
        if transport.get_extra_info("ssl_object") is not None or not hasattr(os, "writev"):
            return None
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        return cls(sock.fileno(), transport)

    def send(self, buffers: list[Any]) -> int:
        """Write `buffers` (bytes, or views of format "B": a len is a size) in order; the
        bytes the transport was handed to hold, copied. Changes `buffers`."""
        transport = self._transport
        index = 0
        if not transport.get_write_buffer_size():
            while index < len(buffers):
                offered = min(len(buffers), index + _IOV_MAX)
                chunk = buffers[index:offered]
                try:
                    sent = os.writev(self._fd, chunk)
                except OSError:  # full (EAGAIN), or broken: the transport will say
                    break
                if sent == sum(map(len, chunk)):  # all of it (the usual case: no walk)
                    index = offered
                    continue
                while index < offered and sent >= len(buffers[index]):
                    sent -= len(buffers[index])
                    index += 1
                if index < offered:  # the socket took less than it was offered: full
                    if sent:
                        buffers[index] = memoryview(buffers[index])[sent:]
                    break
        if index == len(buffers):
            return 0
        rest = buffers[index:]
        held = sum(map(len, rest))
        if self._copies:
            for part in rest:
                transport.write(part)
        else:
            transport.write(b"".join(rest))
        return held
