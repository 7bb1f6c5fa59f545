"""Ragged batching, batch side: pure functions over one batch's requests.

`flatten` gives a ragged input as the model takes it, every request's elements end to end in
one 1-D tensor (`one_request`: a batch of one, views only); `batch_input_values` computes
the config's batch inputs from the requests' source shapes (each shape with its batch dim,
as Triton counts); `scatter` cuts a batch output back per request; `BatchRoom` keeps a batch
being formed within what the model's compiled code takes (RaggedLimits, learned at load).
repository/ragged_config.py says what the config may ask.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tensorgate.errors import InternalError
from tensorgate.pipeline.aoti_child import batch_input_tensor
from tensorgate.repository.model_config import ModelSpec, RaggedLimits

__all__ = ["BatchRoom", "batch_input_values", "flatten", "one_request", "scatter"]


def flatten(value: Any) -> Any:
    """A request's ragged input as one dimension: a view of its (contiguous) bytes."""
    return value.reshape(-1)


def one_request(spec: ModelSpec, inputs: dict[str, Any]) -> dict[str, Any]:
    """One request's `inputs` as the model takes them in a batch of their own: ragged inputs
    flat, batch inputs computed (on the CPU); another model's inputs as they are."""
    ragged = spec.ragged_inputs
    if not ragged and not spec.batch_inputs:
        return inputs
    batch = {name: flatten(value) if name in ragged else value for name, value in inputs.items()}
    batch.update(batch_input_values(spec, [inputs]))
    return batch


def batch_input_values(spec: ModelSpec,
                       requests: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Each of `spec`'s batch inputs for a batch of `requests` (their inputs by name, each
    with its batch dim, before flattening)."""
    values = {}
    for batch_input in spec.batch_inputs:
        shapes = [tuple(int(d) for d in request[batch_input.source].shape)
                  for request in requests]
        counts = [math.prod(shape) for shape in shapes]
        rows = ([list(shape[1:]) for shape in shapes for _ in range(shape[0])]
                if batch_input.kind.startswith("BATCH_ITEM_SHAPE") else None)
        values[batch_input.target] = batch_input_tensor(batch_input.kind, counts, rows,
                                                        batch_input.datatype.torch)
    return values


def scatter(value: Any, dims: Sequence[int], shapes: Sequence[Sequence[int]], model: str,
            output: str) -> list[Any]:
    """The model's flat `value` cut per request: each part shaped `[-1, *dims]` with each
    -1 taken from that request's source input shape, in order (Triton's
    BATCH_SCATTER_WITH_INPUT_SHAPE). Views where `value` is contiguous."""
    wanted = [-1, *dims]
    part_shapes = []
    for shape in shapes:
        if any(want == -1 and k >= len(shape) for k, want in enumerate(wanted)):
            raise InternalError(f"model '{model}' output '{output}' has dims {list(dims)}: a "
                                f"variable dim past its source input's {len(shape)} dims")
        part_shapes.append([int(shape[k]) if want == -1 else want
                            for k, want in enumerate(wanted)])
    flat = value.reshape(-1)
    needed = sum(math.prod(part) for part in part_shapes)
    if needed > len(flat):
        raise InternalError(f"model '{model}' output '{output}' has {len(flat)} elements; "
                            f"scattered in its requests' input shapes it needs {needed}")
    parts = []
    start = 0
    for part in part_shapes:
        end = start + math.prod(part)
        parts.append(flat[start:end].reshape(part))
        start = end
    return parts


class BatchRoom:
    """What one batch being formed still has room for, under `RaggedLimits`."""

    __slots__ = ("_limits", "_elements", "_requests", "_rows")

    def __init__(self, limits: RaggedLimits) -> None:
        self._limits = limits
        self._elements = [0] * len(limits.elements)
        self._requests = 0
        self._rows = 0

    def take(self, inputs: Mapping[str, Any], rows: int) -> bool:
        """Count a request (its `inputs` by name) in, if the batch has room for it."""
        limits = self._limits
        if limits.requests is not None and self._requests + 1 > limits.requests:
            return False
        if limits.rows is not None and self._rows + rows > limits.rows:
            return False
        counts = [math.prod(inputs[name].shape) if name in inputs else 0
                  for name, _ in limits.elements]
        if any(held + count > most for held, count, (_, most)
               in zip(self._elements, counts, limits.elements)):
            return False
        self._elements = [held + count for held, count in zip(self._elements, counts)]
        self._requests += 1
        self._rows += rows
        return True
