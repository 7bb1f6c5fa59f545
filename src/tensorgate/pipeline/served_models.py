"""What the engine serves: each model's loaded versions, and what is known of the others
(loading, failed, unloaded), with the answers the protocol layers ask of them — the
repository index, readiness, statistics, an output's labels.

The Engine (engine.py) changes this as its loads and unloads end, on the event loop; nothing
here starts, stops or waits for anything.
"""

from __future__ import annotations

import itertools
import pathlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

from tensorgate.errors import NotFoundError, UnavailableError
from tensorgate.pipeline.ensemble import EnsembleScheduler
from tensorgate.pipeline.executor import ExecutorThread
from tensorgate.pipeline.rate_limiter import Claim
from tensorgate.pipeline.scheduler import Scheduler
from tensorgate.pipeline.sequences import SequenceScheduler
from tensorgate.pipeline.stats import ModelCall, ModelStatistics
from tensorgate.repository.model_config import ModelSpec

__all__ = ["ServedModels", "ServedVersion", "step_models"]

_LOADS = itertools.count(1)


class ServedVersion:
    """One loaded model version: its scheduler, executors and counters."""

    def __init__(self, spec: ModelSpec, version: int,
                 scheduler: Scheduler | EnsembleScheduler | SequenceScheduler,
                 executors: list[ExecutorThread], stats: ModelStatistics,
                 claims: Iterable[Claim] = ()) -> None:
        self.spec = spec
        self.version = version
        # this load of the version: a reload (new weights, same number) is another, so the
        # response cache never answers for it with what the one before computed
        self.load_id = next(_LOADS)
        self.scheduler = scheduler
        self.executors = executors
        self.stats = stats
        self.claims = tuple(claims)  # its instances' rate limiter claims, released at unload


def step_models(versions: Iterable[ServedVersion]) -> set[str]:
    """The models that these versions' ensemble steps call."""
    return {model for v in versions if isinstance(v.scheduler, EnsembleScheduler)
            for model in v.scheduler.models}


