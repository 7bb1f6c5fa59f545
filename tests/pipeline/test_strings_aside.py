"""A request's large BYTES inputs are cut into bytes objects off the event loop, which
serves others meanwhile; small ones, and any in a sequence, stay where they were."""

from __future__ import annotations

import asyncio
import struct

import numpy as np

from tensorgate.pipeline.requests import STRINGS_ASIDE, InferenceRequest, strings_aside
from tensorgate.pipeline.work import SequenceFlags
from tensorgate.tensor.view import TensorView


def _strings(count: int) -> TensorView:
    """`count` elements of mixed lengths (0, 1, 2 bytes): numpy cannot cut them out."""
    items = [b"ab"[:i % 3] for i in range(count)]
    layout = b"".join(struct.pack("<I", len(item)) + item for item in items)
    return TensorView(layout, "BYTES", [count], name="T")


def _ticks_while(request: InferenceRequest) -> tuple[dict | None, int]:  # type: ignore[type-arg]
    """strings_aside's answer, and how often the loop ran another task meanwhile."""
    async def scenario() -> tuple[dict | None, int]:  # type: ignore[type-arg]
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.001)
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks = 0
        found = await strings_aside(request)
        done = True
        await task
        return found, ticks
    return asyncio.run(scenario())


def test_large_strings_are_cut_out_while_the_loop_serves_others() -> None:
    view = _strings(1_000_000)
    found, ticks = _ticks_while(InferenceRequest("m", {"T": view}))
    assert found is not None and list(found) == ["T"]
    assert found["T"].dtype == object and found["T"].tolist() == view.numpy().tolist()
    assert ticks >= 3  # cut out on the loop (as before) it would have had none


def test_small_strings_and_a_sequence_s_stay_on_the_loop() -> None:
    small = {"T": _strings(STRINGS_ASIDE - 1),
             "X": TensorView.from_numpy(np.zeros(STRINGS_ASIDE, np.float32), name="X")}
    assert _ticks_while(InferenceRequest("m", small))[0] is None
    large = {"T": _strings(STRINGS_ASIDE)}
    assert _ticks_while(InferenceRequest("m", large))[0] is not None
    in_sequence = InferenceRequest("m", large, sequence=SequenceFlags(7, start=True))
    assert _ticks_while(in_sequence) == (None, 0)
