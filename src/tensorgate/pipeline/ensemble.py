"""Ensembles (`platform: "ensemble"` with `ensemble_scheduling`): Triton's way to chain
models — pre-processing, a network, post-processing — behind one model name.

Each step names a model and maps ensemble tensors onto its inputs and its outputs onto
ensemble tensors. A request runs every step whose inputs exist, all such steps at once, until
the ensemble's outputs exist. Steps are ordinary requests to their models: they queue and
batch with everyone else's, and tensors pass from step to step as views (no copies here).

`EnsembleScheduler` stands where a model's Scheduler stands, so that an ensemble is queried,
drained, unloaded and counted like any other model; it has no queue of its own (its steps'
models have theirs) and no executor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from tensorgate.errors import (DeadlineExceededError, InternalError, InvalidArgumentError,
                               ModelConfigError, NotFoundError, Status, TensorgateError,
                               UnavailableError)
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.pipeline.work import WorkItem
from tensorgate.repository.model_config import ModelSpec
from tensorgate.tensor.view import TensorView

__all__ = ["EnsembleScheduler", "Step", "check_step_models", "ensemble_steps"]

log = logging.getLogger("tensorgate.ensemble")

# A step's run: (model, version or None for the latest, inputs by the model's names, the
# outputs wanted, the ensemble's request) → the outputs by the model's names.
RunStep = Callable[[str, int | None, dict[str, TensorView], list[str], WorkItem],
                   Awaitable[dict[str, TensorView]]]

_ERRORS: dict[Status, type[TensorgateError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError, Status.NOT_FOUND: NotFoundError,
    Status.UNAVAILABLE: UnavailableError, Status.DEADLINE_EXCEEDED: DeadlineExceededError}


@dataclass(frozen=True)
class Step:
    model: str
    version: int | None              # None: the latest (-1 in the config)
    inputs: Mapping[str, str]        # the model's input name → ensemble tensor
    outputs: Mapping[str, str]       # the model's output name → ensemble tensor


def ensemble_steps(spec: ModelSpec, source: str) -> tuple[Step, ...]:
    """The config's steps, checked: each ensemble tensor is made once (an ensemble input or
    one step's output), every tensor a step reads is made, the ensemble's outputs are made,
    and the steps can all run (no cycle)."""
    config = spec.config
    if config.WhichOneof("scheduling_choice") != "ensemble_scheduling" \
            or not config.ensemble_scheduling.step:
        raise ModelConfigError(source, "platform 'ensemble' needs 'ensemble_scheduling' with "
                                       "at least one step")
    steps = []
    made = {item.name: "an ensemble input" for item in spec.inputs}
    for number, step in enumerate(config.ensemble_scheduling.step, 1):
        where = f"ensemble step {number} ('{step.model_name}')"
        if not step.model_name:
            raise ModelConfigError(source, f"ensemble step {number} has no 'model_name'")
        if step.model_name == spec.name:
            raise ModelConfigError(source, f"{where} names the ensemble itself")
        if not step.input_map or not step.output_map:
            raise ModelConfigError(source, f"{where} needs an 'input_map' and an 'output_map'")
        for tensor in step.output_map.values():
            if tensor in made:
                raise ModelConfigError(source, f"{where} makes tensor '{tensor}', already "
                                               f"made by {made[tensor]}")
            made[tensor] = where
        version = None if step.model_version == -1 else step.model_version
        if version is not None and version < 1:
            raise ModelConfigError(source, f"{where} has model_version {version}; use -1 "
                                           "(the latest) or a version number")
        steps.append(Step(step.model_name, version, dict(step.input_map),
                          dict(step.output_map)))
    for step in steps:
        unmade = sorted(set(step.inputs.values()) - set(made))
        if unmade:
            raise ModelConfigError(source, f"ensemble step '{step.model}' reads {unmade}, "
                                           "which no ensemble input or step makes")
    missing = sorted(item.name for item in spec.outputs if item.name not in made
                     or made[item.name] == "an ensemble input")
    if missing:
        raise ModelConfigError(source, f"ensemble outputs {missing} are made by no step")
    _waves(steps, {item.name for item in spec.inputs}, source)
    return tuple(steps)


def _waves(steps: Sequence[Step], available: set[str], source: str) -> list[list[Step]]:
    """The steps in the order they can run: each wave needs only what earlier ones made."""
    waves, left, have = [], list(steps), set(available)
    while left:
        ready = [s for s in left if set(s.inputs.values()) <= have]
        if not ready:
            raise ModelConfigError(source, "ensemble steps " + ", ".join(
                f"'{s.model}'" for s in left) + " wait on each other's outputs (a cycle)")
        waves.append(ready)
        for step in ready:
            have |= set(step.outputs.values())
        left = [s for s in left if s not in ready]
    return waves


def check_step_models(spec: ModelSpec, steps: Sequence[Step],
                      specs: Callable[[str, int | None], ModelSpec]) -> None:
    """Each step's model serves the inputs and outputs the step maps (models loaded)."""
    for step in steps:
        model = specs(step.model, step.version)
        if model.decoupled:
            raise ModelConfigError(spec.name, f"ensemble step '{step.model}' is a decoupled "
                                              "model; ensembles take one response per step")
        for kind, names, known in (("input", step.inputs, model.inputs),
                                   ("output", step.outputs, model.outputs)):
            unknown = sorted(set(names) - {t.name for t in known})
            if unknown:
                raise ModelConfigError(spec.name, f"ensemble step '{step.model}' maps {kind}s "
                                                  f"{unknown}; the model's {kind}s are "
                                                  f"{[t.name for t in known]}")


