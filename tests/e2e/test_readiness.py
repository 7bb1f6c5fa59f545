"""Server readiness as Triton's --strict-readiness has it (a model that failed to load
makes the server unready, over HTTP and gRPC, while the others serve; unloading it makes
the server ready again), --exit-on-error, and Triton's flag names for tensorgate's
settings."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tensorgate.cli_triton import triton_settings
from tests.e2e.conftest import RunningServer, held_port, start_server, stop_server
from tests.pipeline import repo_builder as rb


def _repo(root: pathlib.Path) -> pathlib.Path:
    repo = root / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4])
    rb.write_config(repo, "broken", """
        name: "broken"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        """)  # no model.pt in its version folder
    (repo / "broken" / "1").mkdir(parents=True, exist_ok=True)
    return repo


def _ready(server: RunningServer) -> tuple[bool, bool]:
    with httpclient.InferenceServerClient(server.url) as http, \
            grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        return http.is_server_ready(), grpc.is_server_ready()


def _serves_identity(server: RunningServer) -> bool:
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    with httpclient.InferenceServerClient(server.url) as client:
        return bool(client.infer("identity", [item]).as_numpy("OUTPUT__0").sum() == 4)


def test_a_model_that_failed_to_load_makes_the_server_unready(tmp_path: pathlib.Path) -> None:
    repo = _repo(tmp_path)
    server = start_server(repo, tmp_path / "strict.log")
    try:
        assert _ready(server) == (False, False)
        assert _serves_identity(server)  # the others serve
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_server_live() and client.is_model_ready("identity")
            assert not client.is_model_ready("broken")
    finally:
        assert stop_server(server) == 0, server.log.read_text()
    server = start_server(repo, tmp_path / "lenient.log", "--strict-readiness", "false")
    try:
        assert _ready(server) == (True, True)
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_explicit_mode_is_unready_while_a_load_it_was_asked_for_fails(
        tmp_path: pathlib.Path) -> None:
    server = start_server(_repo(tmp_path), tmp_path / "server.log", "--model-control-mode",
                          "explicit", "--load-model", "identity")
    try:
        assert _ready(server) == (True, True)  # broken was never asked for
        with httpclient.InferenceServerClient(server.url) as client:
            with pytest.raises(Exception, match="broken"):
                client.load_model("broken")
            assert _ready(server) == (False, False)
            client.unload_model("broken")  # forgotten: nothing is missing any more
            assert _ready(server) == (True, True)
        assert _serves_identity(server)
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_exit_on_error_stops_the_server_naming_the_model(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError, match="server exited with 1"):
        start_server(_repo(tmp_path), log, "--exit-on-error=true")
    text = log.read_text()
    assert "models failed to load (--exit-on-error): broken:" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port", "--metrics-port"])
def test_a_port_already_held_stops_the_start_with_a_line_naming_it(
        tmp_path: pathlib.Path, flag: str) -> None:
    repo = tmp_path / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4])
    log = tmp_path / "server.log"
    with held_port() as port, pytest.raises(RuntimeError, match="server exited with 1"):
        start_server(repo, log, flag, str(port))
    what = {"--http-port": "HTTP", "--grpc-port": "gRPC", "--metrics-port": "metrics"}[flag]
    text = log.read_text()
    assert (f"cannot listen for {what} on 127.0.0.1 port {port}: Address already in use "
            f"(change {flag}, or stop what holds it)") in text
    assert "Traceback" not in text


def test_tritons_flag_names_carry_over() -> None:
    assert triton_settings({"strict_model_config": "true", "log_verbose": 1,
                            "cache_config": "local,size=1048576", "log_level": None,
                            "disable_auto_complete_config": None,
                            "response_cache_bytes": None}) == {
        "disable_auto_complete_config": "true", "log_level": "DEBUG",
        "response_cache_bytes": 1048576}
    # tensorgate's own flag wins; verbosity 0 changes nothing
    assert triton_settings({"log_verbose": 0, "cache_config": "local,size=5",
                            "response_cache_bytes": 9}) == {}
    with pytest.raises(ValueError, match="--cache-config 'redis,host=x': only local,size="
                                         "BYTES is supported"):
        triton_settings({"cache_config": "redis,host=x"})


def test_tritons_flags_on_the_command_line(tmp_path: pathlib.Path) -> None:
    """The flags parse and reach the config (checked by the server refusing a bad one)."""
    answer = subprocess.run(
        [sys.executable, "-m", "tensorgate", "serve", "--exit-timeout-secs", "5",
         "--strict-model-config", "false", "--log-verbose", "1", "--allow-metrics", "maybe"],
        capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2
    assert "setting 'allow_metrics' expects bool, got 'maybe'" in answer.stderr
