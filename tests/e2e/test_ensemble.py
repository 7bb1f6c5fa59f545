"""An ensemble through tritonclient (HTTP and gRPC): the same answer as calling its steps
one after the other, a failing step named in the error, its metadata and config as Triton
reports them."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer


def _call(client, module, model: str, name: str, value: np.ndarray, output: str) -> np.ndarray:
    item = module.InferInput(name, list(value.shape), "FP32")
    item.set_data_from_numpy(value)
    return client.infer(model, [item]).as_numpy(output)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_ensemble_answers_as_its_steps_in_turn(server: RunningServer, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    x = np.random.default_rng(11).uniform(0, 5, (1, 4)).astype(np.float32)
    with module.InferenceServerClient(url) as client:
        shifted = _call(client, module, "failing", "INPUT__0", x, "OUTPUT__0")
        expected = _call(client, module, "paced", "INPUT__0", shifted, "OUTPUT__0")
        got = _call(client, module, "pipeline", "RAW", x, "SCORES")
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got, 2 * (x + 1) + 1)
        with pytest.raises(InferenceServerException, match=r"ensemble 'pipeline', step "
                                                           r"'failing': model 'failing' raised"):
            _call(client, module, "pipeline", "RAW", -x, "SCORES")
        metadata = client.get_model_metadata("pipeline")
        platform = metadata["platform"] if protocol == "http" else metadata.platform
        assert platform == "ensemble"


def test_ensemble_config_is_served_as_written(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("pipeline")
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["failing", "paced"]
    assert steps[1]["input_map"] == {"INPUT__0": "SHIFTED"}
