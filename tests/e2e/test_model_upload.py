"""Model upload (--allow-model-upload): a load's `file:<path>` parameters are the folder the
model loads from, with the load's `config` its config, as Triton's override files are; sent
with tritonclient's own `load_model(files=...)` over HTTP (base64) and gRPC (bytes)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, post, start_server, stop_server
from tests.pipeline import repo_builder as rb


class Served:
    def __init__(self, server: RunningServer, repo: pathlib.Path, uploads: pathlib.Path,
                 outside: pathlib.Path) -> None:
        self.server, self.repo, self.uploads, self.outside = server, repo, uploads, outside

    def folders(self) -> list[pathlib.Path]:
        """The upload folders the server holds now (its TMPDIR is `uploads`)."""
        return sorted(self.uploads.glob("tensorgate-upload-*"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("upload")
    repo = root / "models"
    rb.add_python(repo, "a", max_batch=4)
    uploads, outside = root / "tmp", root / "tmp" / "outside"
    outside.mkdir(parents=True)
    with mock.patch.dict(os.environ, TMPDIR=str(uploads)):
        server = start_server(repo, root / "server.log", "--model-control-mode", "explicit",
                              "--load-model", "a", "--allow-model-upload")
    try:
        yield Served(server, repo, uploads, outside)
    finally:
        assert stop_server(server) == 0, (root / "server.log").read_text()


def _config(client: httpclient.InferenceServerClient, name: str) -> str:
    """Model a's config (a Python model, x * scale + 1) under another name."""
    config = client.get_model_config("a")
    config["name"] = name
    return json.dumps(config)


def _files(scale: float = 2.0, source: str = rb.PYTHON_MODEL) -> dict[str, bytes]:
    weights = io.BytesIO()
    torch.save({"scale": torch.tensor(scale)}, weights)
    return {"file:1/model.py": source.encode(), "file:1/scale.pt": weights.getvalue()}


def _infer(client: Any, model: str, module: Any = httpclient) -> np.ndarray:
    item = module.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer(model, [item]).as_numpy("OUTPUT__0")


def _post_load(url: str, model: str, body: dict[str, Any]) -> tuple[int, str]:
    return post(url, f"/v2/repository/models/{model}/load", json.dumps(body).encode())


def test_an_uploaded_model_serves_until_unloaded_and_its_folder_goes_with_it(
        served: Served) -> None:
    with httpclient.InferenceServerClient(served.server.url) as client, \
            grpcclient.InferenceServerClient(served.server.grpc_url) as grpc_client:
        client.load_model("up", config=_config(client, "up"), files=_files(2.0))
        assert client.is_model_ready("up")
        assert np.array_equal(_infer(client, "up"), np.full((1, 4), 3.0, np.float32))
        assert "model upload allowed" in served.server.log.read_text()
        index = {e["name"]: e for e in client.get_model_repository_index()}
        assert index["up"]["state"] == "READY"
        [folder] = served.folders()
        assert (folder / "up" / "1" / "model.py").read_text() == rb.PYTHON_MODEL
        assert folder.stat().st_mode & 0o777 == 0o700  # the server's user's alone
        # loaded again over gRPC with other weights: the new folder serves, the old is gone
        grpc_client.load_model("up", config=_config(client, "up"), files=_files(3.0))
        assert np.array_equal(_infer(grpc_client, "up", grpcclient),
                              np.full((1, 4), 4.0, np.float32))
        [second] = served.folders()
        assert second != folder and not folder.exists()
        # an upload whose model fails to load: refused, its folder removed, the last serves
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("up", config=_config(client, "up"),
                              files=_files(source="def broken(:\n"))
        assert failed.value.status() == "400" and "SyntaxError" in failed.value.message()
        assert served.folders() == [second]
        assert np.array_equal(_infer(client, "up"), np.full((1, 4), 4.0, np.float32))
        # a load without files looks in the repository, which has no 'up': the upload serves on
        with pytest.raises(InferenceServerException, match="no model 'up' in repository"):
            client.load_model("up")
        assert client.is_model_ready("up") and served.folders() == [second]
        client.unload_model("up")
        assert not client.is_model_ready("up") and served.folders() == []


