"""A large JSON body decoded a slice at a time means exactly what it means decoded whole:
the same arrays, or the same refusal; a large JSON answer written a slice at a time is the
same bytes. Slices are made tiny here so that small generated bodies cut into many."""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.errors import BytesElementError
from tensorgate.protocol import json_answers, json_slices
from tensorgate.protocol.infer_codec import (MAX_JSON_VALUES, encode_infer_response)
from tensorgate.protocol.json_answers import encode_in_slices
from tests.protocol.sliced_and_whole import both, run_steps
from tensorgate.tensor.view import TensorView


@pytest.fixture(autouse=True)
def tiny_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_slices, "SLICE_BYTES", 16)
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 8)
    monkeypatch.setattr(json_slices, "LARGE_BYTES", 64)
    monkeypatch.setattr(json_answers, "SLICE_BYTES", 16)
    monkeypatch.setattr(json_answers, "LARGE_BYTES", 64)


_VALUES = st.one_of(st.integers(-300, 300), st.floats(allow_nan=True, allow_infinity=True,
                                                       width=32),
                    st.integers(-(1 << 70), 1 << 70), st.booleans(), st.none(),
                    st.just("7"))
_DATATYPES = st.sampled_from(["FP32", "FP64", "FP16", "INT8", "INT32", "INT64", "UINT8",
                              "UINT64", "BOOL", "BYTES"])


_TAIL = b"\x01\x02\x03\x04"  # a binary input's bytes after the JSON


@st.composite
def _bodies(draw: Any) -> tuple[bytes, int | None]:
    """An all-JSON body, or JSON and a binary input's bytes (and the JSON's length)."""
    inputs: list[dict[str, Any]] = []
    binary = draw(st.booleans())
    if binary:
        inputs.append({"name": "raw", "datatype": "UINT8", "shape": [4],
                       "parameters": {"binary_data_size": 4}})
    for index in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["numbers", "ints", "mixed", "nested", "deep", "uneven"]))
        count = draw(st.integers(0, 60))
        if kind == "numbers":
            data: Any = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=count,
                                      max_size=count))
        elif kind == "ints":
            data = draw(st.lists(st.integers(-1000, 1000), min_size=count, max_size=count))
        elif kind == "mixed":
            data = draw(st.lists(_VALUES, min_size=count, max_size=count))
        elif kind == "nested":
            data = [[draw(st.integers(0, 9)) for _ in range(3)] for _ in range(count // 3)]
            count = len(data) * 3
        else:  # evenly nested lists of 2 to 4 levels, then for "uneven" one list changed
            dims = draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))
            flat = draw(st.lists(_VALUES if draw(st.booleans()) else st.integers(-9, 9),
                                 min_size=math.prod(dims), max_size=math.prod(dims)))
            data = np.array(flat, dtype=object).reshape(dims).tolist()
            count = len(flat)
            if kind == "uneven":
                inner = data
                for _ in range(draw(st.integers(0, len(dims) - 2))):
                    inner = inner[0]
                inner.append(draw(st.sampled_from([1, [1], [], [[1]], inner[0]])))
        shape = [count + draw(st.sampled_from([0, 0, 0, 1]))]
        inputs.append({"name": f"in{index}", "datatype": draw(_DATATYPES), "shape": shape,
                       "data": data})
    document = {"id": draw(st.sampled_from(["", "r1", '"data": [1,2]'])), "inputs": inputs}
    text = json.dumps(document, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    for where, what in draw(st.lists(st.tuples(st.integers(0, 10_000),
                                               st.sampled_from([",", "[", "]", "\"", " ", "",
                                                                "1", "-", "true"])),
                                     max_size=2)):
        where %= len(text) + 1
        text = text[:where] + what + text[where + (what == ""):]  # insert, or delete one
    return (text.encode() + _TAIL, len(text.encode())) if binary else (text.encode(), None)


@settings(max_examples=800, deadline=None)
@given(body=_bodies())
def test_sliced_and_whole_decoding_mean_the_same(body: tuple[bytes, int | None]) -> None:
    sliced, whole, _ = both(*body)
    assert sliced == whole


def test_a_large_flat_array_is_parsed_in_many_slices() -> None:
    """Not a vacuous equivalence: the arrays are cut, and yield between their slices."""
    values = np.linspace(-3, 3, 500, dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [500],
                                   "data": values.tolist()}]}).encode()
    sliced, whole, count = both(body)
    assert sliced == whole and sliced[0] == "decoded"
    assert count > 100  # 500 numbers in slices of 16 bytes of text
    assert np.frombuffer(sliced[2]["x"][2], np.float32).tolist() == values.tolist()


