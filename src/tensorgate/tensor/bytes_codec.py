"""The protocol's BYTES layout: each element is a 4-byte little-endian length, then its bytes.

Decoding checks every length against the bytes that remain, so no element can read past the
tensor; the elements become `bytes` objects (a copy, counted). Encoding writes one buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from tensorgate.errors import BytesElementError
from tensorgate.tensor.buffer import HostBuffer
from tensorgate.tensor.copies import CopyLedger, record_copy

__all__ = ["BYTES_CHECKED_WHEN_DECODED", "bytes_pieces", "check_bytes_tensor",
           "decode_bytes_tensor", "encode_bytes_tensor", "write_bytes_items"]

# BYTES tensors of this many elements or more are checked when decoded, not when a view of
# them is made (tensor/view.py): decoding checks them anyway, and is done off the event loop
# (pipeline/requests.py strings_aside).
BYTES_CHECKED_WHEN_DECODED = 1 << 16
_PREFIX = struct.Struct("<I")
_VECTOR_COUNT = 64  # elements from which one length for all is looked for with numpy


def _elements(memory: memoryview, offset: int, nbytes: int, count: int,
              tensor: str) -> Iterator[tuple[int, int]]:
    """(start, length) of each element, every one checked to end inside [offset, offset+nbytes)."""
    position = offset
    end = offset + nbytes
    for index in range(count):
        if position + 4 > end:
            raise BytesElementError(
                tensor, f"element {index} of {count}: its 4-byte length prefix at byte "
                        f"{position - offset} runs past the end of the {nbytes}-byte tensor")
        (length,) = _PREFIX.unpack_from(memory, position)
        position += 4
        if position + length > end:
            raise BytesElementError(
                tensor, f"element {index} of {count} declares {length} bytes at byte "
                        f"{position - offset}, but only {end - position} remain")
        yield position, length
        position += length
    if position != end:
        raise BytesElementError(
            tensor, f"{end - position} bytes left over after the last of {count} elements")


def _same_length(memory: memoryview, offset: int, nbytes: int, count: int) -> int | None:
    """The length of every element when all `count` have one length and fill the `nbytes`
    exactly (checked with numpy, ~9 ms a million elements), else None."""
    if count < _VECTOR_COUNT or nbytes % count:
        return None
    step = nbytes // count
    if step < 4:
        return None
    rows = np.frombuffer(memory, np.uint8, nbytes, offset).reshape(count, step)
    lengths = rows[:, :4].view("<u4").reshape(count)  # a view: each row's first 4 bytes
    length = int(lengths[0])
    return length if length == step - 4 and bool((lengths == length).all()) else None


def _fits(memory: memoryview, offset: int, nbytes: int, count: int) -> bool:
    """Whether exactly `count` elements fill the `nbytes` at `offset` (_elements without
    its messages: a third of its time)."""
    position, end = offset, offset + nbytes
    unpack = _PREFIX.unpack_from
    for _ in range(count):
        if position + 4 > end:
            return False
        position += 4 + unpack(memory, position)[0]
    return position == end


def check_bytes_tensor(memory: memoryview, offset: int, nbytes: int, count: int,
                       tensor: str) -> None:
    """Raise BytesElementError unless exactly `count` elements fill the `nbytes` at `offset`."""
    if _same_length(memory, offset, nbytes, count) is None and \
            not _fits(memory, offset, nbytes, count):
        for _ in _elements(memory, offset, nbytes, count, tensor):  # says what is wrong
            pass


def decode_bytes_tensor(memory: memoryview, offset: int, nbytes: int, shape: Sequence[int],
                        tensor: str, ledger: CopyLedger | None = None) -> np.ndarray:
    """An object array of `bytes` with `shape`, decoded from the BYTES layout. Elements of
    one length are cut out by numpy (30 ms a million); others are copied out one by one in a
    loop that only checks where it ends (0.2 µs an element, against 0.6 with each checked
    on the way)."""
    count = 1
    for dim in shape:
        count *= dim
    out = np.empty(count, dtype=object)
    length = _same_length(memory, offset, nbytes, count)
    if length is not None:
        rows = np.frombuffer(memory, np.uint8, nbytes, offset).reshape(count, length + 4)
        out[:] = rows[:, 4:].view(f"V{length}").reshape(count).tolist() if length \
            else [b""] * count  # (void items are bytes)
        record_copy(nbytes - 4 * count, "decode", ledger)
        return out.reshape(shape)
    items: list[bytes] = []
    append, unpack = items.append, _PREFIX.unpack_from
    position, end = offset, offset + nbytes
    try:
        for _ in range(count):
            (size,) = unpack(memory, position)
            position += 4
            append(memory[position:position + size].tobytes())  # past `end`: caught below
            position += size
    except struct.error:
        position = -1  # a length prefix past the buffer
    if position != end:  # positions only grow: an element past the end leaves them past it
        items = [memory[start:start + size].tobytes()  # raises, saying what is wrong
                 for start, size in _elements(memory, offset, nbytes, count, tensor)]
    out[:] = items
    record_copy(nbytes - 4 * count, "decode", ledger)
    return out.reshape(shape)


def bytes_pieces(memory: memoryview, offset: int, nbytes: int, count: int, step: int,
                 tensor: str) -> Iterator[list[bytes]]:
    """The `count` elements of the BYTES layout at `offset`, `step` at a time, as bytes:
    for writing a large tensor a piece at a time (json_answers). Each element is checked to
    end inside the `nbytes`, and so is the last; on a fault check_bytes_tensor says what is
    wrong."""
    position, end = offset, offset + nbytes
    unpack = _PREFIX.unpack_from
    done = 0
    while done < count:
        piece: list[bytes] = []
        append = piece.append
        for _ in range(min(step, count - done)):
            if position + 4 > end:
                break
            (size,) = unpack(memory, position)
            position += 4
            if position + size > end:
                break
            append(memory[position:position + size].tobytes())
            position += size
        else:
            done += len(piece)
            yield piece
            continue
        break
    if done != count or position != end:
        check_bytes_tensor(memory, offset, nbytes, count, tensor)  # raises, saying why


def _element_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    return str(item).encode("utf-8")


def encode_bytes_tensor(array: np.ndarray,
                        acquire: Callable[[int], HostBuffer]) -> tuple[HostBuffer, int]:
    """Write `array`'s elements (bytes, str or other → str) in the BYTES layout.

    `acquire(n)` supplies the buffer. Returns it and the bytes written; the caller counts them.
    """
    items = [_element_bytes(item) for item in array.reshape(-1).tolist()]
    nbytes = 4 * len(items) + sum(len(item) for item in items)
    buffer = acquire(nbytes)
    write_bytes_items(items, memoryview(buffer).cast("B"), 0)
    return buffer, nbytes


def write_bytes_items(items: Sequence[bytes], memory: memoryview, position: int) -> int:
    """Write `items` in the BYTES layout into `memory` from `position`; where they end.
    Raises struct.error or ValueError when they do not fit, part written."""
    for item in items:
        _PREFIX.pack_into(memory, position, len(item))
        position += 4
        memory[position:position + len(item)] = item
        position += len(item)
    return position
