"""--model-control-mode as in Triton: "none" (the default) serves the whole repository and
refuses load/unload; "explicit" loads only --load-model models and allows the API; "poll"
follows the repository's changes on disk."""

from __future__ import annotations

import http.client
import json
import math
import pathlib
import re
import shutil
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
import grpc
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tensorgate.builtin.repository import default_repository
from tests.e2e.conftest import memory_bytes, post, start_server, stop_server, until
from tests.pipeline import repo_builder as rb

POLL_S = 0.2


def _repo(root: pathlib.Path, *names: str) -> pathlib.Path:
    for name in names:
        rb.add_python(root, name, max_batch=4)
    return root


def _infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer(model, [item]).as_numpy("OUTPUT__0")


def _refuses_load_and_unload(url: str, grpc_url: str, mode: str) -> None:
    message = (f"model load is not allowed: the server runs with --model-control-mode {mode}; "
               "start it with --model-control-mode explicit")
    with httpclient.InferenceServerClient(url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("a")
        assert refused.value.status() == "503" and message in refused.value.message()
        with pytest.raises(InferenceServerException, match="model unload is not allowed"):
            client.unload_model("a")
        assert client.is_model_ready("a")  # still served
    # refused before its body is read: an upload (here not even base64) is not decoded,
    # a body that is not JSON not parsed
    for body in (b'{"parameters": {"config": "{}", "file:1/model.pt": "%s"}}' % (b"?" * size)
                 for size in (16, 1 << 20)):
        status, answer = post(url, "/v2/repository/models/a/load", body)
        assert status == 503 and message in answer
    assert post(url, "/v2/repository/models/a/load", b"{not json")[0] == 503
    with grpcclient.InferenceServerClient(grpc_url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("a")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert message in refused.value.message()
    with grpc.insecure_channel(grpc_url) as channel:  # a file that is not bytes: unread
        request = service_pb2.RepositoryModelLoadRequest(model_name="a")
        request.parameters["file:1/model.py"].string_param = "x"
        with pytest.raises(grpc.RpcError) as failed:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert message in failed.value.details()


def test_default_mode_serves_everything_and_refuses_the_api(tmp_path: pathlib.Path) -> None:
    repo = _repo(tmp_path / "models", "a", "b")
    server = start_server(repo, tmp_path / "server.log")
    try:
        _refuses_load_and_unload(server.url, server.grpc_url, "none")
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_model_ready("b")
    finally:
        assert stop_server(server) == 0


def test_explicit_mode_loads_only_the_named_models(tmp_path: pathlib.Path) -> None:
    repo = _repo(tmp_path / "models", "a", "b")
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                          "--load-model", "a")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_model_ready("a") and not client.is_model_ready("b")
            # as Triton 2.51 lists them: a model never loaded by its name alone
            assert client.get_model_repository_index() == [
                {"name": "a", "version": "1", "state": "READY", "reason": ""}, {"name": "b"}]
            # a name the repository does not hold is refused and listed nowhere: a client
            # loading a million made-up names grew the index (and the server) by a million
            for name in ("nowhere", "not here"):
                with pytest.raises(InferenceServerException, match=r"^\[404\] no model"):
                    client.load_model(name)
            assert {e["name"] for e in client.get_model_repository_index()} == {"a", "b"}
            client.load_model("b")
            assert np.array_equal(_infer(client, "b"), np.full((1, 4), 3.0, np.float32))
            client.unload_model("a")
            assert not client.is_model_ready("a")
            assert client.get_model_repository_index()[0] == {  # the version it served
                "name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
            # unloading what is not loaded leaves it so, without an error (as on Triton)
            for name in ("a", "nowhere"):
                client.unload_model(name)
            with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
                grpc.unload_model("nowhere")
            assert {e["name"] for e in client.get_model_repository_index()} == {"a", "b"}
            assert client.is_model_ready("b")
            # a failed load is listed with the version that failed, as on Triton
            (repo / "a" / "1" / "model.py").write_text("raise RuntimeError('broken')\n")
            with pytest.raises(InferenceServerException, match="broken"):
                client.load_model("a")
            failed = client.get_model_repository_index()[0]
            assert (failed["name"], failed["version"], failed["state"]) == (
                "a", "1", "UNAVAILABLE") and "broken" in failed["reason"]
    finally:
        assert stop_server(server) == 0


# tritonclient's HTTP client quotes names into URLs: a space is %20, "+" %2B, "%" %25
ODD_NAMES = ("my model", "modèle+50%")


def test_names_that_urls_must_quote_are_reached_over_http_as_over_grpc(
        tmp_path: pathlib.Path) -> None:
    repo = _repo(tmp_path / "models", *ODD_NAMES)
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            for name in ODD_NAMES:
                assert not client.is_model_ready(name)
                client.load_model(name)
                assert client.is_model_ready(name)
                assert client.get_model_metadata(name)["name"] == name
                assert client.get_model_config(name)["name"] == name
                assert np.array_equal(_infer(client, name), np.full((1, 4), 3.0, np.float32))
                stats = client.get_inference_statistics(name)["model_stats"]
                assert [(s["name"], s["inference_count"]) for s in stats] == [(name, 1)]
            with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
                assert all(grpc.is_model_ready(name) for name in ODD_NAMES)
            client.unload_model(ODD_NAMES[0])
            assert not client.is_model_ready(ODD_NAMES[0])
            assert client.is_model_ready(ODD_NAMES[1])
            with pytest.raises(InferenceServerException, match=r"^\[404\] no route for"):
                client.load_model("a/b")  # quote keeps "/": a path, not a name
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("POST", "/v2/repository/models/a%2Fb/load")  # a name's "/"
        answer = connection.getresponse()
        assert answer.status == 404 and b"no model 'a/b'" in answer.read()
        connection.request("GET", "/v2/models/caf%E9/ready")  # Latin-1, not UTF-8
        answer = connection.getresponse()
        assert answer.status == 400
        assert json.loads(answer.read()) == {
            "error": "the path segment 'caf%E9' is not percent-encoded UTF-8"}
        connection.close()
        still = httpclient.InferenceServerClient(server.url)
        assert still.is_model_ready(ODD_NAMES[1])
    finally:
        assert stop_server(server) == 0


def test_unload_dependents_over_http_and_grpc(tmp_path: pathlib.Path) -> None:
    repo = _repo(tmp_path / "models", "a", "b")
    for name, step in (("ens_a", "a"), ("ens_b", "b")):
        rb.write_config(repo, name, f"""
            name: "{name}"
            platform: "ensemble"
            max_batch_size: 4
            input [ {{ name: "X" data_type: TYPE_FP32 dims: [4] }} ]
            output [ {{ name: "Y" data_type: TYPE_FP32 dims: [4] }} ]
            ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
                input_map {{ key: "INPUT__0" value: "X" }}
                output_map {{ key: "OUTPUT__0" value: "Y" }} }} ] }}
            """)
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                          "--load-model", "ens_a", "--load-model", "ens_b")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert "model_repository(unload_dependents)" in \
                client.get_server_metadata()["extensions"]
            client.unload_model("ens_a", unload_dependents=True)
            assert not client.is_model_ready("ens_a") and not client.is_model_ready("a")
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("POST", "/v2/repository/models/ens_b/unload",
                           b'{"parameters": {"unload_dependents": 1}}')
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())) == (
            400, {"error": "unload parameter 'unload_dependents' must be true or false"})
        connection.close()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.unload_model("ens_b")
            assert client.is_model_ready("b")
            client.load_model("ens_b")
            client.unload_model("ens_b", unload_dependents=True)
            assert not client.is_model_ready("ens_b") and not client.is_model_ready("b")
    finally:
        assert stop_server(server) == 0


