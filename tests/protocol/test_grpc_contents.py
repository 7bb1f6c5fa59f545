"""A gRPC input's typed contents read from their packed wire bytes make the array numpy made
of the repeated field, bit for bit; a value outside the datatype's range is refused. A large
input's contents, taken out of the request before protobuf parses it and read from the
client's own wire bytes, decode as protobuf's parse of the whole request would, in every form
protobuf accepts; malformed ones are refused naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import InvalidArgumentError, TensorgateError
from tensorgate.protocol.grpc_codec import (decode_model_infer, decode_model_infer_steps,
                                            first_tensor_offset, scan_for_tensor,
                                            split_model_infer)
from tensorgate.protocol.grpc_contents import CONTENTS_APART, contents_array
from tensorgate.protocol.protobuf_wire import varint_bytes
from tensorgate.tensor import CopyLedger
from tensorgate.tensor.dtypes import datatype
from tests.protocol.wire_bytes import field

INT32, INT64 = st.integers(-2**31, 2**31 - 1), st.integers(-2**63, 2**63 - 1)
UINT32, UINT64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
# datatype → (contents field, values of that field, as protobuf holds them)
CASES = {
    "BOOL": ("bool_contents", st.booleans()),
    "INT8": ("int_contents", st.integers(-128, 127)),
    "INT16": ("int_contents", st.integers(-2**15, 2**15 - 1)),
    "INT32": ("int_contents", INT32),
    "INT64": ("int64_contents", INT64),
    "UINT8": ("uint_contents", st.integers(0, 255)),
    "UINT16": ("uint_contents", st.integers(0, 2**16 - 1)),
    "UINT32": ("uint_contents", UINT32),
    "UINT64": ("uint64_contents", UINT64),
    "FP32": ("fp32_contents", st.floats(width=32)),
    "FP64": ("fp64_contents", st.floats()),
}


@settings(max_examples=400, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(CASES)), others=st.booleans())
def test_contents_read_from_their_wire_bytes_are_what_numpy_made(data: st.DataObject,
                                                                  name: str,
                                                                  others: bool) -> None:
    field, values = CASES[name]
    sent = data.draw(st.lists(values, max_size=300))
    contents = pb.InferTensorContents()
    getattr(contents, field).extend(sent)
    if others:  # other fields set too: only the datatype's is read
        for other, more in (("int64_contents", [1, -1]), ("fp32_contents", [2.5])):
            if other != field:
                getattr(contents, other).extend(more)
    dt = datatype(name)
    expected = np.array(getattr(contents, field), dtype=dt.numpy)
    got = contents_array(contents, field, dt, "x", (len(sent),))
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("name, field, value", [
    ("INT8", "int_contents", 128), ("INT8", "int_contents", -129),
    ("INT16", "int_contents", 2**15), ("UINT8", "uint_contents", 256),
    ("UINT16", "uint_contents", 2**16)])
def test_a_value_outside_the_datatype_is_refused(name: str, field: str, value: int) -> None:
    """numpy raised OverflowError here, which reached the client as an internal error."""
    contents = pb.InferTensorContents()
    getattr(contents, field).extend([0, value, 1])
    info = np.iinfo(datatype(name).numpy)
    with pytest.raises(InvalidArgumentError, match=rf"^input 'x': {name} holds \[{info.min}, "
                                                   rf"{info.max}\]; contents has {value}$"):
        contents_array(contents, field, datatype(name), "x", (3,))


def test_unknown_fields_a_client_sent_beside_the_contents_are_skipped() -> None:
    """protobuf keeps unknown fields and writes them again: one of each wire type (varint,
    64-bit, length-delimited, 32-bit) before and after the packed floats."""
    unknown = (bytes([9 << 3 | 0, 0x96, 0x01, 10 << 3 | 1]) + bytes(8)
               + bytes([11 << 3 | 2, 3]) + b"abc" + bytes([12 << 3 | 5]) + bytes(4))
    floats = pb.InferTensorContents(fp32_contents=[1.5, -2.5]).SerializeToString()
    contents = pb.InferTensorContents.FromString(unknown + floats + unknown)
    got = contents_array(contents, "fp32_contents", datatype("FP32"), "x", (2,))
    assert got.tolist() == [1.5, -2.5]


# --- contents taken out of a large input before protobuf parses the request ---------------

def _decoded(message: bytes) -> dict[str, np.ndarray]:
    """The inputs as the server decodes them: the message split, contents read from it."""
    small, spans = split_model_infer(memoryview(bytearray(message)))
    decoded = decode_model_infer(small, CopyLedger(), message=bytearray(message), spans=spans)
    return {name: view.numpy() for name, view in decoded.inputs.items()}


def _parsed(message: bytes) -> dict[str, np.ndarray]:
    """The inputs as protobuf's parse of the whole message gives them."""
    decoded = decode_model_infer(pb.ModelInferRequest.FromString(message), CopyLedger())
    return {name: view.numpy() for name, view in decoded.inputs.items()}


