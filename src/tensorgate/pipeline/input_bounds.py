"""The sizes a compiled model's variable dims take, held against every request.

A config's -1 says a dim may be any size; a model compiled ahead of time may take fewer. An
AOTInductor package runs its code on whatever it is given (aoti_check.py: one compiled for
exactly 16 answered a request of 1 with 16 rows read past the input), and a torch.export
program's guards fail a request outside its range with a 500 ("Guard failed: x.size()[1] <=
16"), or its warm-up, whose zeros took 1 where the program starts at 4, so that it never
loaded. And dims one symbol sizes are sized together: input_ids and a mask of one length,
edges of one more (s + 1), pairs (2*s); a package reads the first's size and sizes the
others from it, so a shorter one was read past. `bounded_spec` puts what the model takes
into the inputs' TensorSpec (`bounds`) and the spec's `tied_dims`: a request outside is
refused with the range or the other input (pipeline/requests.py), and the warm-up's zeros
take each dim's least size. A ragged model's flat dims and batch inputs bound its batches
instead (`RaggedLimits`): the batcher gathered two requests of 3,000 elements for a program
that takes 4,096, and its guards failed both.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from tensorgate.repository.model_config import (ModelConfigError, ModelSpec, RaggedLimits,
                                                TensorSpec, TiedDim)

__all__ = ["CompiledShapes", "Range", "bounded_spec", "guard_dims", "lows_raised",
           "program_shapes", "raised_least", "size_range", "user_input_values"]

log = logging.getLogger("tensorgate.engine")

# (dim of the model's input, counting the batch dim; fewest; most, None: no bound)
Range = tuple[int, int, int | None]


@dataclass(frozen=True)
class CompiledShapes:
    """What a compiled model takes: per input, each dim's range; and the groups of dims it
    sizes from one size s (TiedDim, or (input, dim) for a dim of size s itself)."""

    ranges: Mapping[str, Sequence[Range]]
    ties: Sequence[Sequence[TiedDim | tuple[str, int]]] = ()
    # a program's names of its inputs (its guards' words) -> the config's
    names: Mapping[str, str] = field(default_factory=dict)


def bounded_spec(where: str, spec: ModelSpec, model: str, shapes: CompiledShapes, *,
                 quiet: bool = False) -> ModelSpec:
    """`spec` with each input's `bounds` where `shapes` narrow a dim its config leaves
    variable (a range that starts above 0 or ends at all: a compiled model's code was not
    made for a size it was not exported for, and an empty dim in one of them, unchecked, was
    one of the requests that crashed the server), and the ties among such dims as its
    `tied_dims`; `model` names what takes them in the load's log lines ("the AOTInductor
    package"), which `quiet` leaves out. Dims are the model's: an input's `reshape`, where
    its config has one, else its `dims`. A ragged input is left as it is (the model takes
    it flat)."""
    batch = 1 if spec.max_batch_size > 0 else 0

    def variable(name: str, dim: int) -> bool:
        config = spec.input(name)
        if config is None or config.ragged:
            return False
        dims = config.reshape or config.dims  # as the model takes the input
        return 0 <= dim - batch < len(dims) and dims[dim - batch] == -1

    ties = []
    for group in shapes.ties:
        members = tuple(TiedDim(*member) for member in group if variable(*member[:2]))
        if len(members) < 2 and not any(m.scale > 1 for m in members):
            continue  # a dim of s (or s + b) alone takes any size its range does
        ties.append(members)
        if quiet:
            continue
        if all(m.plain for m in members):
            log.info("%s: %s take one size in %s: requests where they differ are refused",
                     where, _listed([f"dim {m.dim} of input '{m.input}'" for m in members]),
                     model)
        else:
            log.info("%s: %s sizes %s from one s: requests where they disagree are refused",
                     where, model, _listed([f"dim {m.dim} of input '{m.input}' as "
                                            f"{m.formula()}" for m in members]))
    bounded = {}
    for name, found in shapes.ranges.items():
        config = spec.input(name)
        if config is None:
            continue
        dims = config.reshape or config.dims
        field = "reshape" if config.reshape else "dims"
        bounds: list[tuple[int, int | None]] = [(0, None) if d == -1 else (d, d)
                                                for d in dims]
        narrowed = False
        for dim, low, high in found:
            if not variable(name, dim):
                continue  # the batch dim, or one the config fixes (and requests are held to)
            if low <= 0 and high is None:
                continue  # as free as the config says
            bounds[dim - batch] = (low, high)
            narrowed = True
            if quiet or (low == 1 and high is None):
                continue  # no size a client would send is refused but 0: not worth a line
            if low == high:
                log.warning("%s: config %s %s leave dim %d of input '%s' variable, and %s "
                            "takes exactly %d there: requests of another size are refused "
                            "(give %d in its %s)", where, field, list(dims), dim, name, model,
                            low, low, field)
            else:
                log.info("%s: input '%s' takes %s in dim %d (%s's range): requests outside "
                         "it are refused", where, name,
                         f"{low} or more" if high is None else f"{low} to {high}", dim, model)
        if narrowed:
            bounded[name] = replace(config, bounds=tuple(bounds))
    ragged = _ragged_limits(where, spec, model, shapes, quiet)
    if not bounded and not ties and ragged is None:
        return spec
    return replace(spec, inputs=tuple(bounded.get(i.name, i) for i in spec.inputs),
                   tied_dims=tuple(ties), ragged_limits=ragged)


_COUNTS_REQUESTS = {"BATCH_ELEMENT_COUNT": 0, "BATCH_ACCUMULATED_ELEMENT_COUNT": 0,
                    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO": 1}  # kind -> its extra


def _ragged_limits(where: str, spec: ModelSpec, model: str, shapes: CompiledShapes,
                   quiet: bool) -> RaggedLimits | None:
    """What a batch of a ragged model may hold (RaggedLimits), from the range of each
    ragged input's flat dim and each batch input's dim 0 in `shapes`, and the ties among
    ragged inputs' flat dims; None where nothing bounds a batch. A batch's flat dim is its
    requests' elements end to end, so a tie a*s + b with b ≠ 0 cannot hold for batches of
    several requests: such a model is refused."""
    if not spec.ragged_inputs:
        return None

    def most(name: str) -> int | None:
        return next((high for dim, _, high in shapes.ranges.get(name, ()) if dim == 0), None)

    elements = {item.name: high for item in spec.inputs
                if item.ragged and (high := most(item.name)) is not None}
    per_request = dict(elements)
    requests: int | None = None
    rows: int | None = None
    for batch_input in spec.batch_inputs:
        high = most(batch_input.target)
        if high is None:
            continue
        kind, source = batch_input.kind, spec.input(batch_input.source)
        if kind in _COUNTS_REQUESTS:
            high -= _COUNTS_REQUESTS[kind]
            requests = high if requests is None else min(requests, high)
        elif kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":  # as long as the longest request
            per_request[batch_input.source] = min(per_request.get(batch_input.source, high),
                                                  high)
        else:  # an item's shape per row, as one row of numbers or flat
            if kind == "BATCH_ITEM_SHAPE_FLATTEN" and source is not None:
                high //= max(len(source.dims), 1)
            rows = high if rows is None else min(rows, high)
    if spec.max_batch_size > 0:  # a batched input's dim 0 is the batch's rows
        for item in spec.inputs:
            high = None if item.ragged else most(item.name)
            if high is not None:
                rows = high if rows is None else min(rows, high)
    ties = []
    for group in shapes.ties:
        members = [TiedDim(*member) for member in group]
        members = [m for m in members if m.input in spec.ragged_inputs and m.dim == 0]
        if len(members) < 2 and not any(m.scale > 1 for m in members):
            continue  # a flat dim of s alone takes any count its range does
        offset = next((m for m in members if m.offset), None)
        if offset is not None:
            raise ModelConfigError(where, f"{model} sizes the flat dims of its ragged inputs "
                                          f"{_listed([repr(m.input) for m in members])} as "
                                          f"{_listed([m.formula() for m in members])} of one "
                                          "s: a batch holds its requests' elements end to end, "
                                          f"so the '{offset.offset:+d}' of '{offset.input}' "
                                          "would not hold for batches of several requests; "
                                          "export it with the ragged inputs sized a*s, or "
                                          "turn off allow_ragged_batch")
        ties.append(tuple((m.input, m.scale) for m in members))
    fewest_rows = [bound for bound in (requests, rows) if bound is not None]
    if fewest_rows and min(fewest_rows) < 1:
        raise ModelConfigError(where, f"{model} takes no request in a batch: its batch "
                                      "inputs' ranges leave room for none")
    if not per_request and not ties and requests is None and rows is None:
        return None  # (per_request holds every bounded element count)
    if not quiet:
        for name, high in elements.items():
            log.info("%s: %s takes at most %d elements of ragged input '%s' in a batch: "
                     "batches are formed within it, and a request of more is refused", where,
                     model, high, name)
        for bound, what in ((requests, "requests"), (rows, "rows")):
            if bound is not None and bound < spec.max_batch_size:
                log.info("%s: %s takes at most %d %s in a batch (the range it was exported "
                         "for), fewer than max_batch_size %d: batches are formed within it",
                         where, model, bound, what, spec.max_batch_size)
        for tie in ties:
            log.info("%s: %s takes the elements of ragged inputs %s from one n (%s): "
                     "requests where they disagree are refused", where, model,
                     _listed([repr(name) for name, _ in tie]),
                     ", ".join("n" if a == 1 else f"{a}*n" for _, a in tie))
    return RaggedLimits(tuple(elements.items()), tuple(per_request.items()), requests, rows,
                        tuple(ties))


_GUARD_SIZE = re.compile(r"\b(\w+)\.size\(\)\[(\d+)\]")


def guard_dims(said: str) -> list[tuple[str, int]] | None:
    """The (input, dim) sizes an exported program's failed guard names, in the program's
    names of its inputs ("Guard failed: -1 + edges.size()[1] != 1": edges, 1); None where
    `said` is no failed guard."""
    if not said.startswith("Guard failed"):
        return None
    return [(own, int(dim)) for own, dim in _GUARD_SIZE.findall(said)]


def raised_least(spec: ModelSpec, shapes: CompiledShapes, guard: str) -> ModelSpec | None:
    """`spec` with the least size of each variable dim a program's failed `guard` names
    ("Guard failed: -1 + edges.size()[1] != 1") one step up: s + 1 for a dim of a tied
    group, the whole group with it; a ragged input's fewest elements a request (RaggedLimits
    `least`, its tie group's by one n). The batch dim is left as it is (the batcher makes
    batches of 1: `x.view(B, -1, 4)` made the guard "x.size()[1] * x.size()[0] % (4 *
    x.size()[0]) == 0", whose dim 1 goes up). None where it names no other dim, or one that
    cannot go up (fixed, past its most, unknown).

    A program's guards may hold more than its range constraints say: slicing edges of s + 1
    (`edges[:, 1:]`) made the program refuse s = 1 though its range says 1 to 16, so its
    warm-up at the least sizes failed and it never loaded. Raised until the warm-up runs,
    the least size is what requests are held to."""
    batch = 1 if spec.max_batch_size > 0 else 0
    bounds = {item.name: list(_bounds(item)) for item in spec.inputs if not item.ragged}
    ties = {(m.input, m.dim): group for group in spec.tied_dims for m in group}
    raised: dict[tuple[str, int], int] = {}
    limits = spec.ragged_limits or RaggedLimits()
    least = dict(limits.least)
    for own, dim in guard_dims(guard) or ():
        name = shapes.names.get(own, own)
        if name in spec.ragged_inputs and dim == 0:  # its elements end to end: a's of n
            flat = next((g for g in limits.ties if any(m == name for m, _ in g)),
                        ((name, 1),))
            scale = dict(flat)[name]
            n = least.get(name, scale) // scale + 1
            most = dict(limits.elements)
            for ragged, a in flat:
                if a * n > most.get(ragged, a * n):
                    return None
                least[ragged] = a * n
            continue
        if batch and dim == 0 and name in bounds:
            continue  # the batcher's, which the program takes from 1 (_check_batch_range)
        if name not in bounds or not 0 <= dim - batch < len(bounds[name]):
            return None
        low, high = bounds[name][dim - batch]
        if low == high:
            return None  # fixed: nothing to raise
        group = ties.get((name, dim))
        if group is None:
            raised[name, dim] = max(low, 1) + 1
            continue
        member = next(m for m in group if (m.input, m.dim) == (name, dim))
        s = (member.symbol(max(low, 1)) or 0) + 1
        for tied in group:
            raised[tied.input, tied.dim] = tied.scale * s + tied.offset
    fewer = {name: count for name, count in least.items() if (name, count) not in limits.least}
    if not raised and not fewer:
        return None
    for (name, dim), low in raised.items():
        high = bounds[name][dim - batch][1]
        if high is not None and low > high:
            return None
        bounds[name][dim - batch] = (low, high)
    inputs = tuple(replace(item, bounds=tuple(bounds[item.name]))
                   if any(name == item.name for name, _ in raised) else item
                   for item in spec.inputs)
    return replace(spec, inputs=inputs, ragged_limits=replace(
        limits, least=tuple(least.items())) if fewer else spec.ragged_limits)


def lows_raised(before: ModelSpec, after: ModelSpec) -> str:
    """The least sizes `after` holds requests to that `before` did not, in words: "dim 1 of
    input 'x' from 2 and ragged input 'w' from 2 elements a request"."""
    batch = 1 if before.max_batch_size > 0 else 0
    said = []
    for old, new in zip(before.inputs, after.inputs):
        for dim, (was, now) in enumerate(zip(_bounds(old), _bounds(new))):
            if now[0] > was[0]:
                said.append(f"dim {dim + batch} of input '{new.name}' from {now[0]}")
    was_least = dict(before.ragged_limits.least if before.ragged_limits else ())
    for name, count in (after.ragged_limits.least if after.ragged_limits else ()):
        if was_least.get(name) != count:
            said.append(f"ragged input '{name}' from {count} elements a request")
    return _listed(said) if said else "nothing"


