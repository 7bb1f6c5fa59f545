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

__all__ = ["check_bytes_tensor", "decode_bytes_tensor", "encode_bytes_tensor"]

_PREFIX = struct.Struct("<I")


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


def check_bytes_tensor(memory: memoryview, offset: int, nbytes: int, count: int,
                       tensor: str) -> None:
    """Raise BytesElementError unless exactly `count` elements fill the `nbytes` at `offset`."""
    for _ in _elements(memory, offset, nbytes, count, tensor):
        pass


def decode_bytes_tensor(memory: memoryview, offset: int, nbytes: int, shape: Sequence[int],
                        tensor: str, ledger: CopyLedger | None = None) -> np.ndarray:
    """An object array of `bytes` with `shape`, decoded from the BYTES layout."""
    count = 1
    for dim in shape:
        count *= dim
    out = np.empty(count, dtype=object)
    copied = 0
    for index, (start, length) in enumerate(_elements(memory, offset, nbytes, count, tensor)):
        out[index] = bytes(memory[start:start + length])
        copied += length
    record_copy(copied, "decode", ledger)
    return out.reshape(shape)


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
    memory = memoryview(buffer).cast("B")
    position = 0
    for item in items:
        _PREFIX.pack_into(memory, position, len(item))
        position += 4
        memory[position:position + len(item)] = item
        position += len(item)
    return buffer, nbytes
