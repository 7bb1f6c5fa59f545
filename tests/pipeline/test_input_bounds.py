"""What a compiled model's shapes make of its config's inputs (pipeline/input_bounds.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest
import torch

from tensorgate import InferenceRequest, TensorView
from tensorgate.errors import InvalidArgumentError
from tensorgate.pipeline.model_outputs import refused_sizes
from tensorgate.pipeline.input_bounds import (CompiledShapes, bounded_spec, lows_raised,
                                              program_shapes, raised_least)
from tensorgate.pipeline.ragged import BatchRoom
from tensorgate.pipeline.requests import work_item
from tensorgate.pipeline.runner import Runner
from tensorgate.repository.model_config import (ModelConfigError, RaggedLimits, TiedDim,
                                                parse_model_config)

SPEC = parse_model_config('name: "m" max_batch_size: 8 input [ '
                          '{ name: "x" data_type: TYPE_FP32 dims: [ -1, -1, 3 ] }, '
                          '{ name: "w" data_type: TYPE_FP32 dims: [ -1 ] }, '
                          '{ name: "r" data_type: TYPE_FP32 dims: [ -1 ] reshape: { '
                          'shape: [ -1, 1 ] } } ] '
                          'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                          "m/config.pbtxt")


def test_ranges_bound_only_the_variable_dims_they_narrow() -> None:
    """A dim taken from 0 with no end stays free; one the range narrows is held to it (from
    1: an empty dim is refused); the batch dim and dims the config fixes are left to the
    batcher and `accepts`; an input none of whose dims is narrowed is the config's
    TensorSpec; a reshaped input's dims are its reshape's."""
    free = [(0, 1, 8), (1, 0, None)]
    assert bounded_spec("p", SPEC, "it", CompiledShapes(
        {"x": free + [(2, 0, None), (3, 3, 3)], "w": free})) is SPEC
    narrowed = bounded_spec("p", SPEC, "it", CompiledShapes(
        {"x": free + [(2, 2, 64), (3, 3, 3)], "w": free, "r": [(1, 4, 4)], "gone": free}))
    assert narrowed.input("x").bounds == ((0, None), (2, 64), (3, 3))
    assert narrowed.input("x").outside_bounds((5, 65, 3)) == (1, "2 to 64")
    assert narrowed.input("w") is SPEC.input("w")
    assert narrowed.input("r").bounds == ((4, 4), (1, 1))  # reshape [-1, 1]
    assert narrowed.tied_dims == ()
    assert bounded_spec("p", SPEC, "it", CompiledShapes(
        {"w": [(1, 4, 4)]})).input("w").bounds == ((4, 4),)
    from_one = bounded_spec("p", SPEC, "it", CompiledShapes({"w": [(1, 1, None)]})).input("w")
    assert from_one.bounds == ((1, None),) and from_one.outside_bounds((0,)) == (0, "1 or more")
    assert from_one.outside_bounds((10**6,)) is None


def test_ties_keep_the_variable_dims_of_inputs_clients_send() -> None:
    """A tie holds a request's sizes together only among dims the model's shape of each
    input leaves variable (not the batch dim, a fixed dim or an unknown input's)."""
    tied = bounded_spec("p", SPEC, "it", CompiledShapes({}, [
        [("x", 1), ("w", 1), ("r", 1), ("r", 2), ("gone", 1)], [("x", 0), ("w", 0)],
        [("x", 3), ("w", 1)], [("x", 2), ("x", 1), ("w", 1)]]))
    assert tied.tied_dims == ((TiedDim("x", 1), TiedDim("w", 1), TiedDim("r", 1)),
                              (TiedDim("x", 2), TiedDim("x", 1), TiedDim("w", 1)))
    assert tied.inputs == SPEC.inputs
    scaled = bounded_spec("p", SPEC, "it", CompiledShapes({}, [
        [TiedDim("x", 1), TiedDim("w", 1, 2, -1), TiedDim("x", 0, 3, 0)]]))
    assert scaled.tied_dims == ((TiedDim("x", 1), TiedDim("w", 1, 2, -1)),)
    alone = bounded_spec("p", SPEC, "it", CompiledShapes({}, [
        [TiedDim("w", 1, 2, 0)], [TiedDim("x", 1, 1, 3)], [TiedDim("x", 2, 2), ("x", 0)]]))
    assert alone.tied_dims == ((TiedDim("w", 1, 2, 0),), (TiedDim("x", 2, 2),))  # even only


def test_a_tied_dim_says_how_it_is_sized_and_which_sizes_it_takes() -> None:
    assert [TiedDim("x", 1).formula(), TiedDim("x", 1, 1, 1).formula(),
            TiedDim("x", 1, 2).formula(), TiedDim("x", 1, 3, -2).formula()] == [
        "s", "s + 1", "2*s", "3*s - 2"]
    assert [TiedDim("x", 1, 2, 1).symbol(size) for size in (1, 2, 7, 0)] == [0, None, 3, None]


class _Two(torch.nn.Module):
    def forward(self, x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.sum(1) + z.sum(1) + (w * x[:, :1]).sum(1)


def test_a_program_s_shapes_are_read_from_its_range_constraints_and_symbols() -> None:
    """Each user input's dims: a symbol's range (from 2: the program takes 1, torch's 0/1
    specialization), a static size as itself; dims of one symbol are tied."""
    sequence = torch.export.Dim("sequence", min=4, max=32)
    program = torch.export.export(
        _Two(), (torch.randn(2, 5), torch.randn(2, 3), torch.randn(2, 5)),
        dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC, 1: sequence},
                        "z": {0: torch.export.Dim.DYNAMIC},
                        "w": {0: torch.export.Dim.DYNAMIC, 1: sequence}})
    shapes = program_shapes(program, ["x", "z", "w"])
    assert shapes is not None
    assert shapes.ranges == {"x": [(0, 1, None), (1, 4, 32)], "z": [(0, 1, None), (1, 3, 3)],
                             "w": [(0, 1, None), (1, 4, 32)]}
    assert sorted(map(sorted, shapes.ties)) == [
        [TiedDim("w", 0), TiedDim("x", 0), TiedDim("z", 0)], [TiedDim("w", 1), TiedDim("x", 1)]]
    assert program_shapes(program, ["x"]) is None  # names that do not fit: nothing learned


