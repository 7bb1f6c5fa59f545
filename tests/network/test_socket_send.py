"""SocketSender over a real socket pair, on asyncio's loop and uvloop's: bytes arrive whole and
in order, and what the socket does not take is handed to the transport as its own copy, so the
sender's buffers are free as soon as it returns (a view kept by uvloop's transport held a
dropped answer's pooled buffer past the moment the pool was asked again)."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tensorgate.network.socket_send import SocketSender, copies_what_it_keeps


def _loops() -> list[Any]:
    loops: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, pytest.param(uvloop.new_event_loop, id="uvloop")]


LOOPS = _loops()


def _run(new_loop: Callable[[], asyncio.AbstractEventLoop],
         test: Callable[[asyncio.Transport, SocketSender, socket.socket],
                        Coroutine[Any, Any, None]]) -> None:
    """`test(transport, sender, peer)` on a new loop: a transport over one end of a socket
    pair with small buffers, its sender, and the other end (blocking, to read with)."""
    async def main() -> None:
        ours, peer = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 14)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14)
        peer.settimeout(10)
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
            asyncio.Protocol, ours)
        try:
            sender = SocketSender.for_transport(transport)  # type: ignore[arg-type]
            assert sender is not None
            await test(transport, sender, peer)  # type: ignore[arg-type]
        finally:
            transport.abort()
            peer.close()
            await asyncio.sleep(0)  # the transport's connection_lost
    loop = new_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), 30))
    finally:
        loop.close()


def _read(sock: socket.socket, nbytes: int) -> bytes:
    data = bytearray()
    while len(data) < nbytes:
        chunk = sock.recv(1 << 20)
        assert chunk, "the peer closed early"
        data += chunk
    return bytes(data)


@pytest.mark.parametrize("new_loop", LOOPS)
def test_what_the_socket_takes_goes_at_once_and_nothing_is_held(new_loop: Any) -> None:
    async def test(transport: asyncio.Transport, sender: SocketSender,
                   peer: socket.socket) -> None:
        parts: list[Any] = [b"head:", memoryview(bytearray(b"abc" * 100)), b":tail"]
        expected = b"".join(bytes(p) for p in parts)
        assert sender.send(parts) == 0  # small: the socket took all of it
        assert transport.get_write_buffer_size() == 0
        assert _read(peer, len(expected)) == expected
    _run(new_loop, test)


@pytest.mark.parametrize("new_loop", LOOPS)
def test_the_rest_is_the_transports_own_copy_and_arrives_in_order(new_loop: Any) -> None:
    async def test(transport: asyncio.Transport, sender: SocketSender,
                   peer: socket.socket) -> None:
        assert copies_what_it_keeps(transport) == (
            sys.version_info < (3, 12) and type(transport).__module__.startswith("asyncio"))
        source = bytearray(bytes(range(256)) * 8192)  # 2 MiB: more than the socket holds
        view = memoryview(source)
        held = sender.send([b"first", view[:1 << 20], view[1 << 20:]])
        del view
        assert 0 < held == transport.get_write_buffer_size()
        # no view of `source` is left anywhere: a bytearray with one exported refuses this
        source.extend(b"!")
        later = [memoryview(b"later")]
        assert sender.send(later) == 5  # the transport holds bytes: behind them, not past
        received = await asyncio.get_running_loop().run_in_executor(  # the loop sends on
            None, _read, peer, 5 + len(source) - 1 + 5)
        assert received == b"first" + bytes(source[:-1]) + b"later"
    _run(new_loop, test)


def test_tls_and_socketless_transports_get_no_sender() -> None:
    with socket.socket() as sock:
        tls = asyncio.Transport({"ssl_object": object(), "socket": sock})
        assert SocketSender.for_transport(tls) is None
    assert SocketSender.for_transport(asyncio.Transport({})) is None


def test_only_asyncios_joining_transport_counts_as_copying() -> None:
    class _Joins(asyncio.Transport):
        pass

    class _Vectored(asyncio.Transport):
        def writelines(self, list_of_data: Any) -> None:
            raise NotImplementedError

    assert copies_what_it_keeps(_Joins())
    assert not copies_what_it_keeps(_Vectored())