def _same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        assert got[name].tobytes() == array.tobytes(), name


@settings(max_examples=150, deadline=None)
@given(data=st.data(), names=st.lists(st.sampled_from(sorted(CASES)), min_size=1, max_size=3),
       tagged=st.booleans())
def test_contents_taken_out_of_large_inputs_decode_as_protobufs_parse(
        data: st.DataObject, names: list[str], tagged: bool) -> None:
    """Inputs of every numeric datatype, small and large (over CONTENTS_APART, taken out),
    with parameters around their contents: the same arrays as from protobuf's parse, and
    the request's other fields as they were."""
    request = pb.ModelInferRequest(model_name="m", id="r")
    request.parameters["p"].int64_param = 7
    for index, name in enumerate(names):
        field, values = CASES[name]
        size = data.draw(st.sampled_from([0, 3, 1500]))  # 1500: taken out, for any datatype
        sent = (data.draw(st.lists(values, min_size=1, max_size=20)) * size)[:size]
        item = request.inputs.add(name=f"in{index}", datatype=name)
        item.shape.extend([1, len(sent)])
        if tagged:
            item.parameters["tag"].string_param = "t" * index
        getattr(item.contents, field).extend(sent)
    request.outputs.add(name="out")
    message = request.SerializeToString()
    small, spans = split_model_infer(memoryview(bytearray(message)))
    large = [i for i, item in enumerate(request.inputs) if item.ByteSize() >= CONTENTS_APART]
    assert sorted(spans.contents or {}) == large
    event(f"taken out: {len(large)}")
    for index, item in enumerate(request.inputs):
        kept = pb.ModelInferRequest.InferInputTensor()
        kept.CopyFrom(item)
        if index in large:
            kept.ClearField("contents")
        assert small.inputs[index] == kept
    assert (small.parameters, small.outputs, small.id) == (request.parameters, request.outputs,
                                                           "r")
    _same(_decoded(message), _parsed(message))


def _input(contents: bytes, datatype_: str = "INT64", count: int = 3) -> bytes:
    """A request whose one input has these serialized contents, padded by a parameter so
    that they are taken out."""
    item = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype_, shape=[count])
    item.parameters["pad"].string_param = "p" * CONTENTS_APART
    tensor = item.SerializeToString() + field(5, contents)  # InferInputTensor.contents
    return pb.ModelInferRequest(model_name="m").SerializeToString() + field(5, tensor)


@pytest.mark.parametrize("contents, expected", [
    # int64_contents in two packed runs: protobuf joins them
    (field(3, varint_bytes(1) + varint_bytes(300)) + field(3, varint_bytes(2**63 - 1)), [1, 300, 2**63 - 1]),
    # elements sent unpacked, each with its own tag (protobuf reads these)
    (b"".join(bytes([3 << 3]) + varint_bytes(v) for v in (5, 6, 7)), [5, 6, 7]),
    # packed and unpacked in one field
    (field(3, varint_bytes(5)) + bytes([3 << 3]) + varint_bytes(6) + field(3, varint_bytes(7)), [5, 6, 7]),
    # unknown fields of each wire type around the packed run
    (bytes([9 << 3, 1, 10 << 3 | 1]) + bytes(8) + field(3, varint_bytes(1) + varint_bytes(2) +
     varint_bytes(3)) + bytes([12 << 3 | 5]) + bytes(4) + field(11, b"abc"), [1, 2, 3]),
])
def test_contents_on_the_wire_in_any_form_protobuf_reads(contents: bytes,
                                                         expected: list[int]) -> None:
    message = _input(contents)
    assert split_model_infer(memoryview(bytearray(message)))[1].contents is not None
    assert _decoded(message)["x"].tolist() == expected
    _same(_decoded(message), _parsed(message))


