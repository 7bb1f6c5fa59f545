"""A BYTES input's strings parsed a slice at a time into the BYTES layout mean exactly what
they mean parsed whole: the same elements, or the same refusal, whatever the strings hold
(quotes, backslashes, brackets, commas, lone surrogates) and wherever a window of the scan
or a slice ends. Windows and slices are made tiny so that small bodies cut into many."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.protocol import json_slices, json_strings
from tensorgate.protocol.json_slices import worth_slicing
from tensorgate.protocol.json_strings import string_array
from tests.protocol.sliced_and_whole import both


@pytest.fixture(autouse=True)
def tiny_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_slices, "SLICE_BYTES", 16)
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 8)
    monkeypatch.setattr(json_strings, "SCAN_BYTES", 5)
    monkeypatch.setattr(json_strings, "SLICE_BYTES", 12)
    monkeypatch.setattr(json_strings, "STRINGS_A_STEP", 3)


# what makes a string's text hard to cut: escaped quotes and backslashes in runs, the
# array's own marks, a string that ends in a comma, lone surrogates, characters of 2-4 bytes
_PIECES = st.sampled_from(['"', "\\", "\\\\", '\\"', ",", '","', "[", "]", " ", "\n", "a",
                           "é", "€", "😀", "\x00", "data", '"data": ['])


@st.composite
def _string(draw: Any) -> str:
    """Mostly a string of hard pieces; now and then one with a lone surrogate."""
    if draw(st.integers(0, 60)) == 0:
        return draw(st.sampled_from(["\ud800", "a\udfff"]))
    return "".join(draw(st.lists(_PIECES, max_size=6)))


@st.composite
def _element(draw: Any) -> Any:
    """Mostly a string; now and then a value that is not one."""
    if draw(st.integers(0, 60)) == 0:
        return draw(st.sampled_from([1, 2.5, None, True, [], ["a"], {"a": "b"}]))
    return draw(_string())


@st.composite
def _bodies(draw: Any) -> bytes:
    inputs = []
    for index in range(draw(st.integers(1, 2))):
        strings = draw(st.booleans())
        data = draw(st.lists(_string() if strings else _element(), max_size=30))
        shape = [len(data) + draw(st.sampled_from([0] * 8 + [1, -1]))]
        inputs.append({"name": f"s{index}",
                       "datatype": draw(st.sampled_from(["BYTES"] * 9 + ["FP32"])),
                       "shape": shape, "data": data})
    text = json.dumps({"inputs": inputs}, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    changes = st.lists(st.tuples(st.integers(0, 10_000),
                                 st.sampled_from([",", "[", "]", '"', "\\", " ", ""])),
                       min_size=1, max_size=2)
    for where, what in draw(st.one_of(st.just([]), st.just([]), changes)):
        where %= len(text) + 1
        text = text[:where] + what + text[where + (what == ""):]  # insert, or delete one
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=1500, deadline=None)
@given(body=_bodies())
def test_strings_sliced_and_whole_mean_the_same(body: bytes) -> None:
    sliced, whole, _ = both(body)
    assert sliced == whole


@st.composite
def _nested_bodies(draw: Any) -> bytes:
    """A BYTES input's strings as `x.tolist()` sends them, evenly nested lists of 2 to 4
    levels, or made uneven: a list longer than the others, a string (or an empty list) at
    a level above the innermost, an empty innermost list."""
    dims = draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))
    flat = draw(st.lists(_string(), min_size=math.prod(dims), max_size=math.prod(dims)))
    data = np.array(flat + [""], dtype=object)[:-1].reshape(dims).tolist()
    change = draw(st.sampled_from(["none", "none", "none", "longer", "above", "empty"]))
    if change != "none":
        inner = data
        for _ in range(draw(st.integers(0, len(dims) - 2))):
            inner = inner[-1]
        inner.append({"longer": inner[0], "above": "x", "empty": []}[change]
                     if change != "longer" or isinstance(inner[0], list) else "y")
    shape = [len(flat) + draw(st.sampled_from([0, 0, 0, 1]))]
    return json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": shape,
                                   "data": data}]},
                      ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@settings(max_examples=800, deadline=None)
@given(body=_nested_bodies())
def test_nested_strings_sliced_and_whole_mean_the_same(body: bytes) -> None:
    sliced, whole, _ = both(body)
    assert sliced == whole


@pytest.mark.parametrize("data", [
    [["a"], ["b", "c", "d"]],          # as many strings in all as two lists of two
    [["a", "b"], ["c"], ["d", "e", "f"]],
    [[["a", "b"], ["c", "d"]], [["e"], ["f", "g", "h"]]],
    [["a", "b"], "c", ["d"]],
    [[], ["a", "b"]],
])
def test_uneven_nested_strings_are_refused_as_whole(data: list[Any]) -> None:
    """Lists of the same total but not one width, strings above the innermost lists, an
    empty list: numpy makes no shape of them, and the whole path refuses them."""
    count = len(json.dumps(data).split('"')) // 2
    body = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [count],
                                   "data": data}]}).encode()
    sliced, whole, _ = both(body)
    assert sliced == whole and sliced[0] == "refused"


def test_nested_strings_are_laid_out_in_row_major_order_in_many_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """[100, 3] strings as x.tolist() sends them: sliced (many turns), in row-major order."""
    monkeypatch.setattr(json_strings, "SCAN_BYTES", 1 << 20)
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 1 << 20)
    values = np.array([f"r{row}c{col} [\"]" for row in range(100) for col in range(3)],
                      dtype=object).reshape(100, 3)
    body = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [300],
                                   "data": values.tolist()}]}).encode()
    sliced, whole, turns = both(body)
    assert sliced == whole and sliced[0] == "decoded"
    assert turns >= 90
    assert sliced[2]["t"][2] == repr([v.encode() for v in values.reshape(-1)])


@pytest.mark.parametrize("window", [1, 2, 3, 5, 64])
def test_every_string_of_an_array_is_found_wherever_windows_end(
        monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    """Backslash runs and escaped quotes across the scan's windows: the closing quotes it
    finds are the strings' own, and its end the array's `]`."""
    monkeypatch.setattr(json_strings, "SCAN_BYTES", window)
    values = ["\\", '"', '\\"', "\\\\\\", "]", "[", ",", '","', "x\\\\", ""]
    text = json.dumps(values).encode()
    found = _finish(string_array(np.frombuffer(text, np.uint8), 0, 100))
    assert found is not None and found.end == len(text) - 1
    # each string ends at its closing quote: the text up to it parses as that many strings
    for count, close in enumerate(found.closes.tolist(), start=1):
        assert json.loads(text[:close + 1] + b"]") == values[:count]


def _finish(steps: Any) -> Any:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def test_nested_or_too_many_strings_are_not_taken() -> None:
    assert _finish(string_array(np.frombuffer(b'["a", ["b"]]', np.uint8), 0, 100)) is None
    assert _finish(string_array(np.frombuffer(b'["a", "b"', np.uint8), 0, 100)) is None
    assert _finish(string_array(np.frombuffer(b'["a", "b", "c"]', np.uint8), 0, 2)) is None


def test_many_strings_are_laid_out_in_many_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a vacuous equivalence: the strings are parsed in slices (a yield between), and
    what they make is the elements, as bytes, in order. (Looked through at once for the
    array's end, so that the turns counted are the slices'.)"""
    monkeypatch.setattr(json_strings, "SCAN_BYTES", 1 << 20)
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 1 << 20)
    values = [f"token {index} \"quoted\" \\ é" for index in range(300)]
    body = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [3, 100],
                                   "data": values}]}).encode()
    sliced, whole, turns = both(body)
    assert sliced == whole and sliced[0] == "decoded"
    assert turns >= 100  # 300 strings, 3 a step
    assert sliced[2]["t"][1] == (3, 100)
    assert sliced[2]["t"][2] == repr(np.array([v.encode() for v in values], dtype=object)
                                     .reshape(3, 100).tolist())


