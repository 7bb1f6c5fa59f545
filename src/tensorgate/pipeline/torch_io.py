"""Which forward argument each of a TorchScript or `torch.export` model's inputs is, and which
returned value each output is: Triton's PyTorch backend's rules, so that a `pytorch_libtorch`
repository's config means here what it means there. A different guess would not fail: it
would hand the model its tensors swapped and answer wrong numbers.

Inputs clients send (the config's `input` list), the first rule that fits them all:
  1. each name is an argument of `forward` → that argument (Triton's FORWARD_ARGUMENT);
  2. each name is `<anything>__<digits>` → argument <digits> (NAMED_INDEX);
  3. else the config's order (STRICT_CONFIG_ORDERING).
Inputs the server sets (a stateful model's controls and state inputs, ragged batching's
batch inputs): `<name>__<digits>` →
that argument, else an argument of the same name, else the arguments left, in config order.
(Triton insists on `__<digits>` for controls; tensorgate also takes the other two, which is
how it placed them before.) `forward(self, inputs: Dict[str, Tensor])` takes one dict of
every input by config name.

Outputs: when every config output is `<name>__<digits>`, output <digits> of the returned tuple
(a config may leave some out); else the config's order. An unlisted state output comes by
its own `__<digits>`, else takes the first position no listed output takes.

Strings, as Triton's PyTorch backend passes them: a BYTES (TYPE_STRING) input is a `List[str]`
argument holding every element of the batch in row-major order, requests end to end; a
`List[str]` the model returns for a BYTES output is shaped by the output's config dims (Triton
sends it 1-D, whatever the config says).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgate.errors import InternalError, ModelConfigError
from tensorgate.repository.model_config import ModelSpec

__all__ = ["Argument", "as_strings", "input_order", "output_positions", "strings_array"]


@dataclass(frozen=True, slots=True)
class Argument:
    """One parameter of `forward` (after `self`)."""

    name: str
    has_default: bool = False
    # typed List[str], the only type a BYTES input can be; None where types are not known
    strings: bool | None = None


def named_index(name: str) -> int | None:
    """The <digits> of `<anything>__<digits>` (split at the first `__`, as Triton does)."""
    _, separator, tail = name.partition("__")
    if separator and tail.isascii() and tail.isdigit():
        return int(tail)
    return None


def input_order(spec: ModelSpec, arguments: Sequence[Argument] | None,
                source: str) -> tuple[str, ...]:
    """The model's input names (`spec.model_inputs`) in `forward`'s argument order;
    `arguments` None where `forward`'s signature cannot be read (an AOTInductor package)."""
    by_name = (None if arguments is None
               else {a.name: position for position, a in enumerate(arguments)})
    positions = _place([i.name for i in spec.inputs],
                       [i.name for i in spec.model_inputs[len(spec.inputs):]], by_name)
    order = _checked(spec, positions, arguments, source)
    if arguments is not None:
        _check_strings(spec, order, arguments, source)
    return order


def _place(listed: list[str], extra: list[str],
           by_name: dict[str, int] | None) -> dict[str, int]:
    """Positions of the config's `listed` tensors — all by name in `by_name` where given and
    every one is there, else all by `__<index>` where every one has it, else in order — and
    of the server's `extra` ones: by `__<index>`, else by name, else the positions left."""
    indexes = [named_index(name) for name in listed]
    if by_name is not None and all(name in by_name for name in listed):
        positions = {name: by_name[name] for name in listed}
    elif listed and all(index is not None for index in indexes):
        positions = {name: index for name, index in zip(listed, indexes) if index is not None}
    else:
        positions = {name: position for position, name in enumerate(listed)}
    left = []
    for name in extra:
        index = named_index(name)
        if index is None and by_name is not None:
            index = by_name.get(name)
        if index is None:
            left.append(name)
        else:
            positions[name] = index
    positions.update(zip(left, _free(positions)))
    return positions


