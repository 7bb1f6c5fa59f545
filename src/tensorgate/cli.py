"""`tensorgate serve`: arguments → ServerConfig (TENSORGATE_* variables fill the rest) → run."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Mapping
from typing import cast

from tensorgate.cli_triton import (NO_EFFECT, OLD_TRACE_FLAGS, REFUSED, metrics_settings,
                                   no_effect, no_effect_dest, old_trace_dest, old_trace_flags,
                                   refused_dest, trace_settings, triton_settings)
from tensorgate.config import ServerConfig
from tensorgate.pipeline.summary import DEFAULT_QUANTILES
from tensorgate.repository.layout import check_repository_folders

__all__ = ["main", "parse_serve", "serve_config"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorgate")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    serve.add_argument("--model-repository", "--model-store", type=pathlib.Path,
                       action="append",
                       help="a Triton-layout repository (default: the built-in one); repeat "
                            "it to serve several, whose model names must not repeat")
    serve.add_argument("--model-config-name", metavar="NAME",
                       help="Triton's: each model's configs/NAME.pbtxt is its config where it "
                            "has one, its config.pbtxt where not")
    serve.add_argument("--model-control-mode", choices=["none", "explicit", "poll"],
                       help="none (default): serve every model, refuse load/unload; "
                            "explicit: load --load-model models, allow load/unload; poll: "
                            "follow the repository's changes")
    serve.add_argument("--load-model", dest="load_models", action="append",
                       help="with --model-control-mode explicit: a model to load at start "
                            "(repeat it; '*' loads all)")
    serve.add_argument("--rate-limit", choices=["off", "execution_count"],
                       help="Triton's: execution_count runs a model instance only while it "
                            "holds its instance group's rate_limiter resources (default off)")
    serve.add_argument("--rate-limit-resource", dest="rate_limit_resources", action="append",
                       metavar="NAME:COUNT[:DEVICE]",
                       help="how many of a rate limiter resource there are (repeatable; "
                            "default: the most one instance needs)")
    serve.add_argument("--model-load-retry-count", type=int, metavar="N",
                       help="Triton's: try a model's failed load again N times (default 0)")
    serve.add_argument("--model-load-thread-count", type=int, metavar="N",
                       help="at most N of the models loaded at start load at once (default "
                            "4, as Triton's; 0: all at once)")
    serve.add_argument("--repository-poll-secs", dest="repository_poll_s", type=float,
                       help="with --model-control-mode poll: seconds between scans "
                            "(default 15)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int)
    serve.add_argument("--grpc-port", type=int)
    serve.add_argument("--metrics-port", type=int, help="Prometheus metrics (default 8002)")
    for name in ("http", "grpc", "metrics"):
        serve.add_argument(f"--{name}-address",
                           help=f"Triton's: the address {name} binds (default --host"
                                + (", or --http-address)" if name == "metrics" else ")"))
    for name in ("http", "grpc"):
        serve.add_argument(f"--allow-{name}", metavar="BOOL",
                           help=f"Triton's: serve {name} at all (default true)")
    for name, what in (("metrics", "serve Prometheus metrics at all"),
                       ("cpu-metrics", "report nv_cpu_utilization and nv_cpu_memory_*"),
                       ("gpu-metrics", "report nv_gpu_* and nv_energy_consumption (through NVML)")):
        serve.add_argument(f"--allow-{name}", metavar="BOOL",
                           help=f"Triton's: {what} (default true)")
    serve.add_argument("--allow-sagemaker", metavar="BOOL",
                       help="Triton's: serve Amazon SageMaker's GET /ping and POST /invocations "
                            "(SAGEMAKER_TRITON_DEFAULT_MODEL_NAME: the model; default false)")
    serve.add_argument("--sagemaker-port", type=int,
                       help="Triton's: the SageMaker routes' port (default 8080)")
    serve.add_argument("--sagemaker-address",
                       help="the address the SageMaker routes bind (default --http-address; "
                            "SageMaker needs 0.0.0.0)")
    serve.add_argument("--sagemaker-safe-port-range", metavar="LOW-HIGH",
                       help="Triton's: the ports other than --sagemaker-port must lie in it "
                            "(SageMaker's SAGEMAKER_SAFE_PORT_RANGE)")
    serve.add_argument("--metrics-interval-ms", type=int,
                       help="how often the CPU and GPU metrics are sampled (default 2000)")
    serve.add_argument("--metrics-config", action="append", metavar="SETTING=VALUE",
                       help="Triton's, repeated: summary_latencies=true (quantiles of each "
                            "stage's latency over the last 60 s), summary_quantiles="
                            "Q:ERROR,... (default " + DEFAULT_QUANTILES + "), "
                            "counter_latencies=false, histogram_latencies=true")
    serve.add_argument("--allow-model-upload", action="store_const", const=True,
                       help="with --model-control-mode explicit: a load may carry the model's "
                            "files (Triton's file:<version>/<name> load parameters), code the "
                            "server then runs: off by default")
    serve.add_argument("--allow-shared-memory", action="store_const", const=True,
                       help="let clients register system shared-memory regions (off by default)")
    serve.add_argument("--max-request-bytes", type=int,
                       help="largest request body, after decompression (default 64 MiB)")
    serve.add_argument("--host-pool-bytes", type=int,
                       help="bound on the host buffer pool: request bodies, batch staging, "
                            "outputs (default 1 GiB)")
    serve.add_argument("--response-cache-bytes", type=int,
                       help="size of the response cache for models whose config enables "
                            "response_cache (default 0: no cache)")
    serve.add_argument("--disable-auto-complete-config", action="store_const", const=True,
                       help="do not call Python models' auto_complete_config (as Triton's "
                            "option): their config.pbtxt must name inputs and outputs")
    serve.add_argument("--read-timeout-s", type=float,
                       help="answer a request whose bytes stop arriving for this long, "
                            "or whose headers (HTTP/1.1's, an HTTP/2 header block) take "
                            "longer to arrive (default 30)")
    serve.add_argument("--keep-alive-timeout-s", type=float,
                       help="close an HTTP/1.1 connection idle this long (default 75)")
    serve.add_argument("--max-connections", type=int,
                       help="client connections open at once, HTTP and gRPC together; past "
                            "it new ones are refused (default 4096)")
    serve.add_argument("--grpc-max-connection-age", dest="grpc_max_connection_age_ms",
                       type=int, metavar="MS",
                       help="Triton's: send a gRPC connection GOAWAY after this long (±10 %%), "
                            "its client's next calls on a new connection (default: never)")
    serve.add_argument("--grpc-max-connection-age-grace",
                       dest="grpc_max_connection_age_grace_ms", type=int, metavar="MS",
                       help="Triton's: how long the calls open then may take before the "
                            "connection is closed with them (default: no bound)")
    serve.add_argument("--grpc-keepalive-time", dest="grpc_keepalive_time_ms", type=int,
                       metavar="MS", help="Triton's: PING a gRPC connection that has read "
                                          "nothing this long (default 7200000)")
    serve.add_argument("--grpc-keepalive-timeout", dest="grpc_keepalive_timeout_ms", type=int,
                       metavar="MS", help="Triton's: close it if the PING is not answered "
                                          "this soon (default 20000)")
    serve.add_argument("--grpc-keepalive-permit-without-calls", metavar="BOOL",
                       help="Triton's: PING connections with no call open too (default false)")
    serve.add_argument("--grpc-http2-max-pings-without-data", type=int, metavar="N",
                       help="Triton's: at most N PINGs with no response sent between them (0: "
                            "no bound; default 2)")
    serve.add_argument("--grpc-http2-min-recv-ping-interval-without-data",
                       dest="grpc_http2_min_recv_ping_interval_without_data_ms", type=int,
                       metavar="MS", help="Triton's: a client's PING sooner than this after "
                                          "its last, with no data between, is a strike "
                                          "(default 300000; 2 h while no call is open, "
                                          "unless permitted without calls)")
    serve.add_argument("--grpc-http2-max-ping-strikes", type=int, metavar="N",
                       help="Triton's: past N strikes the connection is told GOAWAY "
                            "too_many_pings and closed (0: no bound; default 2)")
    serve.add_argument("--grpc-flood-probation-s", type=float, metavar="S",
                       help="for this long after a client address's gRPC connection was "
                            "ended for flooding, its new connections start on probation, "
                            "paced together (0: never; default 60)")
    serve.add_argument("--grpc-infer-response-compression-level", metavar="LEVEL",
                       help="Triton's: compress inference answers for gRPC clients that "
                            "accept it: none, low (gzip), medium or high (deflate) (default "
                            "none)")
    serve.add_argument("--http-header-forward-pattern",
                       help="regular expression: HTTP headers whose name it matches reach "
                            "the model as request parameters (default: none)")
    serve.add_argument("--grpc-header-forward-pattern",
                       help="regular expression: gRPC metadata whose name it matches reach "
                            "the model as request parameters (default: none)")
    serve.add_argument("--http-restricted-api", action="append", metavar="API[,API]:KEY=VALUE",
                       help="serve these APIs (health, metadata, inference, shared-memory, "
                            "model-config, model-repository, statistics, trace, logging) over "
                            "HTTP only to requests with header KEY: VALUE (repeatable)")
    serve.add_argument("--grpc-restricted-protocol", dest="grpc_restricted_api",
                       action="append", metavar="API[,API]:KEY=VALUE",
                       help="the same over gRPC, the metadata being "
                            "triton-grpc-protocol-KEY: VALUE (repeatable)")
    serve.add_argument("--grpc-use-ssl", metavar="BOOL", nargs="?", const="true",
                       help="Triton's: serve gRPC over TLS with --grpc-server-cert and "
                            "--grpc-server-key (default false)")
    serve.add_argument("--grpc-use-ssl-mutual", metavar="BOOL", nargs="?", const="true",
                       help="Triton's: TLS, and every client must present a certificate "
                            "signed by --grpc-root-cert (default false)")
    for name, what in (("server-cert", "the server's certificate chain"),
                       ("server-key", "the server's private key, without a passphrase"),
                       ("root-cert", "the root certificate that signs clients' "
                                     "certificates, for --grpc-use-ssl-mutual")):
        serve.add_argument(f"--grpc-{name}", type=pathlib.Path, metavar="PEM_FILE",
                           help=f"Triton's: {what}")
    serve.add_argument("--trace-config", action="append", metavar="[MODE,]SETTING=VALUE",
                       help="Triton's tracing settings, repeated: level=TIMESTAMPS|TENSORS|OFF, "
                            "rate=N (one request in N), count=N (-1: no end), "
                            "triton,file=PATH, triton,log-frequency=N (a file each N traces); "
                            "mode=opentelemetry with opentelemetry,url=HOST:PORT/PATH, "
                            "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_max_queue_size"
                            "=N, opentelemetry,bsp_schedule_delay=MS, "
                            "opentelemetry,bsp_max_export_batch_size=N")
    for flag, setting in OLD_TRACE_FLAGS.items():
        serve.add_argument(f"--{flag}", dest=old_trace_dest(flag), metavar="VALUE",
                           action="append" if flag == "trace-level" else "store",
                           help=f"Triton's deprecated form of --trace-config {setting}=VALUE")
    # Triton's names for what tensorgate already has, so that a tritonserver command line
    # carries over (tensorgate's own names above still work)
    serve.add_argument("--strict-readiness", metavar="BOOL",
                       help="ready only while every model it tried to load serves "
                            "(default true)")
    serve.add_argument("--reuse-http-port", metavar="BOOL",
                       help="listen with SO_REUSEPORT: servers started with it share the "
                            "HTTP port, the kernel spreading connections among them (each "
                            "keeps its own models, statistics and metrics port)")
    serve.add_argument("--reuse-grpc-port", metavar="BOOL",
                       help="as --reuse-http-port, for the gRPC port")
    serve.add_argument("--exit-on-error", metavar="BOOL",
                       help="exit if a model fails to load at start (default false; "
                            "Triton's is true)")
    serve.add_argument("--exit-timeout-secs", dest="drain_timeout_s", type=float,
                       help="how long shutdown waits for requests in flight (default 10)")
    serve.add_argument("--strict-model-config", metavar="BOOL",
                       help="Triton's older name: true is --disable-auto-complete-config")
    serve.add_argument("--log-verbose", type=int, metavar="N",
                       help="Triton's: above 0 logs at DEBUG (unless --log-level says)")
    serve.add_argument("--cache-config", metavar="local,size=BYTES",
                       help="Triton's: the response cache's size (--response-cache-bytes)")
    serve.add_argument("--http-max-input-size", type=int, metavar="BYTES",
                       help="Triton's name for --max-request-bytes")
    serve.add_argument("--response-cache-byte-size", type=int, metavar="BYTES",
                       help="Triton's older name for --response-cache-bytes")
    serve.add_argument("--log-file", type=pathlib.Path,
                       help="Triton's: write the log to this file instead of stderr")
    for severity in ("info", "warning", "error"):
        serve.add_argument(f"--log-{severity}", metavar="BOOL",
                           help=f"Triton's: log {severity} messages (default true)")
    serve.add_argument("--log-format", choices=["default", "ISO8601"],
                       help="Triton's: how log lines write the time")
    serve.add_argument("--id", dest="server_id",
                       help="Triton's: the server's name in its metadata (default tensorgate)")
    for flag, why in NO_EFFECT.items():
        serve.add_argument(f"--{flag}", dest=no_effect_dest(flag), metavar="VALUE",
                           help=f"Triton's, taken and not acted on: {why}")
    for flag, why in REFUSED.items():
        serve.add_argument(f"--{flag}", dest=refused_dest(flag), metavar="VALUE",
                           help=f"Triton's, refused unless false: {why}")
    serve.add_argument("--model-call-warn-secs", dest="model_call_warn_s", type=float,
                       help="log a warning when one call into a model (a batch's forward, a "
                            "Python model's execute) has run this long (default 60; 0: never)")
    serve.add_argument("--loop", choices=["auto", "asyncio", "uvloop"])
    serve.add_argument("--placement", choices=["auto", "none"])
    serve.add_argument("--log-level")
    check = commands.add_parser("check", help="load a model repository as serve would, say "
                                              "which models are ready and why the others are "
                                              "not, and exit (1 if any is not)")
    check.add_argument("--model-repository", "--model-store", type=pathlib.Path,
                       action="append", default=[],
                       help="a Triton-layout repository (default: the built-in one); repeat "
                            "it for several")
    check.add_argument("--model-config-name", metavar="NAME",
                       help="each model's configs/NAME.pbtxt is its config where it has one")
    check.add_argument("--load-model", dest="load_models", action="append", default=[],
                       help="a model to check (repeat it; default: every model)")
    check.add_argument("--placement", choices=["auto", "none"], default="auto")
    check.add_argument("--disable-auto-complete-config", action="store_true")
    return parser


def serve_config(args: dict[str, object],
                 environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The configuration `serve` runs with, from its parsed arguments (`args` is consumed)
    and TENSORGATE_* variables (`environ`, default the process's); ValueError names what is
    wrong. The repository folders are not looked at (a deployment's manifest is checked
    where they do not exist: tests/deploy)."""
    no_effect(args)  # Triton's flags that change nothing, taken out (main has said which)
    args.update(trace_settings(old_trace_flags(args)
                               + cast(list[str], args.pop("trace_config") or [])))
    args.update(metrics_settings(cast(list[str], args.pop("metrics_config") or [])))
    args.update(triton_settings(args))
    for name in ("http_restricted_api", "grpc_restricted_api"):
        if args[name] is not None:
            args[name] = ";".join(cast(list[str], args[name]))
    return ServerConfig.from_env(environ, **args)


