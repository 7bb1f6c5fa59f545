"""A request body decoded both ways — a slice at a time (json_slices) and whole — for the
tests that hold the two to the same outcome."""

from __future__ import annotations

from typing import Any

from tensorgate.errors import TensorgateError
from tensorgate.protocol.infer_codec import decode_infer_body
from tensorgate.protocol.json_slices import decode_in_slices
from tensorgate.protocol.steps import Steps
from tensorgate.tensor.copies import CopyLedger


def outcome(decode: Any) -> tuple[Any, ...]:
    """What a decode comes to, comparable: its inputs (bytes, or BYTES elements), id,
    outputs and parameters; or its refusal."""
    try:
        decoded = decode()
    except TensorgateError as error:
        return ("refused", type(error).__name__, error.message)
    inputs = {name: (view.datatype.name, view.shape, repr(view.numpy().tolist())
                     if view.datatype.is_bytes else view.numpy().tobytes())
              for name, view in decoded.inputs.items()}
    return ("decoded", decoded.id, inputs, decoded.outputs, dict(decoded.parameters))


def run_steps(steps: Steps, turns: list[int] | None = None) -> Any:
    """Run steps to their end, as the front end does without its awaits; each yield
    counted in `turns`."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        if turns is not None:
            turns.append(1)


def both(body: bytes, header_length: int | None = None
         ) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    """Each way's outcome, and how many steps the sliced way took."""
    turns: list[int] = []
    sliced = outcome(lambda: run_steps(decode_in_slices(body, len(body), CopyLedger(),
                                                        header_length=header_length), turns))
    whole = outcome(lambda: decode_infer_body(body, len(body), header_length, CopyLedger()))
    return sliced, whole, len(turns)
