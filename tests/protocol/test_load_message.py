"""protocol/load_message.py: a RepositoryModelLoad message with its long files taken out
means what protobuf's parse of the whole message means, for any message: long and short
files, other parameters, keys twice, corrupted bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol.grpc_codec import parse_bounded_steps
from tensorgate.protocol.load_message import LONG_FILE, split_load_steps
from tensorgate.protocol.steps import run_through


def _entry(key: str, kind: str, size: int, seed: int) -> bytes:
    """One parameters entry on the wire, as a message of one entry serialises it."""
    message = pb.RepositoryModelLoadRequest()
    value = message.parameters[key]
    if kind == "bytes":
        value.bytes_param = np.random.default_rng(seed).bytes(size)
    elif kind == "string":
        value.string_param = "x" * min(size, 100)
    else:
        value.bool_param = True
    return message.SerializeToString()


def _outcome(data: bytes, split: bool) -> Any:
    """The message as protobuf would have it (files put back), or the refusal's kind."""
    try:
        if not split:
            return run_through(parse_bounded_steps(pb.RepositoryModelLoadRequest, data))
        request = run_through(split_load_steps(data))
    except InvalidArgumentError as error:
        return "refused", error.message.split(":")[0]
    message = request.message
    for key, view in request.files.items():
        assert isinstance(view, memoryview) and len(view) >= LONG_FILE  # a view, not a copy
        message.parameters[key].bytes_param = bytes(view)
    return message


def test_a_long_file_is_a_view_of_the_message_and_the_rest_is_parsed() -> None:
    message = pb.RepositoryModelLoadRequest(model_name="m")
    message.parameters["config"].string_param = "{}"
    message.parameters["file:1/model.pt"].bytes_param = b"\x01" * (LONG_FILE + 5)
    message.parameters["file:1/small"].bytes_param = b"s"
    data = bytearray(message.SerializeToString())
    request = run_through(split_load_steps(data))
    assert list(request.files) == ["file:1/model.pt"]
    assert request.files["file:1/model.pt"].obj is data  # taken out, not copied
    assert request.message.model_name == "m" and "file:1/model.pt" not in request.message.parameters
    assert request.message.parameters["file:1/small"].bytes_param == b"s"


_ENTRY = st.tuples(st.sampled_from(["file:1/a", "file:2/b", "config", "other"]),
                   st.sampled_from(["bytes", "bytes", "string", "bool"]),
                   st.sampled_from([0, 10, LONG_FILE - 1, LONG_FILE, LONG_FILE + 3]),
                   st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(_ENTRY, max_size=4), name=st.booleans(),
       spoil=st.one_of(st.none(), st.tuples(st.integers(0, 2**31), st.integers(0, 255))),
       cut=st.one_of(st.none(), st.integers(1, 64)))
def test_split_means_what_whole_means(entries: list[tuple[str, str, int, int]], name: bool,
                                      spoil: tuple[int, int] | None, cut: int | None) -> None:
    data = bytearray(b"".join(_entry(*entry) for entry in entries))
    if name:
        data += pb.RepositoryModelLoadRequest(model_name="m").SerializeToString()
    if spoil is not None and data:
        data[spoil[0] % len(data)] = spoil[1]
    if cut is not None:
        data = data[:-cut]
    assert _outcome(bytes(data), True) == _outcome(bytes(data), False)
