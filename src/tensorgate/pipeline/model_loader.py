"""Loading and unloading the Engine's models: each version's instances, ensembles and the
models they chain, uploads and folders of their own, retries and failures, all while the
old version serves.

The Engine (engine.py) owns one ModelLoader and gives its load, load_folder and unload to
the server, the BLS bridge and ensembles alike; the loader serves what it loaded through
the Engine's ServedModels and starts and stops instances through VersionInstances. An
ensemble's load loads the models it chains through this loader's own `load`.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

from tensorgate.errors import (InvalidArgumentError, NotFoundError, TensorgateError,
                               UnavailableError)
from tensorgate.pipeline.ensemble import (EnsembleScheduler, check_step_models,
                                          decoupled_ensemble, ensemble_steps)
from tensorgate.pipeline.model_options import unused_settings
from tensorgate.pipeline.served_config import served_ensemble
from tensorgate.pipeline.served_models import ServedModels, ServedVersion, step_models
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.pipeline.step_requests import StepRequests
from tensorgate.pipeline.version_instances import VersionInstances
from tensorgate.repository.layout import (CompleteConfig, ModelRepositories, ModelSource,
                                         load_source)
from tensorgate.repository.model_config import ModelConfigError, ModelSpec
from tensorgate.repository.upload import (UploadedFiles, link_folder, remove_upload,
                                          write_upload)

__all__ = ["ModelLoader"]

log = logging.getLogger("tensorgate.engine")


class ModelLoader:
    """The Engine's loads and unloads (see the module's docstring)."""

    def __init__(self, repositories: ModelRepositories, served: ServedModels,
                 instances: VersionInstances, steps: StepRequests, *,
                 complete: CompleteConfig | None, cached: bool, summaries: bool,
                 model_upload: bool, load_retries: int,
                 closing: Callable[[], bool]) -> None:
        """`cached`: the Engine has a response cache; `closing`: whether it is shutting
        down (no load then). The rest as the Engine's arguments of those names say."""
        self.repositories = repositories
        self._served = served
        self._instances = instances
        self._steps = steps  # ensembles' steps
        self._complete = complete
        self._cached = cached
        self._summaries = summaries
        self.model_upload = model_upload
        self._load_retries = load_retries
        self._closing = closing
        self._ensembles_loading: set[str] = set()

    async def load(self, name: str, config: str | None = None,
                   files: UploadedFiles | None = None) -> None:
        """Engine.load: to its end, whether or not its caller is still there."""
        await _to_the_end(self._load_counted(name, config, files))

    async def load_folder(self, name: str, folder: pathlib.Path) -> None:
        """Engine.load_folder: to its end, as a load."""
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
                    if attempt == self._load_retries or self._closing():
                        raise
                    log.warning("model %s: load %d of %d failed (%s); trying again "
                                "(--model-load-retry-count)", name, attempt + 1,
                                self._load_retries + 1,
                                error.message if isinstance(error, TensorgateError) else error)
        finally:
            self._served.count_loaded(name)

    async def _load(self, name: str, config: str | None,
                    files: UploadedFiles | None, folder: pathlib.Path | None = None) -> None:
        if self._closing():
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
            for unused in unused_settings(source.spec, self._cached):
                log.warning("model %s: %s", name, unused)
            for number in source.versions:
                loading = str(number)
                if source.spec.platform == "ensemble":
                    versions[number] = await self._load_ensemble(source, number,
                                                                 folder is not None)
                else:
                    versions[number] = await self._load_version(source, number)
            # read here, off the loop, not by the first classification request on it
            labels = await loop.run_in_executor(None, _label_files, source.directory,
                                                source.spec)
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
        if self._closing():  # shut down while this loaded: nothing is left to serve it
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
        if not self.model_upload:
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
                           self.repositories.config_name, rename, checksums=True)

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
        """Engine.unload: to its end, as a load."""
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

    def is_ensemble(self, name: str) -> bool:
        """Whether the repository's model `name` is an ensemble, by its config (False where
        that cannot be read: its load says what is wrong)."""
        try:
            return load_source(self.repositories.holder(name), name,
                               config_name=self.repositories.config_name
                               ).spec.platform == "ensemble"
        except TensorgateError:
            return False

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
        started = time.monotonic()  # its steps' models are loads of their own
        steps = check_step_models(spec, steps, self._served.spec)
        if any(step.decoupled for step in steps):  # it streams, as Triton makes it
            spec = decoupled_ensemble(spec)
        spec = served_ensemble(spec)
        stats = ModelStatistics.of(spec, version, cached=self._caches(spec),
                                   summaries=self._summaries)
        scheduler = EnsembleScheduler(spec, steps, stats, self._steps.run,
                                      self._steps.stream)
        stats.load_s = time.monotonic() - started
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
        started = time.monotonic()
        spec, scheduler, executors, stats, claims = await self._instances.load(
            source, version, self._caches(source.spec))
        stats.load_s = time.monotonic() - started  # its instances started, loaded, warmed up
        return ServedVersion(spec, version, scheduler, executors, stats, claims)

    def _caches(self, spec: ModelSpec) -> bool:
        """Whether `spec`'s requests go through the response cache."""
        return spec.response_cache and self._cached


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
