"""Bad views fail with errors that name the tensor, the expectation and the finding."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgate.errors import (BufferBoundsError, BytesElementError, DatatypeError,
                               InvalidArgumentError, ShapeError)
from tensorgate.tensor import TensorView


def test_shape_and_byte_size_must_agree() -> None:
    with pytest.raises(ShapeError, match=r"^tensor 'INPUT__0' with shape \[2,3\]: FP32 needs 24 "
                                         r"bytes \(6 elements of 4\), found 20$"):
        TensorView(bytes(32), "FP32", [2, 3], nbytes=20, name="INPUT__0")


def test_view_past_the_end() -> None:
    with pytest.raises(BufferBoundsError, match=r"^tensor 'x': 24 bytes at offset 10 run past the "
                                                r"end of its 32-byte buffer \(they end at byte "
                                                r"34\)$"):
        TensorView(bytes(32), "FP32", [6], 10, name="x")


@pytest.mark.parametrize("shape, problem", [
    ([2, -1], r"dim -1 is negative"),
    ([2, 1.5], r"dim 1.5 is not an integer"),
    ([True], r"dim True is not an integer"),
    ([2**63], r"dim 9223372036854775808 exceeds the int64 range"),
    ([2**40, 2**40], r"the dims multiply to 1208925819614629174706176, past what 8-byte "
                     r"elements can address in the int64 range"),
    ([0, 2**31, 2**31], r"the dims multiply to 4611686018427387904, past what 8-byte "
                        r"elements can address in the int64 range"),
])
def test_bad_dims(shape: list, problem: str) -> None:
    with pytest.raises(ShapeError, match=rf"^tensor 'x' with shape .*: {problem}$"):
        TensorView(bytes(8), "FP32", shape, name="x")


def test_absurd_but_representable_dims_do_not_reach_numpy() -> None:
    with pytest.raises(BufferBoundsError):
        TensorView(bytes(8), "FP64", [2**28, 2**28], name="x")


def test_too_many_dims() -> None:
    with pytest.raises(ShapeError, match=r"65 dims; at most 64 are allowed$"):
        TensorView(bytes(8), "UINT8", [1] * 65)


def test_negative_offset() -> None:
    with pytest.raises(BufferBoundsError):
        TensorView(bytes(8), "UINT8", [1], -1)


def test_unknown_datatype_and_missing_library_dtype() -> None:
    with pytest.raises(DatatypeError, match=r"^tensor 'y': unknown datatype 'F32'"):
        TensorView(bytes(8), "F32", [2], name="y")
    with pytest.raises(DatatypeError, match=r"^tensor 'y': numpy has no dtype for datatype "
                                            r"\(use \.torch\(\) for it\) 'BF16'$"):
        TensorView(bytes(8), "BF16", [4], name="y").numpy()
    with pytest.raises(DatatypeError, match=r"torch has no dtype for datatype"):
        TensorView(b"\x01\x00\x00\x00a", "BYTES", [1], name="y").torch()


def test_bytes_element_past_the_end() -> None:
    body = (3).to_bytes(4, "little") + b"abc" + (100).to_bytes(4, "little") + b"xy"
    with pytest.raises(BytesElementError, match=r"^BYTES tensor 's': element 1 of 2 declares 100 "
                                                r"bytes at byte 11, but only 2 remain$"):
        TensorView(body, "BYTES", [2], name="s")


def test_bytes_prefix_past_the_end_and_left_over_bytes() -> None:
    with pytest.raises(BytesElementError, match=r"element 1 of 2: its 4-byte length prefix"):
        TensorView(b"\x01\x00\x00\x00a\x00\x00", "BYTES", [2])
    with pytest.raises(BytesElementError, match=r"3 bytes left over after the last of 1 elements"):
        TensorView(b"\x01\x00\x00\x00abcd", "BYTES", [1])


def test_not_a_buffer() -> None:
    with pytest.raises(TypeError, match=r"a list does not expose the buffer protocol"):
        TensorView([1, 2, 3], "UINT8", [3])


def test_all_bad_input_is_invalid_argument() -> None:
    for cls in (ShapeError, BufferBoundsError, BytesElementError, DatatypeError):
        assert issubclass(cls, InvalidArgumentError)


def test_bytearray_owner_cannot_be_resized_under_a_view() -> None:
    body = bytearray(16)
    array = TensorView(body, "INT32", [4]).numpy()
    with pytest.raises(BufferError):
        body.extend(b"more")
    del array
    body.extend(b"more")  # every view is gone: the owner is free again
    assert len(body) == 20
    assert np.frombuffer(body, np.uint8).size == 20