def _bounds(item: TensorSpec) -> tuple[tuple[int, int | None], ...]:
    """An input's bounds per dim of the model's shape of it, its config's where none are
    learned (-1: any size)."""
    return item.bounds or tuple((0, None) if d == -1 else (d, d)
                                for d in (item.reshape or item.dims))


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def user_input_values(program: Any) -> list[Any]:
    """A torch.export program's user inputs in order, as its graph holds them (fake tensors
    with symbolic sizes; None where an input's placeholder or value is not found)."""
    placeholders = {node.name: node for node in program.graph.nodes
                    if node.op == "placeholder"}
    values = []
    for item in program.graph_signature.input_specs:
        if item.kind.name != "USER_INPUT":
            continue
        node = placeholders.get(getattr(item.arg, "name", ""))
        values.append(None if node is None else node.meta.get("val"))
    return values


def size_range(program: Any, size: Any) -> tuple[int, int | None] | None:
    """(fewest, most) a size of a program's input takes (most None: no bound); None where
    its range is not known."""
    if not isinstance(size, torch.SymInt):
        return int(size), int(size)
    return _expr_range(program, size.node.expr)


def _expr_range(program: Any, expr: Any) -> tuple[int, int | None] | None:
    """(fewest, most) a size expression or symbol takes in a program's range constraints."""
    bounds = program.range_constraints.get(expr)
    if bounds is None:
        return None
    upper = bounds.upper  # a sympy Integer, or torch's int_oo (which calls itself finite)
    return int(bounds.lower), (int(upper) if upper.is_Integer else None)


