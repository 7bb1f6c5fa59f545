"""One frozen server configuration, built the same way from the CLI, TENSORGATE_* variables
and the Python API; validated in the constructor with messages that say what to change
(those of listeners, connections and SageMaker in config_checks.py)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tensorgate.config_checks import check_connections, check_listeners, check_sagemaker
from tensorgate.log_settings import LOG_FORMATS
from tensorgate.pipeline.rate_limiter import parse_resource_counts
from tensorgate.pipeline.summary import DEFAULT_QUANTILES, parse_quantiles
from tensorgate.repository.layout import ModelRepositories, check_config_name
from tensorgate.trace_config import resolve_trace

__all__ = ["ServerConfig"]

LoopChoice = Literal["auto", "asyncio", "uvloop"]
PlacementChoice = Literal["auto", "none"]
ModelControlChoice = Literal["none", "explicit", "poll"]
TraceModeChoice = Literal["triton", "opentelemetry"]
RateLimitChoice = Literal["off", "execution_count"]
# the variables Triton's SageMaker server reads, and those SageMaker sets in a container (a
# port other than 8080 in an inference pipeline; the range every other port must lie in)
# → the settings they are here
SAGEMAKER_ENV = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "sagemaker_model",
                 "SAGEMAKER_TRITON_INFERENCE_TYPE": "sagemaker_inference_type",
                 "SAGEMAKER_TRITON_PING_MODE": "sagemaker_ping_mode",
                 "SAGEMAKER_BIND_TO_PORT": "sagemaker_port",
                 "SAGEMAKER_SAFE_PORT_RANGE": "sagemaker_safe_port_range",
                 "SAGEMAKER_MULTI_MODEL": "sagemaker_multi_model"}
# how a boolean setting may be written (the CLI, TENSORGATE_* variables)
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclass(frozen=True)
class ServerConfig:
    """Everything `tensorgate serve` can be told. Binds 127.0.0.1 unless told otherwise."""

    # Triton's --model-repository, given once or more: their models share one namespace
    # (empty: the embedded default repository). A string: one path, or several joined by
    # os.pathsep (TENSORGATE_MODEL_REPOSITORY=/models:/more-models).
    model_repository: tuple[pathlib.Path, ...] = ()
    # Triton's --model-config-name: a model's configs/<name>.pbtxt is its config where it
    # has one, its config.pbtxt where not ("": config.pbtxt always)
    model_config_name: str = ""
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    # Triton's --reuse-http-port / --reuse-grpc-port: the port is listened on with
    # SO_REUSEPORT, so that several servers, each a process with the same flag, listen on it
    # together and the kernel spreads new connections among them (a way past one loop's core
    # for many clients); each process keeps its own models, statistics, metrics port and
    # shared-memory registrations
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    # Triton's --allow-http / --allow-grpc: serve that protocol at all (one of them must)
    allow_http: bool = True
    allow_grpc: bool = True
    # Triton's --http-address / --grpc-address / --metrics-address: where each listens
    # ("": host; the metrics follow http_address, as Triton's do)
    http_address: str = ""
    grpc_address: str = ""
    metrics_address: str = ""
    # Triton's --allow-metrics (the metrics port at all), --allow-cpu-metrics (nv_cpu_*, read
    # from /proc every metrics_interval_ms), --allow-gpu-metrics (nv_gpu_*, read through
    # NVML as often, where the driver has it)
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_interval_ms: int = 2000
    # Triton's --metrics-config: the nv_inference_*_duration_us counters (counter_latencies),
    # nv_inference_*_summary_us quantiles over the last 60 s (summary_latencies, at
    # summary_quantiles "QUANTILE:ERROR,..."), and decoupled models'
    # nv_inference_first_response_histogram_ms (histogram_latencies)
    metrics_counter_latencies: bool = True
    metrics_summary_latencies: bool = False
    metrics_summary_quantiles: str = DEFAULT_QUANTILES
    metrics_histogram_latencies: bool = False
    # Triton's --allow-sagemaker: Amazon SageMaker's routes (GET /ping, POST /invocations)
    # on their own port (--sagemaker-port, SageMaker's 8080; --sagemaker-address, which
    # follows http_address), /invocations calling sagemaker_model (Triton's
    # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME; "": the repository's one model) as
    # sagemaker_inference_type (infer, generate or generate_stream: SAGEMAKER_TRITON_
    # INFERENCE_TYPE); /ping answers for readiness or liveness (sagemaker_ping_mode: ready or
    # live, SAGEMAKER_TRITON_PING_MODE). --sagemaker-safe-port-range "LOW-HIGH" (SageMaker's
    # SAGEMAKER_SAFE_PORT_RANGE): every other port the server opens must lie in it. SageMaker's
    # SAGEMAKER_BIND_TO_PORT is sagemaker_port (SAGEMAKER_ENV)
    allow_sagemaker: bool = False
    sagemaker_port: int = 8080
    sagemaker_address: str = ""
    sagemaker_safe_port_range: str = ""
    sagemaker_model: str = ""
    sagemaker_inference_type: str = "infer"
    sagemaker_ping_mode: str = "ready"
    # SageMaker's multi-model endpoint (SAGEMAKER_MULTI_MODEL=true): SageMaker loads, calls
    # and unloads models through /models (network/sagemaker_models.py), each from a folder
    # under sagemaker_models_root; /invocations then serves none
    sagemaker_multi_model: bool = False
    sagemaker_models_root: pathlib.Path = pathlib.Path("/opt/ml/models")
    allow_shared_memory: bool = False
    max_request_bytes: int = 64 << 20  # Triton's --http-max-input-size; after decompression
    # the host buffer pool's bound on everything it holds: request bodies, batch staging and
    # outputs; a request that would pass it is answered UNAVAILABLE
    host_pool_bytes: int = 1 << 30
    # the response cache (Triton's --cache-config local,size=N) for models whose config has
    # response_cache { enable: true }; 0: none (those models run every request)
    response_cache_bytes: int = 0
    # Triton's --disable-auto-complete-config: a Python model's auto_complete_config is not
    # called (its config.pbtxt must then say everything)
    disable_auto_complete_config: bool = False
    loop: LoopChoice = "auto"
    placement: PlacementChoice = "auto"
    switch_interval_s: float = 0.0005
    drain_timeout_s: float = 10.0
    # a call into a model (a batch's forward, a Python model's execute) running this long
    # is logged as a warning, once a call: a model that does not return (0: never)
    model_call_warn_s: float = 60.0
    # a request whose bytes stop arriving for this long is answered (HTTP 408, gRPC
    # DEADLINE_EXCEEDED) and its buffer released: a slow client cannot hold the pool; and
    # an HTTP/1.1 request's headers must arrive within it (408), and an HTTP/2 header block
    # (GOAWAY), however they trickle
    read_timeout_s: float = 30.0
    # an HTTP/1.1 connection idle this long between requests is closed (above the usual 60 s
    # of load balancers, so that they close first); gRPC connections may idle for ever (with
    # grpc_keepalive_permit_without_calls, as long as they answer keepalive PINGs)
    keep_alive_timeout_s: float = 75.0
    # client connections open at once, HTTP and gRPC together; past it a new one is answered
    # (HTTP 503, gRPC GOAWAY) and closed. The soft open-files limit is raised to fit it.
    max_connections: int = 4096
    # Triton's --grpc-max-connection-age / --grpc-max-connection-age-grace (ms): a gRPC
    # connection open this long (±10 %) is sent GOAWAY, so that its client's next calls open
    # a new one, which a load balancer may send to another replica (0: never); calls open
    # then have the grace to finish before the connection is closed with them (-1: no bound)
    grpc_max_connection_age_ms: int = 0
    grpc_max_connection_age_grace_ms: int = -1
    # Triton's gRPC keepalive (ms, its defaults): a connection that has read nothing for
    # grpc_keepalive_time_ms is sent a PING (only while a call is open, unless
    # grpc_keepalive_permit_without_calls) and closed if it is not answered within
    # grpc_keepalive_timeout_ms; at most grpc_http2_max_pings_without_data PINGs go with
    # no response between them (0: no bound)
    grpc_keepalive_time_ms: int = 7_200_000
    grpc_keepalive_timeout_ms: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    # and how often a client may PING (gRPC's servers' policy, Triton's defaults): past
    # grpc_http2_max_ping_strikes PINGs (0: no bound) each within
    # grpc_http2_min_recv_ping_interval_without_data_ms of the one before (2 h while no call
    # is open, unless permitted without calls), with no data between, the connection is told
    # GOAWAY "too_many_pings" and closed
    grpc_http2_min_recv_ping_interval_without_data_ms: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    # for this long after a client address's gRPC connection was ended for flooding (GOAWAY
    # ENHANCE_YOUR_CALM), the connections it opens start on probation: read at an eighth of
    # one connection's pace all together, each until it has earned its streams
    # (network/flooders.py; 0: never, as where every client comes through one proxy that
    # bounds floods itself)
    grpc_flood_probation_s: float = 60.0
    # Triton's: inference answers over gRPC compressed for clients that accept it, the level
    # picking the encoding as gRPC's servers pick it (none, low, medium, high)
    grpc_infer_response_compression_level: str = "none"
    log_level: str = "INFO"
    # Triton's --log-file (the log goes there, not to stderr; no client can change it),
    # --log-info / --log-warning / --log-error (each severity on or off, within log_level)
    # and --log-format (default or ISO8601); the logging extension changes all but the file
    log_file: pathlib.Path | None = None
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    # Triton's --id: the server's name in its metadata
    server_id: str = "tensorgate"
    # Triton's --strict-readiness: /v2/health/ready says ready only while every model the
    # server tried to load serves (a failed one makes it unready: Kubernetes sends it no
    # traffic); false: ready once started, whatever failed
    strict_readiness: bool = True
    # Triton's --exit-on-error: a model that fails to load at start stops the server (exit
    # status 1). Triton's default is true; tensorgate's is false (it serves the others,
    # and with strict readiness says it is not ready)
    exit_on_error: bool = False
    # Triton's --model-control-mode: "none" serves every model of the repository and refuses
    # the load/unload API (any client could otherwise unload what is served); "explicit"
    # loads `load_models` ("*": all) and allows the API; "poll" loads all and follows the
    # repository's changes every `repository_poll_s`, refusing the API
    model_control_mode: ModelControlChoice = "none"
    load_models: tuple[str, ...] = ()
    # a load may carry the model's files (Triton's `file:<version>/<name>` load parameters):
    # code the server then runs, from any client that reaches the API, so off unless asked
    # for, and only with model_control_mode explicit (repository/upload.py)
    allow_model_upload: bool = False
    # Triton's --model-load-retry-count: a model whose load fails is tried again this many
    # times before it is reported failed (a file system or a device that failed for a moment)
    model_load_retry_count: int = 0
    # Triton's --model-load-thread-count: at most this many of the models the server loads as
    # it starts load at once (0: all at once), bounding the threads, CPU and memory a large
    # repository's start takes together; a load a client asks for through the API is not
    # held back, and a repository poll loads one model at a time. Triton's default, 4: twelve
    # ResNet-50s were all ready as soon as with 0, the first 8.7 s sooner, the peak RSS 176 MB
    # lower (bench/load_threads_bench.py)
    model_load_thread_count: int = 4
    repository_poll_s: float = 15.0
    # Triton's --rate-limit: "execution_count" makes each model instance run only while it
    # holds the resources its instance group's rate_limiter names, across all models;
    # --rate-limit-resource "NAME:COUNT[:DEVICE]" sets how many there are (else the most
    # one instance needs); "off" ignores rate_limiter
    rate_limit: RateLimitChoice = "off"
    rate_limit_resources: tuple[str, ...] = ()
    # Triton's --http-header-forward-pattern / --grpc-header-forward-pattern: request headers
    # (metadata) whose lower-case name this regular expression finds a match in reach the
    # model as string request parameters; "" forwards none
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    # Triton's --http-restricted-api / --grpc-restricted-protocol: API groups served only to
    # requests with a header of a given value, "API[,API...]:KEY=VALUE", several joined by
    # ";" (protocol/restricted.py); "" restricts none
    http_restricted_api: str = ""
    grpc_restricted_api: str = ""
    # Triton's --grpc-use-ssl / --grpc-server-cert / --grpc-server-key: gRPC over TLS with
    # this certificate chain and key (PEM files; network/tls.py); --grpc-use-ssl-mutual and
    # --grpc-root-cert: also ask every client for a certificate that root signed (mutual
    # implies use_ssl). Read and checked at start. HTTP stays plain, as Triton's
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: pathlib.Path | None = None
    grpc_server_key: pathlib.Path | None = None
    grpc_root_cert: pathlib.Path | None = None
    # Triton's --trace-config (trace extension): the file traces are written to (None: no
    # tracing, nor can a client turn it on), the level (() or "OFF": none; TIMESTAMPS,
    # TENSORS), one request in trace_rate traced, trace_count traces in all (-1: no end),
    # and a file of its own for each trace_log_frequency traces (0: all in trace_file)
    trace_file: pathlib.Path | None = None
    trace_level: tuple[str, ...] = ()
    trace_rate: int = 1000
    trace_count: int = -1
    trace_log_frequency: int = 0
    # Triton's --trace-config mode=opentelemetry: traces become OpenTelemetry spans sent to
    # a collector over OTLP/HTTP (trace_otel_url; "": OTLP_DEFAULT_URL; no path: /v1/traces)
    # instead of a file; resource attributes "key=value" (after OTEL_RESOURCE_ATTRIBUTES and
    # OTEL_SERVICE_NAME; service.name is tensorgate unless one says otherwise); the batch
    # span processor's bounds (0: the OTEL_BSP_* variable, else the SDK's default)
    trace_mode: TraceModeChoice = "triton"
    trace_otel_url: str = ""
    trace_otel_resource: tuple[str, ...] = ()
    trace_bsp_max_queue_size: int = 0
    trace_bsp_schedule_delay_ms: int = 0
    trace_bsp_max_export_batch_size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_repository", _repositories(self.model_repository))
        object.__setattr__(self, "sagemaker_models_root", pathlib.Path(self.sagemaker_models_root))
        object.__setattr__(self, "load_models", tuple(self.load_models))
        try:
            check_config_name(self.model_config_name)
        except ValueError as error:
            raise ValueError(f"model_config_name: {error}") from None
        if self.model_control_mode not in ("none", "explicit", "poll"):
            raise ValueError(f"model_control_mode must be none, explicit or poll, got "
                             f"'{self.model_control_mode}'")
        if self.load_models and self.model_control_mode != "explicit":
            raise ValueError("load_models (--load-model) needs model_control_mode explicit "
                             "(--model-control-mode explicit); the other modes load every "
                             "model of the repository")
        if self.allow_model_upload and self.model_control_mode != "explicit":
            raise ValueError("allow_model_upload (--allow-model-upload) needs "
                             "model_control_mode explicit (--model-control-mode explicit): "
                             "only that mode takes loads from clients")
        if "*" in self.load_models and len(self.load_models) > 1:
            raise ValueError("load_models '*' (every model) must be the only one named")
        if self.rate_limit not in ("off", "execution_count"):
            raise ValueError(f"rate_limit must be off or execution_count, got "
                             f"'{self.rate_limit}'")
        object.__setattr__(self, "rate_limit_resources", tuple(self.rate_limit_resources))
        parse_resource_counts(self.rate_limit_resources)
        if self.rate_limit_resources and self.rate_limit == "off":
            raise ValueError("rate_limit_resources (--rate-limit-resource) needs rate_limit "
                             "execution_count (--rate-limit execution_count)")
        if self.model_load_thread_count < 0:
            raise ValueError(f"model_load_thread_count must be 0 (all at once) or more, got "
                             f"{self.model_load_thread_count}")
        if self.model_load_retry_count < 0:
            raise ValueError(f"model_load_retry_count must be 0 or more, got "
                             f"{self.model_load_retry_count}")
        if not self.repository_poll_s > 0:
            raise ValueError(f"repository_poll_s must be above 0, got "
                             f"{self.repository_poll_s}")
        check_listeners(self)
        check_sagemaker(self)
        parse_quantiles(self.metrics_summary_quantiles)
        if self.metrics_interval_ms < 1:
            raise ValueError(f"metrics_interval_ms must be 1 or more, got "
                             f"{self.metrics_interval_ms}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes must be at least 1024, got "
                             f"{self.max_request_bytes}")
        if self.host_pool_bytes < self.max_request_bytes:
            raise ValueError(f"host_pool_bytes ({self.host_pool_bytes}) must be at least "
                             f"max_request_bytes ({self.max_request_bytes}): a request of the "
                             "largest size allowed could never be received")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got "
                             f"'{self.log_level}'")
        if self.log_file is not None:
            object.__setattr__(self, "log_file", pathlib.Path(self.log_file))
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}, got "
                             f"'{self.log_format}'")
        if not self.server_id.strip():
            raise ValueError("server_id must not be empty")
        if self.response_cache_bytes < 0:
            raise ValueError(f"response_cache_bytes must be 0 (no cache) or more, got "
                             f"{self.response_cache_bytes}")
        if self.loop not in ("auto", "asyncio", "uvloop"):
            raise ValueError(f"loop must be auto, asyncio or uvloop, got '{self.loop}'")
        if self.placement not in ("auto", "none"):
            raise ValueError(f"placement must be auto or none, got '{self.placement}'")
        if self.model_call_warn_s < 0:
            raise ValueError(f"model_call_warn_s must be 0 (never) or more, got "
                             f"{self.model_call_warn_s}")
        check_connections(self)
        resolve_trace(self)
        if not 0 < self.switch_interval_s <= 1:
            raise ValueError(f"switch_interval_s must be in (0, 1], got {self.switch_interval_s}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ServerConfig:
        """Build from strings or typed values by field name (the CLI and env both land here)."""
        kwargs: dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in values.items():
            if value is None:
                continue
            field = fields.get(key)
            if field is None:
                raise ValueError(f"unknown setting '{key}'; settings are: {', '.join(fields)}")
            kwargs[key] = _coerce(key, field.type, value)
        return cls(**kwargs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 **overrides: Any) -> ServerConfig:
        """SageMaker's variables (SAGEMAKER_ENV), TENSORGATE_<FIELD> variables
        (TENSORGATE_HTTP_PORT=9000), then `overrides`."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {field: environ[name] for name, field in SAGEMAKER_ENV.items()
                                  if name in environ}
        for field in dataclasses.fields(cls):
            raw = environ.get("TENSORGATE_" + field.name.upper())
            if raw is not None:
                values[field.name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(values)


def _repositories(given: Any) -> tuple[pathlib.Path, ...]:
    """model_repository as paths, each named once."""
    if isinstance(given, str):  # (not at a URI's "://": an s3:// repository is named whole)
        given = re.split(re.escape(os.pathsep) + "(?!//)", given)
    elif isinstance(given, os.PathLike):
        given = [given]
    paths = [p for p in given if str(p)]
    if not paths:
        return ()  # the embedded default repository
    try:
        return ModelRepositories.of(paths).paths
    except ValueError as error:
        raise ValueError(f"model_repository names {error}") from None


def _coerce(key: str, annotation: Any, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = str(annotation)
    try:
        if text == "bool":
            lowered = value.strip().lower()
            if lowered in TRUE_WORDS:
                return True
            if lowered in FALSE_WORDS:
                return False
            raise ValueError
        if text == "int":
            return int(value)
        if text == "float":
            return float(value)
        if key == "model_repository":
            return value  # paths: split by os.pathsep, not commas (_repositories)
        if text.startswith("tuple"):
            return tuple(part.strip() for part in value.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"setting '{key}' expects {text}, got '{value}'") from None
    if "Path" in text:
        return pathlib.Path(value) if value else None
    return value