def test_a_bool_array_is_parsed_in_many_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BOOL input's true/false, flat or nested, are read in slices as numbers are; a
    number among them is refused as whole. (Looked through at once for its end, so that
    the turns counted are the slices'.)"""
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 1 << 20)
    values = np.arange(480) % 3 == 0
    for data in (values.tolist(), values.reshape(4, 12, 10).tolist()):
        body = json.dumps({"inputs": [{"name": "x", "datatype": "BOOL", "shape": [480],
                                       "data": data}]}).encode()
        sliced, whole, count = both(body)
        assert sliced == whole and sliced[0] == "decoded"
        assert count > 40
        assert np.frombuffer(sliced[2]["x"][2], np.bool_).tolist() == values.tolist()
    body = json.dumps({"inputs": [{"name": "x", "datatype": "BOOL", "shape": [481],
                                   "data": values.tolist() + [1]}]}).encode()
    sliced, whole, _ = both(body)
    assert sliced == whole and "must hold true or false" in sliced[2]


def test_the_json_before_binary_tensors_is_parsed_in_slices() -> None:
    """A request with a binary input and a large JSON one: the JSON's arrays in slices."""
    values = np.linspace(-3, 3, 500, dtype=np.float32)
    head = json.dumps({"inputs": [
        {"name": "raw", "datatype": "UINT8", "shape": [4],
         "parameters": {"binary_data_size": 4}},
        {"name": "x", "datatype": "FP32", "shape": [500], "data": values.tolist()}]}).encode()
    sliced, whole, count = both(head + _TAIL, len(head))
    assert sliced == whole and sliced[0] == "decoded"
    assert count > 100
    assert np.frombuffer(sliced[2]["x"][2], np.float32).tolist() == values.tolist()
    assert sliced[2]["raw"][2] == _TAIL


def _real_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_slices, "SLICE_BYTES", 256 << 10)
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 1 << 20)
    monkeypatch.setattr(json_slices, "LARGE_BYTES", 512 << 10)


def test_more_json_values_than_the_limit_are_refused_unless_numbers_in_data(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What is parsed whole holds at most MAX_JSON_VALUES values (each a Python object);
    the numbers of a `data` array read in slices are not among them."""
    _real_sizes(monkeypatch)
    many = MAX_JSON_VALUES + 1
    refusal = ("refused", "InvalidArgumentError", "the inference request header holds more "
               f"than {MAX_JSON_VALUES:,} JSON values and keys, each a Python object to "
               "parse; send a large tensor's elements as numbers in its 'data' or with the "
               "binary tensor extension")
    small = {"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}
    strings = {**small, "datatype": "BYTES", "shape": [many], "data": [""] * many}
    for junk in ({"inputs": [small], "junk": [{}] * many},
                 {"inputs": [small], "parameters": {f"k{i}": 1 for i in range(many // 2)}},
                 {"inputs": [strings]}):
        body = json.dumps(junk, separators=(",", ":")).encode()
        sliced, whole, _ = both(body)
        assert sliced == whole == refusal
    body = json.dumps({"inputs": [{**small, "shape": [many], "data": [0] * many}]}).encode()
    sliced, whole, _ = both(body)
    assert sliced[0] == "decoded" and whole == refusal


def test_a_body_of_many_small_arrays_gives_the_loop_turns_and_is_refused_by_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 one-number inputs (1.4 MB): each array's end is looked for near it, and the
    loop gets a turn every few hundred, where each had 1 MiB looked through and none came
    (16,000 of them held the loop 4.7 s); then the count refuses it, as whole."""
    monkeypatch.setattr(json_slices, "SLICE_BYTES", 256 << 10)  # the real sizes
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 1 << 20)
    monkeypatch.setattr(json_slices, "LARGE_BYTES", 512 << 10)
    body = json.dumps({"inputs": [{"name": f"x{i}", "datatype": "FP32", "shape": [1],
                                   "data": [1.0]} for i in range(20_000)]}).encode()
    sliced, whole, count = both(body)
    assert sliced == whole == ("refused", "InvalidArgumentError", "the request names 20,000 "
                               "inputs; at most 4,096 are accepted")
    assert count >= 20_000 // 256


