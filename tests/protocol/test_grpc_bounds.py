"""gRPC request messages are counted on the wire before protobuf parses them: past
MAX_MESSAGE_PARTS fields, nested messages and map entries they are refused unparsed (upb
parses a map in time that grows with the square of its entries), and so is an input shape
too long to be one. The receiver's look for the first tensor goes on where it left off."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.grpc_codec import (MAX_MESSAGE_PARTS, PARTS_A_STEP,
                                            decode_model_infer, decode_model_infer_steps,
                                            first_tensor_offset, parse_bounded_steps,
                                            scan_for_tensor, split_model_infer,
                                            split_model_infer_steps)
from tensorgate.protocol.grpc_contents import split_contents_steps
from tensorgate.protocol.protobuf_wire import PartsBudget, varint_bytes
from tensorgate.protocol.steps import run_through
from tensorgate.tensor import CopyLedger
from tests.protocol.sliced_and_whole import run_steps

REFUSAL = (f"holds more than {MAX_MESSAGE_PARTS:,} fields, nested messages and map entries; "
           "at most that many are parsed")


def _request(parameters: int = 0, input_parameters: int = 0, outputs: int = 0
             ) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="x", datatype="FP32", shape=[1])
    for i in range(parameters):
        request.parameters[f"p{i}"].int64_param = i
    for i in range(input_parameters):
        item.parameters[f"p{i}"].bool_param = True
    for _ in range(outputs):
        request.outputs.add(name="y")
    request.raw_input_contents.append(b"\0" * 4)
    return request


@pytest.mark.parametrize("where", ["parameters", "input_parameters", "outputs"])
def test_a_request_of_too_many_parts_is_refused_unparsed(where: str) -> None:
    """Far over the bound: refused, naming it, without protobuf's parse (of a million
    request parameters: 5-12 s here). Under it: parsed as it was."""
    under = _request(**{where: MAX_MESSAGE_PARTS // 8})  # a parameter is 4 parts
    request, spans = split_model_infer(memoryview(under.SerializeToString()))
    assert request.parameters == under.parameters and request.outputs == under.outputs
    assert request.inputs == under.inputs and len(spans.raw) == 1
    over = memoryview(_request(**{where: 1_000_000}).SerializeToString())
    with pytest.raises(InvalidArgumentError, match=f"^ModelInferRequest {REFUSAL}$"):
        split_model_infer(over)


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_input_whose_contents_are_taken_out_is_counted_too(where: str) -> None:
    """Its fields are walked to take its contents out: 70,000 unknown fields around them
    are refused as the count would have (walking them all is Python time on the loop)."""
    values = pb.InferTensorContents(fp32_contents=[1.0] * 400).SerializeToString()
    junk = bytes([9 << 3, 1]) * 70_000  # field 9, a varint: unknown to InferInputTensor
    item = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[400])
    inner = item.SerializeToString()
    contents = b"\x2a" + varint_bytes(len(values)) + values
    inner += junk + contents if where == "before" else contents + junk
    message = (pb.ModelInferRequest(model_name="m").SerializeToString()
               + b"\x2a" + varint_bytes(len(inner)) + inner)
    with pytest.raises(InvalidArgumentError, match=f"^ModelInferRequest {REFUSAL}$"):
        split_model_infer(memoryview(message))


def test_an_input_looked_into_for_its_contents_is_walked_in_steps() -> None:
    """30,000 unknown fields of one input around its contents (under the bound) are walked
    a step of fields at a time, as the message's own are (65,000 held the loop 20 ms)."""
    values = pb.InferTensorContents(fp32_contents=[1.0] * 400).SerializeToString()
    item = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[400])
    inner = (item.SerializeToString() + bytes([9 << 3, 1]) * 30_000
             + b"\x2a" + varint_bytes(len(values)) + values)
    head = pb.ModelInferRequest(model_name="m").SerializeToString() + b"\x2a" + \
        varint_bytes(len(inner))
    message = memoryview(head + inner)
    turns: list[int] = []
    field, (offset, length) = run_steps(split_contents_steps(
        message, len(head), len(message), PartsBudget("ModelInferRequest", 40_000)), turns)
    assert len(turns) == 30_003 // PARTS_A_STEP  # its name, datatype, shape, junk, contents
    assert bytes(message[offset:offset + length]) == values
    taken = pb.ModelInferRequest.FromString(field).inputs[0]  # its unknown fields kept
    assert (taken.name, taken.datatype, list(taken.shape), taken.HasField("contents")) == (
        "x", "FP32", [400], False)


@pytest.mark.parametrize("inputs, junk", [(1, 70_000), (4, 20_000)])
def test_fields_walked_in_taken_out_contents_spend_the_requests_count(inputs: int,
                                                                       junk: int) -> None:
    """Unknown fields beside the packed values are walked to find them: 70,000 in one
    input's contents, or 20,000 in each of four (each under the bound, together over), are
    refused as one message's parts (10 MB of them took 1.4 s to walk, and were served)."""
    values = pb.InferTensorContents(fp32_contents=[1.0] * 4).SerializeToString()
    contents = values + bytes([9 << 3, 1]) * junk
    message = pb.ModelInferRequest(model_name="m").SerializeToString()
    for index in range(inputs):
        item = pb.ModelInferRequest.InferInputTensor(name=f"x{index}", datatype="FP32",
                                                     shape=[4]).SerializeToString()
        item += b"\x2a" + varint_bytes(len(contents)) + contents
        message += b"\x2a" + varint_bytes(len(item)) + item
    received = bytearray(message)
    with pytest.raises(InvalidArgumentError, match=f"^ModelInferRequest {REFUSAL}$"):
        small, spans = split_model_infer(memoryview(received))
        decode_model_infer(small, CopyLedger(), message=received, spans=spans)