def parse_serve(argv: list[str], environ: Mapping[str, str] | None = None) -> ServerConfig:
    """`serve_config` of a `tensorgate serve ...` command line (argv without the program's
    name, starting with "serve"); argparse's own errors exit as on the command line."""
    args = vars(_parser().parse_args(argv))
    if args.pop("command") != "serve":
        raise ValueError(f"not a serve command line: {argv}")
    return serve_config(args, environ)


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    command = args.pop("command")
    if command == "check":
        from tensorgate.check import check_repository
        try:  # the repositories serve would read: the flags, else TENSORGATE_* variables
            settings = ServerConfig.from_env(model_repository=args["model_repository"] or None,
                                             model_config_name=args["model_config_name"])
            check_repository_folders(settings.model_repository)
        except ValueError as error:
            print(f"tensorgate: {error}", file=sys.stderr)
            return 2
        return check_repository(settings.model_repository, args["load_models"],
                                args["placement"], not args["disable_auto_complete_config"],
                                config_name=settings.model_config_name)
    if command == "serve":
        from tensorgate.server import run
        ignored = no_effect(args)
        if ignored:
            print("tensorgate: Triton's flags taken and not acted on: " + "; ".join(ignored),
                  file=sys.stderr)
        try:
            config = serve_config(args)
            check_repository_folders(config.model_repository)
        except ValueError as error:
            print(f"tensorgate: {error}", file=sys.stderr)
            return 2
        run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
