"""The trace extension's settings as a client sends them (HTTP `/v2[/models/M]/trace/setting`,
gRPC `TraceSetting`) or the server starts with: each checked, and refused with what it may
be (tracing.Tracer applies them)."""

from __future__ import annotations

from typing import Any

from tensorgate.errors import InvalidArgumentError
from tensorgate.trace_config import TRACE_LEVELS

__all__ = ["SETTINGS", "check_level", "check_number", "parse_setting"]

SETTINGS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency",
            "trace_mode")


def parse_setting(name: str, value: Any, file: str, otel: bool = False) -> Any:
    """One setting as a client sent it: a string, or a list of strings (gRPC always sends a
    list; the level may have more than one); None clears it. `otel`: opentelemetry mode."""
    if name not in SETTINGS:
        raise InvalidArgumentError(f"unknown trace setting '{name}'; settings are: "
                                   f"{', '.join(SETTINGS)}")
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                             for v in values):
        raise InvalidArgumentError(f"trace setting '{name}' must be a string or a list of "
                                   f"strings; got {value!r}")
    if name == "trace_level":
        return check_level([str(v) for v in values], otel)
    if len(values) != 1:
        raise InvalidArgumentError(f"trace setting '{name}' takes one value; got {value!r}")
    text = str(values[0])
    if name == "trace_mode":  # a client writing back the settings it read may send it
        mode = "opentelemetry" if otel else "triton"
        if text != mode:
            raise InvalidArgumentError(
                f"trace setting 'trace_mode' is chosen when the server starts (--trace-config "
                f"mode=triton|opentelemetry); this server's is {mode}")
        return None
    if name == "trace_file":
        if text != file:
            raise InvalidArgumentError(
                "trace setting 'trace_file' cannot be changed over the API (any client could "
                "choose a file for the server to write); start the server with "
                "--trace-config triton,file=PATH")
        return None
    try:
        number = int(text)
    except ValueError:
        raise InvalidArgumentError(f"trace setting '{name}' must be an integer; got "
                                   f"{text!r}") from None
    if otel and name == "log_frequency" and number:
        raise InvalidArgumentError("trace setting 'log_frequency' is the triton trace mode's "
                                   "(a file each N traces); this server sends OpenTelemetry "
                                   "spans")
    return check_number(name, number, otel)


def check_number(name: str, number: int, otel: bool = False) -> int:
    """A numeric setting (rate, count, log frequency) within its range, or the refusal
    saying what its values mean."""
    lowest = {"trace_rate": 0 if otel else 1, "trace_count": -1, "log_frequency": 0}[name]
    if number < lowest:
        meaning = {"trace_rate": ("0: only requests their caller traced; " if otel else "")
                                 + "1: every request; N: one in N",
                   "trace_count": "-1: no end; N: N more traces",
                   "log_frequency": "0: one file; N: a file each N traces"}[name]
        raise InvalidArgumentError(f"trace setting '{name}' must be {lowest} or more "
                                   f"({meaning}); got {number}")
    return number


def check_level(values: list[str], otel: bool = False) -> tuple[str, ...]:
    """A trace level: OFF, or some of TRACE_LEVELS (TIMESTAMPS only in opentelemetry mode)."""
    upper = [v.strip().upper() for v in values]
    if upper == ["OFF"] or not upper:
        return ()
    for value in upper:
        if value == "OFF":
            raise InvalidArgumentError(f"trace level OFF must stand alone; got {values}")
        if value not in TRACE_LEVELS:
            raise InvalidArgumentError(f"trace level '{value}' is not one of OFF, "
                                       f"{', '.join(TRACE_LEVELS)}")
        if otel and value == "TENSORS":
            raise InvalidArgumentError("trace level TENSORS is not traced in opentelemetry "
                                       "mode (as in Triton); use TIMESTAMPS")
    return tuple(dict.fromkeys(upper))