class ServedModels:
    """The engine's models by name: the versions it serves, the loads under way, the loads
    that failed, the versions an unload stopped, the labels and upload folders of each."""

    def __init__(self) -> None:
        self.versions: dict[str, dict[int, ServedVersion]] = {}
        # a model whose last load failed: (the version whose load failed, or "", the reason)
        self.failed: dict[str, tuple[str, str]] = {}
        self.unloaded: dict[str, list[int]] = {}  # versions served until an unload
        self.loading: dict[str, int] = {}  # loads under way, by model (the server answers
        # while its first loads run: a request for one of them is told it is loading)
        self.uploads: dict[str, pathlib.Path] = {}  # a model served from an upload: its folder
        self._labels: dict[tuple[str, str], list[str]] = {}

    # -- changes, as loads and unloads end --------------------------------------------------

    def count_loading(self, name: str) -> None:
        self.loading[name] = self.loading.get(name, 0) + 1

    def count_loaded(self, name: str) -> None:
        left = self.loading.pop(name) - 1
        if left:
            self.loading[name] = left

    def failed_load(self, name: str, version: str, reason: str) -> None:
        """A load of `name` failed (`version`: the one whose load failed, or ""): listed as
        unavailable with `reason`; a version served before goes on serving."""
        self.failed[name] = (version, reason)

    def serve(self, name: str, versions: dict[int, ServedVersion],
              labels: dict[tuple[str, str], list[str]], upload: pathlib.Path | None
              ) -> tuple[dict[int, ServedVersion] | None, pathlib.Path | None]:
        """A load's versions served from now on, in place of the model's old ones and its
        failure; returns the old versions and upload folder, for the engine to retire."""
        old = self.versions.get(name)
        self.versions[name] = versions
        self.failed.pop(name, None)
        self.unloaded.pop(name, None)
        self._forget_labels(name)
        self._labels.update(labels)
        old_upload = self.uploads.pop(name, None)
        if upload is not None:
            self.uploads[name] = upload
        return old, old_upload

    def withdraw(self, name: str) -> tuple[dict[int, ServedVersion] | None,
                                           tuple[str, str] | None, pathlib.Path | None]:
        """An unload: the model no longer served nor listed as failed; returns its versions,
        its failure and its upload folder (each None where it had none)."""
        versions = self.versions.pop(name, None)
        failed = self.failed.pop(name, None)
        upload = self.uploads.pop(name, None)
        self._forget_labels(name)
        if versions:
            self.unloaded[name] = sorted(versions)
        return versions, failed, upload

    def withdraw_all(self) -> tuple[list[ServedVersion], list[pathlib.Path]]:
        """A shutdown: every version served and every upload folder, none served after."""
        versions = list(self._every_version())
        uploads = list(self.uploads.values())
        self.versions, self.uploads = {}, {}
        return versions, uploads

    def _forget_labels(self, name: str) -> None:
        for key in [key for key in self._labels if key[0] == name]:
            del self._labels[key]

    # -- answers ---------------------------------------------------------------------------

    def knows(self, name: str) -> bool:
        """Whether `name` is served or its last load failed."""
        return name in self.versions or name in self.failed

    def called_by_ensembles(self) -> set[str]:
        """The models that some served ensemble calls as a step."""
        return step_models(self._every_version())

    def _every_version(self) -> Iterator[ServedVersion]:
        return (v for vs in self.versions.values() for v in vs.values())

    def resolve(self, name: str, version: int | None) -> ServedVersion:
        """The version a request for `name` (`version`: None, the newest) runs on."""
        versions = self.versions.get(name)
        if not versions:
            if name in self.loading:
                raise UnavailableError(f"model '{name}' is loading and not ready yet "
                                       f"(/v2/models/{name}/ready says when it is)")
            if name in self.failed:
                raise UnavailableError(f"model '{name}' is not ready: {self.failed[name][1]}")
            raise NotFoundError(f"unknown model '{name}'; loaded models are: "
                                f"{', '.join(sorted(self.versions)) or 'none'}")
        if version is None:
            return versions[max(versions)]
        found = versions.get(version)
        if found is None:
            raise NotFoundError(f"model '{name}' has no version {version}; loaded versions are: "
                                f"{', '.join(map(str, sorted(versions)))}")
        return found

    def spec(self, name: str, version: int | None = None) -> ModelSpec:
        """What `resolve` finds serves: its model's spec."""
        return self.resolve(name, version).spec

    def unavailable(self) -> dict[str, str]:
        """Models whose load failed and that serve no version, with the reason (a model
        whose reload failed while its old version serves is not among them)."""
        return {name: reason for name, (_, reason) in self.failed.items()
                if name not in self.versions}

    def label_lines(self, name: str, output: str) -> list[str]:
        """The lines of an output's `label_filename` as read at load, or [] without one."""
        return self._labels.get((name, output), [])

    def index(self, repository_names: Iterable[str]) -> list[dict[str, str]]:
        """Triton's repository index: these models and every one known here, each with its
        state."""
        entries = []
        names = set(self.versions) | set(self.failed) | set(self.loading) | set(repository_names)
        for name in sorted(names):
            if name in self.versions:
                entries += [{"name": name, "version": str(v), "state": "READY", "reason": ""}
                            for v in sorted(self.versions[name])]
            elif name in self.loading:  # Triton's state while a load runs
                entries.append({"name": name, "version": "", "state": "LOADING", "reason": ""})
            elif name in self.failed:
                version, reason = self.failed[name]
                entries.append({"name": name, "version": version, "state": "UNAVAILABLE",
                                "reason": reason})
            elif name in self.unloaded:
                entries += [{"name": name, "version": str(v), "state": "UNAVAILABLE",
                             "reason": "unloaded"} for v in self.unloaded[name]]
            else:  # never loaded: its name alone, as Triton lists it
                entries.append({"name": name})
        return entries

    def statistics(self, name: str | None = None, version: int | None = None
                   ) -> list[dict[str, Any]]:
        """Triton's `model_stats` entries for one model (version) or all."""
        if name is None:
            return [v.stats.as_dict() for n in sorted(self.versions)
                    for _, v in sorted(self.versions[n].items())]
        if version is None:
            if name not in self.versions:
                raise NotFoundError(f"model '{name}' is not loaded")
            return [v.stats.as_dict() for _, v in sorted(self.versions[name].items())]
        return [self.resolve(name, version).stats.as_dict()]

    def model_statistics(self) -> list[tuple[ModelStatistics, int]]:
        """Every served version's counters and its queued-request count (for metrics)."""
        return [(v.stats, v.scheduler.pending) for n in sorted(self.versions)
                for _, v in sorted(self.versions[n].items())]

    def model_calls(self) -> list[ModelCall]:
        """Each served instance's current call into its model (seconds 0.0: idle)."""
        now = time.monotonic()
        calls = []
        for name in sorted(self.versions):
            for _, v in sorted(self.versions[name].items()):
                for executor in v.executors:
                    since = executor.busy_since  # (read once: its thread may clear it)
                    if not since:
                        calls.append(ModelCall(name, v.version, executor.name, 0.0, 0.0, 0))
                        continue
                    items = executor.busy_items
                    calls.append(ModelCall(name, v.version, executor.name, since, now - since,
                                           executor.busy_rows,
                                           tuple(i.id for i in items if i.id)))
        return calls

    def pending(self, name: str) -> int:
        """Requests queued for `name`, every version's."""
        return sum(v.scheduler.pending for v in self.versions.get(name, {}).values())
