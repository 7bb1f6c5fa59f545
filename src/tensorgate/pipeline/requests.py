"""A request as the engine takes it, its result, and the work item the pipeline makes of it.

`work_item` checks a request against its model's config (names, datatypes, shapes, batch
size) and turns its views into tensors without copying; the scheduler takes it from there.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorgate.errors import InvalidArgumentError, TensorgateError
from tensorgate.model import NO_PARAMETERS, Parameter
from tensorgate.pipeline.stats import StageTimes
from tensorgate.pipeline.trace import Trace
from tensorgate.pipeline.work import SequenceFlags, WorkItem
from tensorgate.repository.model_config import (ModelSpec, QueuePolicy, RaggedLimits, TensorSpec,
                                                TiedDim)
from tensorgate.tensor.bytes_codec import BYTES_CHECKED_WHEN_DECODED
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.view import TensorView

__all__ = ["STRINGS_ASIDE", "InferenceRequest", "InferenceResult", "strings_aside", "work_item"]


@dataclass
class InferenceRequest:
    """One inference: inputs by name as views; `outputs` None means all of them."""

    model: str
    inputs: Mapping[str, TensorView]
    version: int | None = None
    outputs: Sequence[str] | None = None
    timeout_us: int | None = None
    id: str = ""
    ledger: CopyLedger = field(default_factory=CopyLedger)
    priority: int = 0  # 1 is the highest; 0: the model's default level
    sequence: SequenceFlags | None = None  # its sequence, for a stateful model
    # What its model sees of the request parameters (the reserved ones taken out)
    parameters: Mapping[str, Parameter] = field(default_factory=lambda: NO_PARAMETERS)
    trace: Trace | None = None  # when a trace setting sampled it (tensorgate/tracing.py)


@dataclass
class InferenceResult:
    model: str
    version: int
    id: str
    outputs: dict[str, TensorView]
    times: StageTimes
    ledger: CopyLedger
    # what the model's response carries besides outputs (the response's `parameters`)
    parameters: Mapping[str, Parameter] = field(default_factory=lambda: NO_PARAMETERS)
    # a decoupled model's response that the model said is the request's last (work.py)
    final: bool = False
    # a decoupled model's error response that is not its last: no outputs, and the request
    # goes on (a Triton model's sent without the final flag)
    error: TensorgateError | None = None


# BYTES elements from which a request's strings are cut into bytes objects in the loop's
# default executor rather than on the loop: a million of mixed lengths take ~180 ms, and
# every other client waited that long (bench/object_stall_bench.py). Views of as many are
# checked only there, when decoded (tensor/view.py).
STRINGS_ASIDE = BYTES_CHECKED_WHEN_DECODED


async def strings_aside(request: InferenceRequest) -> dict[str, np.ndarray] | None:
    """The request's large BYTES inputs as object arrays of bytes, cut out in the loop's
    default executor (the loop serves others meanwhile, the two sharing the GIL in turns);
    None when it has none. Not for a request in a sequence: a stateful model takes its
    requests in the order they came, and a later one could pass while this one waits."""
    if request.sequence is not None:
        return None
    for view in request.inputs.values():
        if _large(view):
            break
    else:
        return None  # most requests: nothing made
    large = {name: view for name, view in request.inputs.items() if _large(view)}
    return await asyncio.get_running_loop().run_in_executor(None, _cut_out, large)


def _large(view: TensorView) -> bool:
    return view.datatype.is_bytes and view.count >= STRINGS_ASIDE


def _cut_out(views: Mapping[str, TensorView]) -> dict[str, np.ndarray]:
    return {name: view.numpy() for name, view in views.items()}


def work_item(spec: ModelSpec, request: InferenceRequest, loop: asyncio.AbstractEventLoop,
              strings: Mapping[str, np.ndarray] | None = None) -> WorkItem:
    """Check the request against the config and turn its views into tensors (no copies);
    `strings`: BYTES inputs already cut into bytes objects (engine does large ones off the
    loop)."""
    given = request.inputs
    names = spec.input_names
    for name in given:
        if name not in names:
            raise InvalidArgumentError(f"model '{spec.name}' has no input '{name}'; inputs are: "
                                       f"{', '.join(i.name for i in spec.inputs)}")
    batching = spec.max_batch_size > 0
    rows = -1
    inputs: dict[str, Any] = {}
    key = []
    for item_spec in spec.inputs:
        view = given.get(item_spec.name)
        if view is None:
            if item_spec.optional:
                continue
            raise InvalidArgumentError(f"model '{spec.name}' needs input '{item_spec.name}'; the "
                                       f"request has: {', '.join(given) or 'no inputs'}")
        if view.datatype is not item_spec.datatype:
            raise InvalidArgumentError(f"input '{item_spec.name}' of model '{spec.name}' is "
                                       f"{view.datatype.name}; expected {item_spec.datatype.name}")
        shape = view.shape
        item_shape = shape[1:] if batching else shape
        if (batching and (not shape or shape[0] < 1)) or not item_spec.accepts(item_shape):
            expected = ([-1] if batching else []) + list(item_spec.dims)
            raise InvalidArgumentError(
                f"input '{item_spec.name}' of model '{spec.name}' has shape "
                f"[{','.join(map(str, shape))}]; expected [{','.join(map(str, expected))}]")
        these_rows = shape[0] if batching else 1
        if batching and these_rows > spec.max_batch_size:
            raise InvalidArgumentError(f"input '{item_spec.name}' of model '{spec.name}' has a "
                                       f"batch of {these_rows}; max_batch_size is "
                                       f"{spec.max_batch_size}")
        if rows not in (-1, these_rows):
            raise InvalidArgumentError(f"input '{item_spec.name}' of model '{spec.name}' has a "
                                       f"batch of {these_rows}, other inputs {rows}; they must "
                                       "agree")
        rows = these_rows
        value: Any
        if not view.datatype.is_bytes:
            value = view.torch()
        elif strings is not None and item_spec.name in strings:
            value = strings[item_spec.name]
        else:
            value = view.numpy()
        if item_spec.reshape is not None:
            taken = ([these_rows] if batching else []) + list(item_spec.reshape)
            try:
                value = value.reshape(taken)
            except (RuntimeError, ValueError):  # torch's, numpy's: not that many elements
                raise InvalidArgumentError(
                    f"input '{item_spec.name}' of model '{spec.name}' has shape "
                    f"[{','.join(map(str, shape))}], whose elements do not make the shape "
                    f"[{','.join(map(str, taken))}] the model takes it in (its config's "
                    "reshape)") from None
        if item_spec.bounds is not None:
            _check_bounds(spec, item_spec, shape, tuple(value.shape), batching)
        inputs[item_spec.name] = value
        # requests batch when these agree; a ragged input batches whatever its shape
        key.append(None if item_spec.ragged else item_shape)
    if spec.tied_dims:
        _check_ties(spec, inputs)
    if spec.ragged_limits is not None:
        _check_ragged(spec, spec.ragged_limits, inputs, max(rows, 1))
    if request.outputs:
        outputs = spec.output_set
        for name in request.outputs:
            if name not in outputs:
                raise InvalidArgumentError(f"model '{spec.name}' has no output '{name}'; outputs "
                                           f"are: {', '.join(spec.output_names)}")
        wanted = tuple(request.outputs)
    else:
        wanted = spec.output_names
    now = time.monotonic_ns()
    batching_policy = spec.batching
    level = batching_policy.level(request.priority) if batching_policy is not None else 0
    timeout_us = _timeout_us(batching_policy.queues[level] if batching_policy else None,
                             request.timeout_us)
    return WorkItem(inputs, max(rows, 1), tuple(key), wanted, loop.create_future(), now,
                    now + timeout_us * 1000 if timeout_us else 0, request.ledger, level,
                    request.sequence, request.priority, request.id, request.parameters,
                    request.trace)


def _check_bounds(spec: ModelSpec, item: TensorSpec, sent: tuple[int, ...],
                  taken: tuple[int, ...], batching: bool) -> None:
    """An input's shape as the model takes it (`taken`: reshaped, if its config says so) is
    inside the bounds its compiled code was made for."""
    outside = item.outside_bounds(taken[1:] if batching else taken)
    if outside is None:
        return
    dim, sizes = outside[0] + int(batching), outside[1]
    shown = f"[{','.join(map(str, sent))}]"
    if item.reshape is not None:
        shown += f", which the model takes as [{','.join(map(str, taken))}]"
    raise InvalidArgumentError(f"input '{item.name}' of model '{spec.name}' has shape {shown}; "
                               f"the model takes {sizes} in dim {dim}"
                               f"{' of that' if item.reshape is not None else ''} (the sizes "
                               "it was exported for)")


def _check_ties(spec: ModelSpec, inputs: Mapping[str, Any]) -> None:
    """Dims the model sizes from one size agree, in `inputs` as the model takes them (its
    compiled code reads the size from the first: another's would be read past, or short)."""
    for group in spec.tied_dims:
        first, first_size, s = None, 0, 0
        for tied in group:
            name, dim, scale, offset = tied
            value = inputs.get(name)
            if value is None:
                continue
            size = value.shape[dim]
            if first is None:
                first, first_size = tied, size
                # (s itself tested on the fields unpacked: `plain` costs a call a request)
                known = size if scale == 1 and not offset else tied.symbol(size)
                if known is None:
                    raise InvalidArgumentError(
                        f"input '{name}' of model '{spec.name}' has {size} in dim {dim}"
                        f"{_as_taken(spec, name)}; the model sizes that dim as "
                        f"{tied.formula()}, for a whole s (the sizes it was exported for)")
                s = known
            elif size != scale * s + offset:
                raise _untied(spec, group, first, first_size, tied, size, scale * s + offset)


def _untied(spec: ModelSpec, group: tuple[TiedDim, ...], first: TiedDim, first_size: int,
            tied: TiedDim, size: int, taken: int) -> InvalidArgumentError:
    """The refusal of a request whose `tied` dim is `size`, where `first`'s size makes it
    `taken`."""
    said = (f"input '{tied.input}' of model '{spec.name}' has {size} in dim {tied.dim}"
            f"{_as_taken(spec, tied.input)}, and input '{first.input}' {first_size} in dim "
            f"{first.dim}{_as_taken(spec, first.input)}")
    if all(t.plain for t in group):
        return InvalidArgumentError(f"{said}; the model takes one size in both (the sizes it "
                                    "was exported for)")
    return InvalidArgumentError(f"{said}; the model takes {taken} there: it sizes dim "
                                f"{first.dim} of '{first.input}' as {first.formula()} and dim "
                                f"{tied.dim} of '{tied.input}' as {tied.formula()}, for one s "
                                "(the sizes it was exported for)")


def _check_ragged(spec: ModelSpec, limits: RaggedLimits, inputs: Mapping[str, Any],
                  rows: int) -> None:
    """A request fits a batch of its own within what the ragged model's code takes, and
    its ragged inputs' elements are sized from one n as the model sizes them (each batch
    of such requests then is: the scheduler keeps batches within the rest)."""
    if limits.rows is not None and rows > limits.rows:
        raise InvalidArgumentError(f"model '{spec.name}' takes at most {limits.rows} rows in "
                                   f"a batch (the sizes it was exported for); the request has "
                                   f"{rows}")
    counts = {name: math.prod(value.shape) for name, value in inputs.items()}
    for name, most in limits.request_elements:  # (an AS_SHAPE source need not be ragged)
        count = counts.get(name, 0)
        if count > most:
            raise InvalidArgumentError(f"input '{name}' of model '{spec.name}' has {count} "
                                       f"elements; the model takes at most {most} from a "
                                       "request (the sizes it was exported for)")
    for name, fewest in limits.least:
        if name in counts and counts[name] < fewest:
            raise InvalidArgumentError(f"input '{name}' of model '{spec.name}' has "
                                       f"{counts[name]} elements; the model takes at least "
                                       f"{fewest} from a request (the sizes it was exported "
                                       "for: fewer failed its guard)")
    for group in limits.ties:
        first, first_count, n = "", 0, 0
        for name, scale in group:
            if name not in counts:
                continue
            count = counts[name]
            if not first:
                first, first_count = name, count
                n, rest = divmod(count, scale)
                if rest:
                    raise InvalidArgumentError(
                        f"input '{name}' of model '{spec.name}' has {count} elements; the "
                        f"model takes {scale}*n of them, for a whole n (the sizes it was "
                        "exported for)")
            elif count != scale * n:
                said = (f"input '{name}' of model '{spec.name}' has {count} elements, and "
                        f"input '{first}' {first_count}")
                if all(a == 1 for _, a in group):
                    raise InvalidArgumentError(f"{said}; the model takes as many of both (the "
                                               "sizes it was exported for)")
                formula = {a: "n" if a == 1 else f"{a}*n" for _, a in group}
                raise InvalidArgumentError(
                    f"{said}; the model takes {scale * n} there: it takes {formula[scale]} "
                    f"elements of '{name}' where it takes "
                    f"{formula[dict(group)[first]]} of '{first}', for one n (the sizes it was "
                    "exported for)")


def _as_taken(spec: ModelSpec, name: str) -> str:
    item = spec.input(name)
    return "" if item is None or item.reshape is None else " (as the model takes it, reshaped)"


def _timeout_us(policy: QueuePolicy | None, requested: int | None) -> int:
    """A request's timeout: its own where the level's policy lets it override (or sets none),
    otherwise the policy's default."""
    default = policy.default_timeout_us if policy is not None else 0
    if requested is None or requested <= 0:
        return default
    if policy is None or policy.allow_timeout_override or not default:
        return requested
    return default
