"""The executor: one thread per model instance, the only code that touches the device.

It loads the model, warms it and captures CUDA graphs (pipeline/warm_up.py), then runs
batches from its queue: gather inputs (a counted copy when more than one request),
host→device, forward, device→host, and either finishes the outputs itself or hands them to
the post-processing pool. A decoupled tensorgate Model's requests are generators it steps in
turn between batches (pipeline/generations.py). Every result goes back to the event loop with
`loop.call_soon_threadsafe` (a decoupled model's responses through an Outbox: one wake-up
for many); the loop never waits on this thread.

Threads are started here and nowhere else: the executor threads and the post-processing pool
(but for the event loop an `async def execute` of a decoupled Triton Python model runs on,
which that model's instance owns: pipeline/triton_python.py).
Facts that shaped this (2-core machine, ResNet-50, see DESIGN.md): torch's OpenMP pool belongs
to the thread that first ran a parallel region, so loading, warm-up and every run happen on
this thread; intra-op threads default to one fewer than the cores so the loop keeps one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from tensorgate.errors import DatatypeError, InternalError, InvalidArgumentError, TensorgateError
from tensorgate.model import NO_PARAMETERS, ModelContext, RequestInfo
from tensorgate.pipeline import heap
from tensorgate.pipeline.cpu_quota import usable_cpus
from tensorgate.pipeline.batching import gather_rows, split_rows
from tensorgate.pipeline.cuda_graphs import CAPTURING, GraphSet, map_tensors
from tensorgate.pipeline.generations import Generation, Generations
from tensorgate.pipeline.input_bounds import bounded_spec, guard_dims
from tensorgate.pipeline.idle_time import IdleTime, lowered_to_idle_time
from tensorgate.pipeline.placement import (LIGHT_FORWARD_NS, Placement, pin_current_thread,
                                          thread_cpus)
from tensorgate.pipeline.postprocess import Postprocessor
from tensorgate.pipeline.postprocess_pool import PostprocessPool
from tensorgate.pipeline.ragged import batch_input_values, flatten, one_request, scatter
from tensorgate.pipeline.response_streams import CREDIT_POLL_S, Outbox, ResponseStream
from tensorgate.pipeline.runner import Runner, load_runner, name_outputs, warmup_inputs
from tensorgate.pipeline.torch_io import strings_array
from tensorgate.pipeline.triton_python import RESCHEDULED, RequestInputs, TritonPythonRunner
from tensorgate.pipeline.warm_up import WarmUp
from tensorgate.pipeline.work import Batch, WorkItem
from tensorgate.python_backend import (TRITONSERVER_REQUEST_FLAG_SEQUENCE_END as SEQUENCE_END,
                                       TRITONSERVER_REQUEST_FLAG_SEQUENCE_START as SEQUENCE_START)
from tensorgate.repository.model_config import ModelConfigError, ModelSpec
from tensorgate.tensor.copies import CopyLedger, copy_into
from tensorgate.tensor.dtypes import datatype_of_numpy, datatype_of_torch
from tensorgate.tensor.pool import BufferPool
from tensorgate.tensor.view import TensorView

__all__ = ["ExecutorSettings", "ExecutorThread", "default_intra_op_threads"]

log = logging.getLogger("tensorgate.executor")
_STOP = object()
_WAKE = object()  # a parked decoupled request's client took a response (pipeline/generations.py)
_DONE = object()  # what a finished generator gives `next`


def default_intra_op_threads() -> int:
    """All usable CPUs but one, so the event loop keeps a core to itself (usable: the
    calling thread's affinity before the engine pinned it, within a container's CPU quota:
    pipeline/cpu_quota.py)."""
    return max(1, usable_cpus(len(thread_cpus())) - 1)


_NO_STREAM = contextlib.nullcontext()  # (reusable: it holds nothing)
# a batch-1 forward this slow, twice, is heavy beyond doubt: no more timing runs at load
CLEARLY_HEAVY_NS = 4 * LIGHT_FORWARD_NS


@dataclass(frozen=True)
class ExecutorSettings:
    """Everything an executor needs to build its model instance."""

    spec: ModelSpec
    version: int
    artifact: Any  # pathlib.Path
    kind: str
    directory: Any  # pathlib.Path of the version
    device: torch.device
    intra_op_threads: int
    cpu_affinity: frozenset[int] | None
    placement: Placement | None
    cuda_graphs: bool
    postprocessor: Postprocessor | None
    # A runner another instance of this version loaded, run here too instead of a second copy
    # of the weights (only runners whose forward is safe on two threads at once).
    shared_runner: Runner | None = None
    instance: int = 0  # its index among the version's instances
    # A decoupled tensorgate Model's requests one instance interleaves (generations.py)
    streams_per_instance: int = 1
    inference_mode: bool = True  # else no_grad (config parameter INFERENCE_MODE false)
    jit_optimize: bool = True  # the TorchScript executor optimises (DISABLE_OPTIMIZED_EXECUTION)
    # A spare on the loop's core: runs on the time the loop leaves idle (idle_time.py)
    on_idle_time: bool = False
    # Outputs a model made in another datatype than its config's, already logged: one set
    # for a version's instances, so that the warning is said once, not once an instance
    said_datatype: set[str] = field(default_factory=set)


class ExecutorThread:
    """One model instance on one device, behind a queue of batches."""

    def __init__(self, name: str, settings: ExecutorSettings, loop: asyncio.AbstractEventLoop,
                 pool: BufferPool, postprocess_pool: PostprocessPool,
                 on_batch_done: Callable[[Batch], None],
                 on_idle: Callable[[ExecutorThread], None],
                 on_stream_end: Callable[[Batch, WorkItem], None]) -> None:
        self.name = name
        self.settings = settings
        self._loop = loop
        self._pool = pool
        self._postprocess_pool = postprocess_pool
        self._on_batch_done = on_batch_done
        self._on_idle = on_idle
        self._on_stream_end = on_stream_end  # a decoupled Triton Python model's request
        self._outbox = Outbox(loop)  # what its requests' streams send, from any thread
        self._generations = Generations(settings.streams_per_instance)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._runner: Runner | None = None
        self._graphs: GraphSet | None = None
        spec = settings.spec
        # What a batch of several gathers from its requests (batch inputs are computed), and
        # which outputs go back in their requests' input shapes (pipeline/ragged.py)
        computed = {b.target for b in spec.batch_inputs}
        self._gathered = [i.name for i in spec.model_inputs if i.name not in computed]
        self._scattered = {b.target: b.source for b in spec.batch_outputs}
        self._stream: Any = None
        self.cpus = "any"  # where it ended up, for the start-up log
        self.forward_ns: int | None = None  # batch-1 forward, measured at start on CPU
        # seconds its load took, by step ("load", "warm-up", "CUDA graphs"), for the log
        self.setup_s: dict[str, float] = {}
        self._split_said = False  # a failed batch's requests ran alone: logged once, loudly
        # A model not run before its first request (a Triton Python model): its first
        # batch-1 execute times, until there are enough to place the thread by
        self._costs: list[int] | None = None
        self.batches_run = 0  # written by this thread only
        self.batches_done = 0  # taken from its queue and finished, run or failed (likewise)
        self.heap_trims = 0
        # When its current call into the model began (time.monotonic(); 0.0 while idle), the
        # rows it was given (0: a streaming step) and its requests: read by the server's
        # watch for a model that does not return (server.py), written by this thread only
        self.busy_since = 0.0
        self.busy_rows = 0
        self.busy_items: Sequence[WorkItem] = ()
        self.idle_time: IdleTime | None = None  # at SCHED_IDLE: set before `ready`
        self.ready: asyncio.Future[None] = loop.create_future()
        self.stopped: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # -- called on the loop ----------------------------------------------------------------

    @property
    def runner(self) -> Runner | None:
        """The loaded model, once `ready`: what a second instance may share."""
        return self._runner

    def start(self) -> None:
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The thread's id in the kernel, once started."""
        return self._thread.native_id

    def submit(self, batch: Batch) -> None:
        if self.idle_time is not None:
            expected_ns = batch.rows * (self.forward_ns or LIGHT_FORWARD_NS)
            self.idle_time.batch_handed(expected_ns, self._batches_done)
        self._queue.put(batch)

    def _batches_done(self) -> int:
        return self.batches_done

    def stop(self) -> None:
        """Finish what is queued, then release the model and the device."""
        if self.idle_time is not None:
            self.idle_time.raise_now()
        self._queue.put(_STOP)

    # -- the thread ------------------------------------------------------------------------

    def _report(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _main(self) -> None:
        try:
            self._setup()
        except BaseException as error:  # noqa: BLE001 - reported to the loader, never lost
            # without its traceback: its frames hold this executor, whose `ready` would hold
            # the error, a cycle keeping the failed instance (and what the model's own
            # setup frames held) for the collector; the loader says the error's words only
            self._report(_settle, self.ready, error.with_traceback(None))
            self._let_go_of_scheduler()
            self._report(_settle, self.stopped, None)
            return
        if self.settings.on_idle_time:
            self.idle_time = lowered_to_idle_time(self._loop)
        self._report(_settle, self.ready, None)
        trimmer = heap.heap_trimmer()  # idle on a CPU, and once the model is gone (below)
        trim = trimmer if self.settings.device.type == "cpu" else None
        untrimmed = False  # a batch of several rows ran since the last trim
        generations = self._generations
        while True:
            if generations.runnable and self._queue.empty():
                self._step_generations()  # until a request (or a wake-up) comes
                continue
            try:
                batch = self._queue.get(timeout=CREDIT_POLL_S if generations.parked else
                                        heap.IDLE_TRIM_S if untrimmed else None)
            except queue.Empty:
                if generations:  # parked ones: a client that left or took a response
                    self._step_generations()
                    continue
                # idle after a burst: hand its heap back to the system
                assert trim is not None
                trim()
                self.heap_trims += 1
                untrimmed = False
                continue
            if batch is _WAKE:
                generations.unpark()
                continue
            if batch is _STOP:
                for generation in generations.take_all():  # past unload's drain deadline
                    self._end_generation(generation, None)
                break
            untrimmed = untrimmed or (trim is not None and batch.rows > 1)
            self.busy_rows, self.busy_items = batch.rows, batch.items
            self.busy_since = time.monotonic()
            try:
                self._execute(batch)
            finally:  # (its items not held while idle: their buffers go back to the pool)
                self.busy_since, self.busy_items = 0.0, ()
                self.batches_done += 1
            del batch  # not held while idle: its buffers go back to the pool now
        self._teardown()
        self._let_go_of_scheduler()
        self._report(_settle, self.stopped, None)
        # the model gone, its heap goes back to the system (after `stopped`: an unload's
        # or a reload's answer does not wait for it; on a GPU too: the weights were read
        # through host memory)
        if trimmer is not None:
            trimmer()
            self.heap_trims += 1

    def _let_go_of_scheduler(self) -> None:
        """Drop the scheduler's callbacks once nothing more will be reported: the scheduler
        holds its executors, so after an unload they, the scheduler and the version's
        statistics would otherwise wait in a cycle for the collector (the model itself is
        released by _teardown; what is posted already holds its own callback)."""
        self._on_batch_done = self._on_stream_end = _nothing
        self._on_idle = _nothing

    def _setup(self) -> None:
        s = self.settings
        if s.cpu_affinity:
            pin_current_thread(s.cpu_affinity)
        elif s.placement is not None:
            pin_current_thread(s.placement.compute_cpus)
        torch.set_num_threads(s.intra_op_threads)
        torch._C._set_graph_executor_optimize(s.jit_optimize)  # this thread's own setting
        context = ModelContext(s.spec.name, s.version, s.directory, s.device, s.spec.max_batch_size,
                               dict(s.spec.parameters), s.instance)
        if s.device.type == "cuda":
            torch.cuda.set_device(s.device)
            self._stream = torch.cuda.Stream(s.device)  # type: ignore[no-untyped-call]
        with self._no_grad(), self._on_stream():
            if s.shared_runner is not None:  # loaded and warmed by its first instance
                self._runner = s.shared_runner
            else:
                started = time.perf_counter()
                self._runner = load_runner(s.artifact, s.kind, s.spec, context)
                self.setup_s["load"] = time.perf_counter() - started
                if self._runner.shapes is not None:  # the engine serves its first's spec
                    self.settings = s = replace(s, spec=bounded_spec(
                        str(s.artifact), s.spec, "the exported program", self._runner.shapes,
                        quiet=s.instance > 0))
                if self._runner.requests is not None and (s.spec.batch_inputs
                                                          or s.spec.batch_outputs):
                    raise ModelConfigError(str(s.artifact), "a Triton Python model takes its "
                                           "requests one by one, so 'batch_input' and "
                                           "'batch_output' do not apply to it")
                started = time.perf_counter()
                warm = WarmUp(s, self._runner, self._named, self._stream)
                warm.run()
                self.settings = s = warm.settings  # its least sizes may have gone up
                self._graphs = warm.graphs
                if warm.graphs_s:
                    self.setup_s["CUDA graphs"] = warm.graphs_s
                self.setup_s["warm-up"] = time.perf_counter() - started - warm.graphs_s
                self._runner.decide_sharing()  # after a forward compiled its methods
            if s.placement is not None and s.device.type == "cpu" and s.shared_runner is None:
                self.forward_ns = self._forward_cost()
            if s.cpu_affinity:
                self.cpus = _cpu_text(s.cpu_affinity)
            elif s.placement is not None and s.device.type == "cpu":
                self._place(s.placement)
                if self.forward_ns is None and self._runner.requests is not None:
                    self._costs = []  # placed again once its requests show what it costs

    def _no_grad(self) -> Any:
        """Autograd off while the model runs: inference mode (Triton's INFERENCE_MODE default,
        the cheaper), or plain no_grad for a model whose config says INFERENCE_MODE false (one
        that keeps tensors made here and changes them in place outside inference mode)."""
        # (torch.inference_mode()'s own guard: the wrapper made and entered per batch cost
        # 7.7 µs against 3.2 on a cold cache)
        return torch._C._InferenceMode(True) if self.settings.inference_mode else torch.no_grad()

    def _forward_cost(self) -> int | None:
        """The median of five batch-1 forwards here, or None when inputs cannot be made; of
        two, where both are far above LIGHT_FORWARD_NS: the placement is decided then, and
        each more forward of a heavy model is start-up time (ResNet-50 on a CPU: 75 ms each;
        a Python model of 2.5 s took 12.5 s to load)."""
        inputs = warmup_inputs(self.settings.spec, 1, self.settings.device)
        runner = self._runner
        if inputs is None or runner is None or runner.requests is not None:
            return None  # (a Triton Python model runs only what its config says: see below)
        samples: list[int] = []
        for _ in range(5):
            started = time.perf_counter_ns()
            runner.run(inputs)
            samples.append(time.perf_counter_ns() - started)
            if len(samples) == 2 and min(samples) >= CLEARLY_HEAVY_NS:
                return min(samples)
        return sorted(samples)[2]

    def _learn_cost(self, execute_ns: int) -> None:
        """One more batch-1 execute time; with five, the thread is placed by their median."""
        costs = self._costs
        placement = self.settings.placement
        assert costs is not None and placement is not None
        costs.append(execute_ns)
        if len(costs) < 5:
            return
        self._costs = None
        self.forward_ns = sorted(costs)[2]
        self._place(placement)
        log.info("model %s: a batch-1 execute takes %d µs: instance %d now on %s",
                 self.settings.spec.name, self.forward_ns // 1000, self.settings.instance,
                 self.cpus)

    def _place(self, placement: Placement) -> None:
        """Move onto the loop's core when a batch-1 forward is light (overhead-bound)."""
        cost = LIGHT_FORWARD_NS if self.forward_ns is None else self.forward_ns
        if cost < LIGHT_FORWARD_NS:
            pin_current_thread(placement.loop_cpus)
            self.cpus = f"{_cpu_text(placement.loop_cpus)} (the loop's; forward {cost / 1e3:.0f} µs)"
        else:
            self.cpus = _cpu_text(placement.compute_cpus)

    def _on_stream(self) -> Any:
        if self._stream is None:
            return _NO_STREAM
        return torch.cuda.stream(self._stream)

    def _execute(self, batch: Batch) -> None:
        s = self.settings
        runner = self._runner
        assert runner is not None
        if runner.requests is not None:
            if s.spec.decoupled:
                self._execute_streams(batch, runner.requests)
            else:
                self._execute_each(batch, runner.requests)
            return
        if s.spec.decoupled:
            self._start_generation(batch, runner)
            return
        started = batch.started_ns = time.monotonic_ns()
        # What this thread holds of a batch is let go before it reports the batch done: the
        # loop may answer and the pool take the buffers back before this thread runs again.
        inputs: Any = None
        raw: Any = None
        try:
            with self._no_grad(), self._on_stream():
                inputs = self._gather(batch)
                gathered = time.monotonic_ns()
                raw = self._forward(batch, inputs)
            batch.input_ns = gathered - started
            batch.infer_ns = time.monotonic_ns() - gathered
            self.batches_run += 1
        except Exception as error:  # the model's fault fails this batch only
            inputs = raw = None
            if not self._each_alone(batch, error):
                batch.error = self._failure(error)
            batch.infer_ns = time.monotonic_ns() - started
            self._report(self._on_done_and_idle, batch)
            return
        inputs = None
        if runner.postprocess is not None or s.postprocessor is not None:
            self._postprocess_pool.submit(self._finish_and_report, batch, raw)
            raw = None
            self._report(self._on_idle, self)
        else:
            self._finish(batch, raw)
            raw = None
            self._report(self._on_done_and_idle, batch)  # one wake-up of the loop, not two

    def _forward(self, batch: Batch, inputs: dict[str, Any]) -> Any:
        """`inputs` (gathered) through the model, by a CUDA graph where one covers them; its
        raw result on the host."""
        runner = self._runner
        assert runner is not None
        try:
            if self._graphs is not None and self._graphs.covers(inputs, batch.rows):
                raw = self._graphs.replay(inputs, batch.rows, batch.items[0].ledger)
            else:
                raw = _run(runner, self._to_device(inputs, batch), batch)
            if self._stream is not None:
                raw = map_tensors(raw, lambda t: self._to_host(t, batch.items[0].ledger))
        finally:
            if self._stream is not None:
                # Outputs come home before the next batch can overwrite a graph's buffers;
                # and a failure (the pool out of room for an output, after an earlier one's
                # copy home began) lets go of its pooled buffers only once no copy into or
                # out of them is left on the stream: one still writing a freed buffer would
                # write into another request's bytes.
                self._stream.synchronize()
        return raw

    def _each_alone(self, batch: Batch, error: Exception) -> bool:
        """A failed batch of several requests, each run again alone, so that a request that
        fails the model fails alone and its batch-mates are answered (a bad request must not
        cost the requests it was batched with; Triton fails the whole batch). Each gets its
        own answer or error (`item.error`). Not for sequences (a model's state would see a
        request twice) nor batches holding fillers. False where not tried."""
        s = self.settings
        items = batch.items
        if len(items) < 2 or s.spec.sequence is not None or any(i.filler for i in items):
            return False
        if not self._split_said:  # loudly once: a model that fails every batch of several
            # requests (and runs each alone) is served, at a batch's cost per request
            log.warning("model %s: a batch of %d requests failed (%s); each runs alone, so "
                        "that only the requests that fail it fail (said once; later ones at "
                        "debug level)", s.spec.name, len(items),
                        _model_error(s.spec.name, error).message[:300])
            self._split_said = True
        else:  # (the requests' own failures are logged as they fail)
            log.debug("model %s: a batch of %d requests failed (%s); each runs alone",
                      s.spec.name, len(items), type(error).__name__)
        batch.run_alone = True
        for item in items:
            alone = Batch([item], batch.dispatched_ns)
            try:
                with self._no_grad(), self._on_stream():
                    raw = self._forward(alone, self._gather(alone))
                self._finish(alone, raw)  # (its post-processing here: a failure's path)
                raw = None
                if alone.error is not None:
                    item.error = alone.error
            except Exception as own:  # this request's own failure
                item.results = {}
                item.error = self._failure(own)
        self.batches_run += 1
        return True

    def _failure(self, error: Exception) -> TensorgateError:
        """What a run that raised `error` answers: sizes the model refused (a 400 naming
        them), else the model's error."""
        runner = self._runner
        assert runner is not None
        spec = self.settings.spec
        return _refused_sizes(spec, runner, error) or _model_error(spec.name, error)

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
                produced = _run(runner, self._to_device(self._gather(batch), batch), batch)
            if not isinstance(produced, Iterator):
                raise InternalError(
                    f"model '{self.settings.spec.name}' is decoupled: its forward must yield "
                    f"its responses (a generator), not return a {type(produced).__name__}")
        except Exception as error:  # the model's fault fails its request only
            failed = Generation(batch, iter(()), self._wake)
            failed.run_ns = time.monotonic_ns() - started
            self._end_generation(failed, _model_error(self.settings.spec.name, error),
                                 never_added=True)
            return
        generation = Generation(batch, produced, self._wake)
        generation.run_ns = time.monotonic_ns() - started
        if self._generations.add(generation):
            self._outbox.post(self._on_idle, self)  # room for another request

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
            self._end_generation(generation, _model_error(self.settings.spec.name, failure))
            return
        # what the model set for this response
        parameters, item.answer_parameters = item.answer_parameters, NO_PARAMETERS
        for info in batch.infos or ():
            info.response_parameters.clear()
        generation.spend_credit()
        # through the outbox: one wake-up of the loop for what comes meanwhile
        self._outbox.post(item.respond, item.results, generation.give_back, parameters, False)
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
            item.error = error
        output_ns = generation.output_ns
        batch.output_ns = item.times.output_ns = output_ns
        batch.infer_ns = item.times.infer_ns = max(generation.run_ns - output_ns, 0)
        self.batches_run += 1
        # after the responses posted; the execution counted before its client hears the end
        self._outbox.post(self._on_batch_done, batch)
        self._outbox.post(self._on_stream_end, batch, item)
        if never_added or self._generations.ended():
            self._outbox.post(self._on_idle, self)

    def _wake(self) -> None:
        """On the loop: a parked request's client took a response."""
        self._queue.put(_WAKE)

    def _execute_streams(self, batch: Batch, model: TritonPythonRunner) -> None:
        """A decoupled Triton Python model's batch: `execute` hands each request's response
        sender on and returns, and this instance is free for its next batch while the
        requests stream (pipeline/response_streams.py), as on Triton. The batch stays
        running, for the scheduler, until its last request has ended. A request the model
        rescheduled (iterative_sequence) is `rescheduled` once execute returns."""
        items = [item for item in batch.items if not item.filler]  # nobody's request
        batch.streaming = True
        batch.streams_open = len(items)
        started = batch.started_ns = time.monotonic_ns()
        streams = [ResponseStream(item, batch, self._stream_results, self._outbox.post,
                                  self._on_stream_end) for item in items]
        try:
            with self._no_grad(), self._on_stream():
                rescheduled = model.start_streams([_request_inputs(item) for item in items],
                                                  [stream.send for stream in streams],
                                                  lambda error: _fail_streams(streams, error))
            for item, stream, again in zip(items, streams, rescheduled):
                if again and stream.suspend():
                    item.rescheduled = True  # it runs again (pipeline/sequences.py)
            self.batches_run += 1
        except Exception as error:  # the model's fault fails this batch's requests only
            _fail_streams(streams, _model_error(self.settings.spec.name, error))
        batch.infer_ns = time.monotonic_ns() - started
        streams = []
        self._report(self._on_done_and_idle, batch)

    def _stream_results(self, item: WorkItem, outputs: Any) -> dict[str, TensorView]:
        """A streamed response's outputs, on the thread that sent it (copies to the host
        are synchronous there: that thread's stream is not this instance's)."""
        results: dict[str, TensorView] = {}
        try:
            self._take_results(item, outputs, results, non_blocking=False)
        except TensorgateError:
            raise  # (as it is: "from" itself made the error its own cause, a cycle)
        except Exception as error:  # noqa: BLE001 - the model's fault, for its client
            raise _model_error(self.settings.spec.name, error) from error
        return results

    def _execute_each(self, batch: Batch, model: TritonPythonRunner) -> None:
        """A batch of a model that takes requests one by one: each gets its own inputs, as
        they came (on the CPU, as Triton's Python backend gives them), and its own answer
        or error; only the model raising fails the whole batch."""
        spec = self.settings.spec
        items = [item for item in batch.items if not item.filler]
        started = batch.started_ns = time.monotonic_ns()
        answers: Any = None
        try:
            with self._no_grad(), self._on_stream():
                answers = model.run_each([_request_inputs(item) for item in items])
                began, output_started = model.call_ns  # its execute's own time
                batch.output_started_ns = output_started
                for item, answer in zip(items, answers):
                    if isinstance(answer, TensorgateError):
                        item.error = answer
                        continue
                    if answer is RESCHEDULED:  # it runs again (pipeline/sequences.py)
                        item.rescheduled = True
                        continue
                    try:
                        self._take_results(item, answer.outputs, item.results)
                        item.answer_parameters = answer.parameters
                    except Exception as error:  # one response's fault fails its request
                        item.results = {}
                        item.error = _model_error(spec.name, error)
                if self._stream is not None:
                    self._stream.synchronize()  # outputs copied to the host are there
            batch.input_ns = began - started  # its requests made, as Triton's stub does
            batch.infer_ns = output_started - began
            batch.output_ns = time.monotonic_ns() - output_started
            self.batches_run += 1
            if self._costs is not None and batch.rows == 1:
                self._learn_cost(batch.infer_ns)
        except Exception as error:  # the model's fault fails this batch only
            batch.error = _model_error(spec.name, error)
        answers = None
        self._report(self._on_done_and_idle, batch)

    def _take_results(self, item: WorkItem, outputs: Any, into: dict[str, TensorView],
                      non_blocking: bool = True) -> None:
        """The outputs `item` asked for, from a Triton Python model's answer by output
        name, `into` its results (a copy to the host is asynchronous unless not
        `non_blocking`), each in the datatype the model made it in."""
        spec = self.settings.spec
        said = self.settings.said_datatype
        for name in item.wanted:
            value = outputs.get(name)
            if value is None:
                raise InternalError(f"model '{spec.name}' gave no output '{name}' for request "
                                    f"'{item.id}', which asked for it; its response has: "
                                    f"{', '.join(outputs) or 'no outputs'}")
            out = next(o for o in spec.model_outputs if o.name == name)
            found = _output_datatype(spec.name, name, value, out.datatype)
            if found is not out.datatype and name not in said:
                # Triton passes such an output on as it was made (a model's numpy math
                # made FP64 where its config says FP32): so do we, and say so once
                said.add(name)
                log.warning("model '%s' output '%s' is %s where its config says %s: answered "
                            "as %s, as Triton answers it", spec.name, name, found.name,
                            out.datatype.name, found.name)
            if isinstance(value, torch.Tensor):
                value = self._to_host(value, item.ledger, non_blocking)
            into[name] = TensorView.from_array(value, name=name, ledger=item.ledger)

    def _on_done_and_idle(self, batch: Batch) -> None:
        """On the loop: deliver the batch's results, then take the next batch."""
        self._on_batch_done(batch)
        self._on_idle(self)

    def _finish_and_report(self, batch: Batch, raw: Any) -> None:
        """In the post-processing pool."""
        self._finish(batch, raw)
        del raw  # not held while the loop answers (see _execute)
        self._report(self._on_batch_done, batch)

    def _gather(self, batch: Batch) -> dict[str, Any]:
        items = batch.items
        spec = self.settings.spec
        if len(items) == 1:  # the common batch of one: its own tensors (views), no copy
            return one_request(spec, items[0].inputs)
        ledgers = [item.ledger for item in items]
        device = self.settings.device
        on_device = None if device.type == "cpu" else device  # no host staging for a GPU
        gathered = {}
        for name in self._gathered:
            if name in items[0].inputs:
                parts = [item.inputs[name] for item in items]
                if name in spec.ragged_inputs:  # every request's elements end to end, 1-D
                    parts = [flatten(part) for part in parts]
                gathered[name] = gather_rows(parts, ledgers, self._pool, on_device)
        if spec.batch_inputs:
            gathered.update(batch_input_values(spec, [item.inputs for item in items]))
        return gathered

    def _to_device(self, inputs: dict[str, Any], batch: Batch) -> dict[str, Any]:
        device = self.settings.device
        if device.type == "cpu":
            return inputs
        moved = {}
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor) and value.device != device:  # (gathered: there)
                target = torch.empty(value.shape, dtype=value.dtype, device=device)
                copy_into(target, value, "device", batch.items[0].ledger, non_blocking=True)
                value = target
            moved[name] = value
        return moved

    def _named(self, raw: Any, spec: ModelSpec) -> dict[str, Any]:
        """A raw result post-processed (the model's postprocess, then the config's) and
        named by `spec`'s outputs."""
        runner = self._runner
        if runner is not None and runner.postprocess is not None:
            raw = runner.postprocess(raw)
        postprocessor = self.settings.postprocessor
        if postprocessor is not None:
            raw = postprocessor(list(raw) if isinstance(raw, (list, tuple)) else [raw])
        return name_outputs(raw, spec, runner.output_positions if runner else None)

    def _finish(self, batch: Batch, raw: Any) -> None:
        """Post-process, bring outputs to the host and split them per request."""
        started = batch.output_started_ns = time.monotonic_ns()
        s = self.settings
        spec = s.spec
        try:
            outputs = self._named(raw, spec)
            rows = [item.rows for item in batch.items]
            batching = spec.max_batch_size > 0
            for out in spec.model_outputs:
                if not any(out.name in item.wanted for item in batch.items):
                    continue
                value = outputs[out.name]
                if out.datatype.is_bytes and isinstance(value, list):  # TorchScript List[str]
                    value = strings_array(value, out.reshape or out.dims,
                                          sum(rows) if batching else None, spec.name, out.name)
                _check_output(spec.name, out.name, value, out.datatype)
                source = self._scattered.get(out.name)
                if source is not None:  # a batch output: cut in its requests' input shapes
                    pieces = scatter(value, out.dims, [item.inputs[source].shape
                                                       for item in batch.items],
                                     spec.name, out.name)
                elif batching:
                    pieces = split_rows(value, rows, spec.name, out.name)
                else:
                    pieces = [value]
                if out.reshape is not None and source is None:  # the model's shape → dims
                    pieces = [_reshaped(piece, ([item.rows] if batching else []) + list(out.dims),
                                        spec.name, out.name, item.ledger)
                              for piece, item in zip(pieces, batch.items)]
                for item, piece in zip(batch.items, pieces):
                    if out.name in item.wanted:
                        item.results[out.name] = TensorView.from_array(
                            piece, name=out.name, ledger=item.ledger)
            batch.take_response_parameters(spec.name)
        except Exception as error:
            batch.error = _model_error(spec.name, error)
        batch.output_ns = time.monotonic_ns() - started

    def _to_host(self, value: torch.Tensor, ledger: CopyLedger, non_blocking: bool = True
                 ) -> torch.Tensor:
        """A copy into a pooled (pinned) host buffer, counted in `ledger`; asynchronous on
        the current stream when `non_blocking` (the caller synchronizes)."""
        if value.device.type == "cpu":
            return value
        count = value.numel()
        if not count:
            return torch.empty(value.shape, dtype=value.dtype)
        # (in its own dtype: one the protocol has no datatype for is refused by name in
        # _finish, as on a CPU)
        host = torch.frombuffer(self._pool.acquire(count * value.element_size()),
                                dtype=value.dtype, count=count).view(value.shape)
        copy_into(host, value, "device", ledger, non_blocking=non_blocking)
        return host

    def _teardown(self) -> None:
        """Let go of the model here, on this thread: the version's last instance to stop
        frees its weights (not the loop, when the unloaded version's objects go), and _main
        trims the heap they were in after. Without the trim glibc kept a replaced model's
        freed weights: ~8 reloads of the built-in resnet50 left the server at 736 MB, 473 with
        it (444 before them; bench/reload_stall_bench.py)."""
        runner, self._runner = self._runner, None
        if self.settings.shared_runner is not None:  # the first instance's, run here too
            self.settings = replace(self.settings, shared_runner=None)
        if runner is not None and runner.requests is not None:
            try:
                runner.requests.close()  # a Triton Python model's finalize()
            except Exception:
                log.exception("model %s: finalize() raised", self.settings.spec.name)
        del runner  # (its weights: empty_cache below gives back what nothing else holds)
        if self.settings.device.type == "cuda":
            with CAPTURING:  # not while another instance captures its graphs (cuda_graphs)
                self._graphs = None
                torch.cuda.synchronize(self.settings.device)
                torch.cuda.empty_cache()


