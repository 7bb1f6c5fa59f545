"""Ensembles (`platform: "ensemble"` with `ensemble_scheduling`): Triton's way to chain
models — pre-processing, a network, post-processing — behind one model name.

Each step names a model and maps ensemble tensors onto its inputs and its outputs onto
ensemble tensors. A request runs every step whose inputs exist, all such steps at once, until
the ensemble's outputs exist. Steps are ordinary requests to their models: they queue and
batch with everyone else's, and tensors pass from step to step as views (no copies here).

`EnsembleScheduler` stands where a model's Scheduler stands, so that an ensemble is queried,
drained, unloaded and counted like any other model; it has no queue of its own (its steps'
models have theirs) and no executor. A client that goes away cancels its request's steps.

A step whose model is decoupled makes the ensemble decoupled, as on Triton (its served
config says so): each response of that step runs the steps that read its outputs once more,
from that response's tensors, and each time the ensemble's outputs are made they go to the
client as one response — a token streamer between a tokenizer and a detokenizer streams
through the ensemble. Every ensemble tensor has one origin: the request, or the responses of
one decoupled step; a step's inputs, and the ensemble's outputs, must share theirs (Triton's
rule). Responses reach the client in the order of the responses they come from; at most
`max_inflight_requests` (the config's; RESPONSES_AHEAD when 0) of a step's responses are
being carried on at once, past that the step's stream waits (backpressure, as Triton's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tensorgate.errors import (DeadlineExceededError, InternalError, InvalidArgumentError,
                               ModelConfigError, NotFoundError, Status, TensorgateError,
                               UnavailableError)
from tensorgate.model import NO_PARAMETERS
from tensorgate.pipeline.response_streams import RESPONSES_AHEAD
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.pipeline.work import WorkItem
from tensorgate.repository.model_config import ModelSpec
from tensorgate.tensor.view import TensorView

__all__ = ["EnsembleScheduler", "Step", "check_step_models", "decoupled_ensemble",
           "ensemble_steps"]

log = logging.getLogger("tensorgate.ensemble")

# A step's run: (model, version or None for the latest, inputs by the model's names, the
# outputs wanted, the ensemble's request) → the outputs by the model's names.
RunStep = Callable[[str, int | None, dict[str, TensorView], list[str], WorkItem],
                   Awaitable[dict[str, TensorView]]]
# A decoupled step's run: its responses' outputs, as they come.
StreamStep = Callable[[str, int | None, dict[str, TensorView], list[str], WorkItem],
                      AsyncGenerator[dict[str, TensorView], None]]

_ERRORS: dict[Status, type[TensorgateError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError, Status.NOT_FOUND: NotFoundError,
    Status.UNAVAILABLE: UnavailableError, Status.DEADLINE_EXCEEDED: DeadlineExceededError}


@dataclass(frozen=True)
class Step:
    model: str
    version: int | None              # None: the latest (-1 in the config)
    inputs: Mapping[str, str]        # the model's input name → ensemble tensor
    outputs: Mapping[str, str]       # the model's output name → ensemble tensor
    decoupled: bool = False          # its model sends any number of responses a request


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
                      specs: Callable[[str, int | None], ModelSpec]) -> tuple[Step, ...]:
    """Each step's model serves the inputs and outputs the step maps (models loaded); the
    steps, each marked decoupled when its model is, and their tensors' origins checked."""
    marked = []
    for step in steps:
        model = specs(step.model, step.version)
        marked.append(replace(step, decoupled=model.decoupled))
        for kind, names, known in (("input", step.inputs, model.inputs),
                                   ("output", step.outputs, model.outputs)):
            unknown = sorted(set(names) - {t.name for t in known})
            if unknown:
                raise ModelConfigError(spec.name, f"ensemble step '{step.model}' maps {kind}s "
                                                  f"{unknown}; the model's {kind}s are "
                                                  f"{[t.name for t in known]}")
    _origins(spec, marked)
    return tuple(marked)


def decoupled_ensemble(spec: ModelSpec) -> ModelSpec:
    """`spec` as a decoupled model (a step of it is), its served config saying so."""
    config = type(spec.config)()
    config.CopyFrom(spec.config)
    config.model_transaction_policy.decoupled = True
    return replace(spec, config=config, decoupled=True)


