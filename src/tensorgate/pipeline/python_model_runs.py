"""A Triton Python model's requests on its instance's thread: handed to its `execute`
one by one, each with its own inputs as they came and its own answer or error, as Triton's
Python backend gives them; or, for a decoupled one, each with a response sender, the
instance free for its next batch while they stream (pipeline/response_streams.py). Part of
ExecutorThread (pipeline/executor.py; the split: executor_base.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from tensorgate.errors import InternalError, TensorgateError
from tensorgate.model import RequestInfo
from tensorgate.pipeline.executor_base import ExecutorBase
from tensorgate.pipeline.model_outputs import model_error, output_datatype
from tensorgate.pipeline.response_streams import ResponseStream
from tensorgate.pipeline.triton_python import RESCHEDULED, RequestInputs, TritonPythonRunner
from tensorgate.pipeline.work import Batch, WorkItem
from tensorgate.python_backend import (TRITONSERVER_REQUEST_FLAG_SEQUENCE_END as SEQUENCE_END,
                                       TRITONSERVER_REQUEST_FLAG_SEQUENCE_START as SEQUENCE_START)
from tensorgate.tensor.view import TensorView

__all__ = ["PythonModelRuns"]

log = logging.getLogger("tensorgate.executor")


class PythonModelRuns(ExecutorBase):
    """The executor's Triton Python model batches: requests one by one, or streamed."""

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
        streams = [ResponseStream(item, batch, self._stream_results, self._mailbox.post,
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
            batch.error = model_error(self.settings.spec.name, error)  # (for its statistics)
            _fail_streams(streams, batch.error)
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
            raise model_error(self.settings.spec.name, error) from error
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
                        item.set_error(answer)
                        continue
                    if answer is RESCHEDULED:  # it runs again (pipeline/sequences.py)
                        item.rescheduled = True
                        continue
                    try:
                        self._take_results(item, answer.outputs, item.results)
                        item.answer_parameters = answer.parameters
                    except Exception as error:  # one response's fault fails its request
                        item.results = {}
                        item.set_error(model_error(spec.name, error))
                if self._stream is not None:
                    self._stream.synchronize()  # outputs copied to the host are there
            batch.input_ns = began - started  # its requests made, as Triton's stub does
            batch.infer_ns = output_started - began
            batch.output_ns = time.monotonic_ns() - output_started
            self.batches_run += 1
            if self._costs is not None and batch.rows == 1:
                self._learn_cost(batch.infer_ns)
        except Exception as error:  # the model's fault fails this batch only
            batch.error = model_error(spec.name, error)
            batch.infer_ns = time.monotonic_ns() - started  # an execution all the same,
            batch.counted_if_failed = True  # as Triton's Python backend counts it
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
            found = output_datatype(spec.name, name, value, out.datatype)
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
