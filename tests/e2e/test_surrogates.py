"""Lone surrogates anywhere in a JSON body. JSON's \\ud800 escapes parse (the standard
library lets them through) into text that UTF-8 cannot encode, so any place that later
encodes client text (a file name, a shared-memory key, a cache key, a log line, a gRPC
answer) could fail there. Every string and key of a valid body of each JSON endpoint is
tried with one: the answer is the request's own (served, or a 4xx naming what is wrong),
never an internal error, and the server keeps serving. Its own server: these bodies change
log and trace settings."""

from __future__ import annotations

import json
import os
import pathlib
from multiprocessing import shared_memory
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import RunningServer, start_server, still_serving, stop_server
from tests.e2e.test_http_hostile import exchange, request


@pytest.fixture(scope="module")
def own_server(e2e_repo: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("surrogates") / "server.log"
    region = shared_memory.SharedMemory(REGION, create=True, size=64)
    try:
        running = start_server(e2e_repo, log, "--response-cache-bytes", str(1 << 20),
                               "--allow-shared-memory", "--model-control-mode", "explicit",
                               "--load-model", "identity", "--load-model", "params",
                               "--load-model", "params_ensemble", "--load-model", "shout",
                               "--load-model", "accumulate")
        yield running
        assert stop_server(running) == 0, log.read_text()
    finally:
        region.close()
        region.unlink()


REGION = f"surrogate-test-{os.getpid()}"  # a system shared-memory object of this test's own


# a valid body of each JSON endpoint (the loads and unloads name a model the repository
# does not hold: refused, as each body with a surrogate is, but by the name)
_BODIES: list[tuple[str, Any]] = [
    ("/v2/models/identity/infer", {
        "id": "r1", "parameters": {"note": "n", "binary_data_output": False},
        "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 3, 4],
                    "data": list(range(12)), "parameters": {"tag": "t"}}],
        "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": False}}]}),
    ("/v2/models/params/infer", {
        "id": "r2", "parameters": {"echo": "e", "other": "o"},
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}),
    ("/v2/models/params_ensemble/infer", {
        "id": "r3", "parameters": {"echo": "e"},
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}),
    ("/v2/models/shout/infer", {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1],
                    "data": ["hello"]}]}),
    ("/v2/models/shout/generate", {"text_input": "hello", "parameters": {"p": "v"}}),
    ("/v2/models/accumulate/infer", {
        "parameters": {"sequence_id": "seq", "sequence_start": True, "sequence_end": True},
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}),
    ("/v2/repository/index", {"ready": False}),
    ("/v2/repository/models/nothing_here/load", {"parameters": {"config": "{}"}}),
    ("/v2/repository/models/nothing_here/unload", {"parameters": {"unload_dependents": True}}),
    ("/v2/systemsharedmemory/region/region_a/register",
     {"key": f"/{REGION}", "offset": 0, "byte_size": 16}),
    ("/v2/logging", {"log_verbose_level": 0, "log_format": "default"}),
    ("/v2/trace/setting", {"trace_level": ["OFF"], "trace_rate": "1000",
                           "log_frequency": "0"}),
    ("/v2/models/identity/trace/setting", {"trace_level": ["OFF"]}),
]


def _strings(value: Any) -> int:
    """How many strings (values and keys) `value` holds."""
    if isinstance(value, dict):
        return sum(1 + _strings(item) for item in value.values())
    if isinstance(value, list):
        return sum(map(_strings, value))
    return 1 if isinstance(value, str) else 0


def _changed(value: Any, which: int, change: Any) -> tuple[Any, int]:
    """`value` with its string (or key) number `which` changed by `change`; what is left
    of `which` after the strings of `value`."""
    if isinstance(value, str):
        return (change(value), -1) if which == 0 else (value, which - 1)
    if isinstance(value, list):
        items = []
        for item in value:
            item, which = _changed(item, which, change)
            items.append(item)
        return items, which
    if isinstance(value, dict):
        entries = {}
        for key, item in value.items():
            if which == 0:
                key, which = change(key), -1
            elif which > 0:
                which -= 1
            item, which = _changed(item, which, change)
            entries[key] = item
        return entries, which
    return value, which


