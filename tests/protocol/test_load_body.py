"""protocol/load_body.py: a load body decoded in slices means what it means parsed whole, for
any body — uploads of long base64 files and everything that must fall back to the plain
parse (escapes, a long string that is not a file, quotes past the bound, bad base64)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.infer_codec import parse_json
from tensorgate.protocol.load_body import LONG_STRING, load_parameters_steps
from tensorgate.repository.upload import decode_base64_file


def _sliced(body: bytes) -> tuple[Any, int]:
    """The steps' parameters, files as bytes, and how many steps they took."""
    steps = load_parameters_steps(body, len(body))
    count = 0
    while True:
        try:
            next(steps)
            count += 1
        except StopIteration as done:
            return {k: bytes(v) if isinstance(v, bytearray) else v
                    for k, v in done.value.items()}, count


def _whole(body: bytes) -> dict[str, Any]:
    """The plain path: the body parsed whole, every file decoded whole."""
    document = parse_json(body, "the request body") if body else {}
    if not isinstance(document, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    parameters = document.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("'parameters' of a load request must be a JSON object")
    return {k: decode_base64_file(k, v) if k.startswith("file:") else v
            for k, v in parameters.items()}


def _sliced_parameters(body: bytes) -> dict[str, Any]:
    """The steps' parameters with the files they left as text decoded, as the HTTP front
    end decodes them."""
    parameters, _ = _sliced(body)
    return {k: decode_base64_file(k, v) if k.startswith("file:") and not isinstance(v, bytes)
            else v for k, v in parameters.items()}


def _outcome(run: Any, body: bytes) -> Any:
    try:
        return run(body)
    except InvalidArgumentError as error:  # which kind of refusal, naming which parameter
        return "refused", error.message.split(":")[0].split(" (")[0]


def _long_base64(seed: int, size: int) -> str:
    return base64.b64encode(np.random.default_rng(seed).bytes(size)).decode()


_LONG = LONG_STRING * 3 // 4 + 3  # raw bytes whose base64 is just past LONG_STRING


def test_an_upload_s_files_are_decoded_in_slices_to_the_bytes_they_were() -> None:
    model = np.random.default_rng(1).bytes(5 << 20)
    body = json.dumps({"parameters": {
        "config": json.dumps({"name": "m", "backend": "python", "note": 'quoted "x"'}),
        "file:1/model.pt": base64.b64encode(model).decode(),
        "file:1/small.txt": base64.b64encode(b"small").decode()}}).encode()
    parameters, steps = _sliced(body)
    assert parameters["file:1/model.pt"] == model
    assert parameters["file:1/small.txt"] == base64.b64encode(b"small").decode()  # whole
    assert steps >= 5  # 6.7 MB of base64 in 1 MiB slices, with yields between
    assert parameters["config"] == json.loads(body)["parameters"]["config"]


_VALUE = st.one_of(
    st.builds(_long_base64, st.integers(0, 9), st.sampled_from([_LONG, _LONG + 1, _LONG + 2])),
    st.builds(lambda s: _long_base64(s, _LONG)[:-1], st.integers(0, 9)),  # bad padding
    st.builds(lambda s: _long_base64(s, _LONG).replace("A", "\\/", 1), st.integers(0, 9)),
    st.builds(lambda s: "é" + _long_base64(s, _LONG), st.integers(0, 9)),  # not base64
    st.builds(lambda s: _long_base64(s, _LONG) + '\\"', st.integers(0, 9)),  # escaped quote
    st.text(max_size=8), st.integers(), st.none(),
    st.lists(st.builds(_long_base64, st.integers(0, 9), st.just(_LONG)), max_size=2))


@settings(max_examples=150, deadline=None)
@given(parameters=st.dictionaries(
    st.sampled_from(["config", "file:1/a", "file:2/b", "file:3/c", "other"]), _VALUE,
    max_size=4), wrap=st.sampled_from(["object", "array", "no parameters", "junk"]))
@example(parameters={"file:1/a": '"' * 5000}, wrap="object")
@example(parameters={"file:1/a": _long_base64(0, _LONG), "other": "tensorgate-"},
         wrap="object")
def test_sliced_means_what_whole_means(parameters: dict[str, Any], wrap: str) -> None:
    document: Any = {"parameters": parameters}
    body = {"object": lambda: json.dumps(document), "array": lambda: json.dumps([document]),
            "no parameters": lambda: json.dumps({"x": parameters}),
            "junk": lambda: json.dumps(document)[:-1]}[wrap]().encode()
    assert _outcome(_sliced_parameters, body) == _outcome(_whole, body)


@pytest.mark.parametrize("body", [b"", b"{}", b'{"parameters": null}', b"[]", b"{",
                                  b'{"parameters": 5}'])
def test_small_bodies_are_the_plain_path_s(body: bytes) -> None:
    assert _outcome(_sliced_parameters, body) == _outcome(_whole, body)


def test_a_body_of_only_quotes_or_backslashes_is_parsed_whole_not_walked() -> None:
    """Past the bounds (quotes in the body, backslashes before one) the steps give the
    body to the plain parse at once, so a hostile body costs what it costs there."""
    for body in (b'{"parameters": {"file:1/a": "' + b'\\"' * 300_000 + b'"}}',
                 b'{"parameters": {"file:1/a": "' + b"\\\\" * 300_000 + b'"}}'):
        assert _outcome(_sliced_parameters, body) == _outcome(_whole, body)
        assert _sliced(body)[1] <= 2


def test_a_server_that_takes_no_uploads_decodes_no_file() -> None:
    """Without decode_files a long file's text is not read (here it is not base64, and no
    error says so): the load is refused for the file, not for its content."""
    body = json.dumps({"parameters": {"config": "{}", "file:1/model.pt": "?" * LONG_STRING}})
    steps = load_parameters_steps(body.encode(), len(body), decode_files=False)
    with pytest.raises(StopIteration) as done:
        while True:
            next(steps)
    parameters = done.value.value
    assert parameters["config"] == "{}" and isinstance(parameters["file:1/model.pt"], str)
    assert len(parameters["file:1/model.pt"]) < 64  # a placeholder, not the text
    with pytest.raises(InvalidArgumentError, match="is not base64"):
        _sliced(body.encode())  # decoding, the same body is refused for its content
