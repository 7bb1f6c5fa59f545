"""Hypothesis against the HTTP and gRPC request decoders: any input either decodes into
views that stay inside their bytes, or raises a TensorgateError — nothing else."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import TensorgateError
from tensorgate.protocol.grpc_codec import (decode_model_infer, first_tensor_offset,
                                            split_model_infer)
from tensorgate.protocol import json_text
from tensorgate.protocol.generate_codec import (GenerateInput, decode_generate_body,
                                                generate_request)
from tensorgate.protocol.infer_codec import decode_infer_body
from tensorgate.protocol.request_parameters import RESERVED_PARAMETERS, model_parameters
from tensorgate.tensor import CopyLedger
from tensorgate.tensor.dtypes import datatype as datatype_named

DATATYPES = ["BOOL", "UINT8", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES", "X"]
dims = st.lists(st.integers(-2, 2**40), max_size=4)


@settings(max_examples=300, deadline=None)
@given(header=st.fixed_dictionaries({
    "inputs": st.lists(st.fixed_dictionaries({
        "name": st.sampled_from(["a", "b", ""]), "datatype": st.sampled_from(DATATYPES),
        "shape": dims,
        "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-1, 64)})}),
        max_size=3)}), tail=st.binary(max_size=64), declared=st.none() | st.integers(0, 200))
def test_http_decoder(header: dict, tail: bytes, declared: int | None) -> None:
    head = json.dumps(header).encode()
    body = bytearray(head + tail)
    length = len(head) if declared is None else declared
    try:
        decoded = decode_infer_body(body, len(body), length, CopyLedger())
    except TensorgateError:
        return
    for view in decoded.inputs.values():
        assert view.offset + view.nbytes <= len(body)


@settings(max_examples=300, deadline=None)
@given(inputs=st.lists(st.tuples(st.sampled_from(["a", "b", ""]), st.sampled_from(DATATYPES),
                                 dims, st.binary(max_size=48)), max_size=3),
       raw=st.booleans(), fp32=st.lists(st.floats(width=32), max_size=8))
def test_grpc_decoder(inputs: list, raw: bool, fp32: list[float]) -> None:
    request = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, data in inputs:
        tensor = request.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend(shape)
        if raw:
            request.raw_input_contents.append(data)
        else:
            tensor.contents.fp32_contents.extend(fp32)
    try:
        decoded = decode_model_infer(request, CopyLedger())
    except TensorgateError:
        return
    for view, data in zip(decoded.inputs.values(), request.raw_input_contents):
        assert view.nbytes == len(data)
    # The server's path: the tensors stay in the received message, as views.
    message = bytearray(request.SerializeToString())
    small, spans = split_model_infer(memoryview(message))
    assert [bytes(message[o:o + n]) for o, n in spans.raw] == list(request.raw_input_contents)
    assert small.inputs == request.inputs and not small.raw_input_contents
    from_spans = decode_model_infer(small, CopyLedger(), message=message, spans=spans)
    for view, (offset, length) in zip(from_spans.inputs.values(), spans.raw):
        assert (view.offset, view.nbytes) == (offset, length)
    if spans.raw:
        assert first_tensor_offset(memoryview(message)) == spans.raw[0][0]


@settings(max_examples=500, deadline=None)
@given(message=st.binary(max_size=96))
def test_grpc_message_splitter_on_any_bytes(message: bytes) -> None:
    """Hostile wire bytes: split or a clear INVALID_ARGUMENT, spans always inside."""
    try:
        small, spans = split_model_infer(memoryview(message))
    except TensorgateError as error:
        assert error.message.startswith("ModelInferRequest is malformed")
        return
    for offset, length in spans.raw:
        assert 0 <= offset and offset + length <= len(message)
    first_tensor_offset(memoryview(message)[:len(message) // 2])  # never raises more


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                           | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=2)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=2),
                           max_leaves=4)


@settings(max_examples=300, deadline=None)
@given(parameters=st.dictionaries(st.sampled_from(["sequence_id", "sequence_start",
                                                   "sequence_end", "priority", "timeout",
                                                   "custom", "triton_x", "headers"]),
                                  json_values))
def test_request_parameters_decode_or_are_refused_by_name(parameters: dict) -> None:
    body = bytearray(json.dumps({"parameters": parameters, "inputs": [
        {"name": "a", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode())
    try:
        decoded = decode_infer_body(body, len(body), None, CopyLedger())
        seen = model_parameters(decoded.parameters)
    except TensorgateError as error:
        assert any(f"'{name}'" in error.message for name in parameters)
        return
    # a model sees exactly the parameters that are not reserved, each a scalar
    assert set(seen) == {k for k in parameters if k not in RESERVED_PARAMETERS} - {"triton_x"}
    assert all(isinstance(v, (bool, int, float, str)) for v in seen.values())
    if decoded.sequence is not None:
        sequence_id, start, end = decoded.sequence
        assert sequence_id not in (0, "") and isinstance(start, bool) and isinstance(end, bool)
        assert isinstance(sequence_id, str) or sequence_id > 0


@settings(max_examples=400, deadline=None)
@given(datatype=st.sampled_from(DATATYPES), shape=st.lists(st.integers(0, 3), max_size=3),
       data=json_values)
@example(datatype="FP16", shape=[2], data=[False, 0])  # found by this test in CI
@example(datatype="INT32", shape=[2], data=[[True], [2]])
def test_json_data_decodes_to_its_shape_or_is_refused_naming_the_input(
        datatype: str, shape: list[int], data: object) -> None:
    body = bytearray(json.dumps({"inputs": [
        {"name": "x", "shape": shape, "datatype": datatype, "data": data}]}).encode())
    try:
        decoded = decode_infer_body(body, len(body), None, CopyLedger())
    except TensorgateError as error:
        assert "'x'" in error.message, error.message
        return
    view = decoded.inputs["x"]
    assert list(view.shape) == shape
    decoded_values = view.numpy().reshape(-1).tolist()
    if datatype == "BYTES":
        assert all(isinstance(item, bytes) for item in decoded_values)
        return
    # Nothing was silently changed: no string parsed, no fraction cut, no number wrapped,
    # nothing made a boolean, no boolean made a number
    given_values = list(_leaves(data))
    assert len(given_values) == len(decoded_values)
    for sent, got in zip(given_values, decoded_values):
        if datatype == "BOOL":
            assert isinstance(sent, bool) and sent == got
        elif datatype in ("UINT8", "INT32", "INT64"):
            assert type(sent) is int and sent == got
        else:
            assert isinstance(sent, (int, float)) and not isinstance(sent, bool)
            assert got == float(np.float16(sent) if datatype == "FP16" else
                                np.float32(sent) if datatype == "FP32" else sent)


def _leaves(value: object) -> list[object]:
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


GENERATE_INPUTS = [GenerateInput("text", datatype_named("BYTES"), (1,)),
                   GenerateInput("grid", datatype_named("FP32"), (-1, 2)),
                   GenerateInput("flag", datatype_named("BOOL"), ())]


@settings(max_examples=400, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(["text", "grid", "flag", "parameters", "other"]),
                              json_values), batched=st.booleans())
def test_generate_requests_fit_the_dims_or_are_refused_by_name(fields: dict,
                                                              batched: bool) -> None:
    body = bytearray(json.dumps(fields).encode())
    try:
        decoded = generate_request("m", decode_generate_body(body, len(body)), GENERATE_INPUTS,
                                   batched, CopyLedger())
        seen = model_parameters(decoded.parameters)
    except TensorgateError as error:
        nested = fields.get("parameters")
        named = list(fields) + (list(nested) if isinstance(nested, dict) else [])
        assert any(f"'{name}'" in error.message for name in named), error.message
        return
    if "other" in fields:  # a member that is no input is a parameter of the request, as
        # read (an integer beyond 64 bits reads as a float, as Triton's rapidjson reads it)
        assert seen["other"] == json_text.loads(json.dumps(fields["other"]).encode())
    for item in GENERATE_INPUTS:
        if item.name in fields:
            shape = tuple(decoded.inputs[item.name].shape)
            if batched:
                assert shape[0] == 1
                shape = shape[1:]
            assert len(shape) == len(item.dims)
            assert all(d in (-1, s) for d, s in zip(item.dims, shape))
