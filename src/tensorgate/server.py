"""The composition root: builds engine, data plane and front ends; starts and stops them in
stages.

Start: settle process-wide knobs (switch interval), open the model repository, listen (live
from here on), then load and warm every model (ready once all have: a request for a model
still loading is answered that it is). Stop (Ctrl-C / SIGTERM / `stop()`): stop accepting
connections, drain in-flight work within the deadline, answer what could not finish, close
connections, release the models and the device.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from tensorgate.builtin.repository import default_repository
from tensorgate.config import ServerConfig
from tensorgate.dataplane import DataPlane
from tensorgate.host_metrics import HostSampler
from tensorgate.network import ConnectionBudget, PoolRelief
from tensorgate.network.grpc import GrpcFrontEnd
from tensorgate.metrics import LatencyMetrics, render_metrics
from tensorgate.network.http import HttpFrontEnd
from tensorgate.network.sagemaker_routes import sagemaker_routes
from tensorgate.network.metrics_http import MetricsFrontEnd
from tensorgate.log_settings import LOG_LINE, LogSettings
from tensorgate.protocol.restricted import GRPC_PREFIX, parse_restrictions
from tensorgate.tracing import Tracer
from tensorgate.network.loop import run_loop
from tensorgate.pipeline.cpu_quota import cgroup_cpu_limit, usable_cpus
from tensorgate.pipeline.engine import Engine
from tensorgate.pipeline.placement import thread_cpus
from tensorgate.pipeline.rate_limiter import RateLimiter, parse_resource_counts
from tensorgate.pipeline.summary import parse_quantiles
from tensorgate.repository.layout import ModelRepositories
from tensorgate.server_parts import (StartupError, fit_open_files, grace_s, grpc_tls, keepalive,
                                     pattern, sagemaker_model, span_exporter)
from tensorgate.server_tasks import (expire_stalled, fingerprints, follow_repository,
                                     gpu_sampler, sample_every, trim_when_quiet,
                                     watch_model_calls)
from tensorgate.tensor.pool import default_pool

__all__ = ["LoadsAbandoned", "Server", "StartupError", "run"]

log = logging.getLogger("tensorgate.server")


class LoadsAbandoned(Exception):
    """`serve` was told to stop while models loaded: it stopped, and loads still run."""


class Server:
    """One tensorgate server; `await start()`, then `await stop()`."""

    def __init__(self, config: ServerConfig, version: str = "") -> None:
        from tensorgate import __version__
        self.config = config
        self.version = version or __version__
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        # what /v2/logging reads and changes; `run` attaches it to the handlers it sets up
        self.log_settings = LogSettings(config.log_level, log_file=str(config.log_file or ""))
        self.log_settings.update({  # Triton's --log-info/-warning/-error narrow the level
            "log_info": self.log_settings.log_info and config.log_info,
            "log_warning": self.log_settings.log_warning and config.log_warning,
            "log_error": self.log_settings.log_error and config.log_error,
            "log_format": config.log_format})
        # what /v2/trace/setting reads and changes; it writes the traces (or sends them)
        self.tracer = Tracer(config.trace_file, config.trace_level, config.trace_rate,
                             config.trace_count, config.trace_log_frequency,
                             span_exporter(config, self.version))
        self._grpc: GrpcFrontEnd | None = None
        self._metrics: MetricsFrontEnd | None = None
        self._stopping: asyncio.Event | None = None
        self.engine: Engine | None = None
        self._http: HttpFrontEnd | None = None
        self._sagemaker: HttpFrontEnd | None = None  # SageMaker's routes, on a port of their own
        self.sagemaker_port = 0
        self._pool_trimmer: asyncio.Task[None] | None = None
        self._expirer: asyncio.Task[None] | None = None
        self._call_watch: asyncio.Task[None] | None = None
        self._host_sampler: asyncio.Task[None] | None = None
        self._gpu_sampler: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        config = self.config
        # Threads hand the GIL over every 0.5 ms instead of CPython's 5 ms: the executor
        # waits less behind a busy loop (resnet50 P99 ratio 1.39 → 1.13, bench/RESULTS.md).
        sys.setswitchinterval(config.switch_interval_s)
        repositories = ModelRepositories.of(config.model_repository or default_repository(),
                                            config.model_config_name)
        tls = grpc_tls(config) if config.allow_grpc else None  # before loading any model
        sagemaker = None  # /invocations' model (a multi-model endpoint's: none, "")
        if config.allow_sagemaker:
            sagemaker = "" if config.sagemaker_multi_model else \
                await asyncio.get_running_loop().run_in_executor(
                    None, sagemaker_model, config.sagemaker_model, repositories)
        age_s = config.grpc_max_connection_age_ms / 1000
        default_pool().set_limit(config.host_pool_bytes)
        self.engine = Engine(repositories, placement=config.placement,
                             response_cache_bytes=config.response_cache_bytes,
                             auto_complete=not config.disable_auto_complete_config,
                             model_control=config.model_control_mode == "explicit",
                             model_upload=config.allow_model_upload,
                             load_retries=config.model_load_retry_count,
                             load_threads=config.model_load_thread_count,
                             latency_summaries=(config.allow_metrics
                                                and config.metrics_summary_latencies),
                             rate_limiter=RateLimiter(parse_resource_counts(
                                 config.rate_limit_resources))
                             if config.rate_limit == "execution_count" else None)
        dataplane = DataPlane(self.engine, self.version, config.allow_shared_memory,
                              config.model_control_mode, self.log_settings, self.tracer,
                              config.strict_readiness, config.server_id)
        budget = ConnectionBudget(fit_open_files(config.max_connections),
                                  config.grpc_flood_probation_s)
        relief = PoolRelief(config.read_timeout_s)  # slow bodies of either give way
        if config.allow_http:
            self._http = HttpFrontEnd(dataplane, default_pool(), config.max_request_bytes,
                                      config.read_timeout_s, config.keep_alive_timeout_s,
                                      budget, pattern(config.http_header_forward_pattern),
                                      parse_restrictions(config.http_restricted_api), relief)
        if sagemaker is not None:
            self._sagemaker = HttpFrontEnd(
                dataplane, default_pool(), config.max_request_bytes, config.read_timeout_s,
                config.keep_alive_timeout_s, budget, pattern(config.http_header_forward_pattern),
                parse_restrictions(config.http_restricted_api), relief,
                sagemaker_routes(sagemaker, config.sagemaker_inference_type,
                                 config.sagemaker_ping_mode, config.sagemaker_models_root
                                 if config.sagemaker_multi_model else None))
        if config.allow_grpc:
            self._grpc = GrpcFrontEnd(dataplane, default_pool(), config.max_request_bytes,
                                      config.read_timeout_s, budget,
                                      pattern(config.grpc_header_forward_pattern),
                                      parse_restrictions(config.grpc_restricted_api,
                                                         GRPC_PREFIX), tls, relief,
                                      age_s, grace_s(config.grpc_max_connection_age_grace_ms),
                                      keepalive(config),
                                      config.grpc_infer_response_compression_level)
        polling = config.model_control_mode == "poll"
        seen = await fingerprints(repositories) if polling else None  # before loading
        explicit = config.model_control_mode == "explicit"
        # Listen first, then load: live at once (a liveness probe does not fail a slow load),
        # ready once every model has loaded; a request for a model still loading is told so, one
        # for a model already loaded is served. A port another process holds fails the start
        # before any load.
        loading = self.engine.announce(config.load_models if explicit
                                       and config.load_models != ("*",) else None)
        binding = "HTTP", config.http_address, config.http_port, "--http-port"
        try:  # a port another process holds is a line saying so, not a traceback
            if self._http is not None:
                self.http_port = await self._http.start(config.http_address, config.http_port,
                                                        reuse_port=config.reuse_http_port)
            binding = ("SageMaker", config.sagemaker_address, config.sagemaker_port,
                       "--sagemaker-port")
            if self._sagemaker is not None:
                self.sagemaker_port = await self._sagemaker.start(config.sagemaker_address,
                                                                  config.sagemaker_port)
            binding = "gRPC", config.grpc_address, config.grpc_port, "--grpc-port"
            if self._grpc is not None:
                self.grpc_port = await self._grpc.start(config.grpc_address, config.grpc_port,
                                                        reuse_port=config.reuse_grpc_port)
            binding = "metrics", config.metrics_address, config.metrics_port, "--metrics-port"
            if config.allow_metrics:
                await self._start_metrics(budget)
        except OSError as error:
            await self.stop()  # the front ends that did start, and the engine
            what, address, port, flag = binding
            raise StartupError(f"cannot listen for {what} on {address} port {port}: "
                               f"{os.strerror(error.errno) if error.errno else error} "
                               f"(change {flag}, or stop what holds it)") from None
        period = min(1.0, config.read_timeout_s / 4, config.keep_alive_timeout_s / 4,
                     max(age_s / 4, 0.05) if age_s else 1.0,  # (a few checks within an age)
                     max(min(config.grpc_keepalive_time_ms,
                             config.grpc_keepalive_timeout_ms) / 4000, 0.05))
        self._expirer = asyncio.create_task(expire_stalled(self.front_ends(), period))
        print(f"tensorgate {self.version}: {self._listening()}; "
              f"repositor{'ies' if len(repositories.paths) > 1 else 'y'} {repositories}",
              flush=True)
        print(f"loading: {', '.join(loading) or 'no models'} (live now, ready when loaded)",
              flush=True)
        await self.engine.start()
        if not self.engine.is_serving():
            return  # stopped while the models loaded (serve)
        unavailable = self.engine.unavailable()
        if unavailable and config.exit_on_error:
            await self.stop()
            raise StartupError("models failed to load (--exit-on-error): " + "; ".join(
                f"{name}: {reason}" for name, reason in sorted(unavailable.items())))
        dataplane.started = True
        if not default_pool().statistics().pinned:
            self._pool_trimmer = asyncio.create_task(trim_when_quiet(default_pool()))
        if config.model_call_warn_s > 0:
            self._call_watch = asyncio.create_task(watch_model_calls(
                self.engine, config.model_call_warn_s))
        if polling:
            self._poller = asyncio.create_task(follow_repository(
                self.engine, seen or {}, config.repository_poll_s))
        if self._stopping is None:  # (serve makes it first, to hear a stop while loading)
            self._stopping = asyncio.Event()
        ready = [f"{e['name']} v{e['version']}" for e in self.engine.index()
                 if e.get("state") == "READY"]
        failed = [f"{e['name']} ({e['reason']})" for e in self.engine.index()
                  if e.get("state") == "UNAVAILABLE"]  # not those it was not asked to load
        print(f"ready: {', '.join(ready) or 'no models'}", flush=True)
        if failed:
            print(f"not ready: {'; '.join(failed)}", flush=True)
        print(f"connections: at most {budget.limit} (--max-connections)", flush=True)
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        print(f"event loop: {'uvloop' if loop == 'uvloop' else 'asyncio'} (--loop)", flush=True)
        quota = cgroup_cpu_limit()
        if quota is not None:
            print(f"CPUs: {usable_cpus(len(thread_cpus()))} usable (cgroup CPU quota "
                  f"{quota:g}); torch's intra-op threads and the placement count those",
                  flush=True)
        if tls is not None:
            print("gRPC TLS: " + (f"mutual (clients' certificates checked against "
                                  f"{config.grpc_root_cert})" if config.grpc_use_ssl_mutual
                                  else "server certificate only") + f"; certificate "
                  f"{config.grpc_server_cert}", flush=True)
        print(f"model control: {config.model_control_mode}"
              + (f" (every {config.repository_poll_s:g} s)"
                 if config.model_control_mode == "poll" else "")
              + ("; model upload allowed (--allow-model-upload: any client that reaches the "
                 "API can run code here)" if config.allow_model_upload else ""), flush=True)
        if config.rate_limit != "off":
            given = ", ".join(config.rate_limit_resources)
            print(f"rate limit: {config.rate_limit} (resources: "
                  f"{given or 'the most one instance needs'})", flush=True)
        print(f"system shared memory: "
              f"{'allowed' if config.allow_shared_memory else 'off (--allow-shared-memory)'}",
              flush=True)
        for front, text in (("HTTP", config.http_restricted_api),
                            ("gRPC", config.grpc_restricted_api)):
            if text:
                groups = parse_restrictions(text)
                print(f"{front} restricted APIs: {', '.join(groups)} (need a header)",
                      flush=True)
        print("trace: " + (f"{'+'.join(config.trace_level)}, one request in "
                           f"{config.trace_rate}, to {config.trace_file}"
                           if config.trace_level else
                           f"off; settable over the API, to {config.trace_file}"
                           if config.trace_file else "off (--trace-config triton,file=PATH)"),
              flush=True)

    def front_ends(self) -> list[HttpFrontEnd | GrpcFrontEnd]:
        """The front ends clients connect to (HTTP, SageMaker's, gRPC), those started: their
        connection budgets say what is open (the expiry sweep, tools/fuzz_front_ends.py)."""
        return [front for front in (self._http, self._sagemaker, self._grpc)
                if front is not None]

    def _listening(self) -> str:
        """Where each front end listens, or that it is off."""
        config = self.config
        fronts = [("HTTP", config.allow_http, config.http_address, self.http_port),
                  ("gRPC", config.allow_grpc, config.grpc_address, self.grpc_port),
                  ("metrics", config.allow_metrics, config.metrics_address, self.metrics_port)]
        if config.allow_sagemaker:  # (named only where asked for)
            fronts.append(("SageMaker", True, config.sagemaker_address, self.sagemaker_port))
        return ", ".join(
            f"{name} on {f'[{address}]' if ':' in address else address}:{port}" if on
            else f"{name} off"  # an IPv6 address in brackets, as a URL has it
            for name, on, address, port in fronts)

    async def stop(self) -> None:
        if self._pool_trimmer is not None:
            self._pool_trimmer.cancel()
        if self._expirer is not None:
            self._expirer.cancel()
        if self._call_watch is not None:
            self._call_watch.cancel()
        if self._host_sampler is not None:
            self._host_sampler.cancel()
        if self._gpu_sampler is not None:
            self._gpu_sampler.cancel()
        if self._poller is not None:
            self._poller.cancel()
        https = [front for front in (self._http, self._sagemaker) if front is not None]
        for http in https:
            http.stop_accepting()                     # 1. no new connections or calls
        if self._grpc is not None:
            self._grpc.stop_accepting()
        if self.engine is not None:                   # 2-3. drain, answer the rest, unload
            await self.engine.shutdown(self.config.drain_timeout_s)
        for http in https:                            # 4. close idle connections
            await http.close()
        if self._grpc is not None:
            await self._grpc.stop(grace_s=1.0)
        if self._metrics is not None:
            await self._metrics.close()
        await self.tracer.close(self.config.drain_timeout_s)  # 5. write the traces held

    async def _start_metrics(self, budget: ConnectionBudget) -> None:
        """The metrics port, and the CPU sampler behind Triton's nv_cpu_* when allowed."""
        config, engine = self.config, self.engine
        assert engine is not None
        tracer = (self.tracer if config.trace_file is not None
                  or config.trace_mode == "opentelemetry" else None)
        loop = asyncio.get_running_loop()
        period_s = config.metrics_interval_ms / 1000
        host = HostSampler() if config.allow_cpu_metrics else None
        if host is not None:
            await loop.run_in_executor(None, host.sample)
            self._host_sampler = asyncio.create_task(sample_every(host.sample, period_s))
        gpus = await loop.run_in_executor(None, gpu_sampler) \
            if config.allow_gpu_metrics else None
        if gpus is not None:
            self._gpu_sampler = asyncio.create_task(sample_every(gpus.sample, period_s))
        latencies = LatencyMetrics(
            config.metrics_counter_latencies,
            parse_quantiles(config.metrics_summary_quantiles)
            if config.metrics_summary_latencies else (),
            config.metrics_histogram_latencies)
        self._metrics = MetricsFrontEnd(lambda: render_metrics(
            engine.model_statistics(), engine.pool_statistics(),
            (budget.open, budget.refused, budget.floods, budget.retired, budget.unanswered,
             budget.probation),
            engine.cache_statistics(),
            tracer.statistics() if tracer is not None else None,
            host.last if host is not None else None, latencies,
            gpus.last if gpus is not None else (), engine.model_calls()),
            config.read_timeout_s)
        self.metrics_port = await self._metrics.start(config.metrics_address,
                                                      config.metrics_port)

    def request_stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    async def serve(self) -> None:
        """Start, wait for SIGINT/SIGTERM (or `request_stop`), then stop in stages. A stop
        while the models load stops the same way (the models already loaded drain), then
        raises LoadsAbandoned: a load under way cannot be cut short, and the caller need not
        wait for it (`run` exits)."""
        self._stopping = stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        starting = asyncio.ensure_future(self.start())
        asked = asyncio.ensure_future(stopping.wait())
        await asyncio.wait((starting, asked), return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            print("tensorgate: stopping while models load (draining in-flight requests; "
                  "the loads under way are abandoned)", flush=True)
            await self.stop()
            raise LoadsAbandoned
        if starting.exception() is not None:
            asked.cancel()
        starting.result()  # a StartupError goes to the caller
        await asked
        print("tensorgate: stopping (draining in-flight requests)", flush=True)
        await self.stop()


async def _serve_or_exit(server: Server) -> None:
    """`server.serve()`; stopped while models loaded, the process exits there, its output
    flushed: the loop's end would wait for the loads' threads (minutes for a large model)."""
    try:
        await server.serve()
    except LoadsAbandoned:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run(config: ServerConfig) -> None:
    """Run a server until it is told to stop (the CLI's entry point)."""
    logging.basicConfig(level=config.log_level.upper(), format=LOG_LINE,
                        filename=config.log_file)
    server = Server(config)
    server.log_settings.attach(logging.getLogger().handlers)
    try:
        run_loop(_serve_or_exit(server), config.loop)
    except StartupError as error:
        log.error("%s", error)
        sys.exit(1)
