"""The server listens while its models load: live at once, ready once every model has
loaded; a request for a model still loading is answered that it is (HTTP 503, gRPC
UNAVAILABLE), one for a model already loaded is served, and the repository index says
LOADING. A stop meanwhile drains the loaded models and exits without waiting for the loads;
a port already held fails the start before any model loads."""

from __future__ import annotations

import pathlib
import queue
import threading
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import (RunningServer, health_check, held_port, start_server,
                                stop_server)
from tests.pipeline import repo_builder as rb

GATED = '''
import pathlib
import time

from tensorgate import Model


class Gated(Model):
    """Its load writes the file `started` names, then waits (at most 60 s) until the file
    `gate` names exists: a test sees the server while this model loads."""

    def setup(self, context):
        pathlib.Path(context.parameters["started"]).write_text("started")
        gate = pathlib.Path(context.parameters["gate"])
        deadline = time.monotonic() + 60
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def forward(self, inputs):
        return {"OUTPUT__0": inputs["INPUT__0"] * 2}
'''


def _repo(root: pathlib.Path) -> pathlib.Path:
    repo = root / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4])
    rb.add_python(repo, "slow", delay_s=2.0)  # doubles, adds one, after 2 s
    folder = rb.write_config(repo, "gated", f"""
        name: "gated"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        parameters {{ key: "gate" value {{ string_value: "{root / 'gate'}" }} }}
        parameters {{ key: "started" value {{ string_value: "{root / 'started'}" }} }}
        """)
    (folder / "1" / "model.py").write_text(GATED)
    return repo


def _wait(done, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, f"{what} within {limit_s} s"
        time.sleep(0.05)


def _ones() -> tuple[httpclient.InferInput, grpcclient.InferInput]:
    items = (httpclient.InferInput("INPUT__0", [1, 4], "FP32"),
             grpcclient.InferInput("INPUT__0", [1, 4], "FP32"))
    for item in items:
        item.set_data_from_numpy(np.ones((1, 4), np.float32))
    return items


def _while_loading(server: RunningServer, root: pathlib.Path) -> None:
    """What the server answers while `gated` loads (identity and slow have loaded)."""
    http_in, grpc_in = _ones()
    with httpclient.InferenceServerClient(server.url) as http, \
            grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        _wait(lambda: http.is_model_ready("identity") and http.is_model_ready("slow"),
              "identity and slow loaded")
        assert (root / "started").exists() and not (root / "gate").exists()
        assert http.is_server_live() and grpc.is_server_live()
        assert not http.is_server_ready() and not grpc.is_server_ready()
        assert health_check(server.grpc_url, "liveness") == "SERVING"  # Kubernetes' probes
        for service in ("", "readiness"):
            assert health_check(server.grpc_url, service) == "NOT_SERVING"
        assert not http.is_model_ready("gated") and not grpc.is_model_ready("gated")
        states = {e["name"]: e.get("state") for e in http.get_model_repository_index()}
        assert states == {"identity": "READY", "slow": "READY", "gated": "LOADING"}
        with pytest.raises(InferenceServerException) as refused:
            http.infer("gated", [http_in])
        assert refused.value.status() == "503"
        assert "model 'gated' is loading and not ready yet" in refused.value.message()
        with pytest.raises(InferenceServerException) as refused:
            grpc.infer("gated", [grpc_in])
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "model 'gated' is loading and not ready yet" in refused.value.message()
        with pytest.raises(InferenceServerException, match="'gated' is loading"):
            http.get_model_metadata("gated")
        assert http.infer("identity", [http_in]).as_numpy("OUTPUT__0").tolist() == [[1.0] * 4]
        assert grpc.infer("identity", [grpc_in]).as_numpy("OUTPUT__0").tolist() == [[1.0] * 4]


def test_live_while_models_load_ready_once_they_have(tmp_path: pathlib.Path) -> None:
    server = start_server(_repo(tmp_path), tmp_path / "server.log", until="loading:")
    try:
        assert "ready:" not in server.log.read_text()
        _while_loading(server, tmp_path)
        (tmp_path / "gate").write_text("open")
        http_in, grpc_in = _ones()
        with httpclient.InferenceServerClient(server.url) as http, \
                grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            _wait(http.is_server_ready, "the server ready")
            assert grpc.is_server_ready() and http.is_model_ready("gated")
            assert http.infer("gated", [http_in]).as_numpy("OUTPUT__0").tolist() == [[2.0] * 4]
            assert grpc.infer("gated", [grpc_in]).as_numpy("OUTPUT__0").tolist() == [[2.0] * 4]
        _wait(lambda: "ready: gated v1, identity v1, slow v1" in server.log.read_text(), "the line")
    finally:
        (tmp_path / "gate").write_text("open")
        assert stop_server(server) == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


def test_a_stop_while_models_load_drains_the_loaded_ones_and_exits_without_the_loads(
        tmp_path: pathlib.Path) -> None:
    """SIGTERM while `gated` loads: a request already running on `slow` is answered, and
    the process exits 0 at once, not when the load would end (it waits up to 60 s)."""
    server = start_server(_repo(tmp_path), tmp_path / "server.log", until="loading:")
    answers: queue.Queue[Any] = queue.Queue()
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))

    def ask() -> None:
        with httpclient.InferenceServerClient(server.url, network_timeout=30) as client:
            try:
                answers.put(client.infer("slow", [item]).as_numpy("OUTPUT__0").tolist())
            except Exception as error:  # noqa: BLE001 - the test names what came back
                answers.put(error)

    try:
        with httpclient.InferenceServerClient(server.url) as http:
            _wait(lambda: http.is_model_ready("slow"), "slow loaded")
        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(0.5)  # the request is in slow's 2 s
        stopped = time.monotonic()
        assert stop_server(server) == 0, server.log.read_text()
        assert time.monotonic() - stopped < 20
        asking.join(timeout=30)
        assert answers.get(timeout=1) == [[3.0] * 4]
    finally:
        (tmp_path / "gate").write_text("open")
        if server.process.poll() is None:
            server.process.kill()
    text = server.log.read_text()
    assert "stopping while models load" in text and "Traceback" not in text


def test_a_port_already_held_fails_the_start_before_any_model_loads(
        tmp_path: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    with held_port() as port, pytest.raises(RuntimeError, match="server exited with 1"):
        start_server(_repo(tmp_path), log, "--grpc-port", str(port))
    assert f"cannot listen for gRPC on 127.0.0.1 port {port}" in log.read_text()
    assert not (tmp_path / "started").exists()  # the gated model's load never began
