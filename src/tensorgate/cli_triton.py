"""Triton's command line as `tensorgate serve` takes it: its flags that change nothing here
(said at start), those refused with the reason, its deprecated tracing flags, and its
--trace-config, --metrics-config and other settings turned into ServerConfig fields
(cli.py's parser declares the flags; these read what was given)."""

from __future__ import annotations

from tensorgate.config import FALSE_WORDS

__all__ = ["NO_EFFECT", "OLD_TRACE_FLAGS", "REFUSED", "metrics_settings", "no_effect",
           "no_effect_dest", "old_trace_dest", "old_trace_flags", "refused_dest",
           "trace_settings", "triton_settings"]


# Triton's flags for what tensorgate sizes or does its own way: a tritonserver command line
# that carries them still starts, and says at start that they changed nothing
NO_EFFECT = {
    "http-thread-count": "the event loop serves every HTTP connection",
    "grpc-infer-allocation-pool-size": "gRPC requests are parsed in place, not pooled",
    "grpc-max-response-pool-size": "responses are written as views of the outputs",
    "buffer-manager-thread-count": "inputs are views, not copied by threads",
    "pinned-memory-pool-byte-size": "--host-pool-bytes bounds the (pinned) host pool",
    "cuda-memory-pool-byte-size": "the device's memory is PyTorch's caching allocator's",
    "cuda-virtual-address-size": "the device's memory is PyTorch's caching allocator's",
    "min-supported-compute-capability": "PyTorch's build decides which GPUs it runs on",
    "backend-directory": "models run in this process (PyTorch and Python models)",
    "repoagent-directory": "no repository agents",
    "backend-config": "no backend takes settings (Python models' shm pools are not used)",
    "host-policy": "--placement places threads on CPUs",
    "enable-peer-access": "PyTorch's CUDA runtime enables peer access where it copies",
    "sagemaker-thread-count": "the event loop serves every SageMaker connection",
}
# Triton's flags for what tensorgate does not do, where going on would mislead: refused
# (unless given as false) with the reason
REFUSED = {
    "allow-vertex-ai": "Vertex AI's API is not served",
    "model-namespacing": "model names are one namespace",
    "cache-directory": "only the local response cache exists (--cache-config local,size=N)",
    "model-load-gpu-limit": "a load is not refused for the GPU memory in use; leave it out",
    "vertex-ai-port": "Vertex AI's API is not served",
    "vertex-ai-thread-count": "Vertex AI's API is not served",
    "vertex-ai-default-model": "Vertex AI's API is not served",
}
# Triton's deprecated tracing flags → the --trace-config setting each is
OLD_TRACE_FLAGS = {"trace-file": "triton,file", "trace-level": "level", "trace-rate": "rate",
                   "trace-count": "count", "trace-log-frequency": "triton,log-frequency"}


def no_effect_dest(flag: str) -> str:
    """Where the parser keeps a flag of NO_EFFECT, apart from every setting."""
    return "no_effect_" + flag.replace("-", "_")


def refused_dest(flag: str) -> str:
    """Where the parser keeps a flag of REFUSED, apart from every setting."""
    return "refused_" + flag.replace("-", "_")


def old_trace_dest(flag: str) -> str:
    """Where the parser keeps a flag of OLD_TRACE_FLAGS, apart from every setting."""
    return "old_" + flag.replace("-", "_")


def old_trace_flags(args: dict[str, object]) -> list[str]:
    """Triton's deprecated --trace-file, --trace-level, ... (taken out of `args`) as the
    --trace-config values they stand for, to come before those given as such."""
    found = []
    for flag, setting in OLD_TRACE_FLAGS.items():
        value = args.pop(old_trace_dest(flag), None)
        if value is not None:  # (--trace-level is repeated: a list)
            found += [f"{setting}={one}" for one in (value if isinstance(value, list)
                                                      else [value])]
    return found


# --trace-config's settings (Triton's names) → ServerConfig fields, by mode ("": global)
_TRACE_FIELDS = {
    "": {"level": "trace_level", "rate": "trace_rate", "count": "trace_count",
         "mode": "trace_mode"},
    "triton": {"file": "trace_file", "log-frequency": "trace_log_frequency"},
    "opentelemetry": {"url": "trace_otel_url", "resource": "trace_otel_resource",
                      "bsp_max_queue_size": "trace_bsp_max_queue_size",
                      "bsp_schedule_delay": "trace_bsp_schedule_delay_ms",
                      "bsp_max_export_batch_size": "trace_bsp_max_export_batch_size"}}


