"""Front ends on the event loop (HTTP/1.1, gRPC on our HTTP/2, metrics) and what they
share; loop selection. Never imports torch."""

import asyncio
import logging
import time

__all__ = ["ConnectionBudget", "RefusedConnection", "stalled_message"]

REFUSED_LINGER_S = 1.0  # a refused connection is closed this long after its answer at most
REFUSAL_LOG_PERIOD_S = 10.0  # refusals are logged at most this often

log = logging.getLogger("tensorgate.network")


class ConnectionBudget:
    """Client connections open at once across the HTTP and gRPC front ends
    (--max-connections). Past the limit a new connection is answered at once (HTTP 503, gRPC
    GOAWAY) and closed, so that file descriptors and per-connection memory stay bounded
    whatever clients do. Admitted when the connection is accepted, released when it closes."""

    __slots__ = ("limit", "open", "refused", "_logged")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # 0: no limit
        self.open = 0
        self.refused = 0
        self._logged = -REFUSAL_LOG_PERIOD_S

    def admit(self) -> bool:
        if self.limit and self.open >= self.limit:
            self.refused += 1
            now = time.monotonic()
            if now - self._logged >= REFUSAL_LOG_PERIOD_S:
                self._logged = now
                log.warning("refusing new connections: %d open, the limit (--max-connections); "
                            "%d refused so far", self.open, self.refused)
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

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
        assert isinstance(transport, asyncio.Transport)
        transport.write(self._answer)
        if transport.can_write_eof():
            transport.write_eof()
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