def test_many_small_arrays_are_cut_out_when_together_they_are_large(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 inputs of 200 numbers (1.3 KB each, a NaN among them): left in the rest of the
    body they were parsed in one go with it (4,000 such held the loop 75 ms, 125 with a NaN,
    which sends the parse to json); cut out, they are parsed a step's bytes at a time. More
    inputs than MAX_TENSORS are refused before their arrays are parsed, as whole."""
    _real_sizes(monkeypatch)
    values = [0.5] * 200
    body = json.dumps({"inputs": [{"name": f"x{i}", "datatype": "FP32", "shape": [200],
                                   "data": values} for i in range(2000)]},
                      separators=(",", ":")).replace("0.5", "NaN", 1).encode()
    sliced, whole, turns = both(body)
    assert sliced == whole and sliced[0] == "decoded" and len(sliced[2]) == 2000
    assert turns >= len(body) // json_slices.SLICE_BYTES
    assert len(run_steps(json_slices._array_spans(memoryview(body)))) == 2000  # each cut out
    few = body[:body.index(b',{"name":"x150"')] + b"]}"  # 195 KB of them: left in the rest
    assert run_steps(json_slices._array_spans(memoryview(few))) == []
    body = json.dumps({"inputs": [{"name": f"x{i}", "datatype": "FP32", "shape": [60],
                                   "data": values[:60]} for i in range(5000)]}).encode()
    sliced, whole, turns = both(body)
    assert sliced == whole == ("refused", "InvalidArgumentError", "the request names 5,000 "
                               "inputs; at most 4,096 are accepted")


def test_a_large_nested_array_is_parsed_in_many_slices() -> None:
    """data as x.tolist() sends it: read in row-major order, in slices."""
    values = np.linspace(-3, 3, 360, dtype=np.float32).reshape(4, 9, 10)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [4, 9, 10],
                                   "data": values.tolist()}]}).encode()
    sliced, whole, count = both(body)
    assert sliced == whole and sliced[0] == "decoded"
    assert count > 100
    assert np.frombuffer(sliced[2]["x"][2], np.float32).tolist() == values.ravel().tolist()


@pytest.mark.parametrize("data, outcome", [
    ("[[1,2],[3,4]]", "decoded"), ("[ [[1,2], [3,4]] ,\n[[5,6],[7,8]] ]", "decoded"),
    ("[[1,2],[3]]", "refused"), ("[[1,2],3,[4,5]]", "refused"), ("[[1,2],[3,[4]]]", "refused"),
    ("[[[1,2]],[3,4]]", "refused"), ("[[1,2],[]]", "refused"), ("[" + "[],"*7 + "[]]", "decoded"),
    ("[" + "[1,2],"*6 + "[1,2,3]]", "refused"),       # one list wider, in a run of its own
    ("[[1,2],[3,4][5,6],[7,8]]", "refused"),           # no comma between two lists
    ("[[1,2,3,4,5,6,7,8] [1,2,3,4,5,6,7,8]]", "refused"),  # ... where two runs meet
    ("[[[1,2],[3,4]],[[5,6]],[[7,8],[9,10],[11,12]]]", "refused"),  # as long as [3,2,2]
    ("[[[1,2],[3,4]] [[5,6],[7,8]]]", "refused"),      # nor between two lists above them
    ("[[1,2],[3,4],,[5,6]]", "refused"), ("[[1,2],[3,4],]", "refused"),
    ("[ 7[1,2],[3,4]]", "refused"), ("[[1,2],[3,4] 7]", "refused"),
    ("[[1,2],[3,true]]", "refused")])
def test_nested_lists_mean_what_they_mean_whole(data: str, outcome: str) -> None:
    """Evenly nested lists are read in runs of innermost lists (tiny slices: a list or two
    a run); anything else the whole parse names. `shape` is the count of numbers, so that
    a reading that wrongly took uneven lists would decode where the plain path refuses."""
    count = len(re.findall(r"\d+", data)) + ("true" in data)
    body = ('{"inputs": [{"name": "x", "datatype": "INT32", "shape": [%d], "data": %s}]}'
            % (count, data)).encode()
    sliced, whole, _ = both(body)
    assert sliced == whole and sliced[0] == outcome


def test_a_string_in_nested_lists_hides_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its comma would make the lists' skeleton even ([2, 1001]); they are not (1,000 and
    1,001 values), which the plain path names, and so does the sliced one."""
    monkeypatch.setattr(json_slices, "SLICE_BYTES", 4096)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [2001],
                                   "data": [["x,"] + [1] * 999, [1] * 1001]}]}).encode()
    sliced, whole, _ = both(body)
    assert sliced == whole and "evenly nested" in sliced[2]


