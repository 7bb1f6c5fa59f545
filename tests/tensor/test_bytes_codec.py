"""BYTES tensors: the 4-byte little-endian length layout, both ways, with bounds checks."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.errors import BytesElementError
from tensorgate.tensor import CopyLedger, TensorView


def _layout(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


@given(st.lists(st.binary(max_size=40), max_size=12))
def test_decode_matches_the_layout(items: list[bytes]) -> None:
    ledger = CopyLedger()
    body = b"HEADER" + _layout(items) + b"TAIL"
    view = TensorView(body, "BYTES", [len(items)], 6, nbytes=len(body) - 10, ledger=ledger)
    decoded = view.numpy()
    assert decoded.dtype == object and decoded.tolist() == items
    assert ledger.bytes == sum(map(len, items))


@given(st.lists(st.binary(max_size=40), min_size=6, max_size=6))
def test_encode_round_trip_keeps_shape(items: list[bytes]) -> None:
    array = np.array(items, dtype=object).reshape(2, 3)
    view = TensorView.from_numpy(array)
    assert view.datatype.name == "BYTES" and view.shape == (2, 3)
    assert view.memoryview().tobytes() == _layout(items)
    assert view.numpy().tolist() == array.tolist()


def test_encode_strings_and_numpy_string_dtypes() -> None:
    assert TensorView.from_numpy(np.array(["héllo", "x"])).memoryview().tobytes() == \
        _layout(["héllo".encode(), b"x"])
    assert TensorView.from_numpy(np.array([b"ab", b"c"], dtype="S2")).numpy().tolist() == \
        [b"ab", b"c"]
    assert TensorView.from_numpy(np.array([7, "s"], dtype=object)).numpy().tolist() == \
        [b"7", b"s"]


@given(st.binary(max_size=200), st.integers(0, 6))
def test_random_bytes_decode_or_fail_cleanly(body: bytes, count: int) -> None:
    try:
        view = TensorView(body, "BYTES", [count], name="fuzz")
    except BytesElementError as error:
        assert str(error).startswith("BYTES tensor 'fuzz': ")
        return
    decoded = view.numpy()
    assert len(decoded) == count
    assert sum(len(item) + 4 for item in decoded) == len(body)
