"""A gRPC input's typed contents read from their packed wire bytes make the array numpy made
of the repeated field, bit for bit; a value outside the datatype's range is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.grpc_contents import contents_array
from tensorgate.tensor.dtypes import datatype

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
    got = contents_array(contents, field, dt, "x")
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
        contents_array(contents, field, datatype(name), "x")


def test_unknown_fields_a_client_sent_beside_the_contents_are_skipped() -> None:
    """protobuf keeps unknown fields and writes them again: one of each wire type (varint,
    64-bit, length-delimited, 32-bit) before and after the packed floats."""
    unknown = (bytes([9 << 3 | 0, 0x96, 0x01, 10 << 3 | 1]) + bytes(8)
               + bytes([11 << 3 | 2, 3]) + b"abc" + bytes([12 << 3 | 5]) + bytes(4))
    floats = pb.InferTensorContents(fp32_contents=[1.5, -2.5]).SerializeToString()
    contents = pb.InferTensorContents.FromString(unknown + floats + unknown)
    got = contents_array(contents, "fp32_contents", datatype("FP32"), "x")
    assert got.tolist() == [1.5, -2.5]
