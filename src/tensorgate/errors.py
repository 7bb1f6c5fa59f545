"""Every error tensorgate raises, each carrying a transport-neutral status.

The tree::

    TensorgateError                      status decides the HTTP and gRPC code (protocol/status.py)
    ├── InvalidArgumentError             INVALID_ARGUMENT: the request is wrong; fix it and retry
    │   ├── DatatypeError                unknown datatype, or one a consumer cannot represent
    │   ├── ShapeError                   bad dims, or shape × item size ≠ the bytes given
    │   ├── BufferBoundsError            a view reaching past the end of its buffer
    │   ├── BytesElementError            a BYTES element running past the end of its tensor
    │   └── ModelConfigError             config.pbtxt or a model artifact says something wrong
    ├── NotFoundError                    NOT_FOUND: no such model, version, tensor or region
    ├── AlreadyExistsError               ALREADY_EXISTS
    ├── UnavailableError                 UNAVAILABLE: try again later
    │   └── PoolExhaustedError           the host buffer pool is at its memory bound
    ├── DeadlineExceededError            DEADLINE_EXCEEDED: the request's time ran out
    ├── CancelledError                   CANCELLED: the client went away
    ├── UnimplementedError               UNIMPLEMENTED: valid, but not supported here
    └── InternalError                    INTERNAL: a fault of the server or the model

Beside the tree, TritonModelException: Triton's name for what a Python model raises to fail
its batch and what pb_utils (python_backend.py, custom_metrics.py) raises at a model that
misuses it, as Triton's does; it has no status (the executor makes it the batch's
InternalError).

Messages name the tensor or object at fault, what was expected and what was found.
This module imports no web or RPC framework: front ends translate `status` at one boundary.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

__all__ = [
    "AlreadyExistsError",
    "BufferBoundsError",
    "BytesElementError",
    "CancelledError",
    "DatatypeError",
    "DeadlineExceededError",
    "InternalError",
    "InvalidArgumentError",
    "ModelConfigError",
    "NotFoundError",
    "PoolExhaustedError",
    "ShapeError",
    "Status",
    "TensorgateError",
    "TritonModelException",
    "UnavailableError",
    "UnimplementedError",
]


class Status(enum.Enum):
    """Transport-neutral outcome; protocol/status.py maps each to an HTTP and a gRPC code."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"


class TensorgateError(Exception):
    """Base of every tensorgate error; `status` says how a front end must answer it."""

    status: Status = Status.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(TensorgateError):
    status = Status.INVALID_ARGUMENT


class NotFoundError(TensorgateError):
    status = Status.NOT_FOUND


class AlreadyExistsError(TensorgateError):
    status = Status.ALREADY_EXISTS


class UnavailableError(TensorgateError):
    status = Status.UNAVAILABLE


class DeadlineExceededError(TensorgateError):
    status = Status.DEADLINE_EXCEEDED


class CancelledError(TensorgateError):
    status = Status.CANCELLED


class UnimplementedError(TensorgateError):
    status = Status.UNIMPLEMENTED


class InternalError(TensorgateError):
    status = Status.INTERNAL


def _shape_text(shape: Iterable[object]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


class DatatypeError(InvalidArgumentError):
    """A datatype name we do not know, or one the asked-for library cannot hold."""

    def __init__(self, tensor: str, found: str, detail: str, choices: Sequence[str] = ()) -> None:
        message = f"tensor '{tensor}': {detail} '{found}'"
        if choices:
            message += "; datatypes are: " + ", ".join(choices)
        super().__init__(message)
        self.tensor = tensor
        self.found = found


class ShapeError(InvalidArgumentError):
    """Dims that are not valid sizes, or a shape that does not match the bytes given."""

    def __init__(self, tensor: str, shape: Iterable[object], problem: str) -> None:
        super().__init__(f"tensor '{tensor}' with shape {_shape_text(shape)}: {problem}")
        self.tensor = tensor


class BufferBoundsError(InvalidArgumentError):
    """A view of `nbytes` at `offset` does not fit in a buffer of `buffer_nbytes`."""

    def __init__(self, tensor: str, offset: int, nbytes: int, buffer_nbytes: int) -> None:
        super().__init__(
            f"tensor '{tensor}': {nbytes} bytes at offset {offset} run past the end of its "
            f"{buffer_nbytes}-byte buffer (they end at byte {offset + nbytes})"
        )
        self.tensor = tensor


class BytesElementError(InvalidArgumentError):
    """A BYTES tensor whose length prefixes do not fit the bytes given."""

    def __init__(self, tensor: str, problem: str) -> None:
        super().__init__(f"BYTES tensor '{tensor}': {problem}")
        self.tensor = tensor


class ModelConfigError(InvalidArgumentError):
    """A model's config.pbtxt or artifact cannot be served; `source` is the file or model."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source


class PoolExhaustedError(UnavailableError):
    """The host buffer pool would exceed its memory bound."""

    def __init__(self, wanted: int, in_use: int, limit: int) -> None:
        super().__init__(
            f"host buffer pool is full: {wanted} more bytes wanted, {in_use} in use of a "
            f"{limit}-byte limit; retry later or raise the pool limit (--host-pool-bytes)"
        )


class TritonModelException(Exception):
    """What a Triton Python model raises to fail its whole batch, and what pb_utils raises
    at a model that misuses it (Triton's name and type)."""

    def message(self) -> str:
        return str(self)
