"""A large V2 JSON request decoded a slice at a time, so that the event loop serves other
connections in between (json_answers writes large answers so).

Decoding a 12 MB JSON body (identity [4,3,224,224]) in one go held the loop, and the GIL, for
about 50 ms and writing its answer for 12: every other client waited that long
(bench/json_stall_bench.py: a small binary request's P99 went from 1 to 69 ms beside such a
client). orjson's parse is one C call that keeps the GIL, so a worker thread would not help;
instead each large flat `data` array's text is parsed in slices of about SLICE_BYTES by the
same parser, with a yield to the loop between them (and so are small arrays, a slice's
bytes of them between yields, when there are enough of them to hold the loop).

Nothing here decides what a body means. An array's text is found by its key (`"data": [`,
then no `"` before its matching `]`, or for a BYTES input's strings, flat or nested,
json_strings' scan for the `]` outside them) and cut out; the rest, with a placeholder string in its
place, must parse and hold each placeholder as exactly one input's `data`: then the original
body is that document with the arrays put back, since an array that parses whole stands
where a value stood. A nested array (`x.tolist()`, as hand-written clients send) is read as
the plain path reads it, its values in row-major order, when it is evenly nested lists (the
plain path refuses any other nesting): its brackets must be those of some shape's lists,
and it is parsed in runs of whole innermost lists, the brackets above them made spaces,
each run a table of one width, the same for all. Any doubt — a cut that does not verify,
nesting that is not even, a slice that does not parse, a true/false among the numbers — and
the body is decoded whole, as before, so errors and edge cases are the plain path's own.
Either way what is parsed whole is bounded (infer_codec.MAX_JSON_VALUES). A BOOL input's
true/false are parsed in slices as numbers are; so is the JSON before a binary body's tensors;
a BYTES input's strings, flat or evenly nested, are parsed into the BYTES layout
(json_strings).
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Generator
from typing import Any

import numpy as np

from tensorgate.protocol import json_text
from tensorgate.protocol.infer_codec import (MAX_BYTES_ELEMENTS, MAX_JSON_VALUES, DecodedRequest,
                                             decode_infer_steps, header_values_refused,
                                             parse_header, tensor_count)
from tensorgate.protocol.json_tensors import exact_integers, holds_bool
from tensorgate.protocol.json_nesting import Brackets, even_lists
from tensorgate.protocol.json_strings import (STRINGS_A_STEP, Strings, string_array,
                                              strings_layout)
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.pool import default_pool
from tensorgate.tensor.shm import SharedMemoryRegistry

__all__ = ["LARGE_BYTES", "SCAN_BYTES", "SLICE_BYTES", "decode_in_slices", "worth_slicing"]

SLICE_BYTES = 256 << 10   # of array text parsed between two yields (~1 ms)
SCAN_BYTES = 1 << 20      # of text looked through for an array's end (~0.5 ms)
_FIRST_SCAN = 256         # looked through first: most arrays end near where they begin
_KEYS_A_STEP = 256        # `"data"` keys looked at between two yields
LARGE_BYTES = 512 << 10   # bodies from this size go in slices
# Arrays of SLICE_BYTES // _SPAN_PARTS (16 KiB) or more are cut out and parsed on their own:
# left in the rest of the body, 24 arrays of 235 KB (a million values in all, under the
# value bound) were parsed in one go with it, 64 ms. Smaller ones are cut out too when
# together they are SLICE_BYTES or more: 4,000 of 1.3 KB were parsed with the rest, 75 ms
_SPAN_PARTS = 16

_KEY = re.compile(rb'"data"\s*:\s*\[')
_KEY_WINDOW = 4 << 20  # bytes searched for _KEY between two yields (~1 ms)
# what may come between the key's name and its `[`: a window ending in these is searched
# again from the name before them
_BETWEEN = np.zeros(256, np.bool_)
_BETWEEN[list(b" \t\n\r:")] = True
_NAME_BYTES = len(b'"data"')
_NONCE = secrets.token_hex(8)  # placeholders a client cannot write
_OPEN, _CLOSE, _QUOTE, _COMMA = 0x5B, 0x5D, 0x22, 0x2C
# the datatypes whose JSON `data` numpy makes an array of numbers (infer_codec's own checks
# then judge them); a BYTES input's numbers are left to the whole parse
_NUMERIC = frozenset({"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                      "INT64", "FP16", "FP32", "FP64"})


def _placeholder(index: int) -> str:
    return f"\x00tensorgate-{_NONCE}-{index}"


def worth_slicing(body: Any, body_length: int, header_length: int | None) -> bool:
    """Whether decode_in_slices is worth its scans for this body: its JSON is LARGE_BYTES or
    more, or holds enough quotes for an array of more strings than a step lays out (a
    469 KiB body of 160,000 empty strings took 39 ms to decode whole). Counting the quotes
    costs ~12 µs for 160 KiB."""
    json_length = body_length if header_length is None else header_length
    if json_length >= LARGE_BYTES:
        return True
    if json_length < 3 * STRINGS_A_STEP or json_length > body_length:
        return False  # too short to hold that many strings (`"",` each), or a bad length
    octets = np.frombuffer(memoryview(body).cast("B"), np.uint8, json_length)
    return int(np.count_nonzero(octets == _QUOTE)) > 2 * STRINGS_A_STEP


def decode_in_slices(body: Any, body_length: int, ledger: CopyLedger,
                     shm: SharedMemoryRegistry | None = None, header_length: int | None = None
                     ) -> Generator[None, None, DecodedRequest]:
    """decode_infer_body of a body whose JSON (all of it, or the `header_length` bytes
    before binary tensors) has its large arrays parsed a slice at a time (a yield between
    slices)."""
    json_length = body_length if header_length is None else header_length
    document = None
    if 0 < json_length <= body_length:  # else decode_infer_body says what is wrong
        memory = memoryview(body).cast("B")[:json_length]
        spans = yield from _array_spans(memory)
        document = (yield from _parsed(memory, spans)) if spans else None
        if document is None:  # parsed whole, its values counted here in steps
            if (yield from json_text.marks_over_steps([memory], MAX_JSON_VALUES)):
                raise header_values_refused()
            document = parse_header(memory, counted=True)
    decoded: DecodedRequest = yield from decode_infer_steps(body, body_length, header_length,
                                                            ledger, shm, parsed=document)
    return decoded


# an array's text in the body: its `[`, one past its `]`, and for a nested one its
# brackets, for one of strings where they close (None for a flat one of numbers)
Span = tuple[int, int, Brackets | Strings | None]


def _scans(start: int, stop: int) -> Generator[tuple[int, int], None, None]:
    """The windows [from, to) in which to look for something after `start`: _FIRST_SCAN
    bytes, then each twice the last, up to SCAN_BYTES, so that what lies near is found for
    little. Looking through SCAN_BYTES at once for each of a body's arrays made one of 16,000
    one-number arrays (1 MB) hold the loop for 4.7 s, and 200,000 of them for minutes."""
    size = min(_FIRST_SCAN, SCAN_BYTES)
    while start < stop:
        yield start, min(start + size, stop)
        start += size
        size = min(size * 2, SCAN_BYTES)


def _array_spans(memory: memoryview) -> Generator[None, None, list[Span]]:
    """Each large array after a `"data"` key that holds no `"`. Candidates only: _parsed
    checks them."""
    octets = np.frombuffer(memory, np.uint8)
    spans: list[Span] = []
    large: list[Span] = []  # the smaller go too when together they are a step's parse
    small_bytes = 0
    position = 0
    keys = 0
    while (start := (yield from _next_key(memory, position))) is not None:
        keys += 1
        if keys % _KEYS_A_STEP == 0:
            yield  # a body of many small arrays: the loop's turn now and then
        end = position = start + 1
        for begin, stop in _scans(end, len(octets)):  # the first [, ] or " after the [
            piece = octets[begin:stop]
            found = np.flatnonzero((piece == _CLOSE) | (piece == _OPEN) | (piece == _QUOTE))
            if found.size:
                end = begin + int(found[0])
                break
            end = stop
            if stop - begin == SCAN_BYTES:
                yield
        if end >= len(octets):
            continue  # unclosed: left to the whole parse
        kind: Brackets | Strings | None = None
        if octets[end] == _QUOTE:
            kind = yield from string_array(octets, start, MAX_BYTES_ELEMENTS)
            if kind is None:
                continue
            end = kind.end
        elif octets[end] == _OPEN:
            kind = yield from _nested_brackets(octets, start)
            if kind is None:  # a quote among them: lists of strings, perhaps
                kind = yield from string_array(octets, start, MAX_BYTES_ELEMENTS)
                if kind is None:
                    continue
                end = kind.end
            else:
                end = int(kind.at[-1])
        position = end + 1
        spans.append((start, end + 1, kind))
        if end + 1 - start >= SLICE_BYTES // _SPAN_PARTS or (
                isinstance(kind, Strings) and len(kind.closes) > STRINGS_A_STEP):
            large.append(spans[-1])
        else:
            small_bytes += end + 1 - start
    return spans if small_bytes >= SLICE_BYTES else large


def _next_key(memory: memoryview, position: int) -> Generator[None, None, int | None]:
    """Where the `[` of the next `"data": [` from `position` is, looked for _KEY_WINDOW bytes
    at a time (a yield between: one search through 57 MB without a key held the loop 14 ms).
    A window that ends inside a key is searched again from where the key can begin: the
    next one starts before the whitespace and colons it ends with, and a name before them,
    so a key is found unless more than a window of whitespace parts its name from its `[`
    (its array is then parsed with the rest of the body, as any array not cut out is)."""
    octets = np.frombuffer(memory, np.uint8)
    while position < len(memory):
        stop = min(position + _KEY_WINDOW, len(memory))
        match = _KEY.search(memory, position, stop)
        if match is not None:
            return match.end() - 1
        if stop == len(memory):
            return None
        between = _between_start(octets, position, stop)
        # a name ending where they begin, or a name cut by the window's end
        position = (between - _NAME_BYTES if between - _NAME_BYTES > position
                    else stop - _NAME_BYTES + 1)
        yield
    return None


def _between_start(octets: np.ndarray, floor: int, stop: int) -> int:
    """Where the run of whitespace and colons that octets[floor:stop] ends with begins
    (`stop` if it ends in neither), looked at from the end a little at a time."""
    end, size = stop, 64
    while end > floor:
        begin = max(floor, end - size)
        others = np.flatnonzero(~_BETWEEN[octets[begin:end]])
        if others.size:
            return begin + int(others[-1]) + 1
        end, size = begin, size * 2
    return floor


def _nested_brackets(octets: np.ndarray, start: int) -> Generator[None, None, Brackets | None]:
    """The brackets of the array opened at `start`, up to its `]`; None if a `"` comes first
    or it never closes. SCAN_BYTES of text a step (~0.5 ms a MiB for an image's x.tolist();
    ~9 where every other byte is a bracket, [[1],[2],...])."""
    depth = 0
    found: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    for position, stop in _scans(start, len(octets)):
        piece = octets[position:stop]
        at = np.flatnonzero((piece == _OPEN) | (piece == _CLOSE))
        level = depth + np.cumsum(np.where(piece[at] == _OPEN, 1, -1))
        closed = np.flatnonzero(level == 0)
        taken = int(closed[0]) + 1 if closed.size else len(at)
        scanned = int(at[taken - 1]) + 1 if closed.size else len(piece)
        if (piece[:scanned] == _QUOTE).any():
            return None
        found.append(at[:taken] + position)
        levels.append(level[:taken])
        if closed.size:
            return Brackets(np.concatenate(found), np.concatenate(levels))
        depth = int(level[-1]) if level.size else depth
        if len(piece) == SCAN_BYTES:
            yield
    return None


def _nested_array(memory: memoryview, start: int, end: int, brackets: Brackets, dims: int,
                  bools: bool) -> Generator[None, None, Any]:
    """The evenly nested array memory[start:end], parsed a run of innermost lists at a time:
    its values flat in row-major order, as numpy makes an array of the whole and flattens
    it; None when a run is not JSON, not a table of the width of the others, holds a
    true/false without `bools` (a BOOL input's), or two runs are not joined by one comma (the
    whole parse decides those)."""
    at, levels, opens = brackets.at, brackets.levels, brackets.opens
    firsts = at[opens & (levels == dims)]          # each innermost list's `[`
    lasts = at[~opens & (levels == dims - 1)]      # and its `]`
    above = at[(levels < dims) & (opens | (levels < dims - 1))]  # the brackets around them
    pieces = []
    width = -1
    lists = len(firsts)
    first = 0
    while first < lists:
        last = min(lists, int(np.searchsorted(lasts, firsts[first] + SLICE_BYTES)) + 1)
        if first:  # between two runs: `],[` or `]],[[` ..., with spaces
            between = bytes(memory[int(lasts[first - 1]) + 1:int(firsts[first])])
            if between.translate(None, b" \t\n\r[]") != b",":
                return None
        begin = int(firsts[first]) if first else start + 1
        stop = int(lasts[last - 1]) + 1 if last < lists else end - 1
        text = json_text.bracketed(memory, begin, stop)
        inside = above[np.searchsorted(above, begin):np.searchsorted(above, stop)]
        np.frombuffer(text, np.uint8)[inside - begin + 1] = 0x20  # brackets above: spaces
        try:
            values = json_text.loads(text)
            table = exact_integers(values, np.asarray(values))
        except (ValueError, RecursionError):
            return None  # not JSON, or lists of different widths
        if (table.ndim != 2 or table.shape[0] != last - first or not table.shape[1]
                or width not in (-1, table.shape[1]) or (holds_bool(values) and not bools)):
            return None
        width = table.shape[1]
        pieces.append(table.reshape(-1))
        first = last
        yield
    return _joined(pieces)


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    """The slices' arrays as one. Signed and unsigned 64-bit integers together make floats
    in numpy (2**64 - 1 in one slice, small ones in the next): those are joined as exact
    objects, as exact_integers keeps a slice's own."""
    if len(pieces) == 1:
        return pieces[0]
    kinds = {piece.dtype.kind for piece in pieces}
    if len(kinds) > 1 and kinds <= {"i", "u", "O"}:
        return np.concatenate([piece.astype(object) for piece in pieces])
    return np.concatenate(pieces)