def trace_settings(given: list[str]) -> dict[str, object]:
    """ServerConfig fields from `--trace-config` values, Triton's form: `setting=value` for
    the global ones, `triton,setting=value` for the file and log frequency,
    `opentelemetry,setting=value` for the collector. Levels and resources add up."""
    found: dict[str, object] = {}
    levels: list[str] = []
    resources: list[str] = []
    for text in given:
        head, comma, rest = text.partition(",")
        mode, setting = (head, rest) if comma and "=" not in head else ("", text)
        name, equals, value = setting.partition("=")
        if not equals:
            raise ValueError(f"--trace-config '{text}' is not [MODE,]SETTING=VALUE")
        fields = _TRACE_FIELDS.get(mode)
        if fields is None:
            raise ValueError(f"--trace-config '{text}': unknown mode '{mode}'; modes are "
                             "triton, opentelemetry")
        field = fields.get(name)
        if field is None:
            raise ValueError(f"--trace-config '{text}': unknown setting '{name}'; "
                             f"{mode or 'global'} settings are: {', '.join(fields)}")
        if name == "level":
            levels.append(value)
        elif name == "resource":
            resources.append(value)
        else:
            found[field] = value
    if levels:
        found["trace_level"] = ",".join(levels)
    if resources:
        found["trace_otel_resource"] = tuple(resources)
    return found


_METRICS_FIELDS = {name: f"metrics_{name}" for name in (
    "counter_latencies", "summary_latencies", "summary_quantiles", "histogram_latencies")}


def metrics_settings(given: list[str]) -> dict[str, object]:
    """ServerConfig fields from `--metrics-config setting=value` values (Triton's names)."""
    found: dict[str, object] = {}
    for text in given:
        name, equals, value = text.partition("=")
        field = _METRICS_FIELDS.get(name.strip())
        if not equals or field is None:
            raise ValueError(f"--metrics-config '{text}' is not SETTING=VALUE with a setting "
                             f"of: {', '.join(_METRICS_FIELDS)}")
        found[field] = value.strip()
    return found


def triton_settings(args: dict[str, object]) -> dict[str, object]:
    """ServerConfig fields from Triton's flags that say what a tensorgate flag says (they
    are taken out of `args`); tensorgate's own flag wins where both are given."""
    found: dict[str, object] = {}
    for flag, why in REFUSED.items():
        value = args.pop(refused_dest(flag), None)
        if isinstance(value, str) and value.strip().lower() not in FALSE_WORDS:
            raise ValueError(f"--{flag}: {why}")
    for ours, theirs in (("max_request_bytes", "http_max_input_size"),
                         ("response_cache_bytes", "response_cache_byte_size")):
        value = args.pop(theirs, None)
        if value is not None and args.get(ours) is None:
            found[ours] = value
    strict = args.pop("strict_model_config", None)
    if strict is not None and args.get("disable_auto_complete_config") is None:
        found["disable_auto_complete_config"] = strict
    verbose = args.pop("log_verbose", None)
    if isinstance(verbose, int) and verbose > 0 and args.get("log_level") is None:
        found["log_level"] = "DEBUG"
    cache = args.pop("cache_config", None)
    if isinstance(cache, str):
        kind, _, setting = cache.partition(",")
        name, _, size = setting.partition("=")
        if kind != "local" or name != "size" or not size.isdecimal():
            raise ValueError(f"--cache-config '{cache}': only local,size=BYTES is supported "
                             "(the in-memory response cache)")
        if args.get("response_cache_bytes") is None:
            found["response_cache_bytes"] = int(size)
    return found


def no_effect(args: dict[str, object]) -> list[str]:
    """Triton's flags given that change nothing here (taken out of `args`), with why."""
    given = []
    for flag, why in NO_EFFECT.items():
        if args.pop(no_effect_dest(flag), None) is not None:
            given.append(f"--{flag} ({why})")
    return given
