"""A decoupled tensorgate Model's requests on its instance's thread: each request's
forward is a generator, and the thread steps the running ones in turn between batches, each
step one response made and posted to the loop (pipeline/generations.py keeps them, and
parks one whose client has not taken its responses). Part of ExecutorThread
(pipeline/executor.py; the split: executor_base.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from tensorgate.errors import InternalError, TensorgateError
from tensorgate.model import NO_PARAMETERS
from tensorgate.pipeline.cuda_graphs import map_tensors
from tensorgate.pipeline.executor_base import ExecutorBase, run_forward
from tensorgate.pipeline.generations import Generation
from tensorgate.pipeline.model_outputs import model_error
from tensorgate.pipeline.runner import Runner
from tensorgate.pipeline.work import Batch

__all__ = ["WAKE", "GenerationSteps"]

log = logging.getLogger("tensorgate.executor")
WAKE = object()  # on the thread's queue: a parked request's client took a response
_DONE = object()  # what a finished generator gives `next`


class GenerationSteps(ExecutorBase):
    """The executor's decoupled tensorgate Model requests, stepped in turn."""

    def _start_generation(self, batch: Batch, runner: Runner) -> None:
        """A decoupled tensorgate Model's request: its forward's generator joins those this
        thread steps in turn (pipeline/generations.py); each value it yields is
        post-processed here and goes to the loop as a response as soon as it is made. The
        batch stays running, for the scheduler, until the generator ends."""
        batch.streaming = True
        batch.streams_open = 1
        started = batch.started_ns = time.monotonic_ns()
        try:
            with self._no_grad(), self._on_stream():
                produced = run_forward(runner, self._to_device(self._gather(batch), batch), batch)
            if not isinstance(produced, Iterator):
                raise InternalError(
                    f"model '{self.settings.spec.name}' is decoupled: its forward must yield "
                    f"its responses (a generator), not return a {type(produced).__name__}")
        except Exception as error:  # the model's fault fails its request only
            failed = Generation(batch, iter(()), self._wake)
            failed.run_ns = time.monotonic_ns() - started
            self._end_generation(failed, model_error(self.settings.spec.name, error),
                                 never_added=True)
            return
        generation = Generation(batch, produced, self._wake)
        generation.run_ns = time.monotonic_ns() - started
        if self._generations.add(generation):
            self._mailbox.post(self._on_idle, self)  # room for another request

    def _step_generations(self) -> None:
        """Steps of the running requests in turn, each making its next response, until the
        queue has something (a new request starts between two steps) or none can step."""
        generations = self._generations
        with self._no_grad(), self._on_stream():
            while True:
                if generations.parked:
                    generations.unpark()
                generation = generations.next()
                if generation is None:
                    return
                # each step a call into the model (busy_since): a request streaming for
                # minutes is many short calls, a step that never yields one long one
                self.busy_rows, self.busy_items = 0, (generation.item,)
                self.busy_since = time.monotonic()
                try:
                    self._step(generation)
                finally:
                    self.busy_since, self.busy_items = 0.0, ()
                if not self._queue.empty():
                    return

    def _step(self, generation: Generation) -> None:
        """One step of a running request (inside `_step_generations`' context): its next
        response, made and posted, or its end."""
        item, batch = generation.item, generation.batch
        assert item.respond is not None
        if item.abandoned:  # its client has gone: the generator is closed at its yield
            self._end_generation(generation, None)
            return
        if not generation.take_credit():  # its client has RESPONSES_AHEAD untaken
            self._generations.park(generation)
            return
        started = time.monotonic_ns()
        raw: Any = None
        try:
            raw = next(generation.produced, _DONE)
            if raw is _DONE:
                generation.run_ns += time.monotonic_ns() - started
                self._end_generation(generation, None)
                return
            if self._stream is not None:
                raw = map_tensors(raw, lambda t: self._to_host(t, item.ledger))
                self._stream.synchronize()
            item.results = {}
            self._finish(batch, raw)
        except Exception as error:  # the model's fault fails its request only
            batch.error = error
        raw = None
        generation.run_ns += time.monotonic_ns() - started
        generation.output_ns += batch.output_ns
        failure, batch.error = batch.error, None
        if failure is not None:
            self._end_generation(generation, model_error(self.settings.spec.name, failure))
            return
        # what the model set for this response
        parameters, item.answer_parameters = item.answer_parameters, NO_PARAMETERS
        for info in batch.infos or ():
            info.response_parameters.clear()
        generation.spend_credit()
        # through the outbox: one wake-up of the loop for what comes meanwhile
        self._mailbox.post(item.respond, item.results, generation.give_back, parameters, False)
        self._generations.again(generation)

    def _end_generation(self, generation: Generation, error: TensorgateError | None, *,
                        never_added: bool = False) -> None:
        """A request's generator is over (finished, raised, its client left, or the model is
        unloaded): its cleanup runs, and the loop hears of its end after its responses. The
        instance takes another request if it was full, or if this one never started (its
        forward failed): the slot it was given is free again."""
        produced: Any = generation.produced
        generation.produced = iter(())
        if hasattr(produced, "close"):
            try:
                with self._no_grad(), self._on_stream():
                    produced.close()  # a generator left early runs its cleanup here
            except Exception:
                log.exception("model %s: a generator's cleanup raised",
                              self.settings.spec.name)
        produced = None
        item, batch = generation.item, generation.batch
        item.results = {}
        if error is not None:
            item.set_error(error)
        output_ns = generation.output_ns
        batch.output_ns = item.times.output_ns = output_ns
        batch.infer_ns = item.times.infer_ns = max(generation.run_ns - output_ns, 0)
        self.batches_run += 1
        # after the responses posted; the execution counted before its client hears the end
        self._mailbox.post(self._on_batch_done, batch)
        self._mailbox.post(self._on_stream_end, batch, item)
        if never_added or self._generations.ended():
            self._mailbox.post(self._on_idle, self)

    def _wake(self) -> None:
        """On the loop: a parked request's client took a response."""
        self._queue.put(WAKE)
