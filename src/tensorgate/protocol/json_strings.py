"""A BYTES input's JSON `data` — an array of strings, flat or as `x.tolist()` nests them —
found and parsed a slice at a time straight into the BYTES layout, so that the event loop
serves other connections in between (json_slices does the same for arrays of numbers).

Parsed whole, a million short strings held the loop ~360 ms: orjson's parse, then each
string checked, encoded as UTF-8 and written into the layout (json_tensor); 300,000 in lists
of one, 205 ms. Here the array's end, where each string closes and the brackets outside
strings are found with numpy a window at a time: a quote is a string's own when the run of
backslashes before it is even, and such quotes alternate opening and closing. Nested lists
must be a shape's (json_nesting.even_lists) with every string in an innermost list and each
as wide, so that they read in row-major order as numpy reads the whole. The array is cut
after closing quotes into slices of at most STRINGS_A_STEP strings and SLICE_BYTES of text,
the lists' brackets made spaces, each parsed by the same parser; a slice that does not parse
(a lone surrogate does not), or holds anything but strings, leaves the whole body to the
plain parse, whose errors are the ones a client sees.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Generator

import numpy as np

from tensorgate.protocol import json_text
from tensorgate.protocol.json_tensors import EncodedStrings
from tensorgate.protocol.json_nesting import Brackets, even_lists
from tensorgate.tensor.buffer import HostBuffer
from tensorgate.tensor.bytes_codec import write_bytes_items

__all__ = ["SCAN_BYTES", "SLICE_BYTES", "STRINGS_A_STEP", "Strings", "string_array",
           "strings_layout"]

_OPEN, _CLOSE, _QUOTE, _BACKSLASH = 0x5B, 0x5D, 0x22, 0x5C
SCAN_BYTES = 256 << 10  # of text looked through between two yields (~2 ms nested)
_LISTS_A_STEP = 1 << 16  # innermost lists checked between two yields (~2 ms)
_FIRST_SCAN = 256  # looked through first for an array's end
STRINGS_A_STEP = 8192  # strings parsed and laid out between two yields (~1.5 ms)
SLICE_BYTES = 256 << 10  # of text parsed between two yields, at most (but whole strings)
_LEADING_COMMA = re.compile(rb"[ \t\n\r]*,")


class Strings:
    """An array of strings in a body, flat or evenly nested lists of them: its `]` (`end`),
    where each string's closing quote is (`closes`, in order) and, when nested, where its
    brackets are (`brackets`, outside the strings; None for a flat one)."""

    __slots__ = ("brackets", "closes", "end")

    def __init__(self, closes: np.ndarray, end: int, brackets: np.ndarray | None) -> None:
        self.closes, self.end, self.brackets = closes, end, brackets


def string_array(octets: np.ndarray, start: int, most: int
                 ) -> Generator[None, None, Strings | None]:
    """The strings of the array opened at `start`, flat or evenly nested lists of them (as
    `x.tolist()` makes); None when it is smaller than a slice (looked at first, in plain
    Python: numpy's calls cost more than a small array's whole parse), its lists are not
    evenly nested or hold anything but strings at their innermost level, it never closes,
    or it holds more than `most` strings. SCAN_BYTES a step."""
    if _small(octets, start):
        return None
    closes: list[np.ndarray] = []
    at: list[np.ndarray] = [np.array([start])]  # brackets outside strings, whether each
    opens: list[np.ndarray] = [np.array([True])]  # is a `[`, and the depth after it
    levels: list[np.ndarray] = [np.array([1])]
    count = 0
    depth = 1
    inside = False  # the window starts within a string
    carry = 0  # backslashes ending the window before: the run goes on into the next
    position = start + 1
    size = min(_FIRST_SCAN, SCAN_BYTES)
    while position < len(octets):
        # _FIRST_SCAN bytes, then each window twice the last up to SCAN_BYTES: most arrays
        # end near where they begin (16,000 one-string arrays, each looked through a MiB
        # at a time, took 15 s)
        stop = min(position + size, len(octets))
        size = min(size * 2, SCAN_BYTES)
        piece = octets[position:stop]
        quotes, carry = _real_quotes(piece, carry)
        brackets = np.flatnonzero((piece == _OPEN) | (piece == _CLOSE))
        end = -1
        if brackets.size:
            # outside a string where the quotes before it are even (counting the window's
            # start as one when it is inside a string)
            outside = brackets[(np.searchsorted(quotes, brackets) + inside) % 2 == 0]
            is_open = piece[outside] == _OPEN
            level = depth + np.cumsum(np.where(is_open, 1, -1))
            closed = np.flatnonzero(level == 0)
            taken = int(closed[0]) + 1 if closed.size else len(outside)
            at.append(outside[:taken] + position)
            opens.append(is_open[:taken])
            levels.append(level[:taken])
            if closed.size:
                end = int(outside[closed[0]])
                quotes = quotes[:int(np.searchsorted(quotes, end))]
            elif level.size:
                depth = int(level[-1])
        found = quotes[(0 if inside else 1)::2]
        count += len(found)
        if count > most:
            return None
        closes.append(found + position)
        if end >= 0:
            if sum(map(len, at)) == 2:  # flat: no bracket between its own
                return Strings(np.concatenate(closes), position + end, None)
            strings: Strings | None = yield from _even(closes, position + end, at, opens,
                                                       levels)
            return strings
        inside ^= bool(len(quotes) & 1)
        if stop - position == SCAN_BYTES:
            yield
        position = stop
    return None


_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(set(range(256)) - {_OPEN, _CLOSE})


def _small(octets: np.ndarray, start: int) -> bool:
    """Whether the array opened at `start` ends within its first _FIRST_SCAN bytes (or a
    slice, if smaller) with no backslash among them: too small to slice."""
    small = octets[start + 1:start + 1 + min(_FIRST_SCAN, SLICE_BYTES)].tobytes()
    end = small.find(b"]")
    if (end >= 0 and small.count(b'"', 0, end) % 2 == 0 and small.find(b"\\", 0, end) < 0
            and small.find(b"[", 0, end) < 0):
        return True  # flat, and its `]` is the first (most arrays: no more to look at)
    if b"\\" in small:
        return False
    text = _STRING.sub(b"", small)  # no escapes: each string is a quote to the next
    cut = text.find(b'"')  # a string the window's end cuts
    depth = 1
    for bracket in (text if cut < 0 else text[:cut]).translate(None, _NOT_BRACKETS):
        depth += 1 if bracket == _OPEN else -1
        if not depth:
            return True
    return False


def _even(closes_found: list[np.ndarray], end: int, at_found: list[np.ndarray],
          opens_found: list[np.ndarray], levels_found: list[np.ndarray]
          ) -> Generator[None, None, Strings | None]:
    """The strings of a nested array whose `]` is at `end` (its closing quotes and
    brackets as found, a window at a time), if its lists are evenly nested (a shape's) with
    every string in an innermost list, each list holding as many (so that they read in
    row-major order as numpy reads the whole); None otherwise. In steps: a million lists
    took 40 ms and more to check in one."""
    closes, at = np.concatenate(closes_found), np.concatenate(at_found)
    yield
    levels = np.concatenate(levels_found)
    brackets = Brackets(at, levels, np.concatenate(opens_found))
    yield
    dims = even_lists(brackets)
    if dims is None:
        return None
    yield
    firsts = at[brackets.opens & (levels == dims)]  # each innermost list's `[`
    yield
    lasts = at[~brackets.opens & (levels == dims - 1)]  # and its `]`
    width = -1
    for begin in range(0, len(firsts), _LISTS_A_STEP):
        yield
        # how many strings close inside each list: the same for all, and all of them
        stop = begin + _LISTS_A_STEP
        widths = (np.searchsorted(closes, lasts[begin:stop])
                  - np.searchsorted(closes, firsts[begin:stop]))
        if widths.min() != widths.max() or width not in (-1, int(widths[0])):
            return None
        width = int(widths[0])
    if width < 1 or width * len(firsts) != len(closes):
        return None  # empty lists, or a string outside the innermost lists
    return Strings(closes, end, at)


def _real_quotes(piece: np.ndarray, carry: int) -> tuple[np.ndarray, int]:
    """Where the quotes are in `piece` that open or close a string (not those a backslash
    escapes: a quote after an odd run of backslashes), and the run of backslashes the piece
    ends with. `carry`: the backslashes just before the piece (a run it continues)."""
    quotes = np.flatnonzero(piece == _QUOTE)
    slashes = np.flatnonzero(piece == _BACKSLASH)
    if not slashes.size:
        if carry % 2 and quotes.size and quotes[0] == 0:
            quotes = quotes[1:]
        return quotes, 0
    # consecutive backslashes share `slashes[i] - i`: a run is the indices with one value
    runs = slashes - np.arange(len(slashes))
    ends = len(piece) - 1 == slashes[-1]
    last_run = int(np.searchsorted(runs, runs[-1]))
    trailing = len(slashes) - last_run + (carry if slashes[last_run] == 0 else 0)
    if not quotes.size:
        return quotes, trailing if ends else 0
    below = np.searchsorted(slashes, quotes) - 1  # the last backslash before each quote
    clipped = np.maximum(below, 0)
    touching = (below >= 0) & (slashes[clipped] == quotes - 1)
    first = np.searchsorted(runs, runs[clipped])  # where that backslash's run begins
    length = np.where(touching, below + 1 - first, 0)
    from_start = np.where(touching, slashes[first] == 0, quotes == 0)
    length = length + carry * from_start
    return quotes[length % 2 == 0], trailing if ends else 0


def strings_layout(memory: memoryview, start: int, strings: Strings,
                   acquire: Callable[[int], HostBuffer]
                   ) -> Generator[None, None, EncodedStrings | None]:
    """The array memory[start:strings.end + 1] parsed a slice at a time into the BYTES
    layout (in a buffer from `acquire`); None when a slice does not parse or holds anything
    but strings (the plain parse decides those)."""
    closes, end, nested = strings.closes, strings.end, strings.brackets
    count = len(closes)
    # Each string's UTF-8 is no longer than its JSON text, and its two quotes and comma are
    # one byte short of its 4-byte length: the layout fits in the array's text and a byte a
    # string
    capacity = end + 1 - start + count
    buffer = acquire(capacity)
    out = memoryview(buffer).cast("B")[:capacity]
    written = 0
    begin = start + 1
    first = 0
    while first < count:
        by_size = int(np.searchsorted(closes, begin + SLICE_BYTES)) + 1
        last = min(count, first + STRINGS_A_STEP, max(first + 1, by_size))
        stop = int(closes[last - 1]) + 1
        text = json_text.bracketed(memory, begin, stop)
        if nested is not None:  # the lists' brackets: spaces, so the strings read as one list
            inside = nested[np.searchsorted(nested, begin):np.searchsorted(nested, stop)]
            np.frombuffer(text, np.uint8)[inside - begin + 1] = 0x20
        if first:  # the comma after the slice before
            comma = _LEADING_COMMA.match(text, 1)
            if comma is None:
                return None
            text[comma.end() - 1] = 0x20
        try:
            items = [value.encode() for value in json_text.loads(text)]
            written = write_bytes_items(items, out, written)
        except (ValueError, RecursionError, AttributeError, struct.error):
            # not JSON (or a lone surrogate), a value not a string (no encode), or more than
            # the layout's room (never: it is the most the text can make)
            return None
        if len(items) != last - first:
            return None
        begin, first = stop, last
        yield
    tail = bytes(memory[begin:end])
    if nested is not None:
        tail = tail.translate(None, b"[]")  # the lists' closing brackets
    if tail.strip(b" \t\n\r"):
        return None  # a trailing comma, or something that is not a string
    return EncodedStrings(buffer, written, count)
