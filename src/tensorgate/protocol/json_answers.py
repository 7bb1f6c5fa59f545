"""A large V2 JSON answer written a slice at a time, so that the event loop serves other
connections in between (json_slices does the same for requests).

Writing the answer of identity [4,3,224,224] as JSON held the loop 12 ms in one go, and a
BYTES output of a million strings 290 ms (decoded, made str, written). encode_infer_response
writes the header with a placeholder string where each large array goes; each array is then
written a slice at a time, by the same writer, where its placeholder stood. NaN and
infinities are written whole, as json writes them.
"""

from __future__ import annotations

import secrets
from collections.abc import Generator
from typing import Any

import numpy as np

from tensorgate.protocol import json_text
from tensorgate.protocol.infer_codec import encode_infer_response
from tensorgate.protocol.json_tensors import json_data, json_strings
from tensorgate.tensor.bytes_codec import bytes_pieces
from tensorgate.tensor.view import TensorView

__all__ = ["LARGE_BYTES", "SLICE_BYTES", "encode_in_slices", "large_json_outputs"]

SLICE_BYTES = 256 << 10  # of array text written between two yields (~1 ms)
LARGE_BYTES = 512 << 10  # numeric outputs from this size are written in slices
# A BYTES output of this many strings is written as JSON in slices of _STRINGS_A_STEP: a
# million took the loop 290 ms in one go (decoded, made str, written)
_STRINGS_SLICED = 16_384
_STRINGS_A_STEP = 8192
_NONCE = secrets.token_hex(8)  # placeholders a model cannot write by chance


def _placeholder(index: int) -> str:
    return f"\x00tensorgate-{_NONCE}-{index}"


def large_json_outputs(outputs: dict[str, TensorView], binary: dict[str, bool],
                       in_shm: dict[str, tuple[str, int, int]] | None = None) -> bool:
    """Whether an answer has an output that encode_in_slices would write in slices (else
    encode_infer_response writes it as well, with nothing made for the slices)."""
    for name, view in outputs.items():
        if _large_json(name, view, binary, in_shm):
            return True
    return False


def _large_json(name: str, view: TensorView, binary: dict[str, bool],
                in_shm: dict[str, tuple[str, int, int]] | None) -> bool:
    if binary.get(name, False) or (in_shm and name in in_shm):
        return False
    if view.datatype.is_bytes:
        return view.count >= _STRINGS_SLICED
    return view.nbytes >= LARGE_BYTES and view.datatype.numpy is not None


def encode_in_slices(model: str, version: int, request_id: str,
                     outputs: dict[str, TensorView], binary: dict[str, bool],
                     parameters: dict[str, Any] | None = None,
                     in_shm: dict[str, tuple[str, int, int]] | None = None
                     ) -> Generator[None, None, tuple[list[Any], list[memoryview]]]:
    """encode_infer_response's (header, tensor views), with the header as parts: each large
    finite JSON array written a slice at a time (a yield between slices) where its
    placeholder stood."""
    arrays: dict[str, np.ndarray | TensorView] = {}
    for name, view in outputs.items():
        if _large_json(name, view, binary, in_shm):
            if view.datatype.is_bytes:
                arrays[name] = view  # its strings decoded a piece at a time
                continue
            values = json_data(view)
            if isinstance(values, np.ndarray) and json_text.finite(values):
                arrays[name] = values  # NaN and infinities are json's to write, whole
    stand_ins = {name: _placeholder(index) for index, name in enumerate(arrays)}
    head, tail = encode_infer_response(model, version, request_id, outputs, binary,
                                       parameters, in_shm, placeholders=stand_ins)
    if not arrays:
        return [head], tail
    marks = [json_text.dumps(stand_in) for stand_in in stand_ins.values()]
    if any(head.count(mark) != 1 for mark in marks):  # never, unless a model wrote one
        head, tail = encode_infer_response(model, version, request_id, outputs, binary,
                                           parameters, in_shm)
        return [head], tail
    parts: list[Any] = []
    whole = memoryview(head)
    done = 0  # of head, in parts already
    step = max(1, SLICE_BYTES // 8)  # elements: about 8 bytes of text each, or fewer
    for mark, array in zip(marks, arrays.values()):
        at = head.find(mark, done)
        parts += [whole[done:at], b"["]
        if isinstance(array, TensorView):
            pieces = bytes_pieces(array.memoryview(), 0, array.nbytes, array.count,
                                  _STRINGS_A_STEP, array.name)
            for index, piece in enumerate(pieces):
                text = json_text.dumps(json_strings(piece))
                parts += [b"," if index else b"", memoryview(text)[1:-1]]
                yield
        else:
            for begin in range(0, array.size, step):
                text = json_text.dumps(array[begin:begin + step])
                parts += [b"," if begin else b"", memoryview(text)[1:-1]]
                yield
        parts.append(b"]")
        done = at + len(mark)
    parts.append(whole[done:])
    return parts, tail

