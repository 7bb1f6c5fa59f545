"""A request that names many tensors is decoded TENSORS_A_STEP of them at a time (4,096 JSON
inputs held the loop for 38 ms in one step): stepped or straight through, the same request,
and the same refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tensorgate.protocol.infer_codec import (TENSORS_A_STEP, decode_infer_body,
                                             decode_infer_steps)
from tensorgate.tensor import CopyLedger
from tests.protocol.sliced_and_whole import outcome, run_steps


def _binary(inputs: int, outputs: int) -> tuple[bytes, int]:
    header = {"inputs": [{"name": f"x{i}", "datatype": "INT32", "shape": [1],
                          "parameters": {"binary_data_size": 4}} for i in range(inputs)],
              "outputs": [{"name": f"y{i}"} for i in range(outputs)]}
    head = json.dumps(header).encode()
    return head + b"".join(i.to_bytes(4, "little") for i in range(inputs)), len(head)


def _json(inputs: int, outputs: int) -> bytes:
    return json.dumps({"inputs": [{"name": f"x{i}", "datatype": "INT32", "shape": [1],
                                   "data": [i]} for i in range(inputs)],
                       "outputs": [{"name": f"y{i}"} for i in range(outputs)]}).encode()


def _both(body: bytes, header_length: int | None) -> tuple[Any, Any, int]:
    turns: list[int] = []
    stepped = outcome(lambda: run_steps(decode_infer_steps(bytearray(body), len(body),
                                                           header_length, CopyLedger()), turns))
    whole = outcome(lambda: decode_infer_body(bytearray(body), len(body), header_length,
                                              CopyLedger()))
    return stepped, whole, len(turns)


@pytest.mark.parametrize("inputs,outputs", [(1, 0), (TENSORS_A_STEP, TENSORS_A_STEP),
                                            (TENSORS_A_STEP + 1, 0), (1000, 1000), (4096, 0)])
@pytest.mark.parametrize("wire", ["binary", "json"])
def test_stepped_and_whole_decode_alike_a_step_of_tensors_apart(inputs: int, outputs: int,
                                                                wire: str) -> None:
    body, length = _binary(inputs, outputs) if wire == "binary" else (_json(inputs, outputs),
                                                                      None)
    stepped, whole, turns = _both(body, length)
    assert stepped == whole and stepped[0] == "decoded"
    assert list(stepped[2]) == [f"x{i}" for i in range(inputs)]
    assert turns == (inputs - 1) // TENSORS_A_STEP + max(outputs - 1, 0) // TENSORS_A_STEP


@pytest.mark.parametrize("late", [0, 300, 999])
def test_a_bad_input_after_steps_is_refused_as_it_is_whole(late: int) -> None:
    header = json.loads(_json(1000, 0))
    header["inputs"][late]["datatype"] = "FP33"
    stepped, whole, _ = _both(json.dumps(header).encode(), None)
    assert stepped == whole and stepped[0] == "refused"
    assert stepped[2].startswith(f"tensor 'x{late}': unknown datatype 'FP33'")
