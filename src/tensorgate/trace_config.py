"""The trace settings of ServerConfig resolved and checked: Triton's triton mode (a file)
and opentelemetry mode (spans to a collector, with the OpenTelemetry SDK's variables)."""

from __future__ import annotations

import os
import pathlib
import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensorgate.config import ServerConfig

__all__ = ["OTLP_DEFAULT_URL", "TRACE_LEVELS", "key_values", "otlp_url", "resolve_trace"]

TRACE_LEVELS = ("TIMESTAMPS", "TENSORS")
OTLP_DEFAULT_URL = "http://localhost:4318/v1/traces"  # Triton's, the collector's OTLP/HTTP
# the OpenTelemetry SDK's batch span processor defaults, and the variables that change them
_BSP = {"trace_bsp_max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
        "trace_bsp_schedule_delay_ms": ("OTEL_BSP_SCHEDULE_DELAY", 5000),
        "trace_bsp_max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)}


def resolve_trace(config: ServerConfig) -> None:
    """Check the trace settings and put them in their resolved form (a frozen config is
    changed in place, as its constructor does)."""
    if config.trace_file is not None:
        object.__setattr__(config, "trace_file", pathlib.Path(config.trace_file))
    level = tuple(dict.fromkeys(part.strip().upper() for part in config.trace_level))
    if level == ("OFF",):
        level = ()
    for part in level:
        if part not in TRACE_LEVELS:
            raise ValueError(f"trace_level '{part}' is not one of TIMESTAMPS, TENSORS "
                             "(or OFF alone)")
    object.__setattr__(config, "trace_level", level)
    if config.trace_mode not in ("triton", "opentelemetry"):
        raise ValueError(f"trace_mode must be triton or opentelemetry, got "
                         f"'{config.trace_mode}'")
    otel = config.trace_mode == "opentelemetry"
    if level and config.trace_file is None and not otel:
        raise ValueError("trace_level needs trace_file: tracing writes to a file "
                         "(--trace-config triton,file=PATH), or spans to a collector "
                         "(--trace-config mode=opentelemetry)")
    # rate 0 in opentelemetry mode: only requests whose caller's trace is sampled
    for name, lowest in (("trace_rate", 0 if otel else 1), ("trace_count", -1),
                         ("trace_log_frequency", 0)):
        if getattr(config, name) < lowest:
            raise ValueError(f"{name} must be {lowest} or more, got {getattr(config, name)}")
    if otel:
        _resolve_opentelemetry(config)
    elif (config.trace_otel_url or config.trace_otel_resource
          or any(getattr(config, name) for name in _BSP)):
        raise ValueError("the opentelemetry trace settings (url, resource, bsp_*) need "
                         "trace_mode opentelemetry (--trace-config mode=opentelemetry)")

def _resolve_opentelemetry(config: ServerConfig) -> None:
    """Opentelemetry mode: the collector's URL made whole, the resource attributes and
    the batch bounds resolved from the OTEL_* variables where not given."""
    if config.trace_file is not None or config.trace_log_frequency:
        raise ValueError("trace_file and trace_log_frequency are the triton trace mode's "
                         "(a file); opentelemetry mode sends spans to trace_otel_url")
    if "TENSORS" in config.trace_level:
        raise ValueError("opentelemetry trace mode records TIMESTAMPS only (as Triton's "
                         "does); drop TENSORS or use the triton mode")
    object.__setattr__(config, "trace_otel_url", otlp_url(config.trace_otel_url))
    environ = os.environ
    resource = {"service.name": "tensorgate"}
    resource.update(key_values(environ.get("OTEL_RESOURCE_ATTRIBUTES", ""),
                               "OTEL_RESOURCE_ATTRIBUTES"))
    if environ.get("OTEL_SERVICE_NAME"):
        resource["service.name"] = environ["OTEL_SERVICE_NAME"]
    for item in config.trace_otel_resource:
        resource.update(key_values(item, "trace_otel_resource", decode=False))
    object.__setattr__(config, "trace_otel_resource",
                       tuple(f"{key}={value}" for key, value in resource.items()))
    for name, (variable, default) in _BSP.items():
        value = getattr(config, name)
        if not value and environ.get(variable):
            try:
                value = int(environ[variable])
            except ValueError:
                raise ValueError(f"{variable} must be an integer, got "
                                 f"'{environ[variable]}'") from None
            if value < 1:
                raise ValueError(f"{variable} must be 1 or more, got {value}")
        elif value < 0:
            raise ValueError(f"{name} must be 1 or more (0: {variable} or {default}), "
                             f"got {value}")
        object.__setattr__(config, name, value or default)
    if config.trace_bsp_max_export_batch_size > config.trace_bsp_max_queue_size:
        raise ValueError(f"trace_bsp_max_export_batch_size "
                         f"({config.trace_bsp_max_export_batch_size}) must not exceed "
                         f"trace_bsp_max_queue_size ({config.trace_bsp_max_queue_size})")


def otlp_url(text: str) -> str:
    """An OTLP/HTTP traces URL made whole: Triton's form `host:port/path` takes http://, and
    no path takes /v1/traces (the collector's)."""
    given = text.strip() or OTLP_DEFAULT_URL
    whole = given if "://" in given else "http://" + given
    parts = urllib.parse.urlsplit(whole)
    try:
        parts.port
    except ValueError:
        raise ValueError(f"trace_otel_url '{text}' has no valid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"trace_otel_url '{text}' is not http(s)://HOST[:PORT][/PATH] "
                         "(OTLP over HTTP)")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"trace_otel_url '{text}' may not carry a query, fragment or "
                         "credentials (give headers with OTEL_EXPORTER_OTLP_HEADERS)")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/v1/traces",
                                    "", ""))


def key_values(text: str, source: str, decode: bool = True) -> dict[str, str]:
    """`key=value[,key=value...]` as the OTEL_* variables write them (values
    percent-encoded when `decode`); `source` names where it came from in errors."""
    found: dict[str, str] = {}
    for item in text.split(",") if decode else [text]:
        if not item.strip():
            continue
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"{source}: '{item}' is not key=value")
        found[key.strip()] = urllib.parse.unquote(value.strip()) if decode else value
    return found
