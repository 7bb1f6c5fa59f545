"""Tensors in JSON: a request's `data` read into an array of its datatype, checked as
Triton checks it (of the datatype's kind, within its range, as many elements as its shape
holds; that copy counted), and an output's `data` as JSON writes it (infer_codec.py,
json_slices.py, generate_codec.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgate.errors import InvalidArgumentError
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.dtypes import DataType
from tensorgate.tensor.view import TensorView

__all__ = ["EncodedStrings", "exact_integers", "holds_bool", "json_data", "json_strings",
           "json_tensor"]


@dataclass(frozen=True)
class EncodedStrings:
    """A BYTES input's JSON `data` already in the BYTES layout (json_strings parses a large
    array of strings so, a slice at a time): `nbytes` of `buffer`, `count` elements."""
    buffer: Any
    nbytes: int
    count: int


def json_tensor(data: Any, dt: DataType, shape: tuple[int, ...], name: str,
                 ledger: CopyLedger) -> TensorView:
    count = 1
    for dim in shape:
        count *= dim
    if isinstance(data, EncodedStrings):  # json_slices makes them for BYTES inputs only
        if data.count != count:
            raise _data_count(name, data.count, shape, count)
        record_copy(data.nbytes, "encode", ledger)
        return TensorView(data.buffer, dt, shape, nbytes=data.nbytes, name=name, ledger=ledger)
    if dt.is_bytes:
        values = np.array(data, dtype=object).reshape(-1) if data != [] else np.empty(0, object)
    elif dt.numpy is None:
        raise InvalidArgumentError(
            f"input '{name}': {dt.name} cannot travel as JSON; send it as binary data")
    else:
        values = _json_numbers(data, np.dtype(dt.numpy), dt.name, name)
    if values.size != count:
        raise _data_count(name, values.size, shape, count)
    if dt.is_bytes:
        texts = values.tolist()
        if not all(isinstance(v, str) for v in texts):
            raise InvalidArgumentError(f"input '{name}': BYTES 'data' must hold strings")
        # json_text refuses lone surrogates: every string encodes
        items = np.array([v.encode() for v in texts], dtype=object).reshape(shape)
        return TensorView.from_numpy(items, name=name, ledger=ledger)
    record_copy(values.nbytes, "decode", ledger)
    return TensorView.from_numpy(values.reshape(shape), name=name, ledger=ledger)


def _data_count(name: str, found: int, shape: tuple[int, ...], count: int
                ) -> InvalidArgumentError:
    return InvalidArgumentError(f"input '{name}': 'data' has {found} elements; shape "
                                f"[{','.join(map(str, shape))}] needs {count}")


# What each kind of datatype takes from JSON, by the numpy kind of the array JSON's values
# make: BOOL only true/false; integers only integers (1.5 is not silently 1); floats any
# number. Never strings: numpy would parse "1.5", and make "false" True.
_JSON_KINDS = {"b": ("b", "true or false"), "i": ("iu", "integers"), "u": ("iu", "integers"),
               "f": ("iuf", "numbers")}


def _json_numbers(data: Any, target: np.dtype[Any], datatype: str, name: str) -> np.ndarray:
    """The flat array of a JSON `data` list for a numeric datatype, its values checked as
    Triton checks them: of the datatype's kind and within its range."""
    try:
        found = np.asarray(data)
    except ValueError:  # ragged nesting
        raise InvalidArgumentError(
            f"input '{name}': 'data' is not a flat list or evenly nested lists of "
            "values") from None
    kinds, wanted = _JSON_KINDS[target.kind]
    if found.dtype.kind in "fO" and target.kind in "iu":
        # numpy makes floats of integers that no one integer type holds together ([0,
        # 2**64 - 1]) and objects of those past 64 bits: a UINT64 input's large values
        # were refused as fractions. Integers all, they are read as the datatype's own.
        found = _json_integers(data, found, target, datatype, name)
    elif found.dtype.kind == "O" and isinstance(data, np.ndarray):
        found = np.asarray(data.tolist())  # exact_integers' objects, read as whole lists are
    if found.size and found.dtype.kind not in kinds:
        raise InvalidArgumentError(
            f"input '{name}': {datatype} 'data' must hold {wanted}; it holds "
            f"{_json_kind(found)}")
    if target.kind != "b" and found.dtype.kind in "iuf" and holds_bool(data):
        # numpy reads [false, 0] as integers: true/false would pass as 1/0 (Triton refuses)
        raise InvalidArgumentError(
            f"input '{name}': {datatype} 'data' must hold {wanted}; it holds "
            "true/false among them")
    if found.size and target.kind in "iu":
        info = np.iinfo(target)
        low, high = found.min(), found.max()
        if low < info.min or high > info.max:
            raise InvalidArgumentError(
                f"input '{name}': {datatype} holds [{info.min}, {info.max}]; 'data' "
                f"has {low if low < info.min else high}")
    try:
        with np.errstate(over="raise"):  # 1e300 as FP32 would be inf: refuse it
            return found.astype(target, copy=False).reshape(-1)
    except FloatingPointError:
        raise InvalidArgumentError(
            f"input '{name}': 'data' has a value too large for {datatype}") from None


