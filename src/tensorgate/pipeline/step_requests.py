"""An ensemble's step as a request to its model, through the engine like any client's.

A step runs within what is left of the ensemble request's deadline, in its sequence (a
stateful step keeps its state), at its priority, with its parameters, counting its copies to
the ensemble request and traced as a child of its trace. EnsembleScheduler (ensemble.py)
calls `run` and `stream`; the Engine makes them with its `infer` and `infer_stream`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from tensorgate.pipeline.requests import InferenceRequest, InferenceResult
from tensorgate.pipeline.trace import Trace
from tensorgate.pipeline.work import WorkItem
from tensorgate.tensor.view import TensorView

__all__ = ["StepRequests"]


class StepRequests:
    """Ensemble steps sent to `infer` (a model that answers once) or `infer_stream` (a
    decoupled one)."""

    def __init__(self, infer: Callable[[InferenceRequest], Awaitable[InferenceResult]],
                 infer_stream: Callable[[InferenceRequest],
                                        AsyncGenerator[InferenceResult, None]]) -> None:
        self._infer = infer
        self._infer_stream = infer_stream

    async def run(self, model: str, version: int | None, inputs: dict[str, TensorView],
                  outputs: list[str], item: WorkItem) -> dict[str, TensorView]:
        """One step of the ensemble request `item`: its model's outputs."""
        trace = item.trace.child(model) if item.trace is not None else None
        try:
            result = await self._infer(_step_request(model, version, inputs, outputs, item,
                                                     trace))
        finally:
            if trace is not None:
                trace.finish()
        return result.outputs

    async def stream(self, model: str, version: int | None, inputs: dict[str, TensorView],
                     outputs: list[str], item: WorkItem
                     ) -> AsyncGenerator[dict[str, TensorView], None]:
        """A decoupled step: its responses' outputs as they come; leaving early stops its
        model."""
        trace = item.trace.child(model) if item.trace is not None else None
        try:
            async with contextlib.aclosing(self._infer_stream(_step_request(
                    model, version, inputs, outputs, item, trace))) as responses:
                async for result in responses:
                    if result.error is not None:  # an error response ends the ensemble's
                        try:
                            raise result.error
                        finally:  # (as http_generate.generate: no cycle through this frame)
                            del result
                    yield result.outputs
        finally:
            if trace is not None:
                trace.finish()


def _step_request(model: str, version: int | None, inputs: dict[str, TensorView],
                  outputs: list[str], item: WorkItem, trace: Trace | None) -> InferenceRequest:
    timeout_us = None
    if item.deadline_ns:
        timeout_us = max(1, (item.deadline_ns - time.monotonic_ns()) // 1000)
    return InferenceRequest(model, inputs, version, outputs, timeout_us, "", item.ledger,
                            item.priority, item.sequence, item.parameters, trace)