def _parsed(memory: memoryview, spans: list[Span]) -> Generator[None, None, Any]:
    """The body's document with each span's array parsed in slices, or None when anything
    does not verify (the body is then decoded whole)."""
    parts: list[bytes | memoryview] = []
    last = 0
    for index, (start, end, _) in enumerate(spans):
        parts += [memory[last:start], json_text.dumps(_placeholder(index))]
        last = end
    parts.append(memory[last:])
    # what the skeleton holds besides its arrays, counted in steps before it is joined (a
    # copy); past the bound the request is refused as a parse of the whole body would be
    if (yield from json_text.marks_over_steps(parts, MAX_JSON_VALUES)):
        raise header_values_refused()
    skeleton = b"".join(parts)
    try:
        document = json_text.loads(skeleton)
    except (ValueError, RecursionError):
        return None
    holders = _holders(document, len(spans))
    if holders is None:
        return None
    tensor_count(len(document["inputs"]), "inputs")  # refused before its arrays are parsed
    strings = 0
    parsed = 0  # bytes of arrays parsed since the last yield
    for (start, end, kind), entry in zip(spans, holders):
        parsed += end - start
        if parsed >= SLICE_BYTES:
            parsed = 0
            yield
        if isinstance(kind, Strings):
            strings += len(kind.closes)
            if (entry.get("datatype") != "BYTES" or strings > MAX_BYTES_ELEMENTS
                    or _count(entry.get("shape")) != len(kind.closes)):
                return None  # the whole path's to refuse
            laid_out = yield from strings_layout(memory, start, kind, default_pool().acquire)
            if laid_out is None:
                return None
            entry["data"] = laid_out
            continue
        if entry.get("datatype") not in _NUMERIC:
            return None  # BYTES (whose refusal of numbers is the whole path's), or unknown
        bools = entry["datatype"] == "BOOL"
        if kind is None:
            values = yield from _array(memory, start, end, bools)
        else:
            dims = even_lists(kind)
            if dims is None:
                return None
            values = yield from _nested_array(memory, start, end, kind, dims, bools)
        if values is None:
            return None
        entry["data"] = values
    return document


