"""The checks of a server configuration's listeners, connections and SageMaker settings
(config.ServerConfig's constructor calls them), apart from its fields."""

from __future__ import annotations

import ipaddress
import pathlib
import re
import socket
from typing import TYPE_CHECKING

from tensorgate.protocol.restricted import parse_restrictions

if TYPE_CHECKING:
    from tensorgate.config import ServerConfig

__all__ = ["SAGEMAKER_INFERENCE_TYPES", "check_connections", "check_listeners",
           "check_sagemaker", "safe_port_range"]

SAGEMAKER_INFERENCE_TYPES = ("infer", "generate", "generate_stream")


def check_listeners(config: ServerConfig) -> None:
    """Addresses (each defaulting to `host`'s), ports, and at least one protocol served."""
    _check_address("host", config.host)
    for name, default in (("http_address", config.host), ("grpc_address", config.host),
                          ("metrics_address", config.http_address or config.host),
                          ("sagemaker_address", config.http_address or config.host)):
        object.__setattr__(config, name, getattr(config, name) or default)
        _check_address(name, getattr(config, name))
    if not (config.allow_http or config.allow_grpc or config.allow_sagemaker):
        raise ValueError("allow_http and allow_grpc are both false: the server would "
                         "serve nothing (--allow-http or --allow-grpc must be true, or "
                         "--allow-sagemaker)")
    for name in ("http_port", "grpc_port", "metrics_port", "sagemaker_port"):
        port = getattr(config, name)
        if not 0 <= port <= 65535:
            raise ValueError(f"{name} must be 0-65535 (0 picks a free port), got {port}")
    if (config.reuse_http_port or config.reuse_grpc_port) and not hasattr(socket,
                                                                          "SO_REUSEPORT"):
        raise ValueError("reuse_http_port / reuse_grpc_port need SO_REUSEPORT, which "
                         "this system's sockets do not have")


def check_connections(config: ServerConfig) -> None:
    """Timeouts, the connection limit, gRPC connections' age, keepalive and compression,
    the headers forwarded, restricted APIs and TLS."""
    for name in ("read_timeout_s", "keep_alive_timeout_s"):
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be above 0, got {getattr(config, name)}")
    if config.grpc_flood_probation_s < 0:
        raise ValueError(f"grpc_flood_probation_s must be 0 (never) or more, got "
                         f"{config.grpc_flood_probation_s}")
    if config.max_connections < 1:
        raise ValueError(f"max_connections must be 1 or more, got {config.max_connections}")
    if config.grpc_max_connection_age_ms < 0:
        raise ValueError(f"grpc_max_connection_age_ms must be 0 (no limit) or more, got "
                         f"{config.grpc_max_connection_age_ms}")
    if config.grpc_max_connection_age_grace_ms < -1:
        raise ValueError(f"grpc_max_connection_age_grace_ms must be -1 (no bound) or "
                         f"more, got {config.grpc_max_connection_age_grace_ms}")
    for name in ("grpc_keepalive_time_ms", "grpc_keepalive_timeout_ms"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be 1 or more, got {getattr(config, name)}")
    for name in ("grpc_http2_max_pings_without_data", "grpc_http2_max_ping_strikes"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name} must be 0 (no bound) or more, got "
                             f"{getattr(config, name)}")
    if config.grpc_infer_response_compression_level not in ("none", "low", "medium", "high"):
        raise ValueError(f"grpc_infer_response_compression_level must be none, low, medium "
                         f"or high, got '{config.grpc_infer_response_compression_level}'")
    if config.grpc_http2_min_recv_ping_interval_without_data_ms < 0:
        raise ValueError(f"grpc_http2_min_recv_ping_interval_without_data_ms must be 0 or "
                         f"more, got {config.grpc_http2_min_recv_ping_interval_without_data_ms}")
    if config.grpc_max_connection_age_grace_ms >= 0 and not config.grpc_max_connection_age_ms:
        raise ValueError("grpc_max_connection_age_grace_ms (--grpc-max-connection-age-"
                         "grace) is the grace after grpc_max_connection_age_ms "
                         "(--grpc-max-connection-age), which is not set")
    for name in ("http_header_forward_pattern", "grpc_header_forward_pattern"):
        try:
            re.compile(getattr(config, name))
        except re.error as error:
            raise ValueError(f"{name} is not a regular expression: {error}") from None
    for name in ("http_restricted_api", "grpc_restricted_api"):
        try:
            parse_restrictions(getattr(config, name))
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    for name in ("grpc_server_cert", "grpc_server_key", "grpc_root_cert"):
        if getattr(config, name) is not None:
            object.__setattr__(config, name, pathlib.Path(getattr(config, name)))
    if config.grpc_use_ssl or config.grpc_use_ssl_mutual:
        missing = [f"grpc_{name}" for name in ("server_cert", "server_key")
                   if getattr(config, f"grpc_{name}") is None]
        if config.grpc_use_ssl_mutual and config.grpc_root_cert is None:
            missing.append("grpc_root_cert (the root that signs clients' certificates)")
        if missing:
            flag = "grpc_use_ssl_mutual" if config.grpc_use_ssl_mutual else "grpc_use_ssl"
            raise ValueError(f"{flag} needs {' and '.join(missing)}")


def check_sagemaker(config: ServerConfig) -> None:
    """SageMaker's settings (SAGEMAKER_* variables), and the ports within its safe range."""
    if config.sagemaker_inference_type not in SAGEMAKER_INFERENCE_TYPES:
        raise ValueError(f"sagemaker_inference_type (SAGEMAKER_TRITON_INFERENCE_TYPE) must "
                         f"be {', '.join(SAGEMAKER_INFERENCE_TYPES)}, got "
                         f"'{config.sagemaker_inference_type}'")
    if config.sagemaker_multi_model and config.model_control_mode == "poll":
        raise ValueError("sagemaker_multi_model (SAGEMAKER_MULTI_MODEL) loads what SageMaker "
                         "asks for; model_control_mode poll would follow the repository "
                         "instead: use none or explicit")
    if config.sagemaker_ping_mode not in ("ready", "live"):
        raise ValueError(f"sagemaker_ping_mode (SAGEMAKER_TRITON_PING_MODE) must be ready "
                         f"or live, got '{config.sagemaker_ping_mode}'")
    if not config.sagemaker_safe_port_range:
        return
    low, high = safe_port_range(config.sagemaker_safe_port_range)
    if not config.allow_sagemaker:
        return  # (Triton's check too is SageMaker's only)
    for name, on in (("http", config.allow_http), ("grpc", config.allow_grpc),
                     ("metrics", config.allow_metrics)):
        port = getattr(config, f"{name}_port")
        if on and not low <= port <= high:
            raise ValueError(f"{name}_port {port} is outside the SageMaker safe port range "
                             f"{low}-{high} (sagemaker_safe_port_range): give one inside "
                             f"it, or turn {name} off (--allow-{name} false)")


def safe_port_range(text: str) -> tuple[int, int]:
    """SageMaker's "LOW-HIGH" port range (SAGEMAKER_SAFE_PORT_RANGE), or a ValueError."""
    low, dash, high = text.partition("-")
    try:
        bounds = (int(low), int(high)) if dash else None
    except ValueError:
        bounds = None
    if bounds is None or not 0 <= bounds[0] <= bounds[1] <= 65535:
        raise ValueError(f"sagemaker_safe_port_range must be LOW-HIGH ports (23000-23999), "
                         f"got '{text}'")
    return bounds


def _check_address(name: str, address: str) -> None:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if address != "localhost":
            raise ValueError(f"{name} must be an IP address or 'localhost', got "
                             f"'{address}'") from None
