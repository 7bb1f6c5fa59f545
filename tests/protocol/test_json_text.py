"""JSON text in and out: orjson's speed without losing what the standard library accepted."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.protocol import json_text
from tensorgate.protocol.steps import run_through

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
VALUES = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=5),
    max_leaves=30)


def _same(a: Any, b: Any) -> bool:
    """Equality that takes NaN for NaN and tells 1 from 1.0 and True from 1."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_reads_what_json_reads(value: Any) -> None:
    text = json.dumps(value).encode()  # NaN, Infinity and lone surrogates among them
    assert _same(json_text.loads(text), json.loads(text))
    assert _same(json_text.loads(memoryview(text)), json.loads(text))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.text(alphabet='[]{}",:0123456789.eE+-truefalsnNIiy \\u',
                                         max_size=40).map(str.encode))
def test_refuses_what_json_refuses_with_its_message(data: bytes) -> None:
    try:
        expected: Any = json.loads(data)
    except (ValueError, RecursionError) as error:
        with pytest.raises(type(error)) as raised:
            json_text.loads(data)
        assert str(raised.value) == str(error)
    else:
        got = json_text.loads(data)
        if isinstance(expected, int) and not -(2**63) <= expected < 2**64:
            assert got == float(expected)  # rapidjson's reading, and orjson's
        else:
            assert _same(got, expected)


@pytest.mark.parametrize("text, value", [
    (b"[NaN, Infinity, -Infinity]", [math.nan, math.inf, -math.inf]),  # Triton parses them
    (b'\xef\xbb\xbf{"a": 1}', {"a": 1}),
    # a pair, escaped, after a BOM (json's to read): one character, not a lone surrogate
    (b'\xef\xbb\xbf["\\ud83d\\ude00"]', ["\U0001f600"]),
    (b"[" * 2000 + b"]" * 2000, None),  # deeper than orjson goes: json's RecursionError
])
def test_what_orjson_refuses_json_reads(text: bytes, value: Any) -> None:
    if value is None:
        with pytest.raises(RecursionError):
            json_text.loads(text)
    else:
        assert _same(json_text.loads(text), value)


@pytest.mark.parametrize("text, message", [
    (b'["\\ud800"]', "the string at [0] holds a lone surrogate (\\ud800)"),
    (b'{"inputs": [{"data": ["ok", "a\\udfff"]}]}',
     "the string at inputs[0].data[1] holds a lone surrogate (\\udfff)"),
    (b'{"p": {"k\\udc00": 1}}', "the key p.k\\udc00 holds a lone surrogate (\\udc00)"),
    (b'"\xed\xa0\x80"', "the string at the top holds a lone surrogate (\\ud800)"),
    (b'[NaN, "\\ud83d"]', "the string at [1] holds a lone surrogate (\\ud83d)"),
])
def test_a_lone_surrogate_is_refused_naming_where_it_is(text: bytes, message: str) -> None:
    """`json` lets \\ud800 escapes (and a surrogate's UTF-8 bytes) through into text UTF-8
    cannot encode; rapidjson refuses them, and so does the server, saying where."""
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}, which is not valid Unicode$"):
        json_text.loads(text)


_WITH_SURROGATES = st.recursive(
    st.text(st.characters(categories=["Cs", "Ll", "So"]), max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(st.characters(categories=["Cs", "Ll"]), max_size=3), inner, max_size=4),
    max_leaves=12)


def _all_encode(value: Any) -> bool:
    if isinstance(value, str):
        return _encodes(value)
    if isinstance(value, list):
        return all(map(_all_encode, value))
    if isinstance(value, dict):
        return all(_encodes(key) and _all_encode(item) for key, item in value.items())
    return True


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(value=_WITH_SURROGATES, ascii_only=st.booleans())
def test_text_is_refused_exactly_when_it_holds_a_lone_surrogate(value: Any,
                                                                 ascii_only: bool) -> None:
    """Escaped or as (surrogate-passing) UTF-8 bytes: what json reads is read when all of
    its strings can be encoded, and refused when one cannot (a high surrogate then a low one,
    escaped, are one character)."""
    text = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    read = json.loads(text)
    if _all_encode(read):
        assert json_text.loads(text) == read
    else:
        with pytest.raises(ValueError, match="holds a lone surrogate"):
            json_text.loads(text)


def _first_in_order(value: Any, path: str = "") -> str | None:
    """The message for the first lone surrogate in document order, found the plain way."""
    if isinstance(value, str):
        for char in value:
            if not _encodes(char):
                return f"the string at {path or 'the top'} holds a lone surrogate " \
                       f"({ascii(char)[1:-1]})"
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_in_order(item, f"{path}[{index}]")
            if found:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            named = f"{path}.{ascii(key)[1:-1]}" if path else ascii(key)[1:-1]
            for char in key:
                if not _encodes(char):
                    return f"the key {named} holds a lone surrogate ({ascii(char)[1:-1]})"
            found = _first_in_order(item, named)
            if found:
                return found
    return None


@settings(max_examples=300, deadline=None)
@given(value=_WITH_SURROGATES, big=st.booleans(), deep=st.booleans())
def test_the_first_lone_surrogate_in_the_text_is_the_one_named(value: Any, big: bool,
                                                              deep: bool) -> None:
    """Found by halving, orjson telling which halves hold one, or, where orjson will not
    write a value (an integer past 64 bits, 300 nested lists), a level at a time: the
    first in document order either way, named by its path."""
    if big:
        value = [2**70, value]
    if deep:
        for _ in range(300):
            value = [value]
    text = json.dumps(value).encode("utf-8", "surrogatepass")
    expected = _first_in_order(json.loads(text))
    if expected is None:
        json_text.loads(text)
    else:
        with pytest.raises(ValueError) as refused:
            json_text.loads(text)
        assert str(refused.value) == f"{expected}, which is not valid Unicode"


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int16", "int32",
                                   "int64", "uint8", "uint16", "uint32", "uint64", "bool"])
