"""`sequence_batching` → a frozen SequencePolicy: what a stateful model is served by.

A stateful model sees more inputs than its clients send: the control inputs (START, END,
READY, CORRID) the server sets for each request, and each implicit state's input, which
holds what the model put in the state's output on the previous request of the sequence.
Those tensors are declared here only, never in `input` (Triton's rule); a TorchScript model
takes them where pipeline/torch_io places them (`<name>__<index>`, a forward argument's
name, else after its config inputs in config order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError
from tensorgate.tensor.dtypes import DataType, datatype_from_config

__all__ = ["ControlInput", "SequencePolicy", "SequenceState", "sequence_policy"]

ControlKind = Literal["START", "END", "READY", "CORRID"]
DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds

_KINDS: dict[int, ControlKind] = {
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
_CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


@dataclass(frozen=True, slots=True)
class ControlInput:
    """One control tensor: shape [1] per request. `false_true` holds the values meaning
    false and true (START, END, READY); a CORRID control carries the sequence id."""

    name: str
    kind: ControlKind
    datatype: DataType
    false_true: tuple[float | int | bool, float | int | bool] = (0, 1)


@dataclass(frozen=True, slots=True)
class SequenceState:
    """An implicit state: the model's `output_name` on one request of a sequence is its
    `input_name` on the next. The first request gets `initial_dims` (variable dims as 1) of
    zeros, or of `initial_file`'s bytes (under the model's `initial_state/` folder)."""

    input_name: str
    output_name: str
    datatype: DataType
    dims: tuple[int, ...]
    initial_dims: tuple[int, ...]
    initial_file: str = ""


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    """How a stateful model's sequences are scheduled.

    `direct`: each sequence holds one batch slot of one instance from its start to its end;
    its requests always run in that row of the batch, and rows without a request carry
    READY false. `oldest`: each instance batches the next request of up to `slots` of its
    sequences, the oldest first. Either way a sequence runs on one instance, one request at
    a time, in the order they arrived; sequences beyond every instance's slots wait for one
    to end.

    `iterative` (Triton's `iterative_sequence`): a request that comes without a sequence id
    is a sequence of its own (an id given by the server, START set), and the model may
    reschedule it (a Triton Python model's `set_release_flags(RESCHEDULE)`): it runs again in
    a later batch, START false (END as its client set it), until the model answers it, which
    ends a sequence the server made."""

    strategy: Literal["direct", "oldest"]
    slots: int  # per instance
    idle_us: int
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    preserve_ordering: bool
    controls: tuple[ControlInput, ...]
    states: tuple[SequenceState, ...]
    iterative: bool = False
    # direct: a batch of this many ready sequences runs before max_queue_delay_us ends
    # (minimum_slot_utilization of the slots; 0 with no delay)
    ready_rows: int = 0


def sequence_policy(config: pb.ModelConfig, source: str) -> SequencePolicy:
    """The `sequence_batching` of `config`, checked against its inputs and outputs."""
    batching = config.sequence_batching
    if config.model_transaction_policy.decoupled and batching.state:
        raise ModelConfigError(source, "sequence_batching 'state' (implicit state) with a "
                                       "decoupled model is not supported: keep the state in "
                                       "the model, by its CORRID")
    max_batch = config.max_batch_size
    taken = {t.name: "an input" for t in config.input}
    controls = tuple(_control(c, source, taken) for c in batching.control_input)
    states = tuple(_state(s, source, taken) for s in batching.state)
    if batching.WhichOneof("strategy_choice") == "oldest":
        oldest = batching.oldest
        bad = [s for s in oldest.preferred_batch_size if not 1 <= s <= max(max_batch, 1)]
        if bad:
            raise ModelConfigError(source, f"sequence_batching oldest 'preferred_batch_size' "
                                           f"{bad} must lie in [1, max_batch_size="
                                           f"{max_batch}]")
        # Unset (0): as many candidates as a batch has rows.
        return SequencePolicy("oldest", oldest.max_candidate_sequences or max(max_batch, 1),
                              batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US,
                              oldest.max_queue_delay_microseconds,
                              tuple(sorted(set(oldest.preferred_batch_size))),
                              oldest.preserve_ordering, controls, states,
                              batching.iterative_sequence)
    direct = batching.direct  # Triton's default strategy
    slots = max(max_batch, 1)
    delay_us, ready = _direct_delay(direct, slots, source)
    return SequencePolicy("direct", slots,
                          batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US,
                          delay_us, (), False, controls, states, batching.iterative_sequence,
                          ready)


def _direct_delay(direct: pb.ModelSequenceBatching.StrategyDirect, slots: int, source: str
                  ) -> tuple[int, int]:
    """(how long a direct batch may wait for more sequences, in µs; how many ready
    sequences run it sooner), as Triton's direct batcher decides: a batch waits only while
    fewer than `minimum_slot_utilization` of the slots have a request, and at most
    max_queue_delay_microseconds. With no utilization given (0) it runs at once, whatever
    the delay says."""
    utilization = direct.minimum_slot_utilization  # a float32, as Triton compares it
    if not 0.0 <= utilization <= 1.0:
        raise ModelConfigError(source, f"sequence_batching direct minimum_slot_utilization "
                                       f"{utilization:g} must lie in [0, 1]: the share of the "
                                       "slots whose requests run a batch before its delay")
    if utilization == 0.0 or direct.max_queue_delay_microseconds == 0:
        return 0, 0
    def enough(rows: int) -> bool:  # Triton's test, in float32
        return bool(np.float32(rows) / np.float32(slots) >= np.float32(utilization))
    ready = min(max(math.ceil(utilization * slots), 1), slots)  # then to float32's answer
    while ready > 1 and enough(ready - 1):
        ready -= 1
    while ready < slots and not enough(ready):
        ready += 1
    return direct.max_queue_delay_microseconds, ready


def _control(message: pb.ModelSequenceBatching.ControlInput, source: str,
             taken: dict[str, str]) -> ControlInput:
    name = message.name
    if not name:
        raise ModelConfigError(source, "a sequence_batching control_input has no 'name'")
    if name in taken:
        raise ModelConfigError(source, f"sequence_batching control_input '{name}' has the "
                                       f"name of {taken[name]}; names must be unique")
    if len(message.control) != 1:
        raise ModelConfigError(source, f"sequence_batching control_input '{name}' needs "
                                       f"exactly one 'control', has {len(message.control)}")
    control = message.control[0]
    kind = _KINDS.get(control.kind)
    if kind is None:
        raise ModelConfigError(source, f"sequence_batching control_input '{name}' has no "
                                       "'kind'")
    taken[name] = f"the {kind} control"
    if kind == "CORRID":
        if control.data_type == pb.TYPE_INVALID:
            raise ModelConfigError(source, f"sequence_batching control_input '{name}' "
                                           "(CONTROL_SEQUENCE_CORRID) needs a 'data_type'")
        datatype = datatype_from_config(pb.DataType.Name(control.data_type), name)
        if datatype.name not in _CORRID_TYPES:
            raise ModelConfigError(source, f"sequence_batching control_input '{name}': a "
                                           f"CORRID control must be TYPE_UINT64, TYPE_INT64, "
                                           f"TYPE_UINT32, TYPE_INT32 or TYPE_STRING, not "
                                           f"{pb.DataType.Name(control.data_type)}")
        return ControlInput(name, kind, datatype, (0, 0))
    choices = [(field, values) for field, values in (
        ("INT32", list(control.int32_false_true)), ("FP32", list(control.fp32_false_true)),
        ("BOOL", list(control.bool_false_true))) if values]
    if len(choices) != 1 or len(choices[0][1]) != 2:
        raise ModelConfigError(source, f"sequence_batching control_input '{name}' needs one "
                                       "of int32_false_true, fp32_false_true or "
                                       "bool_false_true with two values: false, then true")
    field, values = choices[0]
    return ControlInput(name, kind, datatype_from_config(f"TYPE_{field}", name),
                        (values[0], values[1]))


def _state(message: pb.ModelSequenceBatching.State, source: str,
           taken: dict[str, str]) -> SequenceState:
    where = f"sequence_batching state '{message.input_name or message.output_name}'"
    if not message.input_name or not message.output_name:
        raise ModelConfigError(source, f"{where} needs both 'input_name' and 'output_name'")
    if message.input_name in taken:
        raise ModelConfigError(source, f"{where}: input_name '{message.input_name}' is the "
                                       f"name of {taken[message.input_name]}; names must be "
                                       "unique")
    taken[message.input_name] = "a state input"
    if f"output {message.output_name}" in taken:
        raise ModelConfigError(source, f"{where}: output_name '{message.output_name}' is "
                                       "another state's output")
    if message.data_type == pb.TYPE_INVALID:
        raise ModelConfigError(source, f"{where} has no 'data_type'")
    datatype = datatype_from_config(pb.DataType.Name(message.data_type), message.input_name)
    if datatype.is_bytes:
        raise ModelConfigError(source, f"{where}: TYPE_STRING states are not supported")
    dims = tuple(message.dims)
    if not dims or any(d < -1 or d == 0 for d in dims):
        raise ModelConfigError(source, f"{where} has dims {list(dims)}; it needs dims, each "
                                       "-1 (variable) or positive")
    initial_dims = tuple(1 if d == -1 else d for d in dims)
    initial_file = ""
    if len(message.initial_state) > 1:
        raise ModelConfigError(source, f"{where} has {len(message.initial_state)} "
                                       "initial_state entries; at most one is supported")
    if message.initial_state:
        initial = message.initial_state[0]
        if initial.data_type not in (pb.TYPE_INVALID, message.data_type):
            raise ModelConfigError(source, f"{where}: initial_state data_type "
                                           f"{pb.DataType.Name(initial.data_type)} differs from "
                                           f"the state's {pb.DataType.Name(message.data_type)}")
        initial_dims = tuple(initial.dims)
        if any(d < 1 for d in initial_dims) or len(initial_dims) != len(dims) or any(
                want not in (-1, got) for want, got in zip(dims, initial_dims)):
            raise ModelConfigError(source, f"{where}: initial_state dims {list(initial_dims)} "
                                           f"must be fixed and fit the state's dims "
                                           f"{list(dims)}")
        if initial.WhichOneof("state_data") == "data_file":
            initial_file = initial.data_file
            if "/" in initial_file or initial_file in ("", ".", ".."):
                raise ModelConfigError(source, f"{where}: initial_state data_file "
                                               f"'{initial_file}' must be a file name in the "
                                               "model's initial_state folder")
    # A state output may also be listed under `output`: clients may then ask for it (to
    # debug, as Triton allows); otherwise it never leaves the server.
    taken[f"output {message.output_name}"] = "a state output"
    return SequenceState(message.input_name, message.output_name, datatype, dims, initial_dims,
                         initial_file)
