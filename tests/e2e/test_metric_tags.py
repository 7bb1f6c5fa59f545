"""A model's config.pbtxt labels its metrics (`metric_tags`) and sets its histograms' buckets
(`model_metrics`), as Triton reads them; a load whose tags or buckets are wrong is refused
naming what is wrong, and the version served before keeps serving
(repository/metrics_config.py)."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import scrape, start_server, stop_server, value
from tests.pipeline import repo_builder as rb


def _buckets(text: str, metric: str, labels: str) -> list[tuple[str, int]]:
    return [(le, int(count)) for le, count in re.findall(
        rf'^{metric}_bucket\{{{re.escape(labels)},le="([^"]+)"\}} (\d+)$', text, re.M)]


def _infer(client: httpclient.InferenceServerClient) -> np.ndarray:
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer("tagged", [item]).as_numpy("OUTPUT__0")


def test_a_models_tags_label_its_metrics_and_its_buckets_are_its_own(
        tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    rb.add_python(repo, "tagged", extra="""
        metric_tags { key: "team" value: "vision" }
        model_metrics { metric_control [ {
            metric_identifier { family: "tensorgate_request_duration_seconds" }
            histogram_options { buckets: [0.0001, 30] } } ] }""")
    rb.add_text_models(repo)
    with (repo / "words" / "config.pbtxt").open("a") as config:
        config.write('metric_tags { key: "tier" value: "gold" }\n'
                     'model_metrics { metric_control [ { metric_identifier { family: '
                     '"nv_inference_first_response_histogram_ms" } histogram_options { '
                     'buckets: [0.001, 60000] } } ] }\n')
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                          "--load-model", "tagged", "--load-model", "words",
                          "--metrics-config", "histogram_latencies=true")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            for _ in range(3):
                np.testing.assert_array_equal(_infer(client), np.full((1, 4), 3.0))
        with grpcclient.InferenceServerClient(server.grpc_url) as stream_client:
            answers: list[object] = []
            stream_client.start_stream(callback=lambda result, error: answers.append(
                error or result))
            text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[b"two words"]], dtype=object))
            stream_client.async_stream_infer("words", [text])
            stream_client.stop_stream()
        assert len(answers) == 2 and not any(isinstance(a, Exception) for a in answers)
        metrics = scrape(server)
        tagged = 'model="tagged",version="1",_team="vision"'
        assert value(metrics, "nv_inference_request_success", model="tagged", version="1",
                     _team="vision") == 3
        requests = _buckets(metrics, "tensorgate_request_duration_seconds", tagged)
        # a Python model's round trip takes more than 100 µs, and far less than 30 s
        assert requests == [("0.0001", 0), ("30", 3), ("+Inf", 3)]
        # the histograms the config did not set keep the server's buckets
        assert len(_buckets(metrics, "tensorgate_queue_duration_seconds", tagged)) == 22
        words = 'model="words",version="1",_tier="gold"'
        first = _buckets(metrics, "nv_inference_first_response_histogram_ms", words)
        assert first == [("0.001", 0), ("60000", 1), ("+Inf", 1)]
        assert _buckets(metrics, "tensorgate_first_response_duration_seconds", words) == [
            ("0.000001", 0), ("60", 1), ("+Inf", 1)]  # the same histogram, in seconds
        assert "_team" not in "".join(line for line in metrics.splitlines() if "words" in line)
        # a load whose tag cannot be a label is refused by name; the old version serves on
        config = {"name": "tagged", "backend": "python", "max_batch_size": 8,
                  "metric_tags": {"a b": "x"}}
        with httpclient.InferenceServerClient(server.url) as client:
            with pytest.raises(InferenceServerException,
                               match="metric_tags key 'a b' cannot name a label"):
                client.load_model("tagged", config=json.dumps(config))
            bounds = {"name": "tagged", "backend": "python", "max_batch_size": 8,
                      "model_metrics": {"metric_control": [{
                          "metric_identifier": {"family": "tensorgate_queue_duration_seconds"},
                          "histogram_options": {"buckets": [2, 1]}}]}}
            with pytest.raises(InferenceServerException,
                               match=r"the bucket bounds must increase, each by 1 ns or more; "
                                     r"1.0 follows 2"):
                client.load_model("tagged", config=json.dumps(bounds))
            np.testing.assert_array_equal(_infer(client), np.full((1, 4), 3.0))
        assert value(scrape(server), "nv_inference_request_success", model="tagged",
                     version="1", _team="vision") == 4
    finally:
        assert stop_server(server) == 0, server.log.read_text()
