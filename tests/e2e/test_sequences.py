"""Sequences from tritonclient (HTTP and gRPC): `sequence_id` as an integer or a string,
`sequence_start` / `sequence_end`, the state kept between requests, and the errors a client
gets for requests outside a sequence."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, scrape, value
from tests.e2e.conftest import still_serving
from tests.e2e.test_http_hostile import error_of, exchange, request


def _client(server: RunningServer, protocol: str) -> tuple[Any, Any]:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _inputs(module: Any, value: float) -> list[Any]:
    item = module.InferInput("INPUT", [1, 1], "FP32")
    item.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return [item]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("sequence_id", [41, "session-41"])
def test_a_sequence_adds_up_from_start_to_end(server: RunningServer, protocol: str,
                                              sequence_id: int | str) -> None:
    module, client = _client(server, protocol)
    other = f"{sequence_id}-other" if isinstance(sequence_id, str) else sequence_id + 1
    try:
        totals = []
        client.infer("accumulate", _inputs(module, 100.0), sequence_id=other,
                     sequence_start=True)  # interleaved, with its own state
        for step, value in enumerate([1.0, 2.0, 3.0, 4.0]):
            result = client.infer("accumulate", _inputs(module, value), sequence_id=sequence_id,
                                  sequence_start=step == 0, sequence_end=step == 3)
            totals.append(float(result.as_numpy("TOTAL")[0, 0]))
            assert result.as_numpy("TOTAL_OUT") is None  # the state stays in the server
        assert totals == [1.0, 3.0, 6.0, 10.0]
        result = client.infer("accumulate", _inputs(module, 1.0), sequence_id=other,
                              sequence_end=True)
        assert float(result.as_numpy("TOTAL")[0, 0]) == 101.0
        with pytest.raises(InferenceServerException, match=r"is not active: it ended \d+ ms "
                                                           r"ago, at its request with "
                                                           r"'sequence_end'; the first "
                                                           r"request of a sequence must set "
                                                           r"'sequence_start'"):
            client.infer("accumulate", _inputs(module, 1.0), sequence_id=sequence_id)
    finally:
        client.close()


def test_the_server_says_it_speaks_sequences(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        extensions = client.get_server_metadata()["extensions"]
    assert {"sequence", "sequence(string_id)"} <= set(extensions)
    metrics = scrape(server)
    labels = {"model": "accumulate", "version": "1"}
    assert value(metrics, "tensorgate_sequence_slots", **labels) == 4
    assert value(metrics, "tensorgate_sequences_waiting", **labels) == 0
    assert value(metrics, "tensorgate_sequences_active", **labels) >= 0
    assert value(metrics, "tensorgate_sequences_expired_total", **labels) >= 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_stateful_model_needs_a_sequence_id(server: RunningServer, protocol: str) -> None:
    module, client = _client(server, protocol)
    try:
        with pytest.raises(InferenceServerException, match=r"model 'accumulate' is stateful "
                                                           r"\(sequence_batching\): each "
                                                           r"request needs a non-zero "
                                                           r"'sequence_id'") as caught:
            client.infer("accumulate", _inputs(module, 1.0))
        assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        # the server carries on
        result = client.infer("accumulate", _inputs(module, 2.0), sequence_id=7,
                              sequence_start=True, sequence_end=True)
        assert float(result.as_numpy("TOTAL")[0, 0]) == 2.0
    finally:
        client.close()


@pytest.mark.parametrize(("parameters", "message"), [
    ({"sequence_id": -3}, r"request parameter 'sequence_id' must be a non-negative integer or "
                          r"a string, got -3"),
    ({"sequence_id": 1.5}, r"'sequence_id' must be a non-negative integer or a string"),
    ({"sequence_id": 4, "sequence_start": "yes"},
     r"request parameter 'sequence_start' must be true or false, got 'yes'"),
    ({"sequence_end": True}, r"'sequence_start' and 'sequence_end' need a non-zero "
                             r"'sequence_id'"),
])
def test_bad_sequence_parameters_are_refused_by_name(server: RunningServer,
                                                     parameters: dict[str, Any],
                                                     message: str) -> None:
    # tritonclient will not send these parameters itself: the body is written here
    body = json.dumps({"parameters": parameters, "inputs": [
        {"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()
    status, _, answer = exchange(server, request("/v2/models/accumulate/infer", body))
    assert status == 400
    assert re.search(message, error_of(answer))
    still_serving(server)
