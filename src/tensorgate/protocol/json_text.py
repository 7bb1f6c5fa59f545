"""JSON text in and out of the server: orjson first, the standard library behind it.

orjson parses a tensor's `data` 4–5× faster than `json` and writes it straight from a numpy
array ~19× faster (a [1,3,224,224] FP32 output: 3 ms instead of 63), and a small inference
header in a quarter of the time. What orjson refuses is handed to the standard library, so
the server still accepts what Triton's rapidjson does and `json` did: NaN, Infinity and
-Infinity (in and out), a byte order mark; a body neither accepts fails with `json`'s own
message. One difference, rapidjson's: an integer beyond 64 bits reads as a float.

A lone surrogate (a `\ud800` escape without its pair, or its UTF-8 bytes, which `json`
lets through) is refused naming where it is, as rapidjson refuses it: such text cannot be
encoded as UTF-8, and every place that later encoded client text (a BYTES element, a cache
key, a sequence id, a model's own `.encode()`) failed there, answered as an internal error.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from tensorgate.protocol.steps import run_through

__all__ = ["bracketed", "dumps", "finite", "loads", "marks_over", "marks_over_steps"]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
# `{`, `[`, `,` and `:`: the marks marks_over counts
_MARKS = np.zeros(256, np.bool_)
_MARKS[[0x7B, 0x5B, 0x2C, 0x3A]] = True
_QUOTE, _BACKSLASH = 0x22, 0x5C
_STEP = 1 << 20  # bytes of text looked at a time (bounds its temporaries, and a step's time)


def loads(data: bytes | bytearray | memoryview) -> Any:
    """`data` parsed; raises ValueError (bad syntax, bad UTF-8, a lone surrogate) or
    RecursionError (nesting deeper than Python's recursion limit) as `json.loads` does."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # what orjson refuses: Triton's NaN and Infinity, a BOM, lone surrogates, nesting
        # past 1,024, or bad JSON (parsed twice, so the error is json's own)
        value = json.loads(bytes(data))
    if _MAY_HOLD_SURROGATE.search(data):  # else no string of it can hold one
        where = _lone_surrogate(value)
        if where is not None:
            raise ValueError(where)
    return value


# an escape of a surrogate (or an escaped backslash before "ud8..."), or a surrogate's UTF-8
_MAY_HOLD_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any) -> str | None:
    """Where the first lone surrogate in `value` is, said for an error message (`inputs[0]
    .data[3]`); None if it holds none. Without a path made for each value (a million took
    233 ms; a million one-number lists 1.6 s): orjson writes it back in C unless one is
    there (16 ms for a million numbers), and only if one is, the way down to it is through
    the first child of each container that holds it, found by halving."""
    if _clean([value]):
        return None
    item, path = value, ""
    while True:  # every step down is to a child that holds one
        if type(item) is str:
            found = _SURROGATE.search(item)
            assert found is not None
            return (f"the string at {path or 'the top'} holds a lone surrogate "
                    f"({ascii(found.group())[1:-1]}), which is not valid Unicode")
        if type(item) is list:
            index = _first_holding(item)
            item, path = item[index], f"{path}[{index}]"
            continue
        entries = list(itertools.chain.from_iterable(item.items()))  # key, value, key, ...
        index = _first_holding(entries)
        key = ascii(entries[index - index % 2])[1:-1]
        path = f"{path}.{key}" if path else key
        if not index % 2:
            found = _SURROGATE.search(entries[index])
            assert found is not None
            return (f"the key {path} holds a lone surrogate "
                    f"({ascii(found.group())[1:-1]}), which is not valid Unicode")
        item = entries[index]


_SCALARS = frozenset((int, float, bool, type(None)))
_STRINGS, _LISTS, _DICTS = frozenset((str,)), frozenset((list,)), frozenset((dict,))


def _clean(values: list[Any]) -> bool:
    """Whether no string in `values` (nor key, nor anything they hold) holds a surrogate:
    orjson will write them, or says a surrogate is why not; else (integers past 64 bits,
    nesting past 255, an error worded otherwise) looked at a level at a time, each level's
    strings joined and searched once."""
    try:
        orjson.dumps(values)
        return True
    except orjson.JSONEncodeError as error:
        if "surrogates not allowed" in str(error):
            return False
    while values:
        kinds = set(map(type, values))
        if kinds <= _SCALARS:
            return True
        strings = values if kinds == _STRINGS else [v for v in values if type(v) is str]
        if strings and _SURROGATE.search("".join(strings)):
            return False
        lists = values if kinds == _LISTS else (
            [v for v in values if type(v) is list] if list in kinds else [])
        dicts = values if kinds == _DICTS else (
            [v for v in values if type(v) is dict] if dict in kinds else [])
        if dicts and _SURROGATE.search("".join(itertools.chain.from_iterable(dicts))):
            return False  # a key
        values = list(itertools.chain(itertools.chain.from_iterable(lists),
                                      itertools.chain.from_iterable(map(dict.values, dicts))))
    return True


