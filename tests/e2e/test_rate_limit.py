"""Triton's rate limiter over a real server: two models whose instances need the one copy of
a resource never run at once under --rate-limit execution_count, and do without it; an
instance that could never run fails its model's load, naming the resource."""

from __future__ import annotations

import pathlib
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import start_server, stop_server
from tests.pipeline import repo_builder as rb

CLOCKED = '''
import time

import torch

from tensorgate import Model


class Clocked(Model):
    """Answers when its forward began and ended (the server's monotonic clock)."""

    def preprocess(self, inputs):
        return inputs["INPUT__0"]

    def forward(self, batch):
        start = time.monotonic()
        time.sleep(0.25)
        return torch.tensor([[start, time.monotonic()]], dtype=torch.float64).expand(
            batch.shape[0], 2)

    def postprocess(self, outputs):
        return {"OUTPUT__0": outputs}
'''


def _add_clocked(repo: pathlib.Path, name: str, count: int) -> None:
    folder = rb.write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [1] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP64 dims: [2] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU
                           rate_limiter {{ resources [ {{ name: "R" count: {count} }} ] }} }} ]
        """)
    (folder / "1" / "model.py").write_text(CLOCKED)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("rate_limit") / "models"
    _add_clocked(root, "first", 1)
    _add_clocked(root, "second", 1)
    return root


def _intervals(url: str) -> list[tuple[float, float]]:
    """Three requests to each model from two threads at once: each one's forward interval."""
    found: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    def call(model: str) -> None:
        item = httpclient.InferInput("INPUT__0", [1, 1], "FP32")
        item.set_data_from_numpy(np.zeros((1, 1), np.float32))
        try:
            with httpclient.InferenceServerClient(url, network_timeout=30) as client:
                for _ in range(3):
                    start, end = client.infer(model, [item]).as_numpy("OUTPUT__0")[0]
                    found.append((float(start), float(end)))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=call, args=(m,)) for m in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and len(found) == 6, errors
    return sorted(found)


def _overlaps(intervals: list[tuple[float, float]]) -> int:
    return sum(later[0] < earlier[1] for earlier, later in zip(intervals, intervals[1:]))


def test_instances_sharing_one_resource_take_turns(repo: pathlib.Path,
                                                   tmp_path: pathlib.Path) -> None:
    server = start_server(repo, tmp_path / "limited.log", "--rate-limit", "execution_count")
    try:
        assert _overlaps(_intervals(server.url)) == 0
    finally:
        assert stop_server(server) == 0, server.log.read_text()
    server = start_server(repo, tmp_path / "free.log")  # --rate-limit off: they overlap
    try:
        assert _overlaps(_intervals(server.url)) >= 1
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_an_instance_that_could_never_run_fails_its_load(repo: pathlib.Path,
                                                         tmp_path: pathlib.Path) -> None:
    greedy = tmp_path / "models"
    _add_clocked(greedy, "first", 1)
    _add_clocked(greedy, "greedy", 2)
    server = start_server(greedy, tmp_path / "server.log", "--rate-limit", "execution_count",
                          "--rate-limit-resource", "R:1")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            index = {entry["name"]: entry for entry in client.get_model_repository_index()}
            assert index["first"]["state"] == "READY"
            assert index["greedy"]["state"] == "UNAVAILABLE"
            assert ("needs 2 of rate limiter resource 'R' (the CPU), but "
                    "--rate-limit-resource gives 1" in index["greedy"]["reason"])
    finally:
        assert stop_server(server) == 0, server.log.read_text()
