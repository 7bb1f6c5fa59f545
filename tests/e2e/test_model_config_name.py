"""Triton's --model-config-name over a real server: each model serves its
configs/<name>.pbtxt where it has one, its config.pbtxt where not, and in poll mode a named
config added or removed is followed (as Triton: "the server will pick the configuration file
for each loaded model dynamically")."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import start_server, stop_server, until
from tests.pipeline import repo_builder as rb

POLL_S = 0.2


def _batch(client: httpclient.InferenceServerClient, model: str) -> int:
    return int(client.get_model_config(model)["max_batch_size"])


def _infer(client: httpclient.InferenceServerClient, model: str, rows: int) -> np.ndarray:
    item = httpclient.InferInput("INPUT__0", [rows, 4], "FP32")
    item.set_data_from_numpy(np.ones((rows, 4), np.float32))
    return client.infer(model, [item]).as_numpy("OUTPUT__0")


def test_each_model_serves_its_named_config_and_a_poll_follows_them(
        tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "models"
    for name in ("a", "b"):
        rb.add_python(repo, name, max_batch=4)
    big = rb.add_named_config(repo / "a", "big", 16)
    rb.add_named_config(repo / "b", "small", 2)  # another machine's
    server = start_server(repo, tmp_path / "server.log", "--model-config-name", "big",
                          "--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S))
    try:
        assert f"model a: config from {big}\n" in server.log.read_text()
        assert f"model b: config from {repo / 'b' / 'config.pbtxt'}\n" in server.log.read_text()
        with httpclient.InferenceServerClient(server.url) as client:
            assert (_batch(client, "a"), _batch(client, "b")) == (16, 4)
            assert _infer(client, "a", 16).shape == (16, 4)  # 16 rows: the named config's
            assert (_infer(client, "a", 1) == 3.0).all()
            rb.add_named_config(repo / "b", "big", 8)  # added: b now serves it
            until(lambda: _batch(client, "b") == 8, "model b serves configs/big.pbtxt")
            big.unlink()  # removed: a goes back to its config.pbtxt
            until(lambda: _batch(client, "a") == 4, "model a serves config.pbtxt again")
            assert (_infer(client, "b", 8) == 3.0).all()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.get_model_config("b").config.max_batch_size == 8
    finally:
        assert stop_server(server) == 0


def test_check_reads_the_named_configs_as_serve_does(tmp_path: pathlib.Path) -> None:
    """`tensorgate check --model-config-name`: a machine's config that does not load fails
    the check where config.pbtxt alone would pass it."""
    repo = tmp_path / "models"
    rb.add_python(repo, "a", max_batch=4)
    broken = rb.add_named_config(repo / "a", "h100", 4)
    broken.write_text(broken.read_text().replace("max_batch_size: 4", "max_batch_size: -4"))

    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tensorgate", "check", "--placement",
                               "none", "--model-repository", str(repo), *extra],
                              capture_output=True, text=True, timeout=120)

    assert check().returncode == 0
    done = check("--model-config-name", "h100")
    assert done.returncode == 1 and done.stdout.startswith("UNAVAILABLE  a"), done.stdout
    assert str(broken) in done.stdout
    refused = check("--model-config-name", "h 100")
    assert refused.returncode == 2
    assert refused.stderr == ("tensorgate: model_config_name: model config name 'h 100' must "
                              "be a file name without spaces or slashes: the server reads "
                              "<model>/configs/<name>.pbtxt\n")