def test_an_upload_stands_in_for_a_repository_model_until_it_loads_from_there_again(
        served: Served) -> None:
    """A TorchScript model uploaded as model 'a' (a Python model in the repository): served
    from the upload, then from the repository again at a load without files."""
    script = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Identity()), script)
    config = {"name": "a", "platform": "pytorch_libtorch", "max_batch_size": 4,
              "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [4]}]}
    with grpcclient.InferenceServerClient(served.server.grpc_url) as client:
        try:
            client.load_model("a", config=json.dumps(config),
                              files={"file:1/model.pt": script.getvalue()})
            assert np.array_equal(_infer(client, "a", grpcclient), np.ones((1, 4), np.float32))
            assert client.get_model_config("a").config.platform == "pytorch_libtorch"
            assert len(served.folders()) == 1
        finally:
            client.load_model("a")  # the repository's again
        assert np.array_equal(_infer(client, "a", grpcclient), np.full((1, 4), 3.0, np.float32))
        assert served.folders() == []


def test_what_an_upload_may_not_be_is_refused_by_name(served: Served) -> None:
    source = base64.b64encode(rb.PYTHON_MODEL.encode()).decode()
    with httpclient.InferenceServerClient(served.server.url) as client:
        config = _config(client, "up")
    for parameters, status, message in [
        ({"file:1/model.py": source}, 400, "the load's 'config' parameter must give the "
                                           "model's config too"),
        ({"config": config, "file:../outside/1/model.py": source}, 400,
         "the path after 'file:' must be relative to the model's folder"),
        ({"config": config, "file:/etc/x": source}, 400, "must be relative"),
        ({"config": config, "file:": source}, 400, "must be relative"),
        ({"config": config, "file:1/./model.py": source}, 400, "must be relative"),
        ({"config": config, "file:1/model.py": "not base64!"}, 400, "is not base64"),
        ({"config": config, "file:1/model.py": 7}, 400, "must be a string: the file's "
                                                        "content in base64, not int"),
        ({"config": config, "file:1": source, "file:1/model.py": source}, 400,
         "a path may not name both a file and a folder"),
        ({"config": config, "file:model.py": source}, 400, "no version directory"),
    ]:
        answer = _post_load(served.server.url, "up", {"parameters": parameters})
        assert answer[0] == status and message in json.loads(answer[1])["error"], answer
    with grpc.insecure_channel(served.server.grpc_url) as channel:
        request = service_pb2.RepositoryModelLoadRequest(model_name="up")
        request.parameters["config"].string_param = config
        request.parameters["file:1/model.py"].string_param = rb.PYTHON_MODEL
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must be a bytes parameter (bytes_param)" in refused.value.details()
    assert served.folders() == [] and list(served.outside.iterdir()) == []
    with httpclient.InferenceServerClient(served.server.url) as client:
        assert not client.is_model_ready("up")
        assert np.array_equal(_infer(client, "a"), np.full((1, 4), 3.0, np.float32))


_NAME = st.text(st.sampled_from("ab1./\\\0~-é"), min_size=0, max_size=12)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(paths=st.lists(_NAME, min_size=1, max_size=3, unique=True))
@example(paths=["../../outside/x"])
@example(paths=["1/..", "1/model.py"])
@example(paths=["1/model.py", "1/model.py/x"])
def test_no_upload_writes_outside_its_folder_nor_stops_the_server(
        served: Served, paths: list[str]) -> None:
    """Any paths at all: the load is answered (refused with a reason, or done), every file
    it wrote lies in its own folder, and once unloaded nothing is left."""
    with httpclient.InferenceServerClient(served.server.url) as client:
        config = _config(client, "fuzzed")
        files = {f"file:{path}": b"x = 1\n" for path in paths}
        try:
            client.load_model("fuzzed", config=config, files=files)
            loaded = True
        except InferenceServerException as error:
            assert error.status() == "400", error
            loaded = False
        for folder in served.folders():
            written = [p.relative_to(folder) for p in folder.rglob("*") if p.is_file()]
            assert all(str(p.relative_to("fuzzed"))
                       in {path for path in paths} for p in written), written
        client.unload_model("fuzzed")
        assert served.folders() == [] and list(served.outside.iterdir()) == []
        assert client.is_model_ready("fuzzed") is False
        assert loaded is False or "1/model.py" in paths  # a Python model needs its code
        assert np.array_equal(_infer(client, "a"), np.full((1, 4), 3.0, np.float32))


def test_uploads_are_refused_unless_the_server_allows_them(tmp_path: pathlib.Path) -> None:
    rb.add_python(tmp_path / "models", "a", max_batch=4)
    server = start_server(tmp_path / "models", tmp_path / "server.log",
                          "--model-control-mode", "explicit", "--load-model", "a")
    try:
        with httpclient.InferenceServerClient(server.url) as client, \
                grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
            config = _config(client, "up")
            for each in (client, grpc_client):
                with pytest.raises(InferenceServerException,
                                   match="start the server with --allow-model-upload"):
                    each.load_model("up", config=config, files=_files())
            # refused before a file is read: here none is base64, nor a bytes parameter
            for size in (16, 1 << 20):
                status, answer = _post_load(server.url, "up", {"parameters": {
                    "config": config, "file:1/model.pt": "?" * size}})
                assert status == 400 and "--allow-model-upload" in answer, answer
            with grpc.insecure_channel(server.grpc_url) as channel:
                request = service_pb2.RepositoryModelLoadRequest(model_name="up")
                request.parameters["config"].string_param = config
                request.parameters["file:1/model.py"].string_param = rb.PYTHON_MODEL
                with pytest.raises(grpc.RpcError) as refused:
                    service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                        request)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "--allow-model-upload" in refused.value.details()
            assert not client.is_model_ready("up")
    finally:
        assert stop_server(server) == 0
    assert "model upload allowed" not in (tmp_path / "server.log").read_text()


_SLOW_SOURCE = b'''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(1.0)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT__0", pb_utils.get_input_tensor_by_name(r, "INPUT__0").as_numpy())])
            for r in requests]
'''


def test_a_load_whose_client_goes_away_is_done_all_the_same(served: Served) -> None:
    """The client closes its connection while the model loads (1 s in its initialize): the
    load goes on to its end, as on Triton; the model serves, and its folder is the one left."""
    with httpclient.InferenceServerClient(served.server.url) as client:
        config = json.loads(_config(client, "slow"))
    config.update(backend="python", parameters={})
    body = json.dumps({"parameters": {
        "config": json.dumps(config),
        "file:1/model.py": base64.b64encode(_SLOW_SOURCE).decode()}}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=60)
    connection.request("POST", "/v2/repository/models/slow/load", body)
    time.sleep(0.3)
    connection.close()  # gone before the answer
    with httpclient.InferenceServerClient(served.server.url) as client:
        deadline = time.monotonic() + 20
        while not client.is_model_ready("slow") and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            assert client.is_model_ready("slow")
            assert np.array_equal(_infer(client, "slow"), np.ones((1, 4), np.float32))
            assert len(served.folders()) == 1
        finally:
            client.unload_model("slow")
    assert served.folders() == []
