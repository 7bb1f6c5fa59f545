"""`batch_input` and `batch_output` → frozen BatchInput / BatchOutput: Triton's ragged batching.

An input with `allow_ragged_batch: true` batches across requests whatever its shape: the model
gets every request's elements concatenated into one 1-D tensor, and learns where each
request's part ends from a batch input the server computes from the batch (for `[1,3]`,
`[1,4]`, `[1,5]`: `BATCH_ACCUMULATED_ELEMENT_COUNT` is `[3, 7, 12]`). A batch output is the
reverse: the model's flat output cut back per request in the shape of a source input.
pipeline/ragged.py does the computing; this module checks the config once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError
from tensorgate.tensor.dtypes import DataType, datatype_from_config

__all__ = ["BatchInput", "BatchOutput", "BatchInputKind", "batch_inputs", "batch_outputs"]

BatchInputKind = Literal["BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT",
                         "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
                         "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "BATCH_ITEM_SHAPE",
                         "BATCH_ITEM_SHAPE_FLATTEN"]
_BATCH_INPUT_TYPES = ("TYPE_INT32", "TYPE_INT64", "TYPE_FP32")


@dataclass(frozen=True, slots=True)
class BatchInput:
    """An input the server makes for each batch, from the shapes of `source`'s requests."""

    kind: BatchInputKind
    target: str
    datatype: DataType
    source: str


@dataclass(frozen=True, slots=True)
class BatchOutput:
    """BATCH_SCATTER_WITH_INPUT_SHAPE: output `target` is cut per request, each part shaped
    like the output's config dims with each -1 taken from that request's `source` shape."""

    target: str
    source: str


def batch_inputs(config: pb.ModelConfig, source: str,
                 inputs: dict[str, bool]) -> tuple[BatchInput, ...]:
    """The config's batch inputs, checked; `inputs` maps each config input to whether it is
    ragged."""
    found = []
    for message in config.batch_input:
        kind = pb.BatchInput.Kind.Name(message.kind)
        where = f"batch_input {kind}"
        target = _one(list(message.target_name), f"{where}: 'target_name'", source)
        where = f"batch_input '{target}'"
        if target in inputs:
            raise ModelConfigError(source, f"{where} is also a config input; the server sets "
                                           "it, so a client cannot send it")
        origin = _one(list(message.source_input), f"{where}: 'source_input'", source)
        if origin not in inputs:
            raise ModelConfigError(source, f"{where}: source_input '{origin}' is not an input; "
                                           f"inputs are: {', '.join(inputs)}")
        name = pb.DataType.Name(message.data_type)
        if name not in _BATCH_INPUT_TYPES:
            raise ModelConfigError(source, f"{where} has data_type {name}; it must be "
                                           f"{', '.join(_BATCH_INPUT_TYPES)}")
        found.append(BatchInput(kind, target, datatype_from_config(name, target),
                                origin))
    targets = [b.target for b in found]
    repeated = sorted({t for t in targets if targets.count(t) > 1})
    if repeated:
        raise ModelConfigError(source, f"batch_input target names must be unique; repeated: "
                                       f"{', '.join(repeated)}")
    if (found or any(inputs.values())) and config.max_batch_size < 1:
        raise ModelConfigError(source, "ragged batching ('allow_ragged_batch', 'batch_input') "
                                       "needs 'max_batch_size' of 1 or more")
    if (found or any(inputs.values())) and config.HasField("sequence_batching"):
        raise ModelConfigError(source, "ragged batching ('allow_ragged_batch', 'batch_input') "
                                       "is not supported with 'sequence_batching' here")
    return tuple(found)


def batch_outputs(config: pb.ModelConfig, source: str, inputs: dict[str, bool],
                  outputs: list[str]) -> tuple[BatchOutput, ...]:
    found = []
    for message in config.batch_output:
        target = _one(list(message.target_name), "batch_output: 'target_name'", source)
        where = f"batch_output '{target}'"
        if target not in outputs:
            raise ModelConfigError(source, f"{where} is not an output; outputs are: "
                                           f"{', '.join(outputs)}")
        origin = _one(list(message.source_input), f"{where}: 'source_input'", source)
        if origin not in inputs:
            raise ModelConfigError(source, f"{where}: source_input '{origin}' is not an input; "
                                           f"inputs are: {', '.join(inputs)}")
        found.append(BatchOutput(target, origin))
    if found and config.max_batch_size < 1:
        raise ModelConfigError(source, "'batch_output' needs 'max_batch_size' of 1 or more")
    return tuple(found)


def _one(values: list[str], what: str, source: str) -> str:
    if len(values) != 1:
        raise ModelConfigError(source, f"{what} must name exactly one tensor, got "
                                       f"{len(values)}")
    return values[0]