@pytest.mark.parametrize("contents, error", [
    (field(3, varint_bytes(1) + b"\x80"), "InferTensorContents is malformed: its last varint runs "
                                      "past the end of its field"),
    (field(3, varint_bytes(1) + b"\xff" * 10 + b"\x01" + varint_bytes(2)), "InferTensorContents is "
                                                                 "malformed: a varint is "
                                                                 "longer than 10 bytes"),
    (field(6, bytes(13)), "InferTensorContents is malformed: fp32_contents has 13 bytes, not "
                           "a whole number of 4-byte values"),
    (field(3, varint_bytes(1)) + bytes([3 << 3 | 2, 9, 1]), "InferTensorContents is malformed: "
                                                          "field 3 runs past the end of the "
                                                          "6-byte message"),
    (field(3, varint_bytes(1) + varint_bytes(2)), r"input 'x': contents has 2 elements; shape \[3\] "
                                         "needs 3"),
    (field(6, bytes(16)), r"input 'x': contents has 4 elements; shape \[3\] needs 3"),
])
def test_malformed_contents_are_refused_naming_what_is_wrong(contents: bytes,
                                                            error: str) -> None:
    datatype_ = "FP32" if contents[0] == 6 << 3 | 2 else "INT64"
    with pytest.raises(InvalidArgumentError, match=f"^{error}$"):
        _decoded(_input(contents, datatype_))


def test_varints_of_every_length_across_the_pieces_they_are_read_in() -> None:
    """Over 4 MiB of packed varints of 1 to 10 bytes (read a piece at a time, each piece
    ending where a varint does), shifted by 0 to 9 bytes so that a piece's end falls on every
    byte of a varint: what protobuf parses, element for element."""
    rng = np.random.default_rng(5)
    values = rng.integers(0, 2**63, 900_000, dtype=np.int64) >> rng.integers(0, 63, 900_000)
    values[::7] *= -1  # negative: ten bytes each
    packed = pb.InferTensorContents(int64_contents=values.tolist()).SerializeToString()
    assert packed[0] == 3 << 3 | 2 and len(packed) > 4 << 20
    run = packed[len(field(3, b"")) + len(varint_bytes(len(packed))) - 1:]  # the varints alone
    assert field(3, run) == packed
    for shift in range(10):
        got = _decoded(_input(field(3, bytes(shift) + run), count=shift + values.size))["x"]
        assert got.dtype == np.int64 and not got[:shift].any()
        assert got[shift:].tobytes() == values.tobytes(), shift


def test_fp32_contents_are_a_view_of_the_message_where_aligned_else_copied_once() -> None:
    """Packed FP32 is the tensor's bytes: read in place when they lie 4-byte aligned in the
    received message; otherwise, and when sent in two runs, copied once and counted."""
    values = np.arange(1000, dtype=np.float32)
    for runs in (1, 2):
        halves = [values] if runs == 1 else [values[:300], values[300:]]
        message = _input(b"".join(field(6, h.tobytes()) for h in halves), "FP32", 1000)
        payload = message.index(values.tobytes() if runs == 1 else values[:300].tobytes())
        storage = np.zeros(len(message) + 8, np.uint8)
        aligned = (-(storage.ctypes.data + payload)) % 4  # where the floats start 4-aligned
        for start in (aligned, aligned + 1):
            received = storage[start:start + len(message)]
            received[:] = np.frombuffer(message, np.uint8)
            small, spans = split_model_infer(memoryview(received))
            ledger = CopyLedger()
            got = decode_model_infer(small, ledger, message=received, spans=spans).inputs["x"]
            assert got.numpy().tobytes() == values.tobytes()
            in_place = runs == 1 and start == aligned
            assert np.shares_memory(got.numpy(), received) == in_place
            assert (ledger.bytes, ledger.calls) == ((0, 0) if in_place else (4000, 1))


