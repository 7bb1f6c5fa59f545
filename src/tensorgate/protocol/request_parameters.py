"""A request's parameters, read and checked alike for HTTP/JSON and gRPC bodies
(infer_codec.py, grpc_codec.py): its timeout, priority and sequence, the parameters its
model sees, the headers forwarded to it, and a tensor's shared-memory and classification
parameters. Each refusal names the parameter and what it takes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from tensorgate.errors import InvalidArgumentError

__all__ = ["MAX_SEQUENCE_ID_CHARACTERS", "RESERVED_PARAMETERS", "classification_count",
           "forward_headers", "is_count", "model_parameters", "request_priority",
           "request_sequence", "request_timeout", "shm_parameters"]


def shm_parameters(parameters: dict[str, Any], tensor: str) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) from a tensor's shared_memory_* parameters, or None."""
    region = parameters.get("shared_memory_region")
    size = parameters.get("shared_memory_byte_size")
    if region is None and size is None:
        if "shared_memory_offset" in parameters:
            raise InvalidArgumentError(f"tensor '{tensor}': shared_memory_offset without "
                                       "shared_memory_region")
        return None
    if region is None or size is None:
        raise InvalidArgumentError(f"tensor '{tensor}': shared_memory_region and "
                                   "shared_memory_byte_size go together")
    offset = parameters.get("shared_memory_offset", 0)
    if not isinstance(region, str):
        raise InvalidArgumentError(f"tensor '{tensor}': shared_memory_region must be a string")
    for what, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if not is_count(value):
            raise InvalidArgumentError(f"tensor '{tensor}': {what} must be a non-negative "
                                       "integer")
    return region, offset, size


def is_count(value: Any) -> bool:
    """A non-negative integer (JSON and protobuf both hand bools over as ints)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def request_timeout(parameters: dict[str, Any]) -> int | None:
    """The request's `timeout` parameter in µs (None when absent), checked."""
    value = parameters.get("timeout")
    if value is not None and not is_count(value):
        raise InvalidArgumentError(f"request parameter 'timeout' must be a non-negative integer of "
                                   f"microseconds, got {value!r}")
    return value


def request_priority(parameters: dict[str, Any]) -> int:
    """The request's `priority` parameter (0 when absent: the model's default level)."""
    value = parameters.get("priority", 0)
    if not is_count(value):
        raise InvalidArgumentError(
            f"request parameter 'priority' must be a non-negative integer (1 is the "
            f"highest level, 0 the model's default), got {value!r}")
    return int(value)


# A string sequence_id is held, with the sequence's state, until the sequence ends or idles
# out: bounded, generously (Triton's clients send UUIDs and session names)
MAX_SEQUENCE_ID_CHARACTERS = 1024


def request_sequence(parameters: dict[str, Any]) -> tuple[int | str, bool, bool] | None:
    """The request's sequence parameters (Triton's sequence extension), checked: None when it
    belongs to no sequence (`sequence_id` absent, 0 or "")."""
    if ("sequence_id" not in parameters and "sequence_start" not in parameters
            and "sequence_end" not in parameters):
        return None  # most requests: nothing to check
    sequence_id = parameters.get("sequence_id", 0)
    if not isinstance(sequence_id, str) and not is_count(sequence_id):
        raise InvalidArgumentError(
            f"request parameter 'sequence_id' must be a non-negative integer or a "
            f"string, got {sequence_id!r}")
    if isinstance(sequence_id, str) and len(sequence_id) > MAX_SEQUENCE_ID_CHARACTERS:
        raise InvalidArgumentError(
            f"request parameter 'sequence_id' is a string of {len(sequence_id):,} "
            f"characters; at most {MAX_SEQUENCE_ID_CHARACTERS:,} are accepted (the "
            "server holds it for as long as the sequence lives)")
    flags = []
    for name in ("sequence_start", "sequence_end"):
        value = parameters.get(name, False)
        if not isinstance(value, bool):
            raise InvalidArgumentError(
                f"request parameter '{name}' must be true or false, got {value!r}")
        flags.append(value)
    if sequence_id in (0, ""):
        if any(flags):
            raise InvalidArgumentError(
                "request parameters 'sequence_start' and 'sequence_end' need a "
                "non-zero 'sequence_id' naming the sequence")
        return None
    return sequence_id, flags[0], flags[1]


# Request parameters the server acts on itself (Triton's parameters extension reserves them,
# and every `triton_` key; `tensorgate_` keys are ours); a model sees the others.
RESERVED_PARAMETERS = frozenset({"binary_data_output", "headers", "priority", "sequence_end",
                                 "sequence_id", "sequence_start", "timeout"})


_TRITON_PARAMETERS = frozenset({"triton_enable_empty_final_response"})


_NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})


def model_parameters(parameters: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request parameters its model sees: all but the reserved ones, each checked to be
    a boolean, a number or a string (what gRPC's InferParameter can carry)."""
    found: dict[str, Any] | None = None
    for key, value in parameters.items():
        if key == "headers":  # Triton refuses it too (400)
            raise InvalidArgumentError(
                "request parameter 'headers' is reserved: it is where a server puts "
                "the HTTP headers it forwards to the model (here each forwarded header "
                "is a parameter of its own name: --http-header-forward-pattern)")
        if key in RESERVED_PARAMETERS or key.startswith("tensorgate_"):
            continue
        if key.startswith("triton_"):
            if key in _TRITON_PARAMETERS:
                continue
            raise InvalidArgumentError(
                f"request parameter '{key}': keys starting with 'triton_' are reserved; "
                f"the server knows {', '.join(sorted(_TRITON_PARAMETERS))}")
        if not isinstance(value, (bool, int, float, str)):
            kind = "no value" if value is None else type(value).__name__
            raise InvalidArgumentError(
                f"request parameter '{key}' must be a boolean, a number or a string, "
                f"got {kind}")
        if found is None:
            found = {}
        found[key] = value
    return _NO_PARAMETERS if found is None else MappingProxyType(found)


def forward_headers(headers: Iterable[tuple[str, str]],
                    pattern: re.Pattern[str] | None) -> dict[str, str] | None:
    """The headers (lower-case names) whose name `pattern` finds a match in, to pass to the
    model as string parameters, as Triton's --http/grpc-header-forward-pattern do."""
    if pattern is None:
        return None
    found = {name: value for name, value in headers
             if not name.startswith(":") and pattern.search(name)}
    return found or None


def classification_count(parameters: dict[str, Any], output: str) -> int:
    """An output's `classification` parameter (0: none), checked."""
    value = parameters.get("classification", 0)
    if not is_count(value):
        raise InvalidArgumentError(
            f"output '{output}': classification must be a non-negative integer")
    return int(value)