def test_a_named_repository_is_refused_and_acts_on_nothing(tmp_path: pathlib.Path) -> None:
    """/v2/repository/{name}/... and gRPC's repository_name: one repository is served, so a
    name is refused (501 / UNIMPLEMENTED, as Triton does), not read as this server's."""
    server = start_server(_repo(tmp_path / "models", "a"), tmp_path / "server.log",
                          "--model-control-mode", "explicit", "--load-model", "a")
    refusal = ("repository 'other': naming a repository is not supported: the server serves "
               "one model repository; leave the name out (POST /v2/repository/index, "
               "/v2/repository/models/{model}/load)")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for path in ("/v2/repository/other/index", "/v2/repository/other/models/a/unload",
                     "/v2/repository/other/models/b/load"):
            connection.request("POST", path, b"{}")
            answer = connection.getresponse()
            assert (answer.status, json.loads(answer.read())) == (501, {"error": refusal}), path
        connection.request("POST", "/v2/repository/models/a/index", b"{}")  # not an index
        answer = connection.getresponse()
        assert (answer.status, answer.read()) == (
            404, b'{"error":"no route for /v2/repository/models/a/index"}')
        connection.request("POST", "/v2/repository/index", b"{}")
        answer = connection.getresponse()
        assert answer.status == 200
        assert [m["name"] for m in json.loads(answer.read())] == ["a"]
        connection.request("POST", "/v2/repository/index", b'{"ready": "false"}')
        answer = connection.getresponse()  # not read as true, which lists fewer
        assert (answer.status, answer.read()) == (
            400, b'{"error":"repository index parameter \'ready\' must be true or false"}')
        connection.close()
        channel = grpc.insecure_channel(server.grpc_url)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = ((stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(
                      repository_name="other")),
                 (stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(
                      repository_name="other", model_name="a")),
                 (stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(
                      repository_name="other", model_name="b")))
        for call, message in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call(message, timeout=30)
            assert (refused.value.code(), refused.value.details()) == (
                grpc.StatusCode.UNIMPLEMENTED, refusal)
        index = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=30)
        assert [(m.name, m.state) for m in index.models] == [("a", "READY")]
        channel.close()
        with httpclient.InferenceServerClient(server.url) as client:
            assert np.array_equal(_infer(client, "a"), np.full((1, 4), 3.0, np.float32))
    finally:
        assert stop_server(server) == 0