class EnsembleScheduler:
    """Runs an ensemble's requests; the Scheduler's interface, without a queue."""

    def __init__(self, spec: ModelSpec, steps: Sequence[Step], stats: ModelStatistics,
                 run_step: RunStep) -> None:
        self._spec = spec
        self.models = frozenset(step.model for step in steps)  # the models its steps call
        self._waves = _waves(steps, {item.name for item in spec.inputs}, spec.name)
        self._stats = stats
        self._run_step = run_step
        self._running: dict[asyncio.Task[None], WorkItem] = {}
        self._closed: TensorgateError | None = None

    @property
    def pending(self) -> int:
        return 0  # requests wait in their steps' models' queues

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def submit(self, item: WorkItem) -> None:
        if self._closed is not None:
            raise self._closed
        task = asyncio.ensure_future(self._run(item))
        self._running[task] = item
        task.add_done_callback(self._ran)

    def _ran(self, task: asyncio.Task[None]) -> None:
        item = self._running.pop(task)
        item.release()

    def close(self, reason: TensorgateError) -> None:
        self._closed = reason

    def fail_queued(self, error: TensorgateError) -> int:
        return 0

    def fail_running(self, error: TensorgateError) -> int:
        count = 0
        for task, item in list(self._running.items()):
            task.cancel()
            if not item.future.done():
                item.future.set_exception(error)
                count += 1
        return count

    async def _run(self, item: WorkItem) -> None:
        tensors = {name: TensorView.from_array(value, name=name, ledger=item.ledger)
                   for name, value in item.inputs.items()}
        try:
            for wave in self._waves:
                if len(wave) == 1:  # one step: awaited here, without a task of its own
                    outputs = [await self._step(wave[0], tensors, item)]
                else:
                    outputs = await asyncio.gather(*(self._step(step, tensors, item)
                                                     for step in wave))
                for step, made in zip(wave, outputs):
                    for output, tensor in step.outputs.items():
                        tensors[tensor] = made[output]
        except asyncio.CancelledError:
            self._stats.record_failure(time.monotonic_ns() - item.enqueued_ns, "CANCELED")
            raise
        except TensorgateError as error:
            self._stats.record_failure(time.monotonic_ns() - item.enqueued_ns, "BACKEND")
            if not item.future.done():
                item.future.set_exception(error)
            return
        item.times.total_ns = item.times.infer_ns = time.monotonic_ns() - item.enqueued_ns
        self._stats.record_batch(item.rows, 0, item.times.infer_ns, 0)
        self._stats.record_success(item.times, item.ledger.bytes)
        if not item.future.done():
            item.future.set_result({name: tensors[name] for name in item.wanted})

    async def _step(self, step: Step, tensors: dict[str, TensorView],
                    item: WorkItem) -> dict[str, TensorView]:
        inputs = {name: tensors[tensor] for name, tensor in step.inputs.items()
                  if tensor in tensors}  # an optional ensemble input may be absent
        try:
            return await self._run_step(step.model, step.version, inputs, list(step.outputs),
                                        item)
        except TensorgateError as error:
            kind = _ERRORS.get(error.status, InternalError)
            raise kind(f"ensemble '{self._spec.name}', step '{step.model}': "
                       f"{error.message}") from error
