"""What a stateful model's requests are given beside their own inputs (pipeline/sequences.py):
the control tensors (START, END, READY, CORRID), each implicit state's initial value, and the
filler rows of a direct batch; and what the sequence batcher remembers of the sequences that
ended, to say how when a request still comes for one."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from tensorgate.errors import InvalidArgumentError
from tensorgate.pipeline.made_inputs import tensor_from_file
from tensorgate.pipeline.work import WorkItem
from tensorgate.repository.model_config import ModelSpec
from tensorgate.repository.sequence_config import SequenceState
from tensorgate.tensor.copies import CopyLedger

__all__ = ["ENDED_ID_CHARS", "ENDED_KEPT", "EndedSequences", "SequenceInputs"]

# Sequences remembered once ended, so that a request still sent for one is told how and when
# it ended (the idle timeout, or an end it did not expect) rather than only that it is not
# active: the most recent this many, a small dict entry each, and only ids of at most
# ENDED_ID_CHARS (a string id is as long as a client likes: these stay after their requests).
ENDED_KEPT = 1024
ENDED_ID_CHARS = 256

_INTEGER_LIMITS = {"UINT64": (0, 2**64 - 1), "INT64": (0, 2**63 - 1),
                   "UINT32": (0, 2**32 - 1), "INT32": (0, 2**31 - 1)}


class SequenceInputs:
    """A model's control tensors, made once (a request's row of each, or a batch of one row
    where the model batches), its states' initial values and its CORRID input."""

    def __init__(self, spec: ModelSpec, directory: pathlib.Path) -> None:
        policy = spec.sequence
        assert policy is not None
        self._spec = spec
        self._controls = policy.controls
        batched = spec.max_batch_size > 0
        self._row = (1, 1) if batched else (1,)
        self._flags = {c.name: tuple(torch.full(self._row, v, dtype=c.datatype.torch)
                                     for v in c.false_true)
                       for c in policy.controls if c.kind != "CORRID"}
        self._corrid = next((c for c in policy.controls if c.kind == "CORRID"), None)
        self._initial = {s.input_name: _initial_state(s, directory, batched)
                         for s in policy.states}

    def initial_states(self) -> dict[str, torch.Tensor]:
        """A new sequence's states: a copy each, as a model may update its state input in
        place."""
        return {name: tensor.clone() for name, tensor in self._initial.items()}

    def set_controls(self, inputs: dict[str, Any], start: bool, end: bool,
                     corrid: Any) -> None:
        """Each control input of a request with these flags, into `inputs`."""
        for control in self._controls:
            kind = control.kind
            inputs[control.name] = (
                corrid if kind == "CORRID" else
                self._flags[control.name][start if kind == "START" else end if kind == "END"
                                          else True])

    def corrid(self, sequence_id: int | str) -> Any:
        """The CORRID input of a sequence's requests (None where the model takes none);
        an id its datatype cannot hold is refused."""
        control = self._corrid
        if control is None:
            return None
        if control.datatype.is_bytes:
            text = sequence_id if isinstance(sequence_id, str) else str(sequence_id)
            return np.full(self._row, text.encode(), dtype=object)
        low, high = _INTEGER_LIMITS[control.datatype.name]
        if not isinstance(sequence_id, int) or not low <= sequence_id <= high:
            raise InvalidArgumentError(
                f"model '{self._spec.name}' passes sequence ids to its control input "
                f"'{control.name}' as {control.datatype.name}: 'sequence_id' must be an "
                f"integer in [1, {high}], got {sequence_id!r}")
        return torch.full(self._row, sequence_id, dtype=control.datatype.torch)

    def filler(self, like: WorkItem, loop: asyncio.AbstractEventLoop) -> WorkItem:
        """A row of a direct batch that no sequence fills: READY false, zeros (or empty
        strings) elsewhere, answered to no one."""
        inputs: dict[str, Any] = {}
        for name, value in like.inputs.items():
            if name in self._flags:
                inputs[name] = self._flags[name][0]
            elif isinstance(value, np.ndarray):
                inputs[name] = np.full(value.shape, b"", dtype=object)
            else:
                inputs[name] = torch.zeros_like(value)
        filler = WorkItem(inputs, 1, like.key, like.wanted, loop.create_future(),
                          like.enqueued_ns, 0, CopyLedger())
        filler.filler = True
        return filler


class EndedSequences:
    """The sequences that ended lately, the most recent ENDED_KEPT: how, and when."""

    def __init__(self, model: str, idle_ns: int) -> None:
        self._model = model
        self._idle_ns = idle_ns
        # oldest first → (how they ended, time.monotonic_ns() then)
        self._ended: OrderedDict[int | str, tuple[str, int]] = OrderedDict()

    def remember(self, sequence_id: int | str, how: str) -> None:
        if isinstance(sequence_id, str) and len(sequence_id) > ENDED_ID_CHARS:
            return
        ended = self._ended
        ended.pop(sequence_id, None)
        ended[sequence_id] = (how, time.monotonic_ns())
        if len(ended) > ENDED_KEPT:
            ended.popitem(last=False)

    def forget(self, sequence_id: int | str) -> None:
        """A new sequence starts under the id."""
        self._ended.pop(sequence_id, None)

    def not_started(self, sequence_id: int | str) -> InvalidArgumentError:
        """The refusal of a request for a sequence that is not active, saying how it ended
        when it did so lately."""
        name = self._model
        ended = self._ended.get(sequence_id)
        if ended is None:
            return InvalidArgumentError(
                f"sequence {sequence_id!r} of model '{name}' is not active: the first request "
                f"of a sequence must set 'sequence_start' (a sequence ends at 'sequence_end', "
                f"or after {self._idle_ns / 1e6:g} ms without requests)")
        how, when = ended
        ago = (time.monotonic_ns() - when) / 1e6
        return InvalidArgumentError(
            f"sequence {sequence_id!r} of model '{name}' is not active: it ended {ago:.0f} ms "
            f"ago, {how}; the first request of a sequence must set 'sequence_start'")


def _initial_state(state: SequenceState, directory: pathlib.Path,
                   batched: bool) -> torch.Tensor:
    """A state's input on the first request of a sequence: zeros, or the bytes of its
    initial_state data_file."""
    shape = ((1,) if batched else ()) + state.initial_dims
    if not state.initial_file:
        return torch.zeros(shape, dtype=state.datatype.torch)
    return tensor_from_file(directory / "initial_state" / state.initial_file, state.datatype,
                            state.initial_dims,
                            f"initial state of '{state.input_name}'").reshape(shape)