class _Sized(torch.nn.Module):
    def forward(self, x: torch.Tensor, edges: torch.Tensor, pairs: torch.Tensor
                ) -> torch.Tensor:
        return x.sum(1) + edges.sum(1) + pairs.sum(1)


def test_dims_a_program_sizes_from_a_symbol_are_tied_with_how() -> None:
    """`Dim` arithmetic (s + 1, 2*s) ties a dim to its symbol with its a and b; its range
    is the symbol's, sized so (the symbol's range from 2 read from 1: torch's 0/1
    specialization)."""
    length = torch.export.Dim("length", min=2, max=16)
    program = torch.export.export(
        _Sized(), (torch.randn(2, 5), torch.randn(2, 6), torch.randn(2, 10)),
        dynamic_shapes={"x": {1: length}, "edges": {1: length + 1}, "pairs": {1: 2 * length}})
    shapes = program_shapes(program, ["x", "edges", "pairs"])
    assert shapes is not None
    assert shapes.ranges == {"x": [(0, 2, 2), (1, 1, 16)], "edges": [(0, 2, 2), (1, 2, 17)],
                             "pairs": [(0, 2, 2), (1, 2, 32)]}
    assert [sorted(group) for group in shapes.ties] == [
        [TiedDim("edges", 1, 1, 1), TiedDim("pairs", 1, 2, 0), TiedDim("x", 1, 1, 0)]]


RAGGED = parse_model_config(
    'name: "r" max_batch_size: 8 input [ '
    '{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }, '
    '{ name: "w" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }, '
    '{ name: "k" data_type: TYPE_FP32 dims: [ 2, 3 ] } ] '
    'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
    + " ".join(f'batch_input {{ kind: {kind} target_name: "{target}" data_type: TYPE_INT32 '
               f'source_input: "{source}" }}' for kind, target, source in (
                   ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "ends", "x"),
                   ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "longest", "w"),
                   ("BATCH_ITEM_SHAPE_FLATTEN", "shapes", "k"))),
    "r/config.pbtxt")


