"""What a compiled model's shapes make of its config's inputs (pipeline/input_bounds.py)."""

from __future__ import annotations

import torch

from tensorgate.pipeline.input_bounds import CompiledShapes, bounded_spec, program_shapes
from tensorgate.repository.model_config import TiedDim, parse_model_config

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