def test_poll_mode_follows_added_changed_and_removed_models(tmp_path: pathlib.Path) -> None:
    repo = _repo(tmp_path / "models", "a")
    spare = _repo(tmp_path / "spare", "b")
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "poll",
                          "--repository-poll-secs", str(POLL_S))
    try:
        _refuses_load_and_unload(server.url, server.grpc_url, "poll")
        with httpclient.InferenceServerClient(server.url) as client:
            shutil.copytree(spare / "b", repo / "b")  # added
            until(lambda: client.is_model_ready("b"), "model b was loaded")
            torch.save({"scale": torch.tensor(5.0)}, repo / "a" / "1" / "scale.pt")  # changed
            until(lambda: _infer(client, "a")[0, 0] == 6.0, "model a serves its new weights")
            (repo / "a" / "config.pbtxt").write_text('name: "a" max_batch_size: "x"')  # broken
            time.sleep(5 * POLL_S)
            assert _infer(client, "a")[0, 0] == 6.0  # a failed reload leaves a serving
            assert "model a failed to load" in server.log.read_text()
            shutil.rmtree(repo / "b")  # removed
            until(lambda: not client.is_model_ready("b"), "model b was unloaded")
            assert "b" not in {e["name"] for e in client.get_model_repository_index()}
    finally:
        assert stop_server(server) == 0