def test_any_request_message_is_counted_before_it_is_parsed() -> None:
    """A parameter is 4 parts (its entry, key, value and the value's field), the model's
    name one: MAX / 4 parameters are one part over, one fewer 3 under."""
    load = pb.RepositoryModelLoadRequest(model_name="m")
    for i in range(MAX_MESSAGE_PARTS // 4):
        load.parameters[f"p{i}"].string_param = "x"
    with pytest.raises(InvalidArgumentError, match=f"^RepositoryModelLoadRequest {REFUSAL}$"):
        _parsed(pb.RepositoryModelLoadRequest, load.SerializeToString())
    del load.parameters["p0"]
    turns: list[int] = []
    assert run_steps(parse_bounded_steps(pb.RepositoryModelLoadRequest,
                                         load.SerializeToString()), turns) == load
    assert len(turns) == (MAX_MESSAGE_PARTS - 3) // PARTS_A_STEP  # counted a step at a time
    with pytest.raises(InvalidArgumentError, match="^RepositoryModelLoadRequest is malformed"):
        _parsed(pb.RepositoryModelLoadRequest, b"\x0a\x05ab")


def _parsed(message_type: object, data: bytes) -> object:
    return run_through(parse_bounded_steps(message_type, data))


@pytest.mark.parametrize("outputs", [0, 3, 20_000])
def test_a_message_of_many_fields_is_split_a_step_of_fields_at_a_time(outputs: int) -> None:
    """Each field walked in Python costs 1-2.5 µs: 65,000 empty outputs held the loop for
    155 ms in one step. The top-level walk and the count yield after each PARTS_A_STEP
    fields (20,000 outputs: 20,003 fields, 40,006 parts counted); an ordinary request's
    few never do. Split in steps or straight through, the request is protobuf's."""
    message = _request(outputs=outputs)
    data = memoryview(message.SerializeToString())
    turns: list[int] = []
    request, spans = run_steps(split_model_infer_steps(data), turns)
    fields = outputs + 3  # the model's name, the input, its raw contents
    counted = fields + outputs + 3 if len(data) > 16 << 10 else 0  # nested: name, dtype, shape
    assert len(turns) == fields // PARTS_A_STEP + counted // PARTS_A_STEP
    without_raw = pb.ModelInferRequest()
    without_raw.CopyFrom(message)
    del without_raw.raw_input_contents[:]
    assert request == without_raw and split_model_infer(data)[0] == request
    assert [bytes(data[o:o + n]) for o, n in spans.raw] == [b"\0" * 4]


def test_a_request_of_many_tensors_is_decoded_a_step_of_them_at_a_time() -> None:
    """4,096 inputs and as many outputs held the loop for 19 ms in one step."""
    request = pb.ModelInferRequest(model_name="m")
    for i in range(1000):
        request.inputs.add(name=f"x{i}", datatype="INT32", shape=[1])
        request.raw_input_contents.append(i.to_bytes(4, "little"))
        request.outputs.add(name=f"y{i}")
    data = bytearray(request.SerializeToString())
    small, spans = split_model_infer(memoryview(data))
    turns: list[int] = []
    decoded = run_steps(decode_model_infer_steps(small, CopyLedger(), message=data,
                                                 spans=spans), turns)
    assert len(turns) == 2 * (999 // 256)
    assert [int(v.numpy()[0]) for v in decoded.inputs.values()] == list(range(1000))
    assert [o.name for o in decoded.outputs] == [f"y{i}" for i in range(1000)]


def test_an_input_shape_longer_than_64_dims_can_be_is_refused_unparsed() -> None:
    """Packed dims, at most 10 bytes each: 20 million of them parsed into 160 MB."""
    request = _request()
    request.parameters["pad"].string_param = "x" * (20 << 10)  # counted from 16 KiB
    request.inputs[0].shape.extend([1] * 641)
    with pytest.raises(InvalidArgumentError, match="^ModelInferRequest has an input shape of "
                                                   "642 bytes, more than 64 dims$"):
        split_model_infer(memoryview(request.SerializeToString()))
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend([2**62] * 64)  # 64 dims of 9 bytes: left to checked_shape
    split_model_infer(memoryview(request.SerializeToString()))


@settings(max_examples=200, deadline=None)
@given(fields=st.integers(0, 40), cuts=st.lists(st.integers(1, 400), max_size=8))
def test_looking_for_the_first_tensor_piece_by_piece_finds_what_a_whole_look_finds(
        fields: int, cuts: list[int]) -> None:
    request = _request(parameters=fields)
    message = memoryview(request.SerializeToString())
    at, offset = 0, None
    for end in sorted({min(c * 7, len(message)) for c in cuts} | {len(message)}):
        offset, at = scan_for_tensor(message[:end], at)
        assert offset == first_tensor_offset(message[:end])
        if offset is not None:
            break
    assert offset == split_model_infer(message)[1].raw[0][0]