def _origins(spec: ModelSpec, steps: Sequence[Step]) -> tuple[dict[str, int], list[int]]:
    """Each ensemble tensor's origin — 0: the request; i + 1: the responses of decoupled
    step i — and each step's inputs' origin. A step's inputs, and the ensemble's outputs,
    must share one (as Triton requires); the error says which origins meet where."""
    origin = {item.name: 0 for item in spec.inputs}
    reads = [0] * len(steps)

    def named(found: set[int]) -> str:
        return " and ".join(sorted(
            "the request" if o == 0 else f"the responses of step '{steps[o - 1].model}'"
            for o in found))

    for wave in _waves(steps, set(origin), spec.name):
        for step in wave:
            index = steps.index(step)
            found = {origin[tensor] for tensor in step.inputs.values()}
            if len(found) > 1:
                raise ModelConfigError(spec.name, f"ensemble step '{step.model}' reads tensors "
                                                  f"that come from {named(found)}; a step's "
                                                  "inputs must all come from one (a decoupled "
                                                  "step's responses, or the request)")
            reads[index] = found.pop() if found else 0
            for tensor in step.outputs.values():
                origin[tensor] = index + 1 if step.decoupled else reads[index]
    found = {origin[item.name] for item in spec.outputs}
    if len(found) > 1:
        raise ModelConfigError(spec.name, f"the ensemble's outputs come from {named(found)}; "
                                          "they must all come from one, so that each "
                                          "response has them all")
    return origin, reads