def test_several_repositories_serve_one_namespace_and_are_all_polled(
        tmp_path: pathlib.Path) -> None:
    """--model-repository twice, as Triton takes it: the models of both are served; a name
    both hold is served from neither (the index says why, naming both folders) until one of
    them goes; a poll follows each repository's changes."""
    one, two = _repo(tmp_path / "one", "a", "both"), _repo(tmp_path / "two", "b", "both")
    spare = _repo(tmp_path / "spare", "c")
    server = start_server(one, tmp_path / "server.log", "--model-repository", str(two),
                          "--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S))
    try:
        assert f"repositories {one}, {two}\n" in server.log.read_text()
        with httpclient.InferenceServerClient(server.url) as client:
            assert _infer(client, "a")[0, 0] == 3.0
            index = {e["name"]: e for e in client.get_model_repository_index()}
            assert {name: e["state"] for name, e in index.items()} == {
                "a": "READY", "b": "READY", "both": "UNAVAILABLE"}
            assert index["both"]["reason"] == (
                f"model 'both' is not unique across the model repositories: it is in "
                f"'{one / 'both'}', '{two / 'both'}'; remove or rename all but one")
            with pytest.raises(InferenceServerException, match="'both'"):
                _infer(client, "both")
            shutil.rmtree(two / "both")
            until(lambda: client.is_model_ready("both"), "model both was loaded from one")
            assert _infer(client, "both")[0, 0] == 3.0
            shutil.copytree(spare / "c", two / "c")
            until(lambda: client.is_model_ready("c"), "model c was loaded from two")
            shutil.rmtree(one / "a")
            until(lambda: not client.is_model_ready("a"), "model a was unloaded")
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert {m.name for m in client.get_model_repository_index().models} == {
                "b", "both", "c"}
            item = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
            item.set_data_from_numpy(np.ones((1, 4), np.float32))
            assert client.infer("b", [item]).as_numpy("OUTPUT__0")[0, 0] == 3.0
    finally:
        assert stop_server(server) == 0


def test_a_load_may_override_the_config(tmp_path: pathlib.Path) -> None:
    """Triton's load `config` parameter (Model Analyzer's way to try configs): the model
    loads with the given JSON config instead of its config.pbtxt, until a load without one."""
    repo = _repo(tmp_path / "models", "a")
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                          "--load-model", "a")
    try:
        with httpclient.InferenceServerClient(server.url) as client, \
                grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
            config = client.get_model_config("a")
            assert config["max_batch_size"] == 4
            config["max_batch_size"] = 2
            config["parameters"]["delay_s"] = {"string_value": "0.001"}
            client.load_model("a", config=json.dumps(config))
            changed = client.get_model_config("a")
            assert changed["max_batch_size"] == 2
            assert changed["parameters"]["delay_s"]["string_value"] == "0.001"
            three = httpclient.InferInput("INPUT__0", [3, 4], "FP32")
            three.set_data_from_numpy(np.ones((3, 4), np.float32))
            with pytest.raises(InferenceServerException, match="max_batch_size is 2"):
                client.infer("a", [three])
            # over gRPC too
            config["max_batch_size"] = 3
            grpc_client.load_model("a", config=json.dumps(config))
            assert client.get_model_config("a")["max_batch_size"] == 3
            assert client.infer("a", [three]).as_numpy("OUTPUT__0").shape == (3, 4)
            # refused by name, and the loaded model goes on serving as it was
            for bad, message in [
                ("{not json", "the load request's 'config' of model 'a'"),
                (json.dumps({**config, "max_batch_sise": 1}), "max_batch_sise"),
                (json.dumps({**config, "name": "b"}),
                 "field 'name' is 'b' but the model being loaded is 'a'"),
            ]:
                with pytest.raises(InferenceServerException, match=re.escape(message)):
                    client.load_model("a", config=bad)
                assert client.get_model_config("a")["max_batch_size"] == 3
                assert np.array_equal(_infer(client, "a"), np.full((1, 4), 3.0, np.float32))
            with pytest.raises(InferenceServerException, match="uploading model files"):
                client.load_model("a", config=json.dumps(config),
                                  files={"file:1/model.py": b"import os"})
            with pytest.raises(InferenceServerException, match="uploading model files"):
                grpc_client.load_model("a", config=json.dumps(config),
                                       files={"file:1/model.py": b"import os"})
            # labels follow the config that is loaded (read again at each load)
            (repo / "a" / "labels.txt").write_text("zero\none\ntwo\nthree\n")
            (repo / "a" / "other.txt").write_text("nul\neins\nzwei\ndrei\n")
            wanted = [httpclient.InferRequestedOutput("OUTPUT__0", class_count=1)]
            one = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
            one.set_data_from_numpy(np.array([[0, 0, 5, 0]], np.float32))
            for labels, top in (("labels.txt", b"two"), ("other.txt", b"zwei")):
                config["output"][0]["label_filename"] = labels
                client.load_model("a", config=json.dumps(config))
                [answer] = client.infer("a", [one], outputs=wanted).as_numpy("OUTPUT__0")
                assert answer[0].split(b":")[-1] == top
            # a file a client's config names stays inside the model's directory
            config["output"][0]["label_filename"] = "../../server.log"
            with pytest.raises(InferenceServerException, match="must be a file name in"):
                client.load_model("a", config=json.dumps(config))
            config["output"][0]["label_filename"] = "labels.txt"
            config["default_model_filename"] = "../../a/1/model.py"
            with pytest.raises(InferenceServerException, match="must be a file name in"):
                grpc_client.load_model("a", config=json.dumps(config))
            client.load_model("a")  # without a config: the repository's again
            assert client.get_model_config("a")["max_batch_size"] == 4
    finally:
        assert stop_server(server) == 0