def program_shapes(program: Any, names: Sequence[str]) -> CompiledShapes | None:
    """A torch.export program's shapes (`names`: its user inputs in order): the range of
    each dim, and the dims one symbol sizes (s itself, or a*s + b: `Dim` arithmetic). A
    symbol's range from 2 is torch's 0/1 specialization (Dim.AUTO, Dim.DYNAMIC): the
    program takes 1, and a dim it sizes takes a*1 + b. None where the inputs are not one
    tensor each."""
    values = user_input_values(program)
    if len(values) != len(names) or not all(isinstance(v, torch.Tensor) for v in values):
        return None
    own = [getattr(item.arg, "name", "") for item in program.graph_signature.input_specs
           if item.kind.name == "USER_INPUT"]
    ranges: dict[str, list[Range]] = {}
    symbols: dict[Any, list[TiedDim]] = {}
    # symbols a dim is sized from with another (y of s*t): the 0/1 reading does not hold for
    # them (a guard "y >= 4" keeps s and t from 2), and the warm-up's zeros must agree
    producing = {symbol for value in values for size in value.shape
                 if isinstance(size, torch.SymInt) and _linear(size) is None
                 for symbol in size.node.expr.free_symbols}
    for name, value in zip(names, values):
        found = []
        for dim, size in enumerate(value.shape):
            linear = _linear(size)
            if linear is not None:
                symbol, scale, offset = linear
                symbols.setdefault(symbol, []).append(TiedDim(name, dim, scale, offset))
                taken = _expr_range(program, symbol)
                if taken is not None:
                    low, high = taken
                    if low == 2 and symbol not in producing:
                        low = 1  # the 0/1 specialization (see above)
                    taken = (scale * low + offset,
                             None if high is None else scale * high + offset)
            else:
                taken = size_range(program, size)
            if taken is not None:
                found.append((dim, *taken))
        ranges[name] = found
    return CompiledShapes(ranges, list(symbols.values()),  # bounded_spec keeps what counts
                          dict(zip(own, names)))


def _linear(size: Any) -> tuple[Any, int, int] | None:
    """(symbol, a, b) for a size that is a*symbol + b with a whole a > 0 and b; else None."""
    if not isinstance(size, torch.SymInt):
        return None
    expr = size.node.expr
    if len(expr.free_symbols) != 1:
        return None
    (symbol,) = expr.free_symbols
    scale, offset = expr.coeff(symbol, 1), expr.subs(symbol, 0)
    if not (scale.is_Integer and offset.is_Integer and scale > 0) or \
            (expr - scale * symbol - offset).expand() != 0:
        return None
    return symbol, int(scale), int(offset)