def test_a_ragged_models_ranges_bound_its_batches_and_requests() -> None:
    """A ragged input's flat dim bounds a batch's elements of it (and a request's); a batch
    input's dim 0 bounds what it counts: requests (ENDS with its zero: one fewer), the
    longest request (AS_SHAPE), rows (an item shape a row, flat: 2 numbers each); a batched
    input's dim 0, rows. Ties among the flat dims are kept as (input, a); one with an
    offset cannot hold for a batch of several requests, and the model is refused."""
    limits = bounded_spec("p", RAGGED, "it", CompiledShapes(
        {"x": [(0, 1, 4096)], "w": [(0, 1, 4096)], "ends": [(0, 2, 5)],
         "longest": [(0, 1, 100)], "shapes": [(0, 2, 14)], "k": [(0, 1, 8), (1, 2, 2)]},
        [[("x", 0, 1, 0), ("w", 0, 1, 0)], [("ends", 0, 1, 0)]])).ragged_limits
    assert limits == RaggedLimits((("x", 4096), ("w", 4096)), (("x", 4096), ("w", 100)),
                                  4, 7, ((("x", 1), ("w", 1)),))
    scaled = bounded_spec("p", RAGGED, "it", CompiledShapes(
        {"x": [(0, 2, 2000)]}, [[("x", 0, 2, 0)]])).ragged_limits
    assert scaled == RaggedLimits((("x", 2000),), (("x", 2000),), None, None,
                                  ((("x", 2),),))  # alone, still 2*n: whole n only
    assert bounded_spec("p", RAGGED, "it", CompiledShapes(
        {"x": [(0, 0, None)]})).ragged_limits is None
    with pytest.raises(ModelConfigError, match=re.escape(
            "p: it sizes the flat dims of its ragged inputs 'x' and 'w' as s and s + 1 of one "
            "s: a batch holds its requests' elements end to end, so the '+1' of 'w' would "
            "not hold for batches of several requests; export it with the ragged inputs "
            "sized a*s, or turn off allow_ragged_batch")):
        bounded_spec("p", RAGGED, "it", CompiledShapes(
            {}, [[("x", 0, 1, 0), ("w", 0, 1, 1)]]))


def test_a_batch_has_room_for_requests_while_every_limit_holds() -> None:
    limits = RaggedLimits((("x", 10),), (("x", 10),), requests=3, rows=4)
    room = BatchRoom(limits)
    assert room.take({"x": torch.zeros(1, 4)}, 1) and room.take({"x": torch.zeros(1, 6)}, 1)
    assert not room.take({"x": torch.zeros(1, 1)}, 1)  # 11 elements
    assert room.take({"x": torch.zeros(1, 0)}, 1)  # an empty one fits
    assert not room.take({"x": torch.zeros(1, 0)}, 1)  # a fourth request
    rows = BatchRoom(limits)
    assert rows.take({"x": torch.zeros(3, 1)}, 3) and not rows.take({"x": torch.zeros(2, 1)}, 2)


def test_a_request_no_batch_could_take_is_refused_alone() -> None:
    """requests.py holds each request to RaggedLimits before it is queued: rows, elements
    of a request, and the ties among ragged inputs."""
    spec = dataclasses.replace(RAGGED, ragged_limits=RaggedLimits(
        (("x", 10),), (("x", 10), ("w", 4)), rows=2, ties=((("x", 2), ("w", 1)),)))
    loop = asyncio.new_event_loop()

    def refusal(x: int, w: int, rows: int = 1) -> str:
        views = {"x": torch.zeros(rows, x), "w": torch.zeros(rows, w), "k": torch.zeros(rows, 2, 3)}
        try:
            work_item(spec, InferenceRequest("r", {name: TensorView.from_torch(value, name=name)
                                                   for name, value in views.items()}), loop)
        except InvalidArgumentError as error:
            return str(error)
        return ""

    try:
        assert refusal(8, 4) == "" and refusal(0, 0) == ""
        assert refusal(2, 1, rows=3) == ("model 'r' takes at most 2 rows in a batch (the sizes "
                                         "it was exported for); the request has 3")
        assert refusal(12, 6) == ("input 'x' of model 'r' has 12 elements; the model takes at "
                                  "most 10 from a request (the sizes it was exported for)")
        assert refusal(10, 5) == ("input 'w' of model 'r' has 5 elements; the model takes at "
                                  "most 4 from a request (the sizes it was exported for)")
        assert refusal(3, 1) == ("input 'x' of model 'r' has 3 elements; the model takes 2*n "
                                 "of them, for a whole n (the sizes it was exported for)")
        assert refusal(4, 3) == ("input 'w' of model 'r' has 3 elements, and input 'x' 4; the "
                                 "model takes 2 there: it takes n elements of 'w' where it "
                                 "takes 2*n of 'x', for one n (the sizes it was exported for)")
    finally:
        loop.close()