_SURROGATES = st.sampled_from(["\ud800", "\udfff", "\udc80", "\ud83d"])
_PLACES = st.sampled_from(["replace", "append", "prepend"])


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(endpoint=st.sampled_from(range(len(_BODIES))), pick=st.integers(0, 1 << 16),
       surrogate=_SURROGATES, place=_PLACES)
def test_a_lone_surrogate_anywhere_gets_a_clear_answer(own_server: RunningServer,
                                                       endpoint: int, pick: int,
                                                       surrogate: str, place: str) -> None:
    path, body = _BODIES[endpoint]
    which = pick % _strings(body)
    text = {"replace": lambda s: surrogate, "append": lambda s: s + surrogate,
            "prepend": lambda s: surrogate + s}[place]
    changed, _ = _changed(body, which, text)
    raw = json.dumps(changed).encode()  # ensure_ascii: \\udXXX escapes
    status, _, answer = exchange(own_server, request(path, raw))
    assert status != 0 and status < 500, (path, raw, status, answer)
    if status >= 400:
        assert json.loads(answer)["error"]
    if path.endswith("/register") and status == 200:
        exchange(own_server, request(path.replace("/register", "/unregister"), b""))
    still_serving(own_server)


@pytest.mark.parametrize("path, body", _BODIES)
def test_each_body_unchanged_is_served(own_server: RunningServer, path: str,
                                       body: Any) -> None:
    """Not a vacuous fuzz: without a surrogate each body is the request it says (the load
    of a model the repository does not hold is refused for that; its unload does nothing,
    as on Triton)."""
    status, _, answer = exchange(own_server, request(path, json.dumps(body).encode()))
    if path.endswith("nothing_here/load"):
        assert status == 404 and b"nothing_here" in answer, answer
    else:
        assert status == 200, (path, answer)
    if path.endswith("/register"):
        exchange(own_server, request(path.replace("/register", "/unregister"), b""))


_HEADER = "the inference request header is not valid JSON: "


@pytest.mark.parametrize("body, message", [
    (b'{"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2, 1], '
     b'"data": ["ok", "\\ud800!"]}]}',
     "the string at inputs[0].data[1] holds a lone surrogate (\\ud800), which is not valid "
     "Unicode"),
    (b'{"parameters": {"sequence_id": "s\\udc00"}, "inputs": [{"name": "text_input", '
     b'"datatype": "BYTES", "shape": [1, 1], "data": ["ok"]}]}',
     "the string at parameters.sequence_id holds a lone surrogate (\\udc00), which is not "
     "valid Unicode"),
])
def test_a_lone_surrogate_is_refused_naming_where_it_is(own_server: RunningServer,
                                                        body: bytes, message: str) -> None:
    """A BYTES element was encoded and raised, answered as an internal error (500); so was
    an input's name, in the response cache's key. Now the parse refuses any, as Triton's
    rapidjson does, saying where."""
    status, _, answer = exchange(own_server, request("/v2/models/shout/infer", body))
    assert (status, json.loads(answer)["error"]) == (400, _HEADER + message)
    still_serving(own_server)


def test_a_sequence_id_past_its_bound_is_refused(own_server: RunningServer) -> None:
    """A string sequence_id is held as long as its sequence lives: bounded in length."""
    body = {"parameters": {"sequence_id": "s" * 1025, "sequence_start": True},
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    status, _, answer = exchange(own_server, request("/v2/models/accumulate/infer",
                                                     json.dumps(body).encode()))
    assert (status, json.loads(answer)["error"]) == (
        400, "request parameter 'sequence_id' is a string of 1,025 characters; at most "
             "1,024 are accepted (the server holds it for as long as the sequence lives)")
    body["parameters"]["sequence_id"] = "s" * 1024
    body["parameters"]["sequence_end"] = True
    status, _, answer = exchange(own_server, request("/v2/models/accumulate/infer",
                                                     json.dumps(body).encode()))
    assert status == 200, answer
