"""The Engine: models from a repository, served in-process through the pipeline.

    engine = Engine("/models")
    await engine.start()                                  # load, warm, then gc.freeze()
    result = await engine.infer(InferenceRequest("resnet50", {"INPUT__0": view}))
    result.outputs["OUTPUT__0"].torch()
    await engine.shutdown()                               # staged: stop, drain, answer, unload

All public methods run on the event loop and never block it: loading and inference happen on
executor threads, and their results come back through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import pathlib
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Mapping
from typing import Any

from tensorgate.errors import (InvalidArgumentError, NotFoundError, TensorgateError,
                               UnavailableError)
from tensorgate import python_backend
from tensorgate.model import Parameter
from tensorgate.pipeline.auto_complete import complete_config
from tensorgate.pipeline.bls import BlsBridge, ModelControl
from tensorgate.pipeline.ensemble import (EnsembleScheduler, check_step_models,
                                          decoupled_ensemble, ensemble_steps)
from tensorgate.pipeline.executor import default_intra_op_threads
from tensorgate.pipeline.model_options import unused_settings
from tensorgate.pipeline.loop_load import LoopLoad
from tensorgate.pipeline.placement import (pin_current_thread, plan_placement,
                                           unpin_current_thread)
from tensorgate.pipeline.postprocess_pool import PostprocessPool
from tensorgate.pipeline.rate_limiter import RateLimiter
from tensorgate.pipeline.requests import (InferenceRequest, InferenceResult, strings_aside,
                                         work_item)
from tensorgate.pipeline.response_cache import CacheStatistics, ResponseCache
from tensorgate.pipeline.served_config import served_ensemble
from tensorgate.pipeline.served_models import ServedModels, ServedVersion, step_models
from tensorgate.pipeline.stats import ModelCall, ModelStatistics, StageTimes
from tensorgate.pipeline.step_requests import StepRequests
from tensorgate.pipeline.version_instances import VersionInstances
from tensorgate.repository.layout import ModelRepositories, ModelSource, load_source
from tensorgate.repository.model_config import ModelConfigError, ModelSpec
from tensorgate.repository.upload import (UploadedFiles, link_folder, remove_upload,
                                          write_upload)
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
        self._complete = complete_config if auto_complete else None
        self._model_control = model_control
        self._summaries = latency_summaries
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
        self._ensembles_loading: set[str] = set()
        self._model_upload = model_upload
        self._load_retries = load_retries
        self._load_threads = load_threads
        self._steps = StepRequests(self.infer, self.infer_stream)  # ensembles' steps
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
        python_backend.serve_bls(self._bls)
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
        ensembles = [n for n in names if self._is_ensemble(n)]
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
        await _to_the_end(self._load_counted(name, config, files))

    async def load_folder(self, name: str, folder: pathlib.Path) -> None:
        """Serve the model in `folder` (its config and version folders, anywhere) as `name`,
        whatever its config's name field says: SageMaker's multi-model endpoints load each
        model from where SageMaker unpacked it, by the name SageMaker gives it. Unloading
        it forgets the folder; the folder itself is left as it is."""
        await _to_the_end(self._load_counted(name, None, None, folder))

    async def _load_counted(self, name: str, config: str | None,
                            files: UploadedFiles | None,
                            folder: pathlib.Path | None = None) -> None:
        """`_load`, counted as loading while it runs, tried again `load_retries` times
        when it fails (but for a NotFoundError: what is not there will not come)."""
        self._served.count_loading(name)
        try:
            for attempt in range(self._load_retries + 1):
                try:
                    await self._load(name, config, files, folder)
                    return
                except NotFoundError:
                    raise
                except Exception as error:
                    if attempt == self._load_retries or self._closing:
                        raise
                    log.warning("model %s: load %d of %d failed (%s); trying again "
                                "(--model-load-retry-count)", name, attempt + 1,
                                self._load_retries + 1,
                                error.message if isinstance(error, TensorgateError) else error)
        finally:
            self._served.count_loaded(name)

    async def _load(self, name: str, config: str | None,
                    files: UploadedFiles | None, folder: pathlib.Path | None = None) -> None:
        if self._closing:
            raise UnavailableError("the engine is shutting down; no models can be loaded")
        loop = asyncio.get_running_loop()
        upload = None  # a repository of the model's own, made here (removed with the model)
        if files is not None:
            self._check_upload(name, config, files)
            upload = await loop.run_in_executor(None, write_upload, name, files)
        elif folder is not None:
            upload = await loop.run_in_executor(None, link_folder, name, folder)
        versions: dict[int, ServedVersion] = {}
        source: ModelSource | None = None
        loading = ""  # the version being loaded
        try:
            # off the loop: completing a Python model's config runs its model.py
            source = await loop.run_in_executor(None, self._source, name, config, upload,
                                                folder is not None)
            if config is None and self.repositories.config_name:
                log.info("model %s: config from %s", name, source.config_source)
            for unused in unused_settings(source.spec, self._cache is not None):
                log.warning("model %s: %s", name, unused)
            for number in source.versions:
                loading = str(number)
                if source.spec.platform == "ensemble":
                    versions[number] = await self._load_ensemble(source, number,
                                                                 folder is not None)
                else:
                    versions[number] = await self._load_version(source, number)
            # read here, off the loop, not by the first classification request on it
            labels = await asyncio.get_running_loop().run_in_executor(
                None, _label_files, source.directory, source.spec)
        except Exception as error:
            if versions:  # the versions loaded before one failed are not served: stop them
                await self._instances.retire(versions.values(), drain_timeout_s=0.0)
            if upload is not None:
                await loop.run_in_executor(None, remove_upload, upload)
            if isinstance(error, NotFoundError) and not self._holds(name):
                raise  # a name the repository does not hold: nothing to list as failed
            if isinstance(error, TensorgateError):
                self._served.failed_load(name, loading, error.message)
                raise
            reason = f"{type(error).__name__}: {error}"
            self._served.failed_load(name, loading, reason)
            raise ModelConfigError(str(source.directory) if source else name,
                                   reason) from error
        if self._closing:  # shut down while this loaded: nothing is left to serve it
            await self._instances.retire(versions.values(), drain_timeout_s=0.0)
            if upload is not None:
                await loop.run_in_executor(None, remove_upload, upload)
            raise UnavailableError(f"model '{name}': the engine shut down while it loaded")
        old, old_upload = self._served.serve(name, versions, labels, upload)
        if old:
            await self._instances.retire(old.values(), drain_timeout_s=30.0)
        if old_upload is not None:
            await loop.run_in_executor(None, remove_upload, old_upload)

    def _check_upload(self, name: str, config: str | None, files: UploadedFiles) -> None:
        if not self._model_upload:
            raise InvalidArgumentError(
                f"load of model '{name}' with files: uploading model files is off (they are "
                "code the server runs); start the server with --allow-model-upload to take "
                "them, or put them in the model repository and load again")
        if config is None:
            raise InvalidArgumentError(
                f"load of model '{name}' with files: the load's 'config' parameter must give "
                "the model's config too (the uploaded files replace the model's folder)")
        if not files:
            raise InvalidArgumentError(f"load of model '{name}': an upload of no files")
        if "config.pbtxt" in files:
            log.warning("model %s: its uploaded config.pbtxt is not read: the load's 'config' "
                        "is its config (as on Triton)", name)

    def _source(self, name: str, config: str | None = None,
                upload: pathlib.Path | None = None, rename: bool = False) -> ModelSource:
        """Model `name`'s config and versions, from the repository that holds it (from
        `upload`, a folder write_upload or link_folder made, when given; `rename`: served
        as `name` whatever its config says)."""
        repository = upload if upload is not None else self.repositories.holder(name)
        return load_source(repository, name, config, self._complete,
                           self.repositories.config_name, rename)

    def _holds(self, name: str) -> bool:
        """Whether a repository holds a model `name` (or one was served by that name)."""
        if self._served.knows(name):
            return True
        try:
            return name in self.repositories.names()
        except TensorgateError:
            return False

    async def unload(self, name: str, drain_timeout_s: float = 30.0,
                     dependents: bool = False) -> None:
        """Stop serving `name`: its requests drain, then its executors stop. A model whose
        load failed is forgotten (the repository index no longer lists its failure).
        `dependents` (Triton's unload_dependents): an ensemble's step models are unloaded
        too, each unless another loaded ensemble still calls it. A model that is not loaded
        is left as it is, without an error, as Triton does: a client's clean-up that unloads
        whatever it may have loaded is not refused for the ones it had not. Like a load, an
        unload goes on to its end when its caller is cancelled."""
        await _to_the_end(self._unload(name, drain_timeout_s, dependents))

    async def _unload(self, name: str, drain_timeout_s: float, dependents: bool) -> None:
        versions, failed, upload = self._served.withdraw(name)
        if versions is None:
            if failed is None:
                log.info("unload %r: the model is not loaded; nothing to do", name)
            return
        await self._instances.retire(versions.values(), drain_timeout_s)
        if upload is not None:
            await asyncio.get_running_loop().run_in_executor(None, remove_upload, upload)
        if not dependents:
            return
        for model in sorted(step_models(versions.values())):
            if model in self._served.versions and model not in self._served.called_by_ensembles():
                log.info("model %s: unloaded with ensemble %s (unload_dependents)", model, name)
                await self._unload(model, drain_timeout_s, dependents=True)

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
            python_backend.serve_bls(None, self._bls)
        if self._pinned:
            unpin_current_thread()
            self._pinned = False

    def _is_ensemble(self, name: str) -> bool:
        try:
            return load_source(self.repositories.holder(name), name,
                               config_name=self.repositories.config_name
                               ).spec.platform == "ensemble"
        except TensorgateError:
            return False  # its load will say what is wrong

    async def _load_ensemble(self, source: ModelSource, version: int,
                             own_folder: bool = False) -> ServedVersion:
        """An ensemble: its steps checked against their models, which are loaded first when
        they are not yet (as Triton does). `own_folder`: loaded from a folder of its own
        (load_folder), its steps are the folders beside it, not the repository's models."""
        spec = source.spec
        steps = ensemble_steps(spec, source.config_source)
        if spec.name in self._ensembles_loading:
            raise ModelConfigError(spec.name, "ensembles that name each other as steps")
        self._ensembles_loading.add(spec.name)
        try:
            for model in sorted({step.model for step in steps}):
                beside = source.directory.parent / model
                if own_folder:
                    self._check_step_folder(spec.name, model, beside)
                if model not in self._served.versions:
                    await (self.load_folder(model, beside) if own_folder else self.load(model))
        finally:
            self._ensembles_loading.discard(spec.name)
        steps = check_step_models(spec, steps, self.spec)
        if any(step.decoupled for step in steps):  # it streams, as Triton makes it
            spec = decoupled_ensemble(spec)
        spec = served_ensemble(spec)
        stats = ModelStatistics(spec.name, version, cached=self._caches(spec),
                                summaries=self._summaries)
        scheduler = EnsembleScheduler(spec, steps, stats, self._steps.run,
                                      self._steps.stream)
        log.info("ensemble %s v%d ready: %s", spec.name, version,
                 " → ".join(step.model for step in steps))
        return ServedVersion(spec, version, scheduler, [], stats)

    def _check_step_folder(self, ensemble: str, model: str, folder: pathlib.Path) -> None:
        """A step of an ensemble loaded from its own folder must be the folder beside it,
        not a model of the same name served from elsewhere."""
        if not folder.is_dir():
            raise ModelConfigError(ensemble, f"its step model '{model}' has no folder beside "
                                             f"it ({folder})")
        if model in self._served.versions:
            link = self._served.uploads.get(model)
            if link is None or (link / model).resolve() != folder.resolve():
                raise ModelConfigError(ensemble, f"its step model '{model}' is served "
                                                 f"already, from another folder than {folder}: "
                                                 "give the step another name")

    async def _load_version(self, source: ModelSource, version: int) -> ServedVersion:
        spec, scheduler, executors, stats, claims = await self._instances.load(
            source, version, self._caches(source.spec))
        return ServedVersion(spec, version, scheduler, executors, stats, claims)

    # -- queries ---------------------------------------------------------------------------

    @property
    def takes_uploads(self) -> bool:
        """Whether a load may carry the model's files (--allow-model-upload)."""
        return self._model_upload

    def model_names(self) -> list[str]:
        return sorted(self._served.versions)

    def spec(self, name: str, version: int | None = None) -> ModelSpec:
        return self._served.resolve(name, version).spec

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
            key = cache.key(loaded.spec.name, loaded.load_id, request.inputs, request.outputs,
                            request.parameters)
            outputs = cache.get(key)
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

    def _caches(self, spec: ModelSpec) -> bool:
        """Whether `spec`'s requests go through the response cache."""
        return spec.response_cache and self._cache is not None

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
            if trace is not None:
                trace.stamp("REQUEST_END")
            del item  # (as in infer: the error raised here must not lead back to it)


async def _to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """Await `work` in a task of its own that a cancelled caller does not cancel: a model
    load or unload stopped half way would leave instances running that nothing serves, or
    an upload's folder that nothing removes. Its error goes to the caller, if still there;
    otherwise the task keeps it (retrieved, so asyncio does not log it as lost). The task
    is let go of as the error leaves: it holds the error, whose traceback holds this frame."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        await asyncio.shield(task)
    finally:
        del task


def _label_files(directory: pathlib.Path, spec: ModelSpec) -> dict[tuple[str, str], list[str]]:
    """Each output's `label_filename` lines, from the model's `directory` (a file that is not
    there: no labels)."""
    found = {}
    for output in spec.outputs:
        path = directory / output.label_filename
        if output.label_filename and path.is_file():
            found[(spec.name, output.name)] = path.read_text(encoding="utf-8").splitlines()
    return found