def _run(runner: Runner, inputs: dict[str, Any], batch: Batch) -> Any:
    if runner.takes_requests:
        return runner.run(inputs, batch.requests())
    return runner.run(inputs)


def _request_inputs(item: WorkItem) -> RequestInputs:
    """`item` as a model that takes requests one by one sees it."""
    sequence = item.sequence
    flags = 0
    if sequence is not None:
        flags = ((SEQUENCE_START if sequence.start else 0)
                 | (SEQUENCE_END if sequence.end else 0))
    deadline = item.deadline_ns  # its timeout from when it came, as `request.timeout()`
    return RequestInputs(item.inputs, RequestInfo(item.id, slice(0, item.rows), item.parameters),
                         item.wanted, sequence.id if sequence is not None else 0, flags,
                         lambda: item.abandoned, item.trace,
                         (deadline - item.enqueued_ns) // 1000 if deadline else 0)


def _fail_streams(streams: list[ResponseStream], error: TensorgateError) -> None:
    """End with `error` each of a batch's requests that has not ended yet."""
    for stream in streams:
        stream.fail(error)


def _cpu_text(cpus: frozenset[int]) -> str:
    return "cpu " + ",".join(map(str, sorted(cpus)))


def _nothing(*_: Any) -> None:
    pass


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _refused_sizes(spec: ModelSpec, runner: Runner, error: BaseException
                   ) -> InvalidArgumentError | None:
    """An exported program's failed guard over a dim other than the batch dim, as the
    request's fault (a 400, not a 500): its batch holds only requests whose dims agree (no
    ragged input), in rows the program takes from 1 (runner._check_batch_range), so the
    guard refused the sizes each request brought — ones its ranges take but its code does
    not (x.view(B, -1, 4): a dim 1 of 10). None for anything else."""
    said = str(error)
    named = guard_dims(said) if isinstance(error, AssertionError) else None
    if runner.shapes is None or spec.ragged_inputs or named is None:
        return None
    batch = spec.max_batch_size > 0
    if not any(dim > 0 or not batch for _, dim in named):
        return None  # the batch dim alone: the batcher's doing, not a request's
    return InvalidArgumentError(f"model '{spec.name}' refused the request's sizes, which its "
                                f"ranges take: its exported program's {said[0].lower()}"
                                f"{said[1:]} (the sizes it was exported for)")


def _model_error(model: str, error: BaseException) -> TensorgateError:
    if isinstance(error, TensorgateError):
        return error
    kind, text = type(error).__name__, str(error).strip()
    if isinstance(error, torch.jit.Error) and text:
        # TorchScript wraps the model's exception in two tracebacks; its last line is the
        # exception itself ("builtins.RuntimeError: negative input"). The rest goes to the log.
        log.warning("model %s raised in TorchScript:\n%s", model, text)
        kind, _, text = text.splitlines()[-1].partition(": ")
        kind = kind.rpartition(".")[2]
    return InternalError(f"model '{model}' raised {kind}: {text}")


def _reshaped(value: Any, shape: list[int], model: str, name: str, ledger: Any) -> Any:
    """An output with a config `reshape` (the model's shape of it) in its config dims. The
    reshape itself copies nothing: an output not laid out in rows is first given the one
    counted copy its tensor view would make anyway."""
    try:
        if isinstance(value, torch.Tensor):
            if not value.is_contiguous():
                value = TensorView.from_torch(value, name=name, ledger=ledger).torch()
            return value.view(shape)
        if value.dtype != object and not value.flags.c_contiguous:  # BYTES: references only
            value = TensorView.from_numpy(value, name=name, ledger=ledger).numpy()
        return value.reshape(shape)
    except (RuntimeError, ValueError):
        raise InternalError(f"model '{model}' output '{name}' has shape "
                            f"{list(value.shape)}, which does not reshape to {shape} as its "
                            f"config's dims ask") from None


def _check_output(model: str, name: str, value: Any, expected: Any) -> None:
    found = _output_datatype(model, name, value, expected)
    if found is not expected:
        raise InternalError(f"model '{model}' output '{name}' is {found.name}; its config "
                            f"says {expected.name}")


def _output_datatype(model: str, name: str, value: Any, expected: Any) -> Any:
    """The datatype of a model's output `value`; raises for one no protocol datatype holds
    or that is not a tensor."""
    try:
        if isinstance(value, torch.Tensor):
            found = datatype_of_torch(value.dtype, name)
        elif isinstance(value, np.ndarray):
            found = datatype_of_numpy(value.dtype, name)
        else:
            raise InternalError(f"model '{model}' output '{name}' is a "
                                f"{type(value).__name__}; expected a torch tensor or a numpy "
                                "array")
    except DatatypeError:  # the model's fault, not the request's (a 400 said it was)
        raise InternalError(f"model '{model}' output '{name}' is {value.dtype}, which no "
                            f"protocol datatype holds; its config says {expected.name}") from None
    return found

