"""TLS for the gRPC front end: Triton's --grpc-use-ssl and --grpc-use-ssl-mutual.

The loop's TLS transport (asyncio's or uvloop's, the same design) decrypts into the buffer
our protocol gives it, so a tensor still lands in its pooled, aligned buffer and is used
in place; what TLS itself costs is one more pass over every byte each way (the ssl
module's memory buffers, then the cipher), counted for the process as `tls` copies.

A connection is admitted to the connection budget when it is accepted, before its
handshake; a handshake that fails or never ends is never seen by our protocol (the
transport drops it without a word), so `Handshakes` lets a front end give back the budget of
those it never saw made, once the handshake's time is over.
"""

from __future__ import annotations

import pathlib
import ssl
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["HANDSHAKE_TIMEOUT_S", "Handshakes", "server_context"]

HANDSHAKE_TIMEOUT_S = 10.0  # at most; a handshake takes ~1 ms on loopback, ~100 ms far away
_SWEEP_MARGIN_S = 1.0       # past the transport's own timeout, before we give up on one

C = TypeVar("C")


def server_context(cert: pathlib.Path, key: pathlib.Path, root: pathlib.Path | None,
                   mutual: bool, alpn: str) -> ssl.SSLContext:
    """A server's TLS context: TLS 1.2 or newer, `cert` (PEM, the chain) and `key` (PEM,
    no passphrase); with `mutual`, a client must present a certificate that `root` (PEM)
    signed. `alpn` is the protocol offered (gRPC: "h2"). A ValueError names the file
    and what is wrong with it."""
    for what, path in (("server certificate", cert), ("server key", key)) + (
            (("root certificate", root),) if mutual and root is not None else ()):
        if not path.is_file():
            raise ValueError(f"the {what} '{path}' is not a readable file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols([alpn])
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as error:
        raise ValueError(f"the server certificate '{cert}' and key '{key}' could not be "
                         f"used: {_reason(error)} (both PEM, the key without a passphrase, "
                         "the key the certificate's)") from None
    if mutual:
        if root is None:
            raise ValueError("mutual TLS needs the root certificate that signs clients' "
                             "certificates (--grpc-root-cert)")
        try:
            context.load_verify_locations(cafile=root)
        except ssl.SSLError as error:
            raise ValueError(f"the root certificate '{root}' could not be used: "
                             f"{_reason(error)} (PEM)") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _reason(error: ssl.SSLError) -> str:
    return str(error.reason or error.strerror or error).replace("_", " ").lower()


class Handshakes(Generic[C]):
    """Connections accepted whose handshake may still be under way."""

    __slots__ = ("timeout_s", "_started")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._started: dict[C, float] = {}

    def started(self, connection: C, now: float) -> None:
        self._started[connection] = now

    def sweep(self, now: float, made: Callable[[C], bool]) -> list[C]:
        """Forget those `made` (their protocol saw the handshake end: closing them is its
        own); return those whose handshake's time is over without it — the transport
        closed them (a handshake that failed or timed out), and their budget is free."""
        limit = now - self.timeout_s - _SWEEP_MARGIN_S
        over = []
        for connection, started in list(self._started.items()):
            if made(connection):
                del self._started[connection]
            elif started < limit:
                del self._started[connection]
                over.append(connection)
        return over
