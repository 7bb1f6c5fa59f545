"""BYTES tensors: the 4-byte little-endian length layout, both ways, with bounds checks."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.errors import BytesElementError
from tensorgate.tensor import CopyLedger, TensorView
from tensorgate.tensor.bytes_codec import (BYTES_CHECKED_WHEN_DECODED, bytes_pieces,
                                           check_bytes_tensor, decode_bytes_tensor)


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


@given(st.integers(0, 9), st.integers(64, 300), st.data())
def test_many_elements_of_one_length_decode_as_the_layout_says(length: int, count: int,
                                                                data: st.DataObject) -> None:
    """Where numpy cuts them out (64 elements and more, one length): the same bytes, and a
    layout one byte off anywhere is refused or decoded as the plain loop reads it."""
    items = [bytes([i % 256]) * length for i in range(count)]
    body = bytearray(b"HEAD" + _layout(items) + b"TAIL")
    ledger = CopyLedger()
    view = TensorView(body, "BYTES", [count], 4, nbytes=len(body) - 8, ledger=ledger)
    assert view.numpy().tolist() == items and ledger.bytes == length * count
    where = data.draw(st.integers(4, len(body) - 5))
    body[where] ^= data.draw(st.integers(1, 255))
    try:
        view = TensorView(body, "BYTES", [count], 4, nbytes=len(body) - 8)
    except BytesElementError:
        return
    decoded = view.numpy().tolist()
    assert len(decoded) == count and _layout(decoded) == bytes(body[4:-4])


@given(st.lists(st.binary(max_size=3), min_size=64, max_size=120), st.integers(0, 2))
def test_many_elements_of_mixed_lengths_decode_or_fail_cleanly(items: list[bytes],
                                                                extra: int) -> None:
    """The loop that cuts out elements of mixed lengths, on layouts with `extra` bytes too
    many: refused with _elements' own messages, or the same bytes."""
    body = _layout(items) + b"x" * extra
    try:
        view = TensorView(body, "BYTES", [len(items)], name="many")
    except BytesElementError as error:
        assert extra and str(error).startswith("BYTES tensor 'many': ")
        assert "bytes left over after the last of" in str(error)
        return
    assert not extra and view.numpy().tolist() == items


def _reference(body: bytes, count: int) -> list[bytes] | None:
    """The layout read one element at a time: the elements, or None if they do not fill
    `body` exactly."""
    items, at = [], 0
    for _ in range(count):
        if at + 4 > len(body):
            return None
        (size,) = struct.unpack_from("<I", body, at)
        if at + 4 + size > len(body):
            return None
        items.append(body[at + 4:at + 4 + size])
        at += 4 + size
    return items if at == len(body) else None


@given(st.lists(st.binary(max_size=3), min_size=60, max_size=90), st.integers(-8, 8),
       st.binary(max_size=6))
def test_decode_and_check_agree_with_a_plain_reading(items: list[bytes], shift: int,
                                                     tail: bytes) -> None:
    """decode_bytes_tensor and check_bytes_tensor called directly, on layouts given the
    wrong count or extra bytes: both refuse exactly what a plain reading refuses."""
    body = _layout(items) + tail
    count = max(len(items) + shift, 0)
    expected = _reference(body, count)
    memory = memoryview(body)
    for call in (lambda: check_bytes_tensor(memory, 0, len(body), count, "t"),
                 lambda: decode_bytes_tensor(memory, 0, len(body), [count], "t").tolist()):
        try:
            got = call()
        except BytesElementError:
            assert expected is None
            continue
        assert expected is not None and got in (None, expected)


def _mixed(count: int) -> bytearray:
    """`count` elements of 0, 1 and 2 bytes: the layout only a walk of it can check."""
    return bytearray(_layout([b"ab"[:i % 3] for i in range(count)]))


@pytest.mark.parametrize("fault", ["overrun", "left over", "short"])
def test_a_large_bytes_view_is_checked_when_decoded_with_the_same_error(fault: str) -> None:
    """From BYTES_CHECKED_WHEN_DECODED elements the view is made unchecked and numpy()
    (which the pipeline runs off the event loop) raises what the check would have; below
    it, and when the bytes cannot hold the count's length prefixes, the view is refused."""
    count = BYTES_CHECKED_WHEN_DECODED
    body = _mixed(count)
    if fault == "overrun":  # the last element claims more bytes than remain
        body[-4:] = struct.pack("<I", 9)  # (the last is empty: its prefix ends the body)
    elif fault == "left over":
        body += b"!"
    else:
        body = body[:4 * count - 1]
    with pytest.raises(BytesElementError) as checked:
        check_bytes_tensor(memoryview(body), 0, len(body), count, "t")
    if fault == "short":
        with pytest.raises(BytesElementError, match=re.escape(str(checked.value))):
            TensorView(body, "BYTES", [count], name="t")
        return
    view = TensorView(body, "BYTES", [count], name="t")
    with pytest.raises(BytesElementError, match=f"^{re.escape(str(checked.value))}$"):
        view.numpy()
    with pytest.raises(BytesElementError):  # one element fewer: checked when made
        TensorView(_mixed(count - 1) + b"!", "BYTES", [count - 1], name="t")


def test_a_large_bytes_view_decodes_what_was_sent() -> None:
    count = BYTES_CHECKED_WHEN_DECODED + 5
    view = TensorView(_mixed(count), "BYTES", [count], name="t")
    assert view.numpy().tolist() == [b"ab"[:i % 3] for i in range(count)]


@given(st.binary(max_size=120), st.integers(0, 12), st.integers(1, 5))
def test_pieces_are_the_decode_cut_up_or_its_error(body: bytes, count: int, step: int) -> None:
    """bytes_pieces (a large answer written a piece at a time): the decode's elements in
    pieces of `step`, or, for any bytes that do not hold `count` elements exactly, the
    error the check gives."""
    memory = memoryview(body)
    try:
        check_bytes_tensor(memory, 0, len(body), count, "t")
    except BytesElementError as error:
        with pytest.raises(BytesElementError, match=f"^{re.escape(str(error))}$"):
            list(bytes_pieces(memory, 0, len(body), count, step, "t"))
        return
    pieces = list(bytes_pieces(memory, 0, len(body), count, step, "t"))
    assert all(len(piece) == step for piece in pieces[:-1])
    assert [item for piece in pieces for item in piece] == \
        decode_bytes_tensor(memory, 0, len(body), [count], "t").tolist()
