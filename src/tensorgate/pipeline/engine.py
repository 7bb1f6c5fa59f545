"""The Engine: models from a repository, served in-process through the pipeline.

    engine = Engine("/models")
    await engine.start()                                  # load, warm, then gc.freeze()
    result = await engine.infer(InferenceRequest("resnet50", {"INPUT__0": view}))
    result.outputs["OUTPUT__0"].torch()
    await engine.shutdown()                               # staged: stop, drain, answer, unload

All public methods run on the event loop and never block it: loading and inference happen on
executor threads, and their results come back through the loop's mailbox
(pipeline/handoff.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import pathlib
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from typing import Any

from tensorgate.errors import InvalidArgumentError, TensorgateError, UnavailableError
from tensorgate import python_backend_server
from tensorgate.model import Parameter
from tensorgate.pipeline.auto_complete import complete_config
from tensorgate.pipeline.bls import BlsBridge, ModelControl
from tensorgate.pipeline.executor import default_intra_op_threads
from tensorgate.pipeline.loop_load import LoopLoad
from tensorgate.pipeline.model_loader import ModelLoader
from tensorgate.pipeline.placement import (pin_current_thread, plan_placement,
                                           unpin_current_thread)
from tensorgate.pipeline.postprocess_pool import PostprocessPool
from tensorgate.pipeline.rate_limiter import RateLimiter
from tensorgate.pipeline.requests import (InferenceRequest, InferenceResult, strings_aside,
                                         work_item)
from tensorgate.pipeline.response_cache import CacheStatistics, ResponseCache
from tensorgate.pipeline.served_models import ServedModels
from tensorgate.pipeline.stats import ModelCall, ModelStatistics, StageTimes
from tensorgate.pipeline.step_requests import StepRequests
from tensorgate.pipeline.version_instances import VersionInstances
from tensorgate.repository.layout import ModelRepositories
from tensorgate.repository.model_config import ModelSpec
from tensorgate.repository.upload import UploadedFiles, remove_upload
from tensorgate.tensor.pool import BufferPool, PoolStatistics, default_pool
from tensorgate.tensor.view import TensorView

__all__ = ["Engine", "InferenceRequest", "InferenceResult"]

log = logging.getLogger("tensorgate.engine")

class Engine:
    """Loads models from Triton-layout repositories and runs inference on them."""

    def __init__(self, repository: str | pathlib.Path | Iterable[str | pathlib.Path]
                 | ModelRepositories, *,
                 pool: BufferPool | None = None,
                 intra_op_threads: int | None = None, postprocess_workers: int = 2,
                 device: str = "auto", placement: str = "none",
                 response_cache_bytes: int = 0, auto_complete: bool = True,
                 model_control: bool = False, latency_summaries: bool = False,
                 rate_limiter: RateLimiter | None = None, model_upload: bool = False,
                 load_retries: int = 0, load_threads: int = 4) -> None:
        """`repository`: one folder or several, whose models share one namespace, or
        ModelRepositories (one with a config name: --model-config-name).
        `placement="auto"` pins the thread that calls `start` (the loop's) to the first CPU until
        `shutdown` and places executors by cost (see pipeline/placement.py); "none" pins nothing.
        `response_cache_bytes` > 0: models with `response_cache { enable: true }` answer
        repeated requests from a cache of that size (pipeline/response_cache.py).
        `auto_complete`: Triton Python models' `auto_complete_config` completes their
        config (pipeline/auto_complete.py). `model_control`: Triton Python models may load
        and unload models (`pb_utils.load_model`; --model-control-mode explicit).
        `latency_summaries`: each version keeps the quantile summaries of its latencies
        (--metrics-config summary_latencies=true; pipeline/summary.py). `rate_limiter`:
        instances run only while they hold their instance group's rate_limiter resources
        (--rate-limit execution_count; pipeline/rate_limiter.py). `model_upload`: a load
        may carry the model's files (--allow-model-upload; repository/upload.py).
        `load_retries`: a load that fails is tried again this many times (Triton's
        --model-load-retry-count: a file system or a device that failed for a moment).
        `load_threads` > 0: at most that many of the models `start` loads load at once
        (Triton's --model-load-thread-count, whose default is ours); 0: all at once."""
        self.repositories = (repository if isinstance(repository, ModelRepositories)
                             else ModelRepositories.of(repository))
        self._model_control = model_control
        self._cache = ResponseCache(response_cache_bytes) if response_cache_bytes > 0 else None
        self._pool = pool or default_pool()
        self._placement = plan_placement(placement)
        compute = self._placement.compute_threads if self._placement else None
        # post-processing is the models' work: on their CPUs, where the placement has some
        placed = self._placement if self._placement and not self._placement.shared else None
        self._postprocess = PostprocessPool(postprocess_workers,
                                            placed.compute_cpus if placed else None)
        self._instances = VersionInstances(
            self._pool, self._postprocess, self._placement, rate_limiter, device,
            intra_op_threads or compute or default_intra_op_threads(), latency_summaries,
            LoopLoad())  # (LoopLoad: whether spares on the loop's core may run)
        self._served = ServedModels()
        self._closing = False
        self._streaming = 0  # infer_stream iterations open: whether responses take turns
        self._load_threads = load_threads
        self._loader = ModelLoader(
            self.repositories, self._served, self._instances,
            StepRequests(self.infer, self.infer_stream),  # (ensembles' steps)
            complete=complete_config if auto_complete else None,
            cached=self._cache is not None, summaries=latency_summaries,
            model_upload=model_upload, load_retries=load_retries,
            closing=lambda: self._closing)
        self._bls: BlsBridge | None = None
        self._announced: list[str] | None = None  # what the next `start` loads, announced
        self._pinned = False  # the loop's thread, pinned by `announce` until `shutdown`

    # -- lifecycle -------------------------------------------------------------------------

    def announce(self, models: Iterable[str] | None = None) -> list[str]:
        """What `start` does before its first load, for a server that listens while its
        models load (server.py): the BLS bridge, the loop's CPU, and every model to load
        counted as loading, so that a request for one is told it is loading rather than
        that no such model exists. Returns the names the next `start` loads (it calls this
        itself if the server did not)."""
        names = list(models) if models is not None else self.repositories.names()
        # Triton Python models' BLS requests come here (pipeline/bls.py)
        self._bls = BlsBridge(self.infer, self.infer_stream, asyncio.get_running_loop(),
                              ModelControl(self._model_control, self.load, self.unload,
                                           self.is_ready))
        python_backend_server.serve_bls(self._bls)
        if self._placement is not None and not self._pinned:
            pin_current_thread(self._placement.loop_cpus)
            self._pinned = True
        for name in names:
            self._served.count_loading(name)
        self._announced = names
        return names

    async def start(self, models: Iterable[str] | None = None) -> None:
        """Load `models` (default: every model of the repositories; those `announce` was
        given, if it was called), then freeze the GC heap."""
        names = self._announced if self._announced is not None else self.announce(models)
        self._announced = None
        # Ensembles after the models they chain, which they would otherwise load themselves
        # while the same models load here.
        ensembles = [n for n in names if self._loader.is_ensemble(n)]
        # An ensemble holding a slot never waits for one: the models it chains have loaded
        # (or load through `load`, which takes none), as do those a Python model's
        # initialize loads itself (pb_utils.load_model)
        slots = asyncio.Semaphore(self._load_threads) if self._load_threads else None
        for group in ([n for n in names if n not in ensembles], ensembles):
            results = await asyncio.gather(*(self._announced_load(n, slots) for n in group),
                                           return_exceptions=True)
            for name, result in zip(group, results):
                if isinstance(result, BaseException):
                    log.error("model %s failed to load: %s", name, result)
        # What loading made lives as long as the server: keep the collector from walking it.
        gc.collect()
        gc.freeze()

    async def _announced_load(self, name: str, slots: asyncio.Semaphore | None) -> None:
        """`load` for one of the models `announce` counted as loading: counted until done,
        waiting for one of `slots` first where there are some."""
        try:
            async with slots or contextlib.nullcontext():
                await self.load(name)
        finally:
            self._served.count_loaded(name)

    async def load(self, name: str, config: str | None = None,
                   files: UploadedFiles | None = None) -> None:
        """Load (or reload) model `name` from the repository; `config` (JSON) in place of its
        config.pbtxt. `files` (an upload: path in the model's folder → content; needs
        `config`) make the folder it loads from instead of the repository's, as Triton's
        override files do. Until the new load is ready the old one serves; if it fails, the
        old one goes on serving. A load goes on to its end when its caller is cancelled (a
        client that went away), as on Triton: nothing is left half done."""
        await self._loader.load(name, config, files)

    async def load_folder(self, name: str, folder: pathlib.Path) -> None:
        """Serve the model in `folder` (its config and version folders, anywhere) as `name`,
        whatever its config's name field says: SageMaker's multi-model endpoints load each
        model from where SageMaker unpacked it, by the name SageMaker gives it. Unloading
        it forgets the folder; the folder itself is left as it is."""
        await self._loader.load_folder(name, folder)

    async def unload(self, name: str, drain_timeout_s: float = 30.0,
                     dependents: bool = False) -> None:
        """Stop serving `name`: its requests drain, then its executors stop. A model whose
        load failed is forgotten (the repository index no longer lists its failure).
        `dependents` (Triton's unload_dependents): an ensemble's step models are unloaded
        too, each unless another loaded ensemble still calls it. A model that is not loaded
        is left as it is, without an error, as Triton does: a client's clean-up that unloads
        whatever it may have loaded is not refused for the ones it had not. Like a load, an
        unload goes on to its end when its caller is cancelled."""
        await self._loader.unload(name, drain_timeout_s, dependents)

    async def shutdown(self, drain_timeout_s: float = 10.0) -> None:
        """Stop accepting, drain within the deadline, answer the rest, unload everything, and
        give the loop's thread back the CPUs it had (an engine embedded in an application
        should not leave its thread pinned to one core)."""
        self._closing = True
        versions, uploads = self._served.withdraw_all()
        await self._instances.retire(versions, drain_timeout_s)
        for upload in uploads:
            await asyncio.get_running_loop().run_in_executor(None, remove_upload, upload)
        self._postprocess.shutdown()
        if self._bls is not None:
            python_backend_server.serve_bls(None, self._bls)
        if self._pinned:
            unpin_current_thread()
            self._pinned = False

    # -- queries ---------------------------------------------------------------------------

    @property
    def takes_uploads(self) -> bool:
        """Whether a load may carry the model's files (--allow-model-upload)."""
        return self._loader.model_upload

    def model_names(self) -> list[str]:
        return sorted(self._served.versions)

    def spec(self, name: str, version: int | None = None) -> ModelSpec:
        return self._served.spec(name, version)

    def versions(self, name: str) -> list[int]:
        return sorted(self._served.versions.get(name, {}))

    def is_serving(self) -> bool:
        return not self._closing

    def unavailable(self) -> dict[str, str]:
        """Models whose load failed and that serve no version, with the reason (a model
        whose reload failed while its old version serves is not among them)."""
        return self._served.unavailable()

    def label_lines(self, name: str, output: str) -> list[str]:
        """The lines of an output's `label_filename` as read at load, or [] without one."""
        return self._served.label_lines(name, output)

    def is_ready(self, name: str, version: int | None = None) -> bool:
        try:
            self._served.resolve(name, version)
        except TensorgateError:
            return False
        return not self._closing

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index: every model of the repositories and its state."""
        try:
            names = self.repositories.names()
        except TensorgateError:
            names = []
        return self._served.index(names)

    def statistics(self, name: str | None = None, version: int | None = None
                   ) -> list[dict[str, Any]]:
        """Triton's `model_stats` entries for one model (version) or all."""
        return self._served.statistics(name, version)

    def model_statistics(self) -> list[tuple[ModelStatistics, int]]:
        """Every loaded version's counters and its queued-request count (for metrics)."""
        return self._served.model_statistics()

    def model_calls(self) -> list[ModelCall]:
        """Each loaded instance's current call into its model (seconds 0.0: idle)."""
        return self._served.model_calls()

    def pool_statistics(self) -> PoolStatistics:
        """The host buffer pool's counters and bytes held (for metrics)."""
        return self._pool.statistics()

    def pending(self, name: str) -> int:
        return self._served.pending(name)

    def upload_folders(self) -> list[pathlib.Path]:
        """The folders of the models served from uploads (a load's files; each removed when
        its model goes): what of the temporary folder the server holds."""
        return list(self._served.uploads.values())

    # -- inference -------------------------------------------------------------------------

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        """Run one request through the batcher and an executor; raises TensorgateError."""
        if self._closing:
            raise UnavailableError("the server is shutting down; the request was not run")
        loaded = self._served.resolve(request.model, request.version)
        if loaded.spec.decoupled:
            raise InvalidArgumentError(
                f"model '{loaded.spec.name}' is decoupled (it sends any number of responses "
                "per request): call it on a stream, gRPC ModelStreamInfer (tritonclient's "
                "start_stream / async_stream_infer)")
        trace = request.trace
        if trace is not None:
            trace.begin(loaded.spec.name, loaded.version, request.id, request.inputs,
                        request.ledger)
        cache = self._cache if loaded.stats.cached else None
        if cache is not None:  # answered from the response cache when it was answered before
            started = time.monotonic_ns()
            key, outputs = cache.lookup(loaded.spec.name, loaded.load_id, request.inputs,
                                        request.outputs, request.parameters)
            if outputs is not None:
                times = StageTimes()
                times.total_ns = time.monotonic_ns() - started
                loaded.stats.record_cache_hit(times)
                if trace is not None:
                    trace.answered(outputs, request.ledger, end=True)
                return InferenceResult(loaded.spec.name, loaded.version, request.id, outputs,
                                       times, request.ledger)
            looked_up = time.monotonic_ns() - started
        try:
            item = work_item(loaded.spec, request, asyncio.get_running_loop(),
                             await strings_aside(request))
            if trace is not None:
                trace.stamp("QUEUE_START", item.enqueued_ns)
            loaded.scheduler.submit(item)
        except BaseException:
            if trace is not None:
                trace.stamp("REQUEST_END")
            raise
        try:
            # cancelling the caller cancels this future: the scheduler drops it
            results = await item.future
        except BaseException:
            # The error's traceback holds this frame, and the item's future the error: held
            # here, the item (and the request's buffers) would wait in that cycle for the GC.
            del item
            if trace is not None:
                trace.stamp("REQUEST_END")
            raise
        if cache is not None:
            kept = time.monotonic_ns()
            if not item.answer_parameters:  # the cache keeps outputs only
                cache.put(key, results, request.ledger)
            loaded.stats.cache_miss.add(looked_up + time.monotonic_ns() - kept)
        if trace is not None:
            trace.answered(results, request.ledger, end=True)
        return InferenceResult(loaded.spec.name, loaded.version, request.id, results,
                               item.times, item.ledger, item.answer_parameters)

    def cache_statistics(self) -> CacheStatistics | None:
        """The response cache's counters (for metrics); None without a cache."""
        return self._cache.statistics() if self._cache is not None else None

    def is_decoupled(self, name: str, version: int | None = None) -> bool:
        return self._served.resolve(name, version).spec.decoupled

    async def infer_stream(self, request: InferenceRequest
                           ) -> AsyncGenerator[InferenceResult, None]:
        """Run one request of a decoupled model: its responses, in the order the model made
        them, as they come. (A model that is not decoupled gives its one response.) Leaving
        the iteration early stops the model making more."""
        if self._closing:
            raise UnavailableError("the server is shutting down; the request was not run")
        loaded = self._served.resolve(request.model, request.version)
        if not loaded.spec.decoupled:
            yield await self.infer(request)
            return
        trace = request.trace
        if trace is not None:
            trace.begin(loaded.spec.name, loaded.version, request.id, request.inputs,
                        request.ledger)
        try:
            item = work_item(loaded.spec, request, asyncio.get_running_loop(),
                             await strings_aside(request))
        except BaseException:
            if trace is not None:
                trace.stamp("REQUEST_END")
            raise
        if trace is not None:
            trace.stamp("QUEUE_START", item.enqueued_ns)
        # each response, then None once the request is over (answered or failed)
        arrived: asyncio.Queue[tuple[dict[str, TensorView] | TensorgateError,
                                     Callable[[], None], Mapping[str, Parameter], bool] | None
                               ] = asyncio.Queue()
        item.respond = lambda outputs, taken, parameters, final: arrived.put_nowait(
            (outputs, taken, parameters, final))
        item.future.add_done_callback(lambda _: arrived.put_nowait(None))
        loaded.scheduler.submit(item)
        first = True
        self._streaming += 1
        try:
            while True:
                if arrived.empty():
                    response = await arrived.get()
                else:
                    # Responses made faster than they are sent: with other requests
                    # streaming, this one yields to them after each, so that theirs go out
                    # in turn and a new request's first response waits behind one of each,
                    # not behind all that they have queued (a flat-out token streamer at 8
                    # streams: first response P50 30–34 → 11–21 ms, bench/RESULTS.md).
                    if self._streaming > 1:
                        await asyncio.sleep(0)
                    response = arrived.get_nowait()
                if response is None:
                    break
                if first:  # time to first response: what a token streamer's users feel
                    loaded.stats.first_response_latency.add(time.monotonic_ns() - item.enqueued_ns)
                    first = False
                outputs, taken, parameters, final = response
                taken()
                if isinstance(outputs, TensorgateError):  # an error response, not the last
                    yield InferenceResult(loaded.spec.name, loaded.version, request.id, {},
                                          item.times, item.ledger, error=outputs)
                    continue
                if trace is not None:
                    trace.answered(outputs, request.ledger, end=False)
                yield InferenceResult(loaded.spec.name, loaded.version, request.id, outputs,
                                      item.times, item.ledger, parameters, final)
            item.future.result()  # the request's error, if it failed
        finally:
            self._streaming -= 1
            item.abandoned = True
            if not item.future.done():
                item.future.cancel()  # still queued: the scheduler drops it
            elif not item.future.cancelled():
                item.future.exception()  # (a failure its caller left before reading: not logged)
            if trace is not None:
                trace.stamp("REQUEST_END")
            del item  # (as in infer: the error raised here must not lead back to it)