def _checked(spec: ModelSpec, positions: dict[str, int], arguments: Sequence[Argument] | None,
             source: str) -> tuple[str, ...]:
    """`positions` as names in argument order, when they are the arguments 0..n-1 once each
    and `forward` takes n arguments; else the error that says which input is misplaced."""
    count = len(positions)
    if arguments is not None:
        required = sum(1 for a in arguments if not a.has_default)
        if not required <= count <= len(arguments):
            listed = ", ".join(a.name for a in arguments)
            raise ModelConfigError(source, f"the config gives {count} inputs "
                                           f"({', '.join(positions)}); the model's forward "
                                           f"takes {len(arguments)} ({listed})")
    order: list[str | None] = [None] * count
    for name, position in positions.items():
        if position >= count:
            raise ModelConfigError(source, f"input '{name}' is forward argument {position}, "
                                           f"but the model has {count} inputs (0 to "
                                           f"{count - 1})")
        other = order[position]
        if other is not None:
            raise ModelConfigError(source, f"inputs '{other}' and '{name}' are both forward "
                                           f"argument {position}")
        order[position] = name
    return tuple(name for name in order if name is not None)


def _check_strings(spec: ModelSpec, order: Sequence[str], arguments: Sequence[Argument],
                   source: str) -> None:
    """A BYTES input on a `List[str]` argument and nothing else on one: a mismatch could only
    fail every request, so it fails the load instead, naming both."""
    datatypes = {i.name: i.datatype for i in spec.model_inputs}
    for name, argument in zip(order, arguments):
        if argument.strings is None or argument.strings == datatypes[name].is_bytes:
            continue
        if argument.strings:
            raise ModelConfigError(source, f"forward argument '{argument.name}' is List[str]; "
                                           f"input '{name}' on it must be TYPE_STRING, not "
                                           f"TYPE_{datatypes[name].name}")
        raise ModelConfigError(source, f"input '{name}' is TYPE_STRING; forward argument "
                                       f"'{argument.name}' must be List[str] to take it")


def as_strings(value: np.ndarray) -> list[Any]:
    """A BYTES input (an object array of `bytes`, any shape) as a `List[str]` argument takes
    it: every element in row-major order, the bytes as sent (TorchScript keeps them raw)."""
    return value.ravel().tolist()


def strings_array(values: Sequence[Any], dims: Sequence[int], rows: int | None, model: str,
                  output: str) -> np.ndarray:
    """A `List[str]` the model returned for a BYTES output, as the object array of UTF-8
    `bytes` that `dims` (the model's shape of the output, one dim may be -1) describe, after
    `rows` batch rows when batching; an error naming the output where they cannot hold it."""
    count = len(values)
    lead = [] if rows is None else [rows]
    shape = lead + list(dims)
    fixed = math.prod(d for d in shape if d >= 0)
    free = [i for i, d in enumerate(shape) if d < 0]
    if len(free) == 1 and fixed > 0 and count % fixed == 0:
        shape[free[0]] = count // fixed
    elif free or fixed != count:
        batch = f" for a batch of {rows}" if rows is not None else ""
        raise InternalError(f"model '{model}' returned {count} strings for output '{output}', "
                            f"which do not fill its dims {list(dims)}{batch}")
    array = np.empty(count, dtype=object)
    array[:] = [v.encode() if isinstance(v, str) else v for v in values]
    return array.reshape(shape)


def output_positions(spec: ModelSpec) -> dict[str, int]:
    """Each of `spec.model_outputs` → its position in the tuple `forward` returns."""
    return _place([o.name for o in spec.outputs],
                  [o.name for o in spec.model_outputs[len(spec.outputs):]], None)


def _free(positions: dict[str, int]) -> Iterator[int]:
    """The positions no name in `positions` takes, lowest first."""
    taken = set(positions.values())
    return (position for position in itertools.count() if position not in taken)
