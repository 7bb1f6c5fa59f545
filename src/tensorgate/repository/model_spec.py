"""What tensorgate serves a model by: the frozen ModelSpec that model_config.py makes of a
config.pbtxt (its tensors, batching, instance groups, warm-up), and the config as Triton's
`/config` JSON (config_json).

Frozen, and built once at load: the request path reads it without locks. Dims, bounds and
ragged limits a compiled model has are learned at load (pipeline/input_bounds.py) and set
on a copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, NamedTuple

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.repository.ragged_config import BatchInput, BatchOutput
from tensorgate.repository.sequence_config import SequencePolicy
from tensorgate.tensor.dtypes import DataType

__all__ = ["BatchingPolicy", "InstanceGroup", "ModelSpec", "QueuePolicy", "RaggedLimits",
           "TensorSpec", "TiedDim", "WarmupInput", "WarmupSample", "config_json"]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output. `dims` exclude the batch dim; -1 is a variable dim."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False
    label_filename: str = ""
    ragged: bool = False  # allow_ragged_batch: batches whatever its shape, flat (ragged_config)
    # Per dim of the model's shape of it (`reshape`, else `dims`), the (fewest, most) it
    # may be where the model's compiled code is bounded (most None: no bound), learned at
    # load (pipeline/input_bounds.py); None: not bounded
    bounds: tuple[tuple[int, int | None], ...] | None = None

    def row_bytes(self, reshaped: bool = True) -> int:
        """Bytes of one row of it in zeros (variable dims at their least; a BYTES element as
        1), in the shape the model takes (`reshaped`) or the config's `dims`."""
        dims = (self.least_dims() if reshaped or self.reshape is None
                else [1 if d == -1 else d for d in self.dims])
        return max(self.datatype.itemsize, 1) * math.prod(dims)

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Whether a per-item shape (no batch dim) fits `dims`."""
        return len(shape) == len(self.dims) and all(
            want == -1 or want == got for want, got in zip(self.dims, shape))

    def outside_bounds(self, shape: tuple[int, ...]) -> tuple[int, str] | None:
        """The first dim of a per-item shape as the model takes it (reshaped) outside
        `bounds`, and what that dim takes ("2 to 64"); None where it is inside them."""
        for dim, (size, (fewest, most)) in enumerate(zip(shape, self.bounds or ())):
            if size < fewest or (most is not None and size > most):
                return dim, (f"exactly {fewest}" if fewest == most else
                             f"{fewest} or more" if most is None else f"{fewest} to {most}")
        return None

    def least_dims(self) -> list[int]:
        """The dims the model takes (`reshape`, else `dims`) with each variable one at its
        smallest: 1, or the least of its bounds."""
        dims = self.reshape or self.dims
        fewest = [low for low, _ in self.bounds] if self.bounds else [1] * len(dims)
        return [max(low, 1) if d == -1 else d for d, low in zip(dims, fewest)]


class TiedDim(NamedTuple):
    """A dim of an input (counting the batch dim, as the model takes the input) that a
    compiled model sizes as `scale` * s + `offset`, s one size for the dims of its group:
    an attention mask of the ids' length (s), edges of one more (s + 1), pairs (2*s)."""

    input: str
    dim: int
    scale: int = 1
    offset: int = 0

    @property
    def plain(self) -> bool:
        """Whether the dim is s itself."""
        return self.scale == 1 and self.offset == 0

    def symbol(self, size: int) -> int | None:
        """The s a size of this dim stands for; None where no whole s gives it."""
        s, rest = divmod(size - self.offset, self.scale)
        return None if rest or s < 0 else s

    def formula(self) -> str:
        """How the model sizes this dim: "s", "s + 1", "2*s - 3"."""
        term = "s" if self.scale == 1 else f"{self.scale}*s"
        if not self.offset:
            return term
        return f"{term} {'+' if self.offset > 0 else '-'} {abs(self.offset)}"


