"""Front ends on the event loop (HTTP/1.1, gRPC on our HTTP/2, metrics) and what they
share; loop selection. Never imports torch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

from tensorgate.errors import PoolExhaustedError
from tensorgate.network.flooders import PROBATION_S, FloodedAddresses, Probation

if TYPE_CHECKING:
    from tensorgate.protocol.steps import Steps
    from tensorgate.tensor.buffer import HostBuffer
    from tensorgate.tensor.pool import BufferPool

__all__ = ["ConnectionBudget", "PoolRelief", "RefusedConnection", "SlowReceiver",
           "arrival_eta", "in_steps", "slow_message", "stalled_message"]

REFUSED_LINGER_S = 1.0  # a refused connection is closed this long after its answer at most
REFUSAL_LOG_PERIOD_S = 10.0  # refusals are logged at most this often
# An answer whose client has taken none of it for this long gives way when the pool is full
# (PoolRelief): its connection is dropped, HTTP/1.1 and HTTP/2 alike.
UNREAD_ANSWER_S = 2.0

log = logging.getLogger("tensorgate.network")


async def in_steps(steps: Steps) -> Any:
    """Run protocol work done in steps (protocol.steps), letting the loop serve others
    between them; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)


class _Paced:
    """Says when a warning a client can repeat at will (a refused or flooding connection) is
    due again: at most every REFUSAL_LOG_PERIOD_S."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at = -REFUSAL_LOG_PERIOD_S

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._at < REFUSAL_LOG_PERIOD_S:
            return False
        self._at = now
        return True


class ConnectionBudget:
    """Client connections open at once across the HTTP and gRPC front ends
    (--max-connections). Past the limit a new connection is answered at once (HTTP 503, gRPC
    GOAWAY) and closed, so that file descriptors and per-connection memory stay bounded
    whatever clients do. Admitted when the connection is accepted, released when it closes.
    It also counts the connections ended for flooding (`flooded`), remembering their
    addresses (network/flooders.py), those opened on probation from such an address
    (`on_probation`), those retired at their maximum age (`retired`) and those closed when a
    keepalive PING went unanswered (`unanswered`), for the metrics."""

    __slots__ = ("limit", "open", "refused", "floods", "probation", "retired", "unanswered",
                 "flooders", "_refusals", "_floods")

    def __init__(self, limit: int = 0, probation_s: float = PROBATION_S) -> None:
        """`probation_s`: how long an address that flooded has its connections start on
        probation (0: never)."""
        self.limit = limit  # 0: no limit
        self.open = 0
        self.refused = 0
        self.floods = 0  # connections ended for flooding
        self.probation = 0  # connections opened from an address that lately flooded
        self.flooders = FloodedAddresses(probation_s)
        self.retired = 0  # gRPC connections sent GOAWAY at their maximum age
        self.unanswered = 0  # gRPC connections closed: a keepalive PING went unanswered
        self._refusals, self._floods = _Paced(), _Paced()  # their warnings

    def admit(self) -> bool:
        if self.limit and self.open >= self.limit:
            self.refused += 1
            if self._refusals.due():
                log.warning("refusing new connections: %d open, the limit (--max-connections); "
                            "%d refused so far", self.open, self.refused)
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def flooded(self, how: str, address: str | None = None) -> None:
        """A connection from `address` (flooders.address_key) is ended for flooding (HTTP/2
        ENHANCE_YOUR_CALM): counted, its address remembered, and logged at most every
        REFUSAL_LOG_PERIOD_S (a client connecting again for each flood ended ~8 connections
        a second, each a log line)."""
        self.floods += 1
        self.flooders.flooded(address)
        if self._floods.due():
            log.warning("ended a connection from %s that floods the server (%s); %d so far%s",
                        address or "a client", how, self.floods,
                        "; its next connections start on probation"
                        if self.flooders.period_s > 0 and address is not None else "")

    def on_probation(self, address: str | None) -> Probation | None:
        """The probation a new connection from `address` joins, if the address ended a
        connection for flooding lately (counted)."""
        probation = self.flooders.probation(address)
        if probation is not None:
            self.probation += 1
        return probation

    def refusal(self) -> str:
        return (f"the server already has {self.open} connections open, its limit "
                f"(--max-connections {self.limit}); reuse a connection or retry later")


class RefusedConnection(asyncio.Protocol):
    """A connection past the budget: `answer` is written at once, then our side is shut
    (FIN) and whatever the client sends is read and dropped until it closes, or for
    REFUSED_LINGER_S at most. Closing at once with the client's request unread would make
    the kernel reset the connection, and the client could lose the answer."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # asyncio's or uvloop's (no subclass)
        transport.write(self._answer)
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # reset by the client already (asyncio's transport raises)
                transport.abort()
                return
        asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the client has read the answer and closed: close our side


