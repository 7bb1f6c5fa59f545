"""The one table from a transport-neutral status to the HTTP code and the gRPC code.

Front ends apply it in exactly one place each. Codes follow Triton's `HttpCodeFromError`
where Triton has one (ALREADY_EXISTS and CANCELLED are 400 there too). DEADLINE_EXCEEDED,
which Triton folds into UNAVAILABLE, gets 504 so a client can tell "too slow" from "overloaded".
"""

from __future__ import annotations

from tensorgate.errors import Status, TensorgateError

__all__ = ["STATUS_CODES", "codes_for"]

# status → (HTTP code, gRPC status code name as in grpc.StatusCode)
STATUS_CODES: dict[Status, tuple[int, str]] = {
    Status.INVALID_ARGUMENT: (400, "INVALID_ARGUMENT"),
    Status.NOT_FOUND: (404, "NOT_FOUND"),
    Status.ALREADY_EXISTS: (400, "ALREADY_EXISTS"),
    Status.UNAVAILABLE: (503, "UNAVAILABLE"),
    Status.DEADLINE_EXCEEDED: (504, "DEADLINE_EXCEEDED"),
    Status.CANCELLED: (400, "CANCELLED"),
    Status.UNIMPLEMENTED: (501, "UNIMPLEMENTED"),
    Status.INTERNAL: (500, "INTERNAL"),
}


def codes_for(error: BaseException) -> tuple[int, str]:
    """(HTTP code, gRPC code name) for any exception; anything not ours is INTERNAL."""
    status = error.status if isinstance(error, TensorgateError) else Status.INTERNAL
    return STATUS_CODES[status]
