"""What the server's configuration makes for server.py to compose: the gRPC TLS context,
keepalive settings, the model SageMaker calls, patterns, the open-files limit raised to fit
the connections, and opentelemetry's exporter; StartupError for what cannot start."""

from __future__ import annotations

import functools
import logging
import re
import ssl
from collections.abc import Callable

from tensorgate.config import ServerConfig
from tensorgate.network.keepalive import Keepalive
from tensorgate.network.tls import server_context
from tensorgate.repository.layout import ModelRepositories
from tensorgate.tracing import ExportDone
from tensorgate.tracing_otlp import OtlpExporter

__all__ = ["FILES_BESIDE_CONNECTIONS", "StartupError", "fit_open_files", "grace_s",
           "grpc_tls", "keepalive", "pattern", "sagemaker_model", "span_exporter"]

log = logging.getLogger("tensorgate.server")


class StartupError(Exception):
    """The server cannot start as configured (a model failed to load with exit_on_error)."""


def grpc_tls(config: ServerConfig) -> ssl.SSLContext | None:
    """The gRPC front end's TLS context, or None for plain gRPC; a StartupError says which
    file is wrong and how."""
    if not (config.grpc_use_ssl or config.grpc_use_ssl_mutual):
        return None
    assert config.grpc_server_cert is not None and config.grpc_server_key is not None
    try:
        return server_context(config.grpc_server_cert, config.grpc_server_key,
                              config.grpc_root_cert, config.grpc_use_ssl_mutual, "h2")
    except ValueError as error:
        raise StartupError(f"gRPC TLS: {error}") from None


FILES_BESIDE_CONNECTIONS = 256  # model files, shared memory, the listening sockets, logs


def sagemaker_model(named: str, repositories: ModelRepositories) -> str:
    """The model SageMaker's /invocations calls: `named` (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME),
    which the repositories must hold, else the one model they hold (as Triton's SageMaker
    image picks it); StartupError otherwise."""
    held = repositories.names()
    if named in held or (not named and len(held) == 1):
        return named or held[0]
    listed = ", ".join(held[:20]) + (", ..." if len(held) > 20 else "") if held else "none"
    if named:
        raise StartupError(f"--allow-sagemaker: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME '{named}' "
                           f"names no model of {repositories} (models: {listed})")
    raise StartupError(f"--allow-sagemaker: /invocations serves one model; set "
                       f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to one of {listed} (the models "
                       f"of {repositories})")


def keepalive(config: ServerConfig) -> Keepalive:
    """The gRPC keepalive and ping policy Triton's flags say, in seconds."""
    return Keepalive(config.grpc_keepalive_time_ms / 1000,
                     config.grpc_keepalive_timeout_ms / 1000,
                     config.grpc_keepalive_permit_without_calls,
                     config.grpc_http2_max_pings_without_data,
                     config.grpc_http2_min_recv_ping_interval_without_data_ms / 1000,
                     config.grpc_http2_max_ping_strikes)


def grace_s(grace_ms: int) -> float | None:
    """A retired connection's grace in seconds (None: -1, no bound)."""
    return grace_ms / 1000 if grace_ms >= 0 else None


def pattern(text: str) -> re.Pattern[str] | None:
    """A header-forwarding pattern compiled (None: none given, nothing forwarded)."""
    return re.compile(text) if text else None


def fit_open_files(connections: int) -> int:
    """Raise the soft limit on open files to fit `connections` (up to the hard limit); returns
    the connections that fit. Many systems start processes at a soft limit of 1,024: past
    it accept() fails and new clients hang in the backlog instead of being refused."""
    try:
        import resource
    except ImportError:  # not POSIX
        return connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + FILES_BESIDE_CONNECTIONS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError) as error:
            log.warning("cannot raise the open-files limit to %d: %s", raised, error)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        fitted = max(soft - FILES_BESIDE_CONNECTIONS, 1)
        log.warning("the open-files limit is %d (hard %d): at most %d client connections, not "
                    "%d (--max-connections); raise the limit (ulimit -n) for more", soft, hard,
                    fitted, connections)
        return fitted
    return connections


def span_exporter(config: ServerConfig, version: str
                   ) -> Callable[[ExportDone], OtlpExporter] | None:
    """Opentelemetry mode's exporter, made by the tracer (None: the triton mode's file)."""
    if config.trace_mode != "opentelemetry":
        return None
    return functools.partial(OtlpExporter, config.trace_otel_url, config.trace_otel_resource,
                             config.trace_bsp_max_queue_size,
                             config.trace_bsp_schedule_delay_ms,
                             config.trace_bsp_max_export_batch_size, version)
