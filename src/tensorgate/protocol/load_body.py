"""A load request's JSON body decoded a slice at a time: an upload carries the model's files
in base64 strings (`"file:1/model.pt": "<base64>"`), tens of MB the event loop would
otherwise parse and decode in one go while every other client waits.

Parsed whole, a 53 MB body (a 40 MB model) held the loop for about 300 ms: a small binary
request's P99 beside back-to-back uploads was 320 ms (bench/upload_stall_bench.py). Here
each long string (LONG_STRING bytes or more) is found by its quotes, a slice of the body at
a time, and cut out; the rest, with a placeholder string in each one's place, is parsed
whole (it is small), and each placeholder must then be exactly the value of one `file:`
parameter of the body's "parameters"; those strings are decoded from base64 a slice at a
time, with a yield to the loop between slices. Any doubt — a backslash in a long string,
more quotes than an upload has, a placeholder anywhere else — and the body is parsed whole,
as before, so what a body means and every error stays the plain path's own.
"""

from __future__ import annotations

import binascii
import secrets
from collections.abc import Generator
from typing import Any

import numpy as np

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.infer_codec import parse_json

__all__ = ["LONG_STRING", "load_parameters_steps"]

LONG_STRING = 64 << 10  # bytes: a string this long is cut out and decoded in slices
_SCAN_BYTES = 1 << 20  # of body looked through for quotes between two yields (~0.3 ms)
# of base64 decoded between two yields, a multiple of 4: ~1 ms on the AMD machine, 2.4 ms
# (P99 7.7) on the Xeon, timed in the server beside uploads (bench/RESULTS.md, "Model
# uploads beside small requests, looked at again")
_DECODE_CHARS = 1 << 20
_MOST_QUOTES = 4096  # in a body of long strings: more and it is parsed whole (a JSON
# document of many short strings is what the plain path is for)
_MOST_BACKSLASHES = 64  # in a row before a quote
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def load_parameters_steps(body: Any, length: int, decode_files: bool = True
                          ) -> Generator[None, None, dict[str, Any]]:
    """Steps whose result is the load body's "parameters" object ({} for an empty body):
    each long `file:` value already decoded (a bytearray), the others as the JSON had them
    (a `file:` value a str, still base64). InvalidArgumentError as the plain path says it.
    Without `decode_files` (a server that refuses uploads) a long `file:` value is left a
    placeholder string, undecoded and unchecked."""
    if not length:
        return {}
    memory = memoryview(body)[:length]
    spans = (yield from _long_strings(memory)) if length >= LONG_STRING else None
    if not spans:
        return _parameters(parse_json(memory, "the request body"))
    nonce = secrets.token_hex(8)
    pieces: list[bytes | memoryview] = []
    at = 0
    for index, (start, end) in enumerate(spans):
        pieces += [memory[at:start], f"tensorgate-{nonce}-{index}".encode()]
        at = end
    pieces.append(memory[at:])
    parameters = _parameters(parse_json(b"".join(pieces), "the request body"))
    keys = _placed(parameters, nonce, len(spans))
    if keys is None:  # a long string that is not a file's: the plain path's
        return _parameters(parse_json(memory, "the request body"))
    if not decode_files:
        return parameters
    for key, (start, end) in zip(keys, spans):
        parameters[key] = yield from _base64_steps(key, memory[start:end])
    return parameters


def _parameters(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    parameters = document.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("'parameters' of a load request must be a JSON object")
    return parameters


def _long_strings(memory: memoryview) -> Generator[None, None, list[tuple[int, int]] | None]:
    """The (start, end) of each string's text of LONG_STRING bytes or more, in order; None
    when the body is not one to slice (too many quotes, a backslash in a long string)."""
    octets = np.frombuffer(memory, np.uint8)
    spans: list[tuple[int, int]] = []
    opened: int | None = None
    seen = 0
    for first in range(0, len(octets), _SCAN_BYTES):
        quotes = np.flatnonzero(octets[first:first + _SCAN_BYTES] == _QUOTE)
        seen += len(quotes)
        if seen > _MOST_QUOTES:
            return None
        for quote in (quotes + first).tolist():
            backslashes = _backslashes_before(octets, quote)
            if backslashes is None:
                return None
            if backslashes % 2:  # an escaped quote, inside a string
                continue
            if opened is None:
                opened = quote + 1
                continue
            if quote - opened >= LONG_STRING:
                spans.append((opened, quote))
            opened = None
        yield
    for start, end in spans:
        for at in range(start, end, _SCAN_BYTES):
            if (octets[at:min(at + _SCAN_BYTES, end)] == _BACKSLASH).any():
                return None  # an escape in it: JSON's reading of it is not its bytes
            yield
    return spans


def _backslashes_before(octets: np.ndarray, quote: int) -> int | None:
    """How many backslashes stand just before the quote at `quote` (an odd number escapes
    it); None past _MOST_BACKSLASHES, a run no upload's JSON has."""
    count = 0
    while quote - count > 0 and octets[quote - count - 1] == _BACKSLASH:
        count += 1
        if count > _MOST_BACKSLASHES:
            return None
    return count


def _placed(parameters: dict[str, Any], nonce: str, count: int) -> list[str] | None:
    """The `file:` keys whose values are the placeholders 0 .. count-1, in that order; None
    unless each placeholder is exactly one such value."""
    keys: list[str | None] = [None] * count
    prefix = f"tensorgate-{nonce}-"
    for key, value in parameters.items():
        if isinstance(value, str) and value.startswith(prefix):
            index = value[len(prefix):]
            if not (key.startswith("file:") and index.isdecimal() and int(index) < count
                    and keys[int(index)] is None):
                return None
            keys[int(index)] = key
    return None if None in keys else [key for key in keys if key is not None]


def _base64_steps(key: str, text: memoryview) -> Generator[None, None, bytearray]:
    """`text` (base64) decoded a slice at a time; the error decode_base64_file gives."""
    decoded = bytearray()
    for start in range(0, len(text), _DECODE_CHARS):
        try:
            decoded += binascii.a2b_base64(text[start:start + _DECODE_CHARS], strict_mode=True)
        except binascii.Error as error:
            raise InvalidArgumentError(f"load parameter {key!r} is not base64 ({error}): a "
                                       "file's content is sent in base64 over HTTP") from None
        yield
    return decoded