def _first_holding(values: list[Any]) -> int:
    """The index of the first of `values` that holds a surrogate (one does): those before
    it are clean, found by halving the range that holds it."""
    low, high = 0, len(values)
    while high - low > 1:
        middle = (low + high) // 2
        if _clean(values[low:middle]):
            low = middle
        else:
            high = middle
    return low


def marks_over(data: bytes | bytearray | memoryview, limit: int) -> bool:
    """Whether JSON text `data` holds more than `limit` `{`, `[`, `,` and `:` outside its
    strings: about one for each value and key a parse of it makes (a container's elements
    are its commas and one, a key has its colon), each a Python object. A count of the marks
    anywhere decides most texts (~60 ms for 57 MB); a text it puts over `limit` is counted
    again for its strings. Both read 1 MiB at a time and stop once past `limit`, so a text
    dense with marks is refused within its first pieces."""
    over: bool = run_through(marks_over_steps([data], limit))
    return over


def marks_over_steps(texts: Sequence[bytes | bytearray | memoryview], limit: int
                     ) -> Generator[None, None, bool]:
    """marks_over of `texts` joined, in steps (protocol.steps): a yield after each MiB.
    Each text must end outside a string, or between a string's characters (not after a
    backslash that escapes the next text's first)."""
    if sum(len(text) for text in texts) <= limit:
        return False  # each mark is a byte
    count = 0
    for piece in _all_pieces(texts):
        count += int(np.count_nonzero(_MARKS[piece]))
        if count > limit:
            break
        yield
    else:
        return False
    count, in_string = 0, False
    for piece in _all_pieces(texts):
        if np.any(piece == _BACKSLASH):
            # An escaped quote is a backslash and a quote once the escaped backslashes,
            # which pair from the left of a run, are gone; what is left of a run then
            # escapes the character after it, so every quote that remains opens or closes
            # a string. (_pieces never parts a run from the character after it.)
            text = piece.tobytes().replace(b"\\\\", b"").replace(b'\\"', b"")
            piece = np.frombuffer(text, np.uint8)
        marks = _MARKS[piece]
        quotes = np.flatnonzero(piece == _QUOTE)
        if not quotes.size:
            count += 0 if in_string else int(np.count_nonzero(marks))
        else:
            # the marks before the first quote, then between each quote and the next: those
            # after a quote that closes a string are outside one
            before = 0 if in_string else int(np.count_nonzero(marks[:quotes[0]]))
            between = np.add.reduceat(marks, quotes, dtype=np.int64)
            count += before + int(between[0 if in_string else 1::2].sum())
            in_string ^= bool(quotes.size & 1)
        if count > limit:
            return True
        yield
    return False


def _all_pieces(texts: Sequence[bytes | bytearray | memoryview]) -> Iterator[np.ndarray]:
    for text in texts:
        yield from _pieces(np.frombuffer(text, np.uint8))


def _pieces(octets: np.ndarray) -> Iterator[np.ndarray]:
    """`octets` about _STEP bytes at a time, each but the last ending in an even run of
    backslashes (or none): the backslashes of a run pair from its left, so a piece never
    parts an escape's backslash from what it escapes. (Pieces grown a byte at a time past a
    run held the loop 2 s for 20 MB of backslashes.)"""
    start = 0
    while start < len(octets):
        end = min(start + _STEP, len(octets))
        if end < len(octets) and octets[end - 1] == _BACKSLASH:
            others = np.flatnonzero(octets[start:end] != _BACKSLASH)
            run = end - start - (int(others[-1]) + 1 if others.size else 0)
            end -= run % 2  # every piece before kept an even part of the run
        yield octets[start:end]
        start = end


def bracketed(memory: memoryview, begin: int, stop: int) -> bytearray:
    """memory[begin:stop] copied between a `[` and a `]`: a slice's text as a JSON array."""
    text = bytearray(stop - begin + 2)
    text[0], text[-1] = 0x5B, 0x5D
    text[1:-1] = memory[begin:stop]
    return text


def dumps(value: Any, *, all_finite: bool = True) -> bytes:
    """`value` as compact JSON. It may hold numpy arrays (flat, C-contiguous, native byte
    order, as infer_codec's `json_data` makes them) and numpy scalars. orjson writes a NaN
    or an infinity as null: pass `all_finite=False` when a float in `value` may be one, and
    it is written as Triton writes it (NaN, Infinity, -Infinity)."""
    if all_finite:
        try:
            return orjson.dumps(value, option=_NUMPY)
        except orjson.JSONEncodeError:
            pass  # an integer beyond 64 bits in a model's parameters, say: json writes it
    return json.dumps(value, separators=(",", ":"), default=_plain).encode()


def finite(value: Any) -> bool:
    """Whether every float in `value` (an array, or dicts and lists) is finite, so that
    `dumps` may take orjson's way."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind != "f" or bool(np.isfinite(value).all())
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return all(finite(item) for item in value)
    return True


def _plain(value: Any) -> Any:
    """numpy arrays and scalars as the Python values `json` writes."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