def test_a_loads_config_cannot_make_the_server_allocate_gigabytes_of_zeros(
        tmp_path: pathlib.Path) -> None:
    """A client's load `config` whose inputs are gigabytes a row: the model loads without the
    zero warm-up (4.8 GB of zeros for this one, at the client's word; 19 GB would have had the
    server killed), the log says why, and the server's peak memory does not move."""
    repo = tmp_path / "models"
    shutil.copytree(default_repository() / "identity", repo / "identity")
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                          "--load-model", "identity")
    try:
        with httpclient.InferenceServerClient(server.url, network_timeout=120) as client:
            config = client.get_model_config("identity")
            for tensor in config["input"] + config["output"]:
                tensor["dims"] = ["3", "20000", "20000"]
            peak = memory_bytes("VmHWM", server.process.pid)
            client.load_model("identity", config=json.dumps(config))
            assert client.get_model_config("identity")["input"][0]["dims"] == [3, 20000, 20000]
            assert memory_bytes("VmHWM", server.process.pid) - peak < 256 << 20
            assert ("model identity: no warm-up: it has no model_warmup, and zeros cannot "
                    "stand in: input 'INPUT__0' would be 4,800,000,000 bytes of zeros, more "
                    "than a warm-up input may be (1,073,741,824)") in server.log.read_text()
            client.load_model("identity")  # its own config again: warmed and serving
            item = httpclient.InferInput("INPUT__0", [1, 3, 224, 224], "FP32")
            x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
            item.set_data_from_numpy(x)
            assert np.array_equal(client.infer("identity", [item]).as_numpy("OUTPUT__0"), x)
    finally:
        assert stop_server(server) == 0


@pytest.fixture(scope="module")
def explicit_identity(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fuzzed_loads")
    shutil.copytree(default_repository() / "identity", root / "models" / "identity")
    server = start_server(root / "models", root / "server.log", "--model-control-mode",
                          "explicit", "--load-model", "identity")
    yield server
    assert stop_server(server) == 0, server.log.read_text()


# Integer fields of a config, as paths into its JSON form, and values a hostile or careless
# client may put there: the proto's limits and past them.
_FIELDS = [("max_batch_size",), ("dynamic_batching", "max_queue_delay_microseconds"),
           ("dynamic_batching", "preferred_batch_size", 0),
           ("dynamic_batching", "priority_levels"),
           ("dynamic_batching", "default_queue_policy", "max_queue_size"),
           ("instance_group", 0, "count"), ("input", 0, "dims", 0), ("input", 0, "dims", 2),
           ("output", 0, "dims", 1), ("version_policy", "latest", "num_versions"),
           ("sequence_batching", "oldest", "max_candidate_sequences"),
           ("sequence_batching", "max_sequence_idle_microseconds"),
           ("model_warmup", 0, "batch_size"), ("model_warmup", 0, "count"),
           ("model_warmup", 0, "inputs", "INPUT__0", "dims", 1)]
_EXTREMES_LIST = [0, 1, -1, 20_000, 30_000_000, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1,
                  -2**63, 2**64]
_EXTREMES = st.sampled_from(_EXTREMES_LIST)


def _set(config: dict, path: tuple, value: object) -> None:  # type: ignore[type-arg]
    """`value` at `path`, the objects on the way made where the config has none."""
    for key in path[:-1]:
        config = config.setdefault(key, {}) if isinstance(key, str) else config[key]
    config[path[-1]] = value


def test_each_integer_field_at_each_extreme_loads_or_is_refused_within_memory(
        explicit_identity) -> None:  # type: ignore[no-untyped-def]
    """Every field of _FIELDS at every value of _EXTREMES, one at a time: the sweep the fuzz
    below samples from, so that no single case (30,000,000 sequence slots, say) is left to
    chance."""
    for path in _FIELDS:
        for value in _EXTREMES_LIST:
            _load_or_refused(explicit_identity, [(path, value)])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.sampled_from(_FIELDS),
                                  _EXTREMES | st.integers(-2**65, 2**65)), min_size=1,
                        max_size=3))
