"""A gRPC input's typed `contents` (InferTensorContents) as a numpy array, read from its
packed wire bytes rather than element by element.

Clients that do not use raw_input_contents (KServe's SDK, hand-written ones) send tensors
here. numpy made an array of protobuf's repeated field at ~30 ns an element, one Python
object each, on the event loop. Read from the wire instead, a packed FP32 or FP64 field is
the tensor's little-endian bytes (a view of the received message), and a varint field
decodes with a few numpy passes a piece. `split_contents_steps` takes a large input's
contents out of the message before protobuf parses it, so that protobuf neither copies them
nor unpacks varints into 8 bytes each (60 million one-byte varints: 0.7 s and 480 MB in
upb, then as long again to serialize them for reading); only numeric contents protobuf
itself would have to merge (an element sent unpacked) are still parsed by it. BYTES
contents are read in runs of short strings, in steps, up to the shape's count. What the
array holds is what numpy made of the field, except that a value outside the datatype's
range is refused (numpy raised OverflowError: an internal error).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.protobuf_wire import (LENGTH_DELIMITED, PARTS_A_STEP, PartsBudget,
                                               fields, varint_bytes, whole_fields)
from tensorgate.protocol.steps import run_through
from tensorgate.tensor.dtypes import DataType

__all__ = ["CONTENTS_APART", "check_count", "contents_array", "contents_values_offset",
           "split_contents_steps", "wire_contents_steps", "wire_strings_steps"]

# field name → (field number, how its packed bytes read: a numpy dtype, or "varint")
_FIELDS = {"bool_contents": (1, "varint"), "int_contents": (2, "varint"),
           "int64_contents": (3, "varint"), "uint_contents": (4, "varint"),
           "uint64_contents": (5, "varint"), "fp32_contents": (6, "<f4"),
           "fp64_contents": (7, "<f8")}
_SIGNED = frozenset({"int_contents", "int64_contents"})  # two's complement in 64 bits
_CONTENTS = "InferTensorContents"
_CONTENTS_FIELD = 5  # InferInputTensor.contents
# Inputs at least this long are looked into for their contents: an input without them
# (name, datatype, shape, a few parameters) is well under it, so tritonclient's requests,
# whose tensors are in raw_input_contents, are not walked twice.
CONTENTS_APART = 1024
# An input's fields looked through for its contents while its message arrives: name,
# datatype, shape and a few parameters come before them.
_FIELDS_BEFORE = 64
# Packed varints decoded this many bytes at a time, a yield after each (~1-4 ms): the loop
# serves others between pieces, and the index arrays stay a few MB.
_PIECE = 512 << 10
_COUNTED = 4 << 20  # packed varint bytes counted between two yields (~1 ms)
_BYTES_FIELD = 8  # InferTensorContents.bytes_contents: one field an element
_LENGTH = struct.Struct("<I")  # a BYTES element's length in the tensor layout
_STRINGS_A_STEP = 8192  # bytes_contents elements read between two yields (~4 ms)


def split_contents_steps(message: memoryview, start: int, stop: int, budget: PartsBudget
                         ) -> Generator[None, None, tuple[bytes, tuple[int, int]] | None]:
    """For the InferInputTensor in message[start:stop], that input's field again without its
    contents (tag, length, other fields) and the contents' (offset, length) in `message`;
    None when it has no contents, or more than one to merge, or is malformed (protobuf then
    parses it whole, and says what is wrong). Each field walked spends one of `budget`; a
    yield after each PARTS_A_STEP (65,000 parameters of one input held the loop 20 ms)."""
    found = None
    at = start
    walked = 0
    for number, kind, value_start, value_stop, complete in fields(message, stop, start,
                                                                 "InferInputTensor"):
        budget.spend()
        walked += 1
        if not walked % PARTS_A_STEP:
            yield
        if not complete:
            return None
        if number == _CONTENTS_FIELD:
            if kind != LENGTH_DELIMITED or found is not None:
                return None
            found = at, value_start, value_stop
        at = value_stop
    if found is None or at != stop:
        return None
    field_start, value_start, value_stop = found
    rest = (field_start - start) + (stop - value_stop)
    head = b"\x2a" + varint_bytes(rest)  # ModelInferRequest.inputs: field 5, length-delimited
    return (head + message[start:field_start] + message[value_stop:stop],
            (value_start, value_stop - value_start))


def contents_values_offset(head: memoryview, start: int, stop: int) -> int | None:
    """Where the values of the typed contents start, in the InferInputTensor in
    head[start:stop] (`head`: the part of a message that has arrived): the first
    length-delimited field of its contents (a packed run, as protobuf writes them); None if
    that is not known yet, or the contents start otherwise, or it has none, or more than
    _FIELDS_BEFORE fields come before them (the receiver asks again after each 512 bytes)."""
    end = min(stop, len(head))
    for walked, (number, kind, value_start, value_stop, complete) in enumerate(
            fields(head, end, start, "InferInputTensor")):
        if number == _CONTENTS_FIELD and kind == LENGTH_DELIMITED:
            for _, inner, values_start, _, _ in fields(head, min(value_stop, end), value_start,
                                                       _CONTENTS):
                return values_start if inner == LENGTH_DELIMITED else None
            return None
        if not complete or walked == _FIELDS_BEFORE:
            return None
    return None


def contents_array(contents: Any, field: str, dt: DataType, tensor: str,
                   shape: tuple[int, ...]) -> np.ndarray:
    """The array of parsed `contents`' numeric `field` as `dt`'s dtype, in `shape`."""
    data = memoryview(contents.SerializeToString())
    array = run_through(wire_contents_steps(data, field, dt, tensor, shape,
                                            PartsBudget(_CONTENTS)))
    assert array is not None  # protobuf writes each repeated field packed, in one run
    return array[0]


def wire_contents_steps(data: memoryview, field: str, dt: DataType, tensor: str,
                        shape: tuple[int, ...], budget: PartsBudget
                        ) -> Generator[None, None, tuple[np.ndarray, bool] | None]:
    """The array of the serialized contents `data`'s numeric `field` as `dt`'s dtype, in
    `shape`, and whether it was copied (False: a view of `data`); None when an element of
    the field was sent unpacked (protobuf parses those). Each of its fields walked spends one
    of `budget` (unknown ones a client sent: 10 MB of them took 1.4 s to walk, unbounded).
    Varints are decoded a piece at a time, with a yield after each (protocol.steps)."""
    number, kind = _FIELDS[field]
    runs = _packed_runs(data, number, budget)
    if runs is None:
        return None
    count = math.prod(shape)
    packed: Any = runs[0] if len(runs) == 1 else b"".join(runs)
    if kind != "varint":
        itemsize = np.dtype(kind).itemsize
        if len(packed) % itemsize:
            raise InvalidArgumentError(f"{_CONTENTS} is malformed: {field} has {len(packed)} "
                                       f"bytes, not a whole number of {itemsize}-byte values")
        check_count(len(packed) // itemsize, tensor, shape, field,
                    lambda: other_fields(data, number))
        flat = np.frombuffer(packed, kind)
        array = flat.astype(dt.numpy, copy=False)
        return array.reshape(shape), array is not flat or len(runs) > 1
    octets = np.frombuffer(packed, np.uint8)
    if octets.size and octets[-1] >= 0x80:
        raise InvalidArgumentError(f"{_CONTENTS} is malformed: its last varint runs past the "
                                   "end of its field")
    found = 0
    for at in range(0, octets.size, _COUNTED):
        found += int(np.count_nonzero(octets[at:at + _COUNTED] < 0x80))
        yield
    check_count(found, tensor, shape, field, lambda: other_fields(data, number))
    values = np.empty(count, bool if field == "bool_contents" else dt.numpy)
    reader = _PieceReader(values, field in _SIGNED, dt, tensor)
    at = 0
    while at < octets.size:
        stop = min(at + _PIECE, octets.size)
        if octets[stop - 1] >= 0x80:  # on to the end of the varint the piece cut
            ends = np.flatnonzero(octets[stop:stop + 10] < 0x80)
            if not ends.size:
                raise InvalidArgumentError(f"{_CONTENTS} is malformed: a varint is longer "
                                           "than 10 bytes")
            stop += int(ends[0]) + 1
        reader.read(octets[at:stop])
        at = stop
        yield
    return values.reshape(shape), True


def wire_strings_steps(data: memoryview, tensor: str, shape: tuple[int, ...],
                       budget: PartsBudget) -> Generator[None, None, bytearray]:
    """The serialized contents `data`'s `bytes_contents` in the BYTES layout (each a 4-byte
    length, then its bytes), with a yield every _STRINGS_A_STEP; its elements must number
    the shape's count. They are bounded by the shape (which infer_codec.MAX_BYTES_ELEMENTS
    bounds), not by `budget`, which its other fields spend: a request's strings may number
    a million, where protobuf's counted parse refused more than 65,536. (An object array of
    them, encoded into the layout, held the loop 225 ms a million in its last step.) Runs of
    strings under 16 KiB, as protobuf writes them (a tag and a one- or two-byte length
    each), are found in a tight loop and laid out from it, by numpy when they are many and
    short: a million tokens took 471 ms a field at a time, 182 so; any other field is read
    on its own."""
    count = math.prod(shape)
    array = np.frombuffer(data, np.uint8)
    layout = bytearray()
    pack = _LENGTH.pack
    found = stepped = others = at = 0
    end = len(data)
    while at < end:
        begin = at
        starts, lengths, at = _strings_run(data, at, end,
                                           min(_STRINGS_A_STEP, count - found + 1))
        if not starts:  # a field of another kind, or a string of 16 KiB or more
            number, kind, start, stop = next(whole_fields(data, _CONTENTS, at))
            at = stop
            if number == _BYTES_FIELD and kind == LENGTH_DELIMITED:
                starts, lengths = [start], [stop - start]
            else:
                budget.spend()
                others += 1
        if starts:
            found += len(starts)
            if found > count:
                raise InvalidArgumentError(f"input '{tensor}': contents has more than {count} "
                                           f"elements; shape [{','.join(map(str, shape))}] "
                                           f"needs {count}")
            if len(starts) >= _NUMPY_RUN and sum(lengths) <= _NUMPY_LENGTH * len(starts):
                layout += _laid_out(array, begin, at, starts, lengths).data
            else:
                for start, length in zip(starts, lengths):
                    layout += pack(length)
                    layout += data[start:start + length]
        if found - stepped >= _STRINGS_A_STEP or others >= PARTS_A_STEP:
            stepped, others = found, 0
            yield
    check_count(found, tensor, shape, "bytes_contents",
                lambda: other_fields(data, _BYTES_FIELD))
    return layout


_SHORT_TAG = _BYTES_FIELD << 3 | LENGTH_DELIMITED
# numpy lays out a run of at least _NUMPY_RUN strings (~40 µs a call) of at most
# _NUMPY_LENGTH bytes on average: 100,000 of 4 bytes took 15 ms so, 22 one at a time; of
# 64 bytes 27 against 24, of 300 bytes 101 against 36 (its masks pass over every byte)
_NUMPY_RUN, _NUMPY_LENGTH = 64, 32


def _strings_run(data: memoryview, at: int, end: int, most: int
                 ) -> tuple[list[int], list[int], int]:
    """Where the bytes of each of (at most `most`) bytes_contents fields from `at` whose
    length is one or two bytes start, their lengths, and where the run of them ends."""
    starts: list[int] = []
    lengths: list[int] = []
    while most and at + 1 < end and data[at] == _SHORT_TAG:
        length = data[at + 1]
        if length < 0x80:
            begin = at + 2
        else:
            if at + 2 >= end or data[at + 2] >= 0x80:
                break  # a length of three bytes or more, or cut off: read on its own
            length = (length & 0x7F) | data[at + 2] << 7
            begin = at + 3
        if begin + length > end:
            break
        starts.append(begin)
        lengths.append(length)
        at = begin + length
        most -= 1
    return starts, lengths, at


def _laid_out(array: np.ndarray, begin: int, end: int, starts: list[int],
              lengths: list[int]) -> np.ndarray:
    """The BYTES layout of the run of fields array[begin:end] whose values are at `starts`
    and `lengths`: the values picked out of the run by a mask, put between four-byte
    little-endian lengths by another (a few passes over the bytes, no index per byte)."""
    values_at = np.array(starts, np.int64) - begin
    sizes = np.array(lengths, np.int64)
    values = array[begin:end][_mask(end - begin, values_at, sizes)]
    heads = np.zeros(len(sizes), np.int64)  # each element's place in the layout
    np.cumsum(sizes[:-1] + 4, out=heads[1:])
    out = np.zeros(int(heads[-1] + 4 + sizes[-1]), np.uint8)
    out[_mask(len(out), heads + 4, sizes)] = values
    out[heads] = sizes & 0xFF
    out[heads + 1] = sizes >> 8  # under 16 KiB: the two high bytes stay 0
    return out


def _mask(size: int, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """True over [start, start + size) of each (apart, in order) span of `size` bytes."""
    edges = np.zeros(size + 1, np.int8)
    edges[starts] = 1
    edges[starts + sizes] -= 1  # an empty span's start is its end: 0 there
    return np.cumsum(edges[:-1], dtype=np.int8) > 0


def check_count(found: int, tensor: str, shape: tuple[int, ...], field: str = "",
                others: Callable[[], list[str]] | None = None) -> None:
    """Refuse contents of `found` elements for an input of `shape` that needs another count.
    None found where `others` (asked only then) names fields of other datatypes that hold
    values: the client put them in the wrong field, and the error says which is right."""
    if found == math.prod(shape):
        return
    misplaced = others() if others is not None and not found else []
    if misplaced:
        raise InvalidArgumentError(f"input '{tensor}': its datatype's values go in {field}; "
                                   f"its contents has {', '.join(misplaced)} instead")
    raise InvalidArgumentError(f"input '{tensor}': contents has {found} elements; shape "
                               f"[{','.join(map(str, shape))}] needs {math.prod(shape)}")


_NAMES = {number: name for name, (number, _) in _FIELDS.items()} | {
    _BYTES_FIELD: "bytes_contents"}


def other_fields(data: memoryview, number: int) -> list[str]:
    """The contents fields in serialized `data` other than field `number` (walked only on an
    error: the walk that found none of `number` bounded their count)."""
    return list(dict.fromkeys(_NAMES[found] for found, _, start, stop in
                              whole_fields(data, _CONTENTS)
                              if found != number and found in _NAMES and stop > start))


def _packed_runs(data: memoryview, number: int, budget: PartsBudget
                 ) -> list[memoryview] | None:
    """The payloads of field `number`'s packed runs in the serialized message `data`, in
    order (protobuf joins a repeated field's runs); None if an element came unpacked. Other
    fields, unknown ones a client sent among them, are skipped by their wire type."""
    runs: list[memoryview] = []
    for found, kind, start, stop in whole_fields(data, _CONTENTS):
        budget.spend()
        if found == number:
            if kind != LENGTH_DELIMITED:
                return None
            runs.append(data[start:stop])
    return runs or [data[:0]]


class _PieceReader:
    """Decodes pieces of packed varints (whole ones) into `values` one after another:
    straight into it for 64-bit integers, else through a piece-sized uint64 array, checked
    against the datatype's range (BOOL: nonzero is true)."""

    def __init__(self, values: np.ndarray, signed: bool, dt: DataType, tensor: str) -> None:
        self._values = values
        self._done = 0
        self._signed = signed
        self._dt = dt
        self._tensor = tensor
        self._direct = values.dtype.itemsize == 8  # int64_contents, uint64_contents
        kind = values.dtype.kind
        self._limits = np.iinfo(values.dtype) if kind in "iu" and not self._direct else None

    def read(self, octets: np.ndarray) -> None:
        out = self._values[self._done:]
        more = octets >= 0x80
        if not more.any():  # one byte each (0-127, in every datatype's range): bools, small ints
            out[:octets.size] = octets if out.dtype != bool else octets != 0
            self._done += octets.size
            return
        ends = np.flatnonzero(~more)
        values = out[:ends.size].view(np.uint64) if self._direct else np.empty(ends.size,
                                                                                np.uint64)
        _decode(octets, ends, values)
        if not self._direct:
            checked = values.view(np.int64) if self._signed else values
            if self._limits is not None:
                self._check(checked, self._limits)
            out[:ends.size] = checked if out.dtype != bool else checked != 0
        self._done += ends.size

    def _check(self, values: np.ndarray, limits: Any) -> None:
        low, high = values.min(), values.max()
        if low < limits.min or high > limits.max:
            raise InvalidArgumentError(f"input '{self._tensor}': {self._dt.name} holds "
                                       f"[{limits.min}, {limits.max}]; contents has "
                                       f"{low if low < limits.min else high}")


def _decode(octets: np.ndarray, ends: np.ndarray, values: np.ndarray) -> None:
    """The varints ending at `ends` in `octets` into uint64 `values` (each ends at a byte
    under 0x80; its bytes hold 7 bits each, least significant first; a 10th byte's one bit
    is bit 63)."""
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > 10:
        raise InvalidArgumentError(f"{_CONTENTS} is malformed: a varint is longer than 10 "
                                   "bytes")
    np.bitwise_and(octets[starts], 0x7F, out=values, casting="unsafe")
    longer = np.arange(ends.size)
    for place in range(1, longest):
        longer = longer[lengths[longer] > place]
        bits = (octets[starts[longer] + place] & 0x7F).astype(np.uint64)
        values[longer] |= bits << np.uint64(7 * place)