def _json_integers(data: Any, found: np.ndarray, target: np.dtype[Any], datatype: str,
                   name: str) -> np.ndarray:
    """`data` as an array of integer type `target` when every value in it is a JSON integer
    (`found`, numpy's own reading, otherwise), its range checked. `data` is the parsed
    lists, or json_slices' array of them (objects where exact_integers kept them)."""
    if isinstance(data, np.ndarray):
        flat = data.ravel().tolist() if data.dtype.kind == "O" else None
        if flat is not None and not all(type(v) is int for v in flat):
            flat = None
    else:
        flat = _integer_leaves(data)
    if flat is None:
        return found
    info = np.iinfo(target)
    outside = next((v for v in flat if not info.min <= v <= info.max), None)
    if outside is not None:
        raise InvalidArgumentError(
            f"input '{name}': {datatype} holds [{info.min}, {info.max}]; 'data' has "
            f"{outside}")
    return np.array(flat, dtype=target).reshape(found.shape)


def _integer_leaves(data: Any) -> list[int] | None:
    """The values of JSON `data` (nested lists) in order when all are integers, else None:
    it stops at the first that is not, having copied no list (a stack of iterators: deep
    nesting is no recursion)."""
    flat: list[int] = []
    levels = [iter((data,))]
    while levels:
        for item in levels[-1]:
            if type(item) is list:
                levels.append(iter(item))
                break
            if type(item) is not int:
                return None
            flat.append(item)
        else:
            levels.pop()
    return flat


def exact_integers(values: Any, read: np.ndarray) -> np.ndarray:
    """numpy's reading `read` of JSON `values`, or, where numpy made floats of integers that
    no one integer type holds together ([0, 2**64 - 1]), those integers as exact objects:
    a slice of a UINT64 input is not rounded before its datatype is known. numpy reads
    integers as floats only when one is past int64's largest: below it, floats are what
    came, and the slice is not walked (an FP32 tensor's slices cost one max each)."""
    if read.dtype.kind != "f" or not read.size or not read.max() >= 2.0**63:
        return read
    flat = _integer_leaves(values)
    return read if flat is None else np.array(flat, dtype=object).reshape(read.shape)


def holds_bool(data: Any) -> bool:
    """Whether JSON `data` (nested lists) has a true/false anywhere; about 12 ns an element,
    a twentieth of what parsing the JSON took."""
    if not isinstance(data, list):
        return type(data) is bool
    kinds = set(map(type, data))
    return bool in kinds or (list in kinds and any(holds_bool(item) for item in data
                                                    if type(item) is list))


def _json_kind(values: np.ndarray) -> str:
    kind = values.dtype.kind
    if kind == "b":
        return "true/false"
    if kind == "f":
        return "numbers written with a fraction or an exponent, or integers beyond 64 bits"
    if kind in "iu":
        return "integers"
    if kind in "US":
        return "strings"
    return "values of other types (null, objects or numbers beyond 64 bits)"


def json_strings(items: list[bytes]) -> list[str]:
    """BYTES elements as JSON writes them: UTF-8, what is not replaced by U+FFFD."""
    return [item.decode("utf-8", "replace") for item in items]


def json_data(view: TensorView) -> np.ndarray | list[str]:
    """An output's `data`: its elements flat, as json_text.dumps writes them without making
    a Python object of each (C-contiguous, native byte order); BYTES as strings."""
    dt = view.datatype
    if dt.is_bytes:
        return json_strings(view.numpy().reshape(-1).tolist())
    if dt.numpy is None:
        raise InvalidArgumentError(
            f"output '{view.name}' is {dt.name}, which cannot travel as JSON; request "
            "it with binary_data")
    values = np.ascontiguousarray(view.numpy().reshape(-1))
    return values if values.dtype.isnative else values.astype(values.dtype.newbyteorder("="))