@dataclass(frozen=True, slots=True)
class RaggedLimits:
    """What a batch of a ragged model's requests may hold, where its compiled code takes
    fewer than any (pipeline/input_bounds.py): a ragged input's elements end to end, and
    the requests a batch input counts. A batch past them fails every request in it (an
    exported program's guards) or is read past (an AOTInductor package)."""

    # (ragged input, the most elements of it one batch may hold)
    elements: tuple[tuple[str, int], ...] = ()
    # (ragged input, the most one request may bring: a batch of it alone holds them all, and
    # a BATCH_MAX_ELEMENT_COUNT_AS_SHAPE input is as long as its longest request)
    request_elements: tuple[tuple[str, int], ...] = ()
    requests: int | None = None  # the most requests one batch may hold (a batch input counts)
    # the most rows: a batched input's dim 0 has one a row, as a BATCH_ITEM_SHAPE input has
    rows: int | None = None
    # groups of (ragged input, a): the model sizes each a*n from one n, so each request's
    # elements of them must be too (a batch's sums then are)
    ties: tuple[tuple[tuple[str, int], ...], ...] = ()
    # (ragged input, the fewest elements one request may bring), where an exported
    # program's guard refused fewer at its warm-up (a batch of one request holds only its
    # own): learned there (input_bounds.raised_least), not from its range, which an empty
    # request passes
    least: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One priority level's queue (Triton's ModelQueuePolicy; 0 = no bound, no timeout).
    `delay_on_timeout` is `timeout_action: DELAY`: a request past its timeout is not failed
    but waits behind every request of its level that has not timed out."""

    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """dynamic_batching, with Triton's defaults (0 = no delay, no priority levels).

    `queues` has one policy per priority level, level 1 (the highest) first; without
    priority levels it is the one default queue policy."""

    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    queues: tuple[QueuePolicy, ...] = (QueuePolicy(),)
    default_level: int = 0  # index into `queues` for requests without a priority
    # a batch of this many rows runs before the delay ends (a full or a preferred batch
    # still does; 0: no such count): a direct sequence batcher's minimum_slot_utilization
    # (repository/sequence_config.py)
    ready_rows: int = 0

    def level(self, priority: int) -> int:
        """The queue index for a request's `priority` parameter. As in Triton, 0 and values
        above the model's levels mean the default level (1 is the highest priority)."""
        if 0 < priority <= len(self.queues):
            return priority - 1
        return self.default_level


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    count: int
    kind: str  # KIND_CPU, KIND_GPU, KIND_AUTO, KIND_MODEL
    gpus: tuple[int, ...] = ()
    # its rate_limiter: the resources each instance holds while it executes (name, count,
    # global) and its priority (a weight: 2 gets half the turns of 1); acted on only
    # with --rate-limit execution_count (pipeline/rate_limiter.py)
    resources: tuple[tuple[str, int, bool], ...] = ()
    priority: int = 1
    passive: bool = False  # loaded, not warmed up, never given a request (as on Triton)


@dataclass(frozen=True, slots=True)
class WarmupInput:
    """One input of a warm-up sample: per-item `dims` (no batch dim) of zeros, random
    values, or a file's bytes (row-major; BYTES as 4-byte lengths and bytes) found in the
    model's `warmup/` folder."""

    datatype: DataType
    dims: tuple[int, ...]
    data: Literal["zero", "random", "file"]
    file: str = ""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """A `model_warmup` entry: run `count` times at `batch_size` before the model is ready."""

    name: str
    batch_size: int
    inputs: tuple[tuple[str, WarmupInput], ...]
    count: int