def test_varint_contents_decode_in_steps_that_let_the_loop_turn() -> None:
    """3 million varints (3 MB) are decoded a piece at a time, a yield after each (the front
    end awaits a turn of the loop there); FP32 contents, a view, and raw tensors in none."""
    def yields(message: bytes) -> tuple[int, np.ndarray]:
        received = bytearray(message)
        small, spans = split_model_infer(memoryview(received))
        steps = decode_model_infer_steps(small, CopyLedger(), message=received, spans=spans)
        count = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return count, done.value.inputs["x"].numpy()
            count += 1

    count = 3_000_000
    found, array = yields(_input(field(3, bytes([5]) * count), count=count))
    assert found >= 3_000_000 // (512 << 10) and array.tolist() == [5] * count
    floats = np.arange(4000, dtype=np.float32)
    assert yields(_input(field(6, floats.tobytes()), "FP32", 4000))[0] == 0
    raw = pb.ModelInferRequest(model_name="m", raw_input_contents=[floats.tobytes()])
    raw.inputs.add(name="x", datatype="FP32", shape=[4000])
    assert yields(raw.SerializeToString())[0] == 0


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(1, 3000), max_size=10), padding=st.integers(0, 3000),
       raw=st.booleans())
def test_the_first_tensor_is_a_large_inputs_packed_values_found_piece_by_piece(
        cuts: list[int], padding: int, raw: bool) -> None:
    """The receiver aligns the first tensor: the values of the first input's typed contents
    when the input is large (taken out), found as soon as their header has arrived and the
    same however the message arrives; else the first raw_input_contents entry."""
    values = np.arange(600, dtype=np.float32)
    request = pb.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="x", datatype="FP32", shape=[600])
    item.parameters["pad"].string_param = "p" * padding
    if raw:
        request.raw_input_contents.append(values.tobytes())
    else:
        item.contents.fp32_contents.extend(values.tolist())
    message = memoryview(request.SerializeToString())
    expected = bytes(message).rindex(values.tobytes())
    at, offset = 0, None
    for end in sorted({min(c, len(message)) for c in cuts} | {len(message)}):
        offset, at = scan_for_tensor(message[:end], at)
        assert offset == first_tensor_offset(message[:end])
        assert offset in (None, expected)
        if offset is not None:
            assert end > (expected - 8 if raw else expected - 4)  # its header had arrived
            break
    assert offset == expected
    spans = split_model_infer(message)[1]
    assert (spans.raw[0][0] if raw else spans.contents[0][0] + 3) == expected  # tag, length


_VALID = {name: (lambda field=field, n=n: _contents_message(field, n))
          for name, (field, n) in {"INT64": ("int64_contents", 400),
                                   "FP32": ("fp32_contents", 400),
                                   "INT8": ("int_contents", 1200),
                                   "BOOL": ("bool_contents", 1200),
                                   "BYTES": ("bytes_contents", 300)}.items()}