@pytest.mark.parametrize("levels, outcome", [(32, "decoded"), (33, "decoded"),
                                             (70, "refused")])
def test_deep_nesting_means_what_it_means_whole(levels: int, outcome: str) -> None:
    """Sliced up to 32 levels; deeper, decoded whole (numpy refuses over 64)."""
    deep: Any = [1, 2]
    for _ in range(levels - 1):
        deep = [deep]
    body = json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [2],
                                   "data": deep}]}).encode()
    sliced, whole, _ = both(body)
    assert sliced == whole and sliced[0] == outcome


def test_a_client_string_like_the_key_does_not_move_a_cut() -> None:
    body = (b'{"id": "\\"data\\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]", "inputs": '
            b'[{"name": "x", "datatype": "INT32", "shape": [20], "data": '
            + json.dumps(list(range(20))).encode() + b'}]}')
    sliced, whole, _ = both(body)
    assert sliced == whole and sliced[0] == "decoded"


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32),
                       min_size=0, max_size=300),
       datatype=st.sampled_from(["FP32", "FP64", "INT32", "UINT8", "BOOL"]),
       binary=st.booleans(), request_id=st.sampled_from(["", "id-1", "\x00tensorgate-0"]))
def test_sliced_and_whole_answers_are_the_same_bytes(values: list[float], datatype: str,
                                                     binary: bool, request_id: str) -> None:
    target = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "UINT8": np.uint8,
              "BOOL": np.bool_}[datatype]
    floats = np.asarray(values, np.float64)
    if target is not np.float32 and target is not np.float64:
        floats = np.nan_to_num(floats, nan=0.0, posinf=1.0, neginf=-1.0).clip(0, 200)
    array = floats.astype(target)
    outputs = {"small": TensorView.from_numpy(np.arange(3, dtype=np.int64), name="small"),
               "large": TensorView.from_numpy(array, name="large")}
    flags = {"small": False, "large": binary}
    parameters = {"note": "x", "ratio": math.pi}
    heads, tail = run_steps(encode_in_slices("m", 1, request_id, outputs, flags, parameters))
    head, whole_tail = encode_infer_response("m", 1, request_id, outputs, flags, parameters)
    assert b"".join(bytes(part) for part in heads) == head
    assert [bytes(t) for t in tail] == [bytes(t) for t in whole_tail]


@pytest.mark.parametrize("with_array", [False, True])
def test_a_body_over_the_value_bound_is_counted_in_steps_and_refused_as_whole(
        monkeypatch: pytest.MonkeyPatch, with_array: bool) -> None:
    """12 MB of `{}` beside a small input, or beside a large `data` array cut out: refused
    as the whole path refuses it, the count giving the loop a turn each MiB (it was one
    call: ~73 ms on the loop for 57 MB, the skeleton joined first when an array was cut)."""
    _real_sizes(monkeypatch)
    data = [0.5] * (300_000 if with_array else 1)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(data)],
                                   "data": data}], "junk": [{}] * 4_000_000},
                      separators=(",", ":")).encode()
    sliced, whole, count = both(body)
    assert sliced == whole and sliced[:2] == ("refused", "InvalidArgumentError")
    assert "holds more than 1,048,576 JSON values and keys" in sliced[2]
    assert count >= 2


@pytest.mark.parametrize("key", [b'"data":[', b'"data"' + b" " * 300 + b": \n ["])
def test_a_data_key_across_two_windows_of_its_search_is_found(
        monkeypatch: pytest.MonkeyPatch, key: bytes) -> None:
    """The key is looked for 4 MiB at a time, windows overlapping: one that straddles two
    (its name, or the whitespace after it: windows once overlapped by 64 bytes) is
    found, and its array cut out and parsed in slices, as one well inside a window is (as
    many turns, or one or two more where the windows part it), not whole (fewer)."""
    _real_sizes(monkeypatch)
    values = np.arange(200_000, dtype=np.float32)
    input_head = b'","inputs":[{"name":"x","datatype":"FP32","shape":[200000],'

    def body(pad: int) -> bytes:
        return (b'{"pad":"' + b"p" * pad + input_head + key
                + b",".join(b"%d" % v for v in range(200_000)) + b"]}]}")

    straddling = (4 << 20) - len(b'{"pad":"') - len(input_head) - len(key) // 2
    turns = []
    for pad in (straddling, straddling - 1000):
        text = body(pad)
        assert (text.index(key) < 4 << 20 < text.index(key) + len(key)) == (pad == straddling)
        sliced, whole, count = both(text)
        assert sliced == whole and sliced[0] == "decoded"
        assert np.frombuffer(sliced[2]["x"][2], np.float32).tolist() == values.tolist()
        turns.append(count)
    assert turns[1] <= turns[0] <= turns[1] + 2