@dataclass(frozen=True)
class ModelSpec:
    """What tensorgate serves a model by; `config` keeps the full proto for `/config`."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batching: BatchingPolicy | None
    instance_groups: tuple[InstanceGroup, ...]
    version_policy: tuple[str, tuple[int, ...]]  # ("latest", (n,)) | ("all", ()) | ("specific", vs)
    parameters: dict[str, str] = field(default_factory=dict)
    default_model_filename: str = ""
    # cc_model_filenames: the file a GPU instance loads by its compute capability ("9.0")
    cc_model_filenames: tuple[tuple[str, str], ...] = ()
    # model_transaction_policy { decoupled: true }: any number of responses per request
    decoupled: bool = False
    sequence: SequencePolicy | None = None  # sequence_batching: a stateful model
    warmup: tuple[WarmupSample, ...] = ()  # model_warmup; none: zeros at batch 1
    ignored: tuple[str, ...] = ()  # fields given, not acted on (model_config.NOT_ACTED_ON)
    # optimization.cuda.graph_spec's batch sizes; none: the server's (graph_batch_sizes)
    graph_sizes: tuple[int, ...] = ()
    response_cache: bool = False  # response_cache { enable: true } (pipeline/response_cache)
    batch_inputs: tuple[BatchInput, ...] = ()  # ragged batching (repository/ragged_config)
    batch_outputs: tuple[BatchOutput, ...] = ()
    # groups of dims a compiled model sizes from one size s, learned at load
    # (pipeline/input_bounds.py): a request's must agree
    tied_dims: tuple[tuple[TiedDim, ...], ...] = ()
    ragged_limits: RaggedLimits | None = None  # learned at load, as tied_dims
    # metric_tags as labels, ("_key", value) sorted (repository/metrics_config.py)
    metric_tags: tuple[tuple[str, str], ...] = ()
    # model_metrics: a latency histogram's bucket bounds (ns) by its name, where set
    histogram_bounds: tuple[tuple[str, tuple[int, ...]], ...] = ()
    config: pb.ModelConfig = field(default_factory=pb.ModelConfig, repr=False, compare=False)

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    @cached_property
    def ragged_inputs(self) -> frozenset[str]:
        """The inputs with `allow_ragged_batch`: batched flat, whatever each request's shape."""
        return frozenset(spec.name for spec in self.inputs if spec.ragged)

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    @cached_property
    def input_names(self) -> frozenset[str]:
        """The inputs a client may send (checked on every request)."""
        return frozenset(spec.name for spec in self.inputs)

    @cached_property
    def output_set(self) -> frozenset[str]:
        """`output_names` to look up in."""
        return frozenset(self.output_names)

    @cached_property
    def model_inputs(self) -> tuple[TensorSpec, ...]:
        """What the model receives: the inputs clients send, then a stateful model's control
        inputs and state inputs, or the batch inputs, which the server sets."""
        if self.sequence is None:
            return self.inputs + tuple(TensorSpec(b.target, b.datatype, (-1,))
                                       for b in self.batch_inputs)
        return (self.inputs
                + tuple(TensorSpec(c.name, c.datatype, (1,)) for c in self.sequence.controls)
                + tuple(TensorSpec(s.input_name, s.datatype, s.dims)
                        for s in self.sequence.states))

    @cached_property
    def model_outputs(self) -> tuple[TensorSpec, ...]:
        """What the model returns: its outputs, then state outputs not listed among them."""
        if self.sequence is None:
            return self.outputs
        listed = {o.name for o in self.outputs}
        return self.outputs + tuple(TensorSpec(s.output_name, s.datatype, s.dims)
                                    for s in self.sequence.states
                                    if s.output_name not in listed)

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)

    def config_dict(self) -> dict[str, Any]:
        """The config as Triton's `/config` JSON (config_json)."""
        return config_json(self.config)


def config_json(config: pb.ModelConfig) -> dict[str, Any]:
    """`config` as Triton's `/config` JSON: snake_case names, enum names, scalar fields at
    their defaults too (`"max_batch_size": 0`, as Triton prints it: code reading
    `config["max_batch_size"]` must not fail on a model that does not batch), and 64-bit
    integers as numbers (`"dims": [3, 224]`), where protobuf's JSON writes strings."""
    value = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                      always_print_fields_with_no_presence=True)
    _int64_as_numbers(config, value)
    return value


_INT64 = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


def _int64_as_numbers(message: Message, value: dict[str, Any]) -> None:
    """Turn the 64-bit integers protobuf's JSON writes as strings back into numbers, in
    place, walking `message`'s schema beside its JSON `value`."""
    for descriptor in message.DESCRIPTOR.fields:
        name = descriptor.name
        if name not in value:
            continue
        field_value = getattr(message, name)
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            entry = descriptor.message_type.fields_by_name["value"]
            if entry.message_type is not None:
                for key, item in field_value.items():
                    _int64_as_numbers(item, value[name][str(key)])
            elif entry.cpp_type in _INT64:
                value[name] = {key: int(item) for key, item in value[name].items()}
        elif descriptor.message_type is not None:
            if isinstance(value[name], list):  # a repeated field
                for item, item_value in zip(field_value, value[name]):
                    _int64_as_numbers(item, item_value)
            else:
                _int64_as_numbers(field_value, value[name])
        elif descriptor.cpp_type in _INT64:
            value[name] = ([int(item) for item in value[name]] if isinstance(value[name], list)
                           else int(value[name]))