def _count(shape: Any) -> int | None:
    """The elements of a JSON `shape`, if it is a list of non-negative integers."""
    if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
        return None
    return math.prod(shape)


def _holders(document: Any, count: int) -> list[dict[str, Any]] | None:
    """The inputs whose `data` is placeholder 0, 1, ... in turn; None unless each is found
    exactly once."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, list):
        return None
    indices = {_placeholder(index): index for index in range(count)}
    found: dict[int, dict[str, Any]] = {}
    for entry in inputs:
        data = entry.get("data") if isinstance(entry, dict) else None
        index = indices.get(data) if isinstance(data, str) else None
        if index is not None:
            if index in found:
                return None
            found[index] = entry
    return [found[index] for index in range(count)] if len(found) == count else None


def _array(memory: memoryview, start: int, end: int, bools: bool
           ) -> Generator[None, None, Any]:
    """The flat array memory[start:end] (its brackets included) parsed a slice at a time,
    cut at commas: the values as one numpy array, as numpy makes one of the whole list; None
    when a slice is not JSON or holds a true/false without `bools` (a BOOL input's; the whole
    parse decides those)."""
    octets = np.frombuffer(memory, np.uint8)
    pieces = []
    begin = start + 1
    close = end - 1
    while begin < close:
        cut = min(begin + SLICE_BYTES, close)
        while cut < close:  # on to the next comma, looked for a little at a time
            commas = np.flatnonzero(octets[cut:min(cut + 4096, close)] == _COMMA)
            if commas.size:
                cut += int(commas[0])
                break
            cut = min(cut + 4096, close)
        text = json_text.bracketed(memory, begin, cut)
        try:
            values = json_text.loads(text)
        except (ValueError, RecursionError):
            return None
        if not values or (holds_bool(values) and not bools):
            return None  # an empty slice hides ",,"; true/false are the whole path's to name
        pieces.append(exact_integers(values, np.asarray(values)))
        begin = cut + 1
        if begin < close:  # a whole slice parsed; after the last the caller yields
            yield
    if not pieces or begin != close + 1:
        return None  # no values, or a trailing comma
    return _joined(pieces)
