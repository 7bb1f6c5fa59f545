"""A BYTES input's JSON `data` — a flat array of strings — found and parsed a slice at a
time straight into the BYTES layout, so that the event loop serves other connections in
between (json_slices does the same for arrays of numbers).

Parsed whole, a million short strings held the loop ~360 ms: orjson's parse, then each
string checked, encoded as UTF-8 and written into the layout (json_tensor). Here the array's
end, and where each string closes, are found with numpy a window at a time: a quote is a
string's own when the run of backslashes before it is even, and such quotes alternate
opening and closing. The array is cut after closing quotes into slices of at most
STRINGS_A_STEP strings and SLICE_BYTES of text, each parsed by the same parser; a slice
that does not parse (a lone surrogate does not), or holds anything but strings, leaves the
whole body to the plain parse, whose errors are the ones a client sees.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator

import numpy as np

from tensorgate.protocol import json_text
from tensorgate.protocol.infer_codec import EncodedStrings
from tensorgate.tensor.buffer import HostBuffer
from tensorgate.tensor.bytes_codec import write_bytes_items

__all__ = ["SCAN_BYTES", "SLICE_BYTES", "STRINGS_A_STEP", "Strings", "string_array",
           "strings_layout"]

_OPEN, _CLOSE, _QUOTE, _BACKSLASH = 0x5B, 0x5D, 0x22, 0x5C
SCAN_BYTES = 1 << 20  # of text looked through between two yields (~1 ms)
_FIRST_SCAN = 256  # looked through first for an array's end
STRINGS_A_STEP = 8192  # strings parsed and laid out between two yields (~1.5 ms)
SLICE_BYTES = 256 << 10  # of text parsed between two yields, at most (but whole strings)
_LEADING_COMMA = re.compile(rb"[ \t\n\r]*,")
_SPACE = re.compile(rb"[ \t\n\r]*")


class Strings:
    """A flat array of strings in a body: its `]` (`end`) and where each string's closing
    quote is (`closes`, in order)."""

    __slots__ = ("closes", "end")

    def __init__(self, closes: np.ndarray, end: int) -> None:
        self.closes, self.end = closes, end


def string_array(octets: np.ndarray, start: int, most: int
                 ) -> Generator[None, None, Strings | None]:
    """The strings of the array opened at `start` whose first non-space is a `"`; None when
    it is smaller than a slice (looked at first, in plain Python: numpy's calls cost more
    than a small array's whole parse), a `[` comes first outside a string (nested), it never
    closes, or it holds more than `most` strings. SCAN_BYTES a step."""
    small = octets[start + 1:start + 1 + min(_FIRST_SCAN, SLICE_BYTES)].tobytes()
    end = small.find(b"]")
    if (end >= 0 and small.count(b'"', 0, end) % 2 == 0 and small.find(b"\\", 0, end) < 0
            and small.find(b"[", 0, end) < 0):
        return None  # ends within a slice: the whole parse's (and a Python one's here)
    closes: list[np.ndarray] = []
    count = 0
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
        first_close = 0 if inside else 1
        brackets = np.flatnonzero((piece == _OPEN) | (piece == _CLOSE))
        if brackets.size:
            # outside a string where the quotes before it are even (counting the window's
            # start as one when it is inside a string)
            before = np.searchsorted(quotes, brackets) + (1 if inside else 0)
            outside = np.flatnonzero(before % 2 == 0)
            if outside.size:
                at = int(brackets[outside[0]])
                if piece[at] == _OPEN:
                    return None
                quotes = quotes[:int(before[outside[0]]) - (1 if inside else 0)]
                count += len(quotes[first_close::2])
                if count > most:
                    return None
                closes.append(quotes[first_close::2] + position)
                return Strings(np.concatenate(closes), position + at)
        found = quotes[first_close::2]
        count += len(found)
        if count > most:
            return None
        closes.append(found + position)
        inside ^= bool(len(quotes) & 1)
        if stop - position == SCAN_BYTES:
            yield
        position = stop
    return None


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
    closes, end = strings.closes, strings.end
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
        if first:  # the comma after the slice before
            comma = _LEADING_COMMA.match(text, 1)
            if comma is None:
                return None
            text[comma.end() - 1] = 0x20
        try:
            items = [value.encode() for value in json_text.loads(text)]
            written = write_bytes_items(items, out, written)
        except (ValueError, RecursionError, AttributeError):
            return None  # not JSON (or a lone surrogate), a value not a string (no encode)
        if len(items) != last - first:
            return None
        begin, first = stop, last
        yield
    tail = _SPACE.match(memory, begin, end)
    if tail is None or tail.end() != end:
        return None  # a trailing comma, or something that is not a string
    return EncodedStrings(buffer, written, count)