def stalled_message(quiet_s: float, limit_s: float) -> str:
    """Why a request whose bytes stopped arriving was answered (the server's
    --read-timeout-s): HTTP 408, gRPC DEADLINE_EXCEEDED."""
    return (f"the request stopped arriving: no bytes for {quiet_s:.1f} s (the server waits "
            f"{limit_s:g} s, --read-timeout-s)")


class SlowReceiver(Protocol):
    """A request body or message being read into a pooled buffer taken whole at its start,
    or an HTTP answer waiting in its pooled views for a client that does not read it."""

    def body_eta(self, now_ns: int) -> float | None:
        """Seconds the rest still needs at the rate it has come so far; None unless it is
        arriving into its buffer, and has been for a second or more."""

    def refuse_slow(self, eta_s: float, limit_s: float) -> int:
        """Answer it (HTTP 408, gRPC DEADLINE_EXCEEDED) and let its buffer go: bytes freed."""


class PoolRelief:
    """When the host buffer pool is full, bodies that arrive too slowly give way. A body's
    buffer is taken whole when it begins (it is read into place), so a few connections that
    each announce --max-request-bytes and send a byte now and then would hold the whole
    pool, and every other request be refused (17 did, with 17 bytes). A front end that
    cannot get a buffer asks `acquire` to: bodies, HTTP and gRPC alike, that would need more
    than `limit_s` (the read timeout) to arrive at their rate so far are refused, longest
    first, until the buffer fits. So are answers, HTTP and gRPC, whose clients have read
    none of them for UNREAD_ANSWER_S (their connections dropped): they hold the pool too."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._sources: list[Callable[[], Iterable[SlowReceiver]]] = []

    def add_source(self, receivers: Callable[[], Iterable[SlowReceiver]]) -> None:
        self._sources.append(receivers)

    def acquire(self, pool: BufferPool, nbytes: int, asking: object) -> HostBuffer:
        """`pool.acquire(nbytes)`. When the pool is full, slow bodies and unread answers
        other than `asking`'s (those that would need more than `limit_s` at their rate so
        far) are refused, slowest first, until the buffer fits: the pool itself says when,
        since what a refusal frees (whole pooled buffers) is more than the bytes it held.
        PoolExhaustedError if it never does."""
        try:
            return pool.acquire(nbytes)
        except PoolExhaustedError as error:
            full = error
        freed = refused = 0
        try:
            for eta, receiver in self._slow(asking):
                freed += receiver.refuse_slow(eta, self.limit_s)
                refused += 1
                try:
                    return pool.acquire(nbytes)
                except PoolExhaustedError as error:
                    full = error
            raise full
        finally:
            if refused:
                log.warning("the buffer pool was full: %d slow request bodies or unread "
                            "answers refused to give back %d bytes", refused, freed)

    def _slow(self, asking: object) -> list[tuple[float, SlowReceiver]]:
        """(eta, receiver) of every receiver but `asking` that needs more than `limit_s`,
        slowest first."""
        now = time.monotonic_ns()
        slow = []
        for source in self._sources:
            for receiver in source():
                eta = receiver.body_eta(now) if receiver is not asking else None
                if eta is not None and eta > self.limit_s:
                    slow.append((eta, receiver))
        slow.sort(key=lambda pair: pair[0], reverse=True)
        return slow


def arrival_eta(received: int, length: int, elapsed_s: float) -> float | None:
    """Seconds the rest of a body still needs at the rate it has come so far; None for one
    begun less than a second ago (its rate is not known yet)."""
    if elapsed_s < 1.0:
        return None
    rate = received / elapsed_s
    return (length - received) / rate if rate > 0 else float("inf")


def slow_message(received: int, length: int, elapsed_s: float, eta_s: float,
                 limit_s: float) -> str:
    return (f"the request body arrives too slowly while the server's buffer pool is full: "
            f"{received} of {length} bytes in {elapsed_s:.1f} s, the rest would take "
            f"{eta_s:.0f} s at that rate (bodies that need more than {limit_s:g} s give way)")
