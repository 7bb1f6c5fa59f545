"""Triton's gRPC keepalive settings: the PINGs the server sends a quiet connection, and how
often a client may PING one (gRPC's servers' ping policy).

Each PING a client sends asks for an answer: one that sends them without end costs the server
a write for each, for ever (and its memory, when it does not read the answers: http2_control.py caps
those left unread). As gRPC's servers do, a PING that comes sooner than
`min_ping_interval_s` after the one before, with no data sent or received between them, is a
strike; past `max_ping_strikes` the connection is sent GOAWAY(ENHANCE_YOUR_CALM,
"too_many_pings") and closed (grpcio then doubles its own keepalive time for its next
connection). On a connection with no call open, unless idle PINGs are permitted, the interval
is two hours, TCP keepalive's. Data flowing either way forgives the strikes: a client that
PINGs often beside its calls is never closed.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["IDLE_PING_INTERVAL_S", "Keepalive", "PingStrikes", "TOO_MANY_PINGS"]

IDLE_PING_INTERVAL_S = 7200.0
TOO_MANY_PINGS = "too_many_pings"  # the GOAWAY's debug data, which grpcio looks for


@dataclasses.dataclass(frozen=True)
class Keepalive:
    """Triton's gRPC keepalive settings, as gRPC's servers take them: a connection that has
    read nothing for `time_s` is sent a PING (only while a call is open on it, unless
    `idle`), and closed if no answer comes within `timeout_s` — a client gone without
    closing (a host down, a cable out, a NAT's state lost) otherwise holds its calls and its
    place for ever. At most `max_pings` PINGs go without a response sent between them (0:
    no bound). Reads put the next PING off: a busy connection is never pinged. A client's
    own PINGs: at most `max_ping_strikes` (0: no bound) sooner than `min_ping_interval_s`
    after the one before, with no data between (PingStrikes); `idle` permits them at that
    interval on a connection with no call open too."""

    time_s: float
    timeout_s: float
    idle: bool = False
    max_pings: int = 2
    min_ping_interval_s: float = 300.0
    max_ping_strikes: int = 2


class PingStrikes:
    """One connection's count of its client's PINGs that came too soon."""

    __slots__ = ("_settings", "strikes", "_last")

    def __init__(self, settings: Keepalive) -> None:
        self._settings = settings
        self.strikes = 0
        self._last = -math.inf  # when the last PING came, since data last flowed

    def struck_out(self, now: float, calls_open: bool, data_flowed: bool) -> bool:
        """A PING came at `now`: whether it is one strike too many (the connection goes).
        `data_flowed`: data was sent or received since the last PING."""
        settings = self._settings
        if data_flowed:
            self.strikes, self._last = 0, -math.inf
        interval = (settings.min_ping_interval_s if calls_open or settings.idle
                    else IDLE_PING_INTERVAL_S)
        too_soon = now < self._last + interval
        self._last = now
        if not too_soon:
            return False
        self.strikes += 1
        return settings.max_ping_strikes != 0 and self.strikes > settings.max_ping_strikes

    def describe(self, calls_open: bool) -> str:
        """Why the connection goes, for the log."""
        settings = self._settings
        if calls_open or settings.idle:
            within = (f"{settings.min_ping_interval_s:g} s (--grpc-http2-min-recv-ping-"
                      f"interval-without-data)")
        else:
            within = (f"{IDLE_PING_INTERVAL_S:g} s (no call open, and "
                      f"--grpc-keepalive-permit-without-calls is false)")
        return (f"{TOO_MANY_PINGS}: {self.strikes} PINGs each within {within} of the one "
                f"before, with no data between, past the {settings.max_ping_strikes} "
                f"allowed (--grpc-http2-max-ping-strikes)")
