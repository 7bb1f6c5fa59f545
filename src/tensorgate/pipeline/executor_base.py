"""What every kind of run on a model instance's thread shares (pipeline/executor.py): the
instance's state, and the way a batch's inputs come in and its outputs go back.

The executor's thread runs four kinds of work: batches through a model's forward
(executor.py), a decoupled tensorgate Model's generators stepped in turn
(generation_steps.py), and a Triton Python model's requests, one by one or streamed
(python_model_runs.py). Each is a class over this one, and ExecutorThread is all of them:
one object and one thread, as before the split, its state written by that thread only (but
for what the loop's side of it sets), in modules of a size one can read in a sitting
(executor.py was 955 lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tensorgate.pipeline.batching import gather_rows
from tensorgate.pipeline.cuda_graphs import GraphSet
from tensorgate.pipeline.executor_settings import ExecutorSettings
from tensorgate.pipeline.generations import Generations
from tensorgate.pipeline.handoff import LoopMailbox, ThreadInbox
from tensorgate.pipeline.idle_time import IdleTime
from tensorgate.pipeline.model_outputs import model_error, results_per_request
from tensorgate.pipeline.placement import LIGHT_FORWARD_NS, Placement, pin_current_thread
from tensorgate.pipeline.postprocess_pool import PostprocessPool
from tensorgate.pipeline.ragged import batch_input_values, flatten, one_request
from tensorgate.pipeline.runner import Runner, name_outputs
from tensorgate.pipeline.work import Batch, WorkItem
from tensorgate.repository.model_config import ModelSpec
from tensorgate.tensor.copies import CopyLedger, copy_into
from tensorgate.tensor.pool import BufferPool

__all__ = ["ExecutorBase", "cpu_text", "run_forward"]

log = logging.getLogger("tensorgate.executor")
_NO_STREAM = contextlib.nullcontext()  # (reusable: it holds nothing)


class ExecutorBase:
    """A model instance's state and its batches' way in and out; see the module's
    docstring."""

    def __init__(self, name: str, settings: ExecutorSettings, mailbox: LoopMailbox,
                 pool: BufferPool, postprocess_pool: PostprocessPool,
                 on_batch_done: Callable[[Batch], None],
                 on_idle: Callable[[Any], None],  # given the ExecutorThread
                 on_stream_end: Callable[[Batch, WorkItem], None]) -> None:
        self.name = name
        self.settings = settings
        self._loop = loop = mailbox.loop
        # what it and its requests' streams report to the loop, from any thread, in order
        self._mailbox = mailbox
        self._pool = pool
        self._postprocess_pool = postprocess_pool
        self._on_batch_done = on_batch_done
        self._on_idle = on_idle
        self._on_stream_end = on_stream_end  # a decoupled Triton Python model's request
        self._generations = Generations(settings.streams_per_instance)
        self._queue = ThreadInbox()  # its batches (closed by its thread as it ends)
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

    # -- called on the loop ----------------------------------------------------------------

    @property
    def runner(self) -> Runner | None:
        """The loaded model, once `ready`: what a second instance may share."""
        return self._runner

    # -- the thread -------------------------------------------------------------------------

    def _report(self, fn: Callable[..., None], *args: Any) -> None:
        self._mailbox.post(fn, *args)

    def _no_grad(self) -> Any:
        """Autograd off while the model runs: inference mode (Triton's INFERENCE_MODE default,
        the cheaper), or plain no_grad for a model whose config says INFERENCE_MODE false (one
        that keeps tensors made here and changes them in place outside inference mode)."""
        # (torch.inference_mode()'s own guard: the wrapper made and entered per batch cost
        # 7.7 µs against 3.2 on a cold cache)
        return torch._C._InferenceMode(True) if self.settings.inference_mode else torch.no_grad()

    def _on_stream(self) -> Any:
        if self._stream is None:
            return _NO_STREAM
        return torch.cuda.stream(self._stream)

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
            self.cpus = (f"{cpu_text(placement.loop_cpus)} (the loop's; forward "
                         f"{cost / 1e3:.0f} µs)")
        else:
            self.cpus = cpu_text(placement.compute_cpus)

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
        """Post-process a batch's raw result and hand each request its outputs (on this
        thread, or in the post-processing pool)."""
        started = batch.output_started_ns = time.monotonic_ns()
        spec = self.settings.spec
        try:
            results_per_request(batch, self._named(raw, spec), spec, self._scattered)
            batch.take_response_parameters(spec.name)
        except Exception as error:
            batch.error = model_error(spec.name, error)
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

    def _on_done_and_idle(self, batch: Batch) -> None:
        """On the loop: deliver the batch's results, then take the next batch."""
        self._on_batch_done(batch)
        self._on_idle(self)

    def _finish_and_report(self, batch: Batch, raw: Any) -> None:
        """In the post-processing pool."""
        self._finish(batch, raw)
        del raw  # not held while the loop answers (see executor.py, _execute)
        self._report(self._on_batch_done, batch)


def run_forward(runner: Runner, inputs: dict[str, Any], batch: Batch) -> Any:
    """`inputs` through the model's forward (with the batch's requests, for one that takes
    them)."""
    if runner.takes_requests:
        return runner.run(inputs, batch.requests())
    return runner.run(inputs)


def cpu_text(cpus: frozenset[int]) -> str:
    return "cpu " + ",".join(map(str, sorted(cpus)))
