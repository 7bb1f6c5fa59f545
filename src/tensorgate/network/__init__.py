"""Front ends on the event loop (HTTP/1.1, gRPC on our HTTP/2, metrics) and what they
share; loop selection. Never imports torch."""

__all__ = ["stalled_message"]


def stalled_message(quiet_s: float, limit_s: float) -> str:
    """Why a request whose bytes stopped arriving was answered (the server's
    --read-timeout-s): HTTP 408, gRPC DEADLINE_EXCEEDED."""
    return (f"the request stopped arriving: no bytes for {quiet_s:.1f} s (the server waits "
            f"{limit_s:g} s, --read-timeout-s)")
