"""Triton's request rescheduling (`sequence_batching { iterative_sequence: true }`) through
tritonclient: a Triton Python model that runs each request STEPS times before answering it
(tests/testdata/triton_python/iterative), requests that join each other's batches between
steps, a client's own sequence id, and the error a model gets when its config does not let
it reschedule."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer
from tests.e2e.test_triton_python import repo, served  # noqa: F401  (the fixtures)


def _steps(module: Any, steps: int) -> list[Any]:
    item = module.InferInput("STEPS", [1, 1], "INT32")
    item.set_data_from_numpy(np.array([[steps]], np.int32))
    return [item]


def _counts(client: httpclient.InferenceServerClient) -> tuple[int, int, int]:
    """Requests answered, inferences (rows executed, as Triton counts them: each step of a
    rescheduled request is one) and executions."""
    stats = client.get_inference_statistics("iterative")["model_stats"][0]
    return (stats["inference_stats"]["success"]["count"], stats["inference_count"],
            stats["execution_count"])


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_rescheduled_request_runs_until_its_model_answers(served: RunningServer,  # noqa: F811
                                                            module: Any) -> None:
    client = module.InferenceServerClient(served.url if module is httpclient
                                          else served.grpc_url)
    try:
        result = client.infer("iterative", _steps(module, 4))
        assert result.as_numpy("RUNS").tolist() == [[4]]
        answer = result.get_response()
        parameters = (answer["parameters"] if module is httpclient
                      else {k: v.int64_param for k, v in answer.parameters.items()})
        assert parameters["sequence"] > 0  # an id the server gave: the client sent none
        # a client's own sequence, started and ended by this one request, is rescheduled too
        result = client.infer("iterative", _steps(module, 2), sequence_id=9_000_001,
                              sequence_start=True, sequence_end=True)
        assert result.as_numpy("RUNS").tolist() == [[2]]
        assert result.as_numpy("RUNS").dtype == np.int32
    finally:
        client.close()


def test_requests_join_each_other_s_batches_between_steps(served: RunningServer  # noqa: F811
                                                          ) -> None:
    """Continuous batching: four requests sent at once, of 2 to 8 steps, share executes
    (the model saw up to four requests in one), each gets its own count, and the model ran
    fewer times than the steps add up to; statistics count four requests answered and one
    inference a step."""
    steps = [8, 2, 5, 3]
    client = httpclient.InferenceServerClient(served.url, concurrency=len(steps))
    try:
        before = _counts(client)
        pending = [client.async_infer("iterative", _steps(httpclient, n)) for n in steps]
        results = [p.get_result(timeout=30) for p in pending]
        assert [r.as_numpy("RUNS").item() for r in results] == steps
        assert max(r.as_numpy("WIDEST").item() for r in results) >= 2
        ids = {r.get_response()["parameters"]["sequence"] for r in results}
        assert len(ids) == len(steps)  # a sequence each
        answered, inferences, executions = (a - b for a, b in zip(_counts(client), before))
        assert (answered, inferences) == (len(steps), sum(steps))
        assert max(steps) <= executions < sum(steps)
    finally:
        client.close()


def test_rescheduling_without_iterative_sequence_is_an_error_naming_it(
        served: RunningServer) -> None:  # noqa: F811
    """The same model under a config without iterative_sequence (a dynamic batcher): the
    request that the model reschedules fails, saying what the config needs; a request it
    answers at once is answered, and the model serves again under its own config."""
    config = {"name": "iterative", "backend": "python", "max_batch_size": 4,
              "dynamic_batching": {},
              "input": [{"name": "STEPS", "data_type": "TYPE_INT32", "dims": [1]}],
              "output": [{"name": "RUNS", "data_type": "TYPE_INT32", "dims": [1]},
                         {"name": "WIDEST", "data_type": "TYPE_INT32", "dims": [1]}]}
    client = httpclient.InferenceServerClient(served.url)
    try:
        client.load_model("iterative", config=json.dumps(config))
        with pytest.raises(InferenceServerException,
                           match=r"rescheduled \(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE\) "
                                 r"only by a model whose config has 'sequence_batching "
                                 r"\{ iterative_sequence: true \}'"):
            client.infer("iterative", _steps(httpclient, 3))
        assert client.infer("iterative", _steps(httpclient, 1)).as_numpy("RUNS").item() == 1
    finally:
        client.load_model("iterative")  # its config.pbtxt again
        try:
            assert client.infer("iterative", _steps(httpclient, 3)).as_numpy("RUNS").item() == 3
        finally:
            client.close()


def test_a_request_whose_client_left_while_rescheduled_runs_once_more_cancelled(
        served: RunningServer) -> None:  # noqa: F811
    """A client gives up on a request of 1,000 steps (10 s): the request runs once more,
    `is_cancelled()` and as its sequence's end, and the model lets go of its progress, so
    that a later request finds the model keeping nothing for anyone."""
    leaving = httpclient.InferenceServerClient(served.url, network_timeout=0.3)
    client = httpclient.InferenceServerClient(served.url)
    try:
        with pytest.raises(Exception, match="timed out"):
            leaving.infer("iterative", _steps(httpclient, 1000))
        leaving.close()  # its connection closes: the server drops what it asked for
        deadline = time.monotonic() + 5
        kept = client.infer("iterative", _steps(httpclient, 1)).as_numpy("KEPT").item()
        while kept and time.monotonic() < deadline:
            time.sleep(0.05)
            kept = client.infer("iterative", _steps(httpclient, 1)).as_numpy("KEPT").item()
        assert kept == 0
    finally:
        leaving.close()
        client.close()
