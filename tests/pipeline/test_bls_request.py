"""A BLS call's request as the engine takes it (pipeline/bls.py): its inputs as views, its
sequence from its correlation id and flags (none without an id), its other fields as they
were set."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgate import python_backend as pb_utils
from tensorgate.errors import InvalidArgumentError
from tensorgate.pipeline.bls import _engine_request

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


@pytest.mark.parametrize(("correlation", "flags", "expected"), [
    (7, START, (7, True, False)), (7, END, (7, False, True)), ("s-1", START | END,
                                                               ("s-1", True, True)),
    (7, 0, (7, False, False)), (0, START, None), ("", END, None)])
def test_a_bls_request_s_sequence_comes_from_its_correlation_id_and_flags(
        correlation: int | str, flags: int, expected: tuple[object, bool, bool] | None) -> None:
    value = np.arange(4, dtype=np.float32)
    request = pb_utils.InferenceRequest(
        model_name="seq", requested_output_names=["OUT"], inputs=[pb_utils.Tensor("IN", value)],
        request_id="r", correlation_id=correlation, flags=flags, timeout=5, model_version=2,
        parameters={"k": 1})
    call = _engine_request(request)
    sequence = call.sequence
    assert (None if sequence is None else (sequence.id, sequence.start, sequence.end)) == \
        expected
    assert (call.model, call.version, call.id, call.outputs, call.parameters) == \
        ("seq", 2, "r", ["OUT"], {"k": 1})
    assert np.array_equal(call.inputs["IN"].numpy(), value)


def test_a_bls_request_needs_a_model_name() -> None:
    with pytest.raises(InvalidArgumentError, match="needs a model_name"):
        _engine_request(pb_utils.InferenceRequest(inputs=[]))
