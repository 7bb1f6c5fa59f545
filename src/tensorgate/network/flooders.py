"""Client addresses whose connections were lately ended for flooding (HTTP/2
ENHANCE_YOUR_CALM), so that their next connections start on probation.

A connection's own bounds end a flood (http2_base: wasted streams, frames that carry
nothing, CONTINUATIONs); a client that connects again each time is fresh to those bounds,
and rapid reset done so cost every other connection eight times its P50 on the 2-core
machine (696 µs against 81 a health check; four such clients at once 2,588:
bench/flood_bench.py `reset-again`). The connections open from an address that flooded
within PROBATION_S share one `Probation`: together they are parsed an eighth of one
connection's frames a turn of the loop (http2_base.PROBATION_FRAMES: one new stream a turn,
however many connections the address opens), each until it has earned its streams.
Nothing is refused, as many clients may share an address (NAT, a proxy, a sidecar on
127.0.0.1) and the one beside a flooder keeps its calls, at the shared pace at first.

Addresses are keyed by host, an IPv6 host by its /64 (what one client is usually given), an
IPv4 address mapped into IPv6 as the IPv4 address; at most MAX_ADDRESSES are remembered,
the longest quiet forgotten first, so a flood from many addresses costs bounded memory."""

from __future__ import annotations

import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_ADDRESSES", "PROBATION_S", "FloodedAddresses", "Probation", "address_key"]

PROBATION_S = 60.0  # an address stays suspect this long after its last flood ended
MAX_ADDRESSES = 10_000  # remembered at most (1.6 MB), the longest quiet forgotten first
_IPV4_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:a.b.c.d


def address_key(peer: Any) -> str | None:
    """The client a socket's peer name stands for: its host (IPv6: the /64 it is in; an
    IPv4-mapped IPv6 address: the IPv4 address); None where there is none (a Unix socket,
    a transport that knows none)."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None
    host = peer[0]
    if ":" not in host:
        return host
    try:  # (socket's, not ipaddress's: 1 µs against 8 a connection)
        packed = socket.inet_pton(socket.AF_INET6, host.partition("%")[0])
    except OSError:
        return host
    if packed[:12] == _IPV4_MAPPED:
        return socket.inet_ntop(socket.AF_INET, packed[12:])
    return socket.inet_ntop(socket.AF_INET6, packed[:8] + bytes(8)) + "/64"


class Probation:
    """What the connections open on probation from one address share: how many they are."""

    __slots__ = ("address", "open", "_of")

    def __init__(self, address: str, of: dict[str, Probation]) -> None:
        self.address = address
        self.open = 0
        self._of = of

    def leave(self) -> None:
        """One of its connections closed, or earned its streams."""
        self.open -= 1
        if self.open <= 0:
            self._of.pop(self.address, None)


class FloodedAddresses:
    """Which addresses ended a connection for flooding within the last `period_s`, and the
    probation their open connections share."""

    __slots__ = ("period_s", "capacity", "_clock", "_last", "_probations")

    def __init__(self, period_s: float = PROBATION_S, capacity: int = MAX_ADDRESSES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self.capacity = capacity
        self._clock = clock
        self._last: OrderedDict[str, float] = OrderedDict()  # address: its last flood
        self._probations: dict[str, Probation] = {}  # (those with connections open)

    def flooded(self, address: str | None) -> None:
        """A connection from `address` was ended for flooding."""
        if address is None or self.period_s <= 0:
            return
        self._last[address] = self._clock()
        self._last.move_to_end(address)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)

    def suspect(self, address: str | None) -> bool:
        """Whether `address` ended a connection for flooding within `period_s`."""
        if address is None or not self._last:
            return False
        at = self._last.get(address)
        if at is None:
            return False
        if self._clock() - at < self.period_s:
            return True
        del self._last[address]
        return False

    def probation(self, address: str | None) -> Probation | None:
        """A new connection from `address` joins its probation (None: not suspect)."""
        if not self.suspect(address):
            return None
        assert address is not None
        probation = self._probations.get(address)
        if probation is None:
            probation = self._probations[address] = Probation(address, self._probations)
        probation.open += 1
        return probation

    def __len__(self) -> int:
        """Addresses remembered now (the quiet ones forgotten first)."""
        self._forget_quiet()
        return len(self._last)

    def _forget_quiet(self) -> None:
        now = self._clock()
        while self._last:
            address, at = next(iter(self._last.items()))
            if now - at < self.period_s:
                return
            del self._last[address]