def _contents_message(field: str, count: int) -> tuple[bytes, str]:
    datatype_ = {"int64_contents": "INT64", "fp32_contents": "FP32", "int_contents": "INT8",
                 "bool_contents": "BOOL", "bytes_contents": "BYTES"}[field]
    request = pb.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="x", datatype=datatype_, shape=[count])
    values = {"int64_contents": [-(i * 7919) for i in range(count)],
              "fp32_contents": [i / 3 for i in range(count)],
              "int_contents": [i % 200 - 100 for i in range(count)],
              "bool_contents": [i % 2 == 0 for i in range(count)],
              "bytes_contents": [b"s%d" % i for i in range(count)]}[field]
    getattr(item.contents, field).extend(values)
    return request.SerializeToString(), datatype_


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(_VALID)), data=st.data())
def test_hostile_bytes_in_taken_out_contents_decode_or_are_refused(name: str,
                                                                   data: st.DataObject) -> None:
    """A valid large-contents request with bytes overwritten, cut or inserted anywhere:
    decoded into an array of the shape the request gives, or refused with a TensorgateError;
    never another exception, never a read outside the message. Its first tensor, looked for
    as it arrives, is inside what has arrived or not known yet."""
    message = bytearray(_VALID[name]()[0])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(message) - 1))
        edit = data.draw(st.sampled_from(["set", "cut", "insert"]))
        if edit == "set":
            message[at] = data.draw(st.integers(0, 255))
        elif edit == "cut":
            del message[at:at + data.draw(st.integers(1, 16))]
        else:
            message[at:at] = data.draw(st.binary(min_size=1, max_size=12))
    for end in (len(message) // 3, len(message) // 2, len(message)):  # as the receiver asks
        try:
            offset = first_tensor_offset(memoryview(message)[:end])
        except TensorgateError:
            continue
        assert offset is None or 0 <= offset <= end
    try:
        small, spans = split_model_infer(memoryview(message))
        decoded = decode_model_infer(small, CopyLedger(), message=message, spans=spans)
    except TensorgateError:
        return
    for view in decoded.inputs.values():
        array = view.numpy()
        assert array.shape == view.shape and array.size == view.count


@settings(max_examples=100, deadline=None)
@given(strings=st.lists(st.binary(max_size=300), min_size=1, max_size=30),
       count=st.integers(1, 60), unknown=st.booleans())
def test_bytes_contents_taken_out_decode_as_protobufs_parse(strings: list[bytes], count: int,
                                                            unknown: bool) -> None:
    """A large input's bytes_contents are read a field at a time into the BYTES layout: the
    same strings as protobuf's parse gives, with unknown fields (a bytes_contents sent as a
    varint among them: protobuf keeps it as unknown) skipped."""
    values = [strings[i % len(strings)] for i in range(count)]
    contents = b"".join(field(8, value) for value in values)
    if unknown:
        contents = bytes([8 << 3, 5]) + contents + field(11, b"x") + bytes([9 << 3, 1])
    message = _input(contents, "BYTES", count)  # padded: taken out
    assert split_model_infer(memoryview(bytearray(message)))[1].contents is not None
    got, expected = _decoded(message), _parsed(message)
    assert got["x"].tolist() == expected["x"].tolist() == values


# lengths about where a string's length takes one, two and three bytes
_LENGTHS = st.integers(0, 130) | st.integers(16_380, 16_390)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(_LENGTHS, min_size=1, max_size=300),
       unknown=st.lists(st.integers(0, 299), max_size=3), padded=st.booleans())
def test_runs_of_bytes_contents_lay_out_as_protobufs_parse(lengths: list[int],
                                                          unknown: list[int],
                                                          padded: bool) -> None:
    """Runs of strings whose lengths take one or two bytes are found in a tight loop and,
    from 64 of them, laid out by numpy; a string of 16 KiB or more, an unknown field or a
    non-canonical length (two bytes for a short one) ends a run. Whatever the mix, the
    layout holds protobuf's strings."""
    values = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    pieces = [field(8, value) for value in values]
    if padded and values and len(values[0]) < 128:  # 0x80 0x00 is a length too
        pieces[0] = bytes([8 << 3 | 2, 0x80 | len(values[0]), 0x00]) + values[0]
    for at in sorted(set(unknown), reverse=True):
        pieces.insert(min(at, len(pieces)), bytes([9 << 3, 1]))  # field 9, a varint
    message = _input(b"".join(pieces), "BYTES", len(values))
    got, expected = _decoded(message), _parsed(message)
    assert got["x"].tolist() == expected["x"].tolist() == values


@pytest.mark.parametrize("count", [63, 64, 500])
@pytest.mark.parametrize("low, high, long_every", [
    (0, 40, 0), (0, 40, 40), (0, 128, 0), (120, 300, 0), (16_000, 16_384, 0)])
def test_a_run_of_strings_each_way_it_is_laid_out(count: int, low: int, high: int,
                                                  long_every: int) -> None:
    """Under 64 strings a run is laid out one string at a time, from 64 of 32 bytes or less
    on average by numpy: lengths of one byte, across one and two, and two (their high byte
    written too; by numpy, every 40th string of 300 bytes among short ones)."""
    values = [bytes([i % 251]) * (300 if long_every and i % long_every == 7 else
                                  low + i * 7919 % (high - low)) for i in range(count)]
    message = _input(b"".join(field(8, value) for value in values), "BYTES", count)
    assert _decoded(message)["x"].tolist() == values