@pytest.mark.parametrize(("data", "shape", "refusal"), [
    (["ok"] * 40 + ["\ud800"], [41], "the string at inputs[0].data[40] holds a lone surrogate"),
    (["ok"] * 40 + [7], [41], "BYTES 'data' must hold strings"),
    (["ok"] * 40, [41], "'data' has 40 elements; shape [41] needs 41"),
])
def test_a_bad_string_array_is_refused_as_whole(data: list[Any], shape: list[int],
                                                refusal: str) -> None:
    body = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": shape,
                                   "data": data}]}).encode()
    sliced, whole, _ = both(body)
    assert sliced == whole and sliced[0] == "refused" and refusal in sliced[2]


def test_a_body_under_the_large_size_is_sliced_when_it_holds_many_strings() -> None:
    """160,000 empty strings are 469 KiB of JSON, under json_slices.LARGE_BYTES: worth
    slicing (decoded whole they held the loop 39 ms); as many numbers are not, nor is a
    binary body whose tensor bytes are quotes."""
    strings = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [160_000],
                                      "data": [""] * 160_000}]},
                         separators=(",", ":")).encode()
    numbers = strings.replace(b'""', b"0")
    assert len(strings) < json_slices.LARGE_BYTES
    assert worth_slicing(strings, len(strings), None)
    assert not worth_slicing(numbers, len(numbers), None)
    head = json.dumps({"inputs": [{"name": "t", "datatype": "UINT8", "shape": [100_000],
                                   "parameters": {"binary_data_size": 100_000}}]}).encode()
    assert not worth_slicing(head + b'"' * 100_000, len(head) + 100_000, len(head))