@example(changes=[(("input", 0, "dims", 2), 230950)])  # 620 MB of warm-up zeros, allowed
def test_fuzzed_load_configs_load_or_are_refused_by_name_and_cost_no_memory(
        explicit_identity, changes: list) -> None:  # type: ignore[no-untyped-def,type-arg]
    """A load's `config` whose integers are the proto's extremes, or past them, several at
    once."""
    _load_or_refused(explicit_identity, changes)


def _load_or_refused(server, changes: list) -> None:  # type: ignore[no-untyped-def,type-arg]
    """The model loads with `changes` made to its config (the server bounding what such
    numbers would have it allocate) or the load is refused naming the config; the server
    serves on within its memory, and the model with its own config after."""
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        config = client.get_model_config("identity")
        if any(path[0] == "model_warmup" for path, _ in changes):  # else zeros at batch 1
            config["model_warmup"] = [{"name": "w", "batch_size": 1, "count": 1, "inputs": {
                "INPUT__0": {"data_type": "TYPE_FP32", "dims": [3, 224, 224],
                             "zero_data": True}}}]
        if any(path[0] == "sequence_batching" for path, _ in changes):
            del config["dynamic_batching"]  # one scheduler or the other
            config["sequence_batching"] = {"oldest": {}}
        if any(path[:2] == ("dynamic_batching", "preferred_batch_size") for path, _ in changes):
            config.setdefault("dynamic_batching", {})["preferred_batch_size"] = [1]
        for path, value in changes:
            _set(config, path, value)
        before = memory_bytes("VmHWM", server.process.pid)
        try:
            client.load_model("identity", config=json.dumps(config))
        except InferenceServerException as refused:
            assert refused.status() == "400", refused.message()
            assert "model 'identity'" in refused.message(), refused.message()
        assert client.is_server_live()
        grown = memory_bytes("VmHWM", server.process.pid) - before
        assert grown < (512 << 20) + 2 * _warmup_bytes(config), grown
        client.load_model("identity")  # its own config again: serving as before
        assert np.array_equal(_infer_identity(client), np.ones((1, 3, 224, 224), np.float32))


def _warmup_bytes(config: dict) -> int:  # type: ignore[type-arg]
    """The zeros a warm-up with `config` may make, as the server bounds them: its one FP32
    input at the sample's batch (batch 1 without a sample), up to 1 GiB (past it, none).
    Its answer may take as much again: [3, 224, 230950] grew the peak by 567 MB."""
    sample = (config.get("model_warmup") or [None])[0]
    batch, dims = ((1, config["input"][0]["dims"]) if sample is None else
                   (sample.get("batch_size", 1), sample["inputs"]["INPUT__0"]["dims"]))
    nbytes = 4 * max(int(batch), 1) * math.prod(max(int(d), 1) for d in dims)
    return nbytes if nbytes <= 1 << 30 else 0


def _infer_identity(client: httpclient.InferenceServerClient) -> np.ndarray:
    item = httpclient.InferInput("INPUT__0", [1, 3, 224, 224], "FP32")
    item.set_data_from_numpy(np.ones((1, 3, 224, 224), np.float32))
    return client.infer("identity", [item]).as_numpy("OUTPUT__0")
