"""A binary request's JSON header is decoded once and looked up by its bytes afterwards
(infer_codec._kept_headers): every request made that way must be the request a fresh decode
makes, over its own body; headers that cannot be made again from their bytes are not kept."""

from __future__ import annotations

import json
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tensorgate.errors import TensorgateError
from tensorgate.protocol import infer_codec
from tensorgate.protocol.infer_codec import DecodedRequest, decode_infer_body
from tensorgate.tensor import CopyLedger


@pytest.fixture(autouse=True)
def _nothing_kept() -> None:
    infer_codec._kept_headers.clear()


def _body(header: dict[str, Any], tensors: bytes) -> tuple[bytearray, int]:
    head = json.dumps(header).encode()
    return bytearray(head + tensors), len(head)


def _fields(decoded: DecodedRequest) -> tuple[Any, ...]:
    # the bytes, not their values: random bytes read as floats hold NaNs, never equal
    inputs = {name: (v.datatype.name, v.shape, v.offset, v.nbytes,
                     v.numpy().tolist() if v.datatype.is_bytes else v.numpy().tobytes())
              for name, v in decoded.inputs.items()}
    return (decoded.id, inputs, decoded.outputs, decoded.binary_default, decoded.timeout_us,
            decoded.parameters, decoded.priority, decoded.sequence)


def _header(**parameters: Any) -> dict[str, Any]:
    return {"id": "r", "parameters": parameters,
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                        "parameters": {"binary_data_size": 24}},
                       {"name": "y", "datatype": "INT8", "shape": [4],
                        "parameters": {"binary_data_size": 4}}],
            "outputs": [{"name": "z", "parameters": {"binary_data": True}}]}


def test_a_kept_header_views_each_request_s_own_body() -> None:
    first, length = _body(_header(), np.arange(6, dtype=np.float32).tobytes() + b"\x01" * 4)
    second, _ = _body(_header(), np.full(6, 7, np.float32).tobytes() + b"\x02" * 4)
    a = decode_infer_body(first, len(first), length, CopyLedger())
    assert len(infer_codec._kept_headers) == 1
    b = decode_infer_body(second, len(second), length, CopyLedger())
    assert b.inputs["x"].numpy().tolist() == [[7.0] * 3] * 2
    assert b.inputs["y"].numpy().tolist() == [2] * 4
    assert a.inputs["x"].numpy().ravel().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    # each request has its own parameters and outputs: a change to one is not the next's
    b.parameters["changed"] = True
    b.outputs.append(b.outputs[0])
    c = decode_infer_body(second, len(second), length, CopyLedger())
    assert c.parameters == {} and len(c.outputs) == 1


def test_a_kept_header_holds_no_body() -> None:
    """A kept header that held its first request's views would hold that body's pooled
    buffer as long as it is kept (a 12 MB one stayed in use: tests/e2e/test_http_client)."""
    raw, length = _body(_header(), bytes(28))
    body = np.frombuffer(raw, np.uint8).copy()  # an owner a weak reference can watch
    gone = weakref.ref(body)
    decoded = decode_infer_body(body, len(body), length, CopyLedger())
    assert infer_codec._kept_headers and decoded.inputs["x"].nbytes == 24
    del decoded, body
    assert gone() is None


def test_a_kept_header_over_a_body_of_another_length_is_decoded_and_refused_afresh() -> None:
    body, length = _body(_header(), bytes(28))
    decode_infer_body(body, len(body), length, CopyLedger())
    longer = body + b"\0"
    with pytest.raises(TensorgateError, match="1 bytes after the last binary input"):
        decode_infer_body(longer, len(longer), length, CopyLedger())


@pytest.mark.parametrize("header", [
    # JSON data: its arrays are the request's own
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]},
    # shared memory, for an input or an output: a region's registration may change
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                 "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]},
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                 "parameters": {"binary_data_size": 8}}],
     "outputs": [{"name": "z", "parameters": {"shared_memory_region": "r",
                                              "shared_memory_byte_size": 8}}]},
])
def test_headers_that_are_not_theirs_alone_are_not_kept(header: dict[str, Any]) -> None:
    body, length = _body(header, bytes(8) if "data" not in header["inputs"][0] else b"")
    try:
        decode_infer_body(body, len(body), length, CopyLedger())
    except TensorgateError:
        pass  # (no shared memory registry here: refused, and still not kept)
    assert not infer_codec._kept_headers


def test_what_is_kept_is_bounded() -> None:
    for n in range(3 * infer_codec._KEPT_HEADERS):
        body, length = _body({"id": str(n), **_header()}, bytes(28))
        decode_infer_body(body, len(body), length, CopyLedger())
        assert len(infer_codec._kept_headers) <= infer_codec._KEPT_HEADERS
    body, length = _body({**_header(), "pad": "x" * infer_codec._KEPT_HEADER_BYTES}, bytes(28))
    decode_infer_body(body, len(body), length, CopyLedger())
    assert bytes(body[:length]) not in infer_codec._kept_headers


ITEMSIZE = {"FP32": 4, "INT64": 8, "UINT8": 1, "BOOL": 1}


@settings(max_examples=300, deadline=None)
@given(inputs=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                                 st.sampled_from(["FP32", "INT64", "UINT8", "BOOL", "BYTES"]),
                                 st.lists(st.integers(0, 3), max_size=3),
                                 st.none() | st.integers(-1, 40)), max_size=3),
       parameters=st.fixed_dictionaries({}, optional={
           "priority": st.integers(-1, 3), "timeout": st.integers(-1, 10**6),
           "sequence_id": st.integers(0, 5), "sequence_start": st.booleans(),
           "binary_data_output": st.booleans() | st.none()}),
       extra=st.none() | st.integers(-3, 3),
       seeds=st.lists(st.integers(0, 255), min_size=2, max_size=3))
@example(inputs=[("a", "FP32", [3, 3], None)], parameters={}, extra=None,
         seeds=[0, 168])  # seed 168's bytes hold a NaN
def test_a_kept_header_makes_what_a_fresh_decode_makes(inputs: list, parameters: dict,
                                                        extra: int | None,
                                                        seeds: list[int]) -> None:
    """Bodies of one length after one header: from the second on, a kept header (if the
    first was valid) makes the request, and it must be what decoding afresh makes. Sizes
    are mostly right (None: the shape's), so that most headers are valid and kept."""
    tensors = []
    for name, kind, shape, size in inputs:
        if size is None:
            size = int(np.prod(shape)) * ITEMSIZE.get(kind, 1)
        tensors.append({"name": name, "datatype": kind, "shape": shape,
                        "parameters": {"binary_data_size": size}})
    header = {"parameters": parameters, "inputs": tensors}
    length = max(sum(t["parameters"]["binary_data_size"] for t in tensors) + (extra or 0), 0)
    for seed in seeds:
        body, json_length = _body(header, np.random.default_rng(seed).bytes(length))
        made = _outcome(body, json_length)
        kept = dict(infer_codec._kept_headers)
        infer_codec._kept_headers.clear()
        assert made == _outcome(body, json_length)
        infer_codec._kept_headers.clear()
        infer_codec._kept_headers.update(kept)


def _outcome(body: bytearray, json_length: int) -> Any:
    try:
        return _fields(decode_infer_body(body, len(body), json_length, CopyLedger()))
    except TensorgateError as error:
        return error.message