@settings(max_examples=60, deadline=None)
@given(strings=st.lists(st.binary(max_size=6), min_size=1, max_size=40),
       count=st.sampled_from([16_383, 16_384, 8192 * 3, 8192 * 3 + 1]),
       binary=st.booleans())
def test_a_large_bytes_answer_written_in_slices_is_the_same_bytes(
        strings: list[bytes], count: int, binary: bool) -> None:
    """From 16,384 strings a BYTES output is written as JSON 8,192 strings a step (a million
    held the loop 290 ms in one go): bytes that are not UTF-8 replaced as whole writes
    them, slices cut anywhere, the answer the same bytes; a smaller one is written whole."""
    values = np.array([strings[i % len(strings)] for i in range(count)], dtype=object)
    outputs = {"text": TensorView.from_numpy(values, name="text"),
               "small": TensorView.from_numpy(np.arange(3, dtype=np.int64), name="small")}
    flags = {"text": binary, "small": False}
    turns: list[int] = []
    heads, tail = run_steps(encode_in_slices("m", 1, "r", outputs, flags), turns)
    head, whole_tail = encode_infer_response("m", 1, "r", outputs, flags)
    assert b"".join(bytes(part) for part in heads) == head
    assert [bytes(t) for t in tail] == [bytes(t) for t in whole_tail]
    assert len(turns) == (0 if binary or count < 16_384 else -(-count // 8192))


def test_a_malformed_bytes_answer_is_refused_as_whole_refuses_it() -> None:
    """A BYTES view made unchecked (large: checked when decoded) whose last element runs
    past its bytes: the same error from the sliced writer as from the whole one."""
    layout = bytearray(b"".join(struct.pack("<I", 1) + b"x" for _ in range(70_000)))
    layout[-5:-1] = struct.pack("<I", 2)
    view = TensorView(layout, "BYTES", [70_000], name="text")
    with pytest.raises(BytesElementError) as whole:
        encode_infer_response("m", 1, "", {"text": view}, {"text": False})
    with pytest.raises(BytesElementError, match=f"^{re.escape(str(whole.value))}$"):
        run_steps(encode_in_slices("m", 1, "", {"text": view}, {"text": False}))


@pytest.mark.parametrize("datatype", ["UINT64", "INT64", "INT32", "FP64", "FP32", "BOOL"])
@pytest.mark.parametrize("data", [
    [0, 2**64 - 1],                                   # numpy reads these two as floats
    [[1, 2**63], [3, 4]],
    [2**64 - 1] + list(range(60_000)),                # sliced: the large one in one slice
    list(range(60_000)) + [2**63],
    [[i, 2**63 + i] for i in range(30_000)],          # nested, sliced
    [2**64],
    [0.5, 2**64 - 1],
], ids=["pair", "nested", "first-of-many", "last-of-many", "nested-many", "past-64-bits",
        "with-a-fraction"])
def test_integers_no_one_integer_type_holds_together_are_read_exactly(datatype: str,
                                                                      data: list[Any]) -> None:
    """A UINT64 input's values past 2**63 beside small ones: numpy alone reads them as
    floats, and they were refused as fractions (Triton 2.51 reads them). Read exactly now,
    the same a slice at a time as whole; out of the datatype's range, refused naming the
    value."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype,
                                   "shape": list(np.shape(data)), "data": data}]}).encode()
    sliced, whole, _ = both(body)
    assert sliced == whole
    flat = np.array(data, dtype=object).reshape(-1).tolist()
    if not all(type(v) is int and v < 2**64 for v in flat):  # JSON's parser makes floats
        return                                               # of integers past 64 bits
    if datatype == "UINT64":
        assert whole[0] == "decoded"
        assert np.frombuffer(whole[2]["x"][2], np.uint64).tolist() == flat
    elif datatype in ("INT64", "INT32"):
        info = np.iinfo(datatype.lower())
        outside = next(v for v in flat if not info.min <= v <= info.max)
        assert whole == ("refused", "InvalidArgumentError",
                         f"input 'x': {datatype} holds [{info.min}, {info.max}]; 'data' has "
                         f"{outside}")