class EnsembleScheduler:
    """Runs an ensemble's requests; the Scheduler's interface, without a queue."""

    def __init__(self, spec: ModelSpec, steps: Sequence[Step], stats: ModelStatistics,
                 run_step: RunStep, stream_step: StreamStep | None = None) -> None:
        """`steps` as check_step_models marked them; `stream_step` runs a decoupled one."""
        self._spec = spec
        self.models = frozenset(step.model for step in steps)  # the models its steps call
        self._steps = list(steps)
        self._waves = _waves(steps, {item.name for item in spec.inputs}, spec.name)
        self._stats = stats
        self._run_step = run_step
        self._stream_step = stream_step
        self._running: dict[asyncio.Task[None], WorkItem] = {}
        self._closed: TensorgateError | None = None
        self._streams = any(step.decoupled for step in steps)
        if self._streams:
            origin, reads = _origins(spec, self._steps)
            # the steps that read each origin's tensors, wave by wave
            self._by_origin: dict[int, list[list[int]]] = {}
            for wave in self._waves:
                groups: dict[int, list[int]] = {}
                for step in wave:
                    index = self._steps.index(step)
                    groups.setdefault(reads[index], []).append(index)
                for read, group in groups.items():
                    self._by_origin.setdefault(read, []).append(group)
            self._out_origin = origin[spec.outputs[0].name] if spec.outputs else 0
            # the origins on the way from the request to the outputs: whose responses the
            # client's follow, in order
            self._path = set()
            at = self._out_origin
            while at:
                self._path.add(at)
                at = reads[at - 1]
            scheduling = spec.config.ensemble_scheduling  # the field is in tritonclient ≥ 2.57
            limit = getattr(scheduling, "max_inflight_requests", 0)
            self._inflight = limit or RESPONSES_AHEAD

    @property
    def pending(self) -> int:
        return 0  # requests wait in their steps' models' queues

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def submit(self, item: WorkItem) -> None:
        if self._closed is not None:
            raise self._closed
        task = asyncio.ensure_future(self._settle(
            item, self._run_streams(item) if self._streams else self._run(item)))
        self._running[task] = item
        task.add_done_callback(self._ran)
        item.future.add_done_callback(lambda done: task.cancel() if done.cancelled() else None)

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
            if item.fail(error):
                count += 1
        return count

    async def _settle(self, item: WorkItem,
                      run: Coroutine[Any, Any, dict[str, TensorView]]) -> None:
        """Run a request's steps (`run` gives what answers it) and answer it, counted."""
        try:
            results = await run
        except asyncio.CancelledError:
            self._stats.record_failure(time.monotonic_ns() - item.enqueued_ns, "CANCELED")
            raise
        except Exception as error:  # a step's error, or a bug: the client is told either way
            if not isinstance(error, TensorgateError):
                log.exception("ensemble %s: unexpected error", self._spec.name)
                error = InternalError(f"ensemble '{self._spec.name}': internal error: "
                                      f"{type(error).__name__}: {error}")
            self._stats.record_failure(time.monotonic_ns() - item.enqueued_ns, "BACKEND")
            item.fail(error)
            return
        item.times.total_ns = item.times.infer_ns = time.monotonic_ns() - item.enqueued_ns
        self._stats.record_batch(item.rows, 0, item.times.infer_ns, 0)
        self._stats.record_success(item.times, item.ledger.bytes)
        if not item.future.done():
            item.future.set_result(results)

    async def _run(self, item: WorkItem) -> dict[str, TensorView]:
        tensors = _request_tensors(item)
        for wave in self._waves:
            if len(wave) == 1:  # one step: awaited here, without a task of its own
                outputs = [await self._step(wave[0], tensors, item)]
            else:
                outputs = await asyncio.gather(*(self._step(step, tensors, item)
                                                 for step in wave))
            for step, made in zip(wave, outputs):
                for output, tensor in step.outputs.items():
                    tensors[tensor] = made[output]
        return {name: tensors[name] for name in item.wanted}

    async def _run_streams(self, item: WorkItem) -> dict[str, TensorView]:
        """A decoupled ensemble's request: its responses go to `item.respond` as they are
        made, at most RESPONSES_AHEAD not yet taken by the client."""
        respond = item.respond
        assert respond is not None  # the engine runs a decoupled model's requests as streams
        credits = asyncio.Semaphore(RESPONSES_AHEAD)

        async def emit(tensors: dict[str, TensorView]) -> None:
            await credits.acquire()  # the client takes one: it gives one back
            respond({name: tensors[name] for name in item.wanted}, credits.release,
                    NO_PARAMETERS, False)

        await self._run_origin(0, _request_tensors(item), item, emit, None)
        return {}  # its outputs went with each response

    async def _run_origin(self, origin: int, tensors: dict[str, TensorView], item: WorkItem,
                          emit: Callable[[dict[str, TensorView]], Awaitable[None]],
                          turn: asyncio.Future[None] | None) -> None:
        """Run the steps that read tensors of `origin` (the request's, or one response's of
        the decoupled step that made them), from `tensors`; a decoupled one among them is
        carried on response by response. Where the ensemble's outputs come from here, they
        go out once `turn` (the responses before this one) is done."""
        streams: list[asyncio.Task[None]] = []
        try:
            for group in self._by_origin.get(origin, ()):
                plain = [self._steps[i] for i in group if not self._steps[i].decoupled]
                for index in group:
                    if self._steps[index].decoupled:  # its responses are carried on apart
                        streams.append(asyncio.ensure_future(self._carry(
                            index, tensors, item, emit, index + 1 in self._path, turn)))
                made = await asyncio.gather(*(self._step(step, tensors, item)
                                              for step in plain))
                for step, outputs in zip(plain, made):
                    for output, tensor in step.outputs.items():
                        tensors[tensor] = outputs[output]
            if origin == self._out_origin:
                if turn is not None:
                    await turn
                await emit(tensors)
            await asyncio.gather(*streams)
        finally:
            for stream in streams:
                stream.cancel()  # a no-op unless a step failed

    async def _carry(self, index: int, tensors: dict[str, TensorView], item: WorkItem,
                     emit: Callable[[dict[str, TensorView]], Awaitable[None]], ordered: bool,
                     turn: asyncio.Future[None] | None) -> None:
        """Decoupled step `index`: run what reads its outputs once for each response, each
        from that response's tensors, at most `max_inflight_requests` at once. On the way
        to the ensemble's outputs (`ordered`), what they emit goes out in the order of the
        responses: the first's after `turn`, each next one's after the one before."""
        step = self._steps[index]
        assert self._stream_step is not None
        inputs = {name: tensors[tensor] for name, tensor in step.inputs.items()
                  if tensor in tensors}
        carried: list[asyncio.Task[None]] = []
        failed: TensorgateError | None = None
        try:
            async with contextlib.aclosing(self._stream_step(
                    step.model, step.version, inputs, list(step.outputs), item)) as responses:
                try:
                    async for outputs in responses:
                        made = {tensor: outputs[output] for output, tensor in step.outputs.items()
                                if output in outputs}
                        carried.append(asyncio.ensure_future(self._run_origin(
                            index + 1, made, item, emit, turn if ordered else None)))
                        if ordered:
                            turn = carried[-1]  # the next response's go out after this one's
                        while sum(not task.done() for task in carried) >= self._inflight:
                            await asyncio.wait([t for t in carried if not t.done()],
                                               return_when=asyncio.FIRST_COMPLETED)
                        for task in [t for t in carried if t.done()]:
                            task.result()  # a failed response fails the request now
                            if task is not turn:
                                carried.remove(task)
                except TensorgateError as error:  # the responses before it go out first
                    failed = _named(self._spec.name, step.model, error)
            await asyncio.gather(*carried)
            if failed is not None:
                raise failed
        finally:
            for task in carried:
                task.cancel()

    async def _step(self, step: Step, tensors: dict[str, TensorView],
                    item: WorkItem) -> dict[str, TensorView]:
        inputs = {name: tensors[tensor] for name, tensor in step.inputs.items()
                  if tensor in tensors}  # an optional ensemble input may be absent
        try:
            return await self._run_step(step.model, step.version, inputs, list(step.outputs),
                                        item)
        except TensorgateError as error:
            raise _named(self._spec.name, step.model, error) from error


def _request_tensors(item: WorkItem) -> dict[str, TensorView]:
    """An ensemble request's inputs as the ensemble tensors they are (views)."""
    return {name: TensorView.from_array(value, name=name, ledger=item.ledger)
            for name, value in item.inputs.items()}


def _named(ensemble: str, model: str, error: TensorgateError) -> TensorgateError:
    """A step's error, saying which ensemble and step it is from."""
    if error.message.startswith(f"ensemble '{ensemble}', step "):
        return error  # named already (a step of a response's carried on)
    kind = _ERRORS.get(error.status, InternalError)
    return kind(f"ensemble '{ensemble}', step '{model}': {error.message}")