def test_a_guard_that_refuses_the_least_sizes_raises_them_a_step() -> None:
    """raised_least: the dims a failed guard names go one step up — a tied dim's whole group
    by one s, another dim by one — in the program's words mapped to the config's names;
    nothing for a guard naming the batch dim, a fixed dim, a ragged or unknown input, or a
    step past the most."""
    spec = bounded_spec("p", SPEC, "it", CompiledShapes(
        {"x": [(1, 1, 16)], "w": [(1, 2, 17)], "r": [(1, 1, 8)]},
        [[("x", 1, 1, 0), ("w", 1, 1, 1)]]), quiet=True)
    shapes = CompiledShapes({}, (), {"x_arg": "x", "r": "r"})
    up = raised_least(spec, shapes, "Guard failed: -1 + w.size()[1] != 1")
    assert up is not None
    assert (up.input("x").bounds[0], up.input("w").bounds) == ((2, 16), ((3, 17),))
    assert lows_raised(spec, up) == "dim 1 of input 'x' from 2 and dim 1 of input 'w' from 3"
    alone = raised_least(spec, shapes, "Guard failed: r.size()[1] != 1")
    assert alone is not None and alone.input("r").bounds == ((2, 8), (1, 1))
    assert lows_raised(SPEC, alone) == "dim 1 of input 'x' from 1, dim 1 of input 'w' from " \
        "2 and dim 1 of input 'r' from 2"  # against the config's: the ranges' lows too
    assert raised_least(spec, shapes, "Guard failed: x_arg.size()[1] > 1") is not None
    for guard in ("Guard failed: x.size()[0] != 1",  # the batch dim
                  "Guard failed: x.size()[3] == 3",  # fixed
                  "Guard failed: nothing.size()[1] > 1", "Guard failed: x.size()[9] > 1",
                  "Guard failed: a bool"):
        assert raised_least(spec, shapes, guard) is None, guard
    top = bounded_spec("p", SPEC, "it", CompiledShapes({"w": [(1, 4, 4)]}), quiet=True)
    assert raised_least(top, shapes, "Guard failed: w.size()[1] != 4") is None


def test_a_guard_that_refuses_a_ragged_input_raises_its_fewest_elements_a_request() -> None:
    """A ragged input's flat dim is its batch's elements end to end: the guard raises the
    fewest elements one request may bring (RaggedLimits.least), a tie group's by one n, the
    warm-up's n = 1 to n = 2; past the most, nothing."""
    tied = dataclasses.replace(RAGGED, ragged_limits=RaggedLimits(
        (("x", 2000), ("w", 1000)), (("x", 2000), ("w", 1000)), 3, None,
        ((("x", 2), ("w", 1)),)))
    shapes = CompiledShapes({})
    spec = raised_least(tied, shapes, "Guard failed: x.size()[0] // 2 != 1")
    assert spec is not None
    assert spec.ragged_limits is not None and spec.ragged_limits.least == (("x", 4), ("w", 2))
    assert lows_raised(tied, spec) == ("ragged input 'x' from 4 elements a request and "
                                       "ragged input 'w' from 2 elements a request")
    again = raised_least(spec, shapes, "Guard failed: x.size()[0] // 2 != 2")
    assert again is not None and again.ragged_limits.least == (("x", 6), ("w", 3))
    assert lows_raised(spec, again) == ("ragged input 'x' from 6 elements a request and "
                                        "ragged input 'w' from 3 elements a request")
    alone = raised_least(RAGGED, shapes, "Guard failed: w.size()[0] != 1")
    assert alone is not None and alone.ragged_limits == RaggedLimits(least=(("w", 2),))
    assert lows_raised(RAGGED, RAGGED) == "nothing"
    full = dataclasses.replace(RAGGED, ragged_limits=RaggedLimits((("w", 1),), (("w", 1),)))
    assert raised_least(full, shapes, "Guard failed: w.size()[0] != 1") is None


def test_only_a_programs_guard_over_a_requests_own_dims_is_its_fault() -> None:
    """model_outputs.refused_sizes: a 400 for a failed guard of an exported program over a dim
    other than the batch dim; nothing for the batch dim alone, a ragged model (its batches
    mix sizes), a model that is no exported program, or another error."""
    program = Runner(lambda inputs: inputs, None, None)
    program.shapes = CompiledShapes({})
    other = Runner(lambda inputs: inputs, None, None)
    guard = AssertionError("Guard failed: x.size()[1] % 4 == 0")
    refusal = refused_sizes(SPEC, program, guard)
    assert refusal is not None and str(refusal) == (
        "model 'm' refused the request's sizes, which its ranges take: its exported "
        "program's guard failed: x.size()[1] % 4 == 0 (the sizes it was exported for)")
    assert refused_sizes(SPEC, program, AssertionError("Guard failed: x.size()[0] != 3")) \
        is None
    assert refused_sizes(RAGGED, program, guard) is None
    assert refused_sizes(SPEC, other, guard) is None
    assert refused_sizes(SPEC, program, RuntimeError("Guard failed: x.size()[1] > 2")) is None