def test_arrays_are_written_so_they_read_back_exactly(dtype: str) -> None:
    rng = np.random.default_rng(1)
    if dtype == "bool":
        array = rng.integers(0, 2, 64).astype(bool)
    elif dtype.startswith("float"):
        array = np.concatenate([rng.standard_normal(60) * 1e3, [1 / 3, 1e-7, 0.0, -0.0]])
        array = array.astype(dtype)
        if dtype == "float32":
            array[-5] = np.finfo(np.float32).smallest_subnormal
    else:
        info = np.iinfo(dtype)
        ends = np.array([info.min, info.max], dtype=dtype)
        array = np.concatenate([ends, rng.integers(info.min, info.max, 62, dtype=dtype)])
    text = json_text.dumps({"data": array, "one": array[3]})
    back = json.loads(text)
    assert np.array(back["data"], dtype=dtype).tobytes() == array.tobytes()
    assert np.array(back["one"], dtype=dtype) == array[3]


def test_non_finite_floats_are_written_as_triton_writes_them() -> None:
    array = np.array([1.5, np.nan, np.inf, -np.inf], dtype=np.float32)
    assert not json_text.finite(array) and not json_text.finite({"a": [0.5, math.inf]})
    assert json_text.finite(np.arange(3)) and json_text.finite(np.zeros(0, np.float32))
    assert json_text.finite({"a": [0.5, "x", None, {"b": 2}]})
    assert json_text.dumps({"data": array}, all_finite=False) == (
        b'{"data":[1.5,NaN,Infinity,-Infinity]}')
    assert json_text.dumps({"data": array}) == b'{"data":[1.5,null,null,null]}'  # orjson's


def test_an_integer_beyond_64_bits_is_still_written() -> None:
    assert json_text.dumps({"p": 2**70, "data": np.arange(2)}) == (
        b'{"p":1180591620717411303424,"data":[0,1]}')


# strings made mostly of what marks_over must not count inside a string, and of escapes
_MARKED_TEXT = st.text(alphabet=st.sampled_from('{}[],:"\\/ a\n\u00e9\U0001f600'), max_size=12)
_MARKED = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _MARKED_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_MARKED_TEXT, inner,
                                                                 max_size=5),
    max_leaves=30)


def _marks(value: Any) -> int:
    """The `{`, `[`, `,` and `:` that JSON text of `value` has outside its strings."""
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(map(_marks, value))
    if isinstance(value, dict):
        return 1 + max(len(value) - 1, 0) + len(value) + sum(map(_marks, value.values()))
    return 0


@settings(max_examples=400, deadline=None)
@given(value=_MARKED, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_marks_are_counted_outside_strings_exactly(value: Any, ascii_only: bool,
                                                   indent: int | None) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    marks = _marks(value)
    assert not json_text.marks_over(text, marks)
    if marks:
        assert json_text.marks_over(memoryview(text), marks - 1)


def test_marks_are_counted_across_the_pieces_of_a_long_text() -> None:
    """Strings and escapes that straddle the pieces the count reads at a time (1 MiB each:
    4 MiB is one of their ends)."""
    for fill in range((4 << 20) - 8, (4 << 20) + 1):
        value = ["a" * fill + '\\"{[,:' * 4, "\\" * 7 + "," * 5, [1, 2], {"k": "\\"}]
        text = json.dumps(value).encode()
        assert json_text.marks_over(text, _marks(value) - 1)
        assert not json_text.marks_over(text, _marks(value))


@pytest.mark.parametrize("shift", [0, 1, 2, 3])
def test_a_long_run_of_backslashes_is_counted_a_piece_at_a_time(shift: int) -> None:
    """Runs of backslashes longer than a piece (1 MiB), even and odd, each before a quote
    and marks: counted exactly, and the count outside strings (the commas inside the first
    put the quick count over) yields a turn for each MiB of them."""
    value = ["," * (1 << 20), "a" * shift + "\\" * (3 << 19) + '"{,', "\\" * (5 << 18) + ",",
             [1, 2]]
    text = json.dumps(value).encode()  # each backslash written as two: runs of 3 and 2.5 MiB
    assert json_text.marks_over(text, _marks(value) - 1)
    assert not json_text.marks_over(text, _marks(value))
    steps = json_text.marks_over_steps([text], _marks(value))
    turns = 0
    try:
        while True:
            next(steps)
            turns += 1
    except StopIteration as done:
        assert done.value is False
    assert turns >= len(text) // (1 << 20)


@settings(max_examples=300, deadline=None)
@given(value=_MARKED, cuts=st.lists(st.integers(0, 1 << 16), max_size=4))
def test_marks_are_counted_over_texts_as_over_their_join(value: Any, cuts: list[int]) -> None:
    """json_slices counts a body's parts around the arrays it cut out, in steps, without
    joining them: the same count as the joined text's, wherever the cuts fall between
    characters (a cut never parts a backslash from what it escapes)."""
    text = json.dumps(value).encode()
    marks = _marks(value)
    ends = sorted({min(c, len(text)) for c in cuts})
    ends = [e for e in ends if not text[:e].endswith(b"\\")]
    parts = [text[a:b] for a, b in zip([0, *ends], [*ends, len(text)])]
    assert not run_through(json_text.marks_over_steps(parts, marks))
    if marks:
        assert run_through(json_text.marks_over_steps(parts, marks - 1))
