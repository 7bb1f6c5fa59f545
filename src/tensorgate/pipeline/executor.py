"""The executor: one thread per model instance, the only code that touches the device.

It loads the model, warms it and captures CUDA graphs (pipeline/warm_up.py), then runs
batches from its queue: gather inputs (a counted copy when more than one request),
host→device, forward, device→host, and either finishes the outputs itself or hands them to
the post-processing pool. A decoupled tensorgate Model's requests are generators it steps in
turn between batches (pipeline/generations.py). Every result goes back to the event loop
through its mailbox (pipeline/handoff.py: one wake-up for all that come before it runs,
a decoupled model's many responses too); the loop never waits on this thread.

Threads are started here and nowhere else: the executor threads and the post-processing pool
(but for the event loop an `async def execute` of a decoupled Triton Python model runs on,
which that model's instance owns: pipeline/triton_python.py).
Facts that shaped this (2-core machine, ResNet-50, see DESIGN.md): torch's OpenMP pool belongs
to the thread that first ran a parallel region, so loading, warm-up and every run happen on
this thread; intra-op threads default to one fewer than the cores so the loop keeps one.

This module is the thread and a batch's forward; the rest of the instance is in
executor_base.py (its state, inputs in, outputs out), generation_steps.py (a decoupled
tensorgate Model), python_model_runs.py (a Triton Python model) and model_outputs.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from tensorgate.errors import TensorgateError
from tensorgate.model import ModelContext
from tensorgate.pipeline import heap
from tensorgate.pipeline.cpu_quota import usable_cpus
from tensorgate.pipeline.cuda_graphs import CAPTURING, map_tensors
from tensorgate.pipeline.executor_base import cpu_text, run_forward
from tensorgate.pipeline.executor_settings import ExecutorSettings
from tensorgate.pipeline.generation_steps import WAKE, GenerationSteps
from tensorgate.pipeline.handoff import LoopMailbox
from tensorgate.pipeline.idle_time import lowered_to_idle_time
from tensorgate.pipeline.input_bounds import bounded_spec
from tensorgate.pipeline.model_outputs import model_error, refused_sizes
from tensorgate.pipeline.placement import LIGHT_FORWARD_NS, pin_current_thread, thread_cpus
from tensorgate.pipeline.postprocess_pool import PostprocessPool
from tensorgate.pipeline.python_model_runs import PythonModelRuns
from tensorgate.pipeline.response_streams import CREDIT_POLL_S
from tensorgate.pipeline.made_inputs import warmup_inputs
from tensorgate.pipeline.runner import load_runner
from tensorgate.pipeline.warm_up import WarmUp
from tensorgate.pipeline.work import Batch, WorkItem
from tensorgate.repository.model_config import ModelConfigError
from tensorgate.tensor.pool import BufferPool

__all__ = ["ExecutorThread", "default_intra_op_threads"]

log = logging.getLogger("tensorgate.executor")
_STOP = object()


def default_intra_op_threads() -> int:
    """All usable CPUs but one, so the event loop keeps a core to itself (usable: the
    calling thread's affinity before the engine pinned it, within a container's CPU quota:
    pipeline/cpu_quota.py)."""
    return max(1, usable_cpus(len(thread_cpus())) - 1)


# a batch-1 forward this slow, twice, is heavy beyond doubt: no more timing runs at load
CLEARLY_HEAVY_NS = 4 * LIGHT_FORWARD_NS


class ExecutorThread(GenerationSteps, PythonModelRuns):
    """One model instance on one device, behind a queue of batches."""

    def __init__(self, name: str, settings: ExecutorSettings, mailbox: LoopMailbox,
                 pool: BufferPool, postprocess_pool: PostprocessPool,
                 on_batch_done: Callable[[Batch], None],
                 on_idle: Callable[[ExecutorThread], None],
                 on_stream_end: Callable[[Batch, WorkItem], None]) -> None:
        super().__init__(name, settings, mailbox, pool, postprocess_pool, on_batch_done, on_idle,
                         on_stream_end)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # -- called on the loop ----------------------------------------------------------------

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

    # -- the thread -------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._take_batches()
        finally:
            self._queue.close()  # what is put from now on is dropped: nobody would take it

    def _take_batches(self) -> None:
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
            if batch is WAKE:
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
                if not s.passive:
                    self._warm_up()
            if (s.placement is not None and s.device.type == "cpu" and s.shared_runner is None
                    and not s.passive):
                self.forward_ns = self._forward_cost()
            if s.cpu_affinity:
                self.cpus = cpu_text(s.cpu_affinity)
            elif s.placement is not None and s.device.type == "cpu":
                self._place(s.placement)
                if self.forward_ns is None and self._runner.requests is not None:
                    self._costs = []  # placed again once its requests show what it costs

    def _warm_up(self) -> None:
        assert self._runner is not None
        started = time.perf_counter()
        warm = WarmUp(self.settings, self._runner, self._named, self._stream)
        warm.run()
        self.settings = warm.settings  # its least sizes may have gone up
        self._graphs = warm.graphs
        if warm.graphs_s:
            self.setup_s["CUDA graphs"] = warm.graphs_s
        self.setup_s["warm-up"] = time.perf_counter() - started - warm.graphs_s
        self._runner.decide_sharing()  # after a forward compiled its methods

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
                raw = run_forward(runner, self._to_device(inputs, batch), batch)
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
                        model_error(s.spec.name, error).message[:300])
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
                    item.set_error(alone.error)
            except Exception as own:  # this request's own failure
                item.results = {}
                item.set_error(self._failure(own))
        self.batches_run += 1
        return True

    def _failure(self, error: Exception) -> TensorgateError:
        """What a run that raised `error` answers: sizes the model refused (a 400 naming
        them), else the model's error."""
        runner = self._runner
        assert runner is not None
        spec = self.settings.spec
        return refused_sizes(spec, runner, error) or model_error(spec.name, error)

    def _teardown(self) -> None:
        """Let go of the model here, on this thread: the version's last instance to stop
        frees its weights (not the loop, when the unloaded version's objects go), and
        _take_batches trims the heap they were in after. Without the trim glibc kept a
        replaced model's freed weights: ~8 reloads of the built-in resnet50 left the server at
        736 MB, 473 with it (444 before them; bench/reload_stall_bench.py)."""
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


def _nothing(*_: Any) -> None:
    pass


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