def test_more_bytes_contents_than_protobufs_counted_parse_took_are_read() -> None:
    """100,000 strings: refused before as more than 65,536 parts; the shape bounds them now
    (a million at most in a request, infer_codec.MAX_BYTES_ELEMENTS)."""
    values = [b"ab"[:i % 3] for i in range(100_000)]
    message = _input(b"".join(field(8, value) for value in values), "BYTES", len(values))
    assert _decoded(message)["x"].tolist() == values


@pytest.mark.parametrize("sent, error", [
    (4, r"input 'x': contents has more than 3 elements; shape \[3\] needs 3"),
    (2, r"input 'x': contents has 2 elements; shape \[3\] needs 3"),
])
def test_bytes_contents_that_do_not_fill_the_shape_are_refused(sent: int, error: str) -> None:
    message = _input(b"".join(field(8, b"s%d" % i) for i in range(sent)), "BYTES", 3)
    with pytest.raises(InvalidArgumentError, match=f"^{error}$"):
        _decoded(message)


def test_unknown_fields_among_bytes_contents_spend_the_requests_count() -> None:
    contents = field(8, b"a") + bytes([9 << 3, 1]) * 70_000
    with pytest.raises(InvalidArgumentError, match="^ModelInferRequest holds more than 65,536 "
                                                   "fields"):
        _decoded(_input(contents, "BYTES", 1))


@pytest.mark.parametrize("size", [4, 1500], ids=["small", "taken-out"])
def test_typed_contents_beside_raw_input_contents_are_refused(size: int) -> None:
    """Data sent both ways leaves it open which is the input; Triton refuses it too ("contents
    field must not be specified when using raw_input_contents"). Each way the server reads
    the message, whole or with a large input's contents taken out. An empty `contents`
    message beside the raw bytes carries nothing and is read as the raw bytes."""
    request = pb.ModelInferRequest(model_name="m")
    for name in ("a", "b"):
        request.inputs.add(name=name, datatype="FP32", shape=[size])
        request.raw_input_contents.append(np.ones(size, np.float32).tobytes())
    request.inputs[1].contents.fp32_contents.extend([2.0] * size)
    message = request.SerializeToString()
    for decode in (_decoded, _parsed):
        with pytest.raises(InvalidArgumentError, match="input 'b' has typed contents and the "
                                                       "request has raw_input_contents"):
            decode(message)
    request.inputs[1].contents.ClearField("fp32_contents")
    request.inputs[1].contents.SetInParent()
    message = request.SerializeToString()
    assert request.inputs[1].HasField("contents")
    for decode in (_decoded, _parsed):
        assert decode(message)["b"].tolist() == [1.0] * size


@pytest.mark.parametrize("datatype, sent, right", [
    ("FP32", "fp64_contents", "fp32_contents"), ("INT32", "int64_contents", "int_contents"),
    ("UINT8", "int_contents", "uint_contents"), ("BOOL", "int_contents", "bool_contents"),
    ("INT64", "fp32_contents", "int64_contents"), ("BYTES", "fp32_contents", "bytes_contents"),
])
@pytest.mark.parametrize("size", [3, 1500], ids=["small", "taken-out"])
def test_values_in_another_datatypes_field_are_named(datatype: str, sent: str, right: str,
                                                     size: int) -> None:
    """FP32 values sent as fp64_contents: the error says where they go (it said "contents
    has 0 elements"; Triton names the wrong field too), however the message is read."""
    request = pb.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="x", datatype=datatype, shape=[size])
    getattr(item.contents, sent).extend([1] * size)
    message = request.SerializeToString()
    for decode in (_decoded, _parsed):
        with pytest.raises(InvalidArgumentError) as refused:
            decode(message)
        assert refused.value.message == (f"input 'x': its datatype's values go in {right}; "
                                         f"its contents has {sent} instead")
