"""The logging extension through tritonclient, HTTP and gRPC: the settings read and change
while the server runs, and act on what it writes; wrong changes are refused by name."""

from __future__ import annotations

import pathlib
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import start_server, stop_server
from tests.pipeline import repo_builder as rb

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}


def _logged(log: pathlib.Path, text: str) -> bool:
    """Whether `text` is in the log within a few seconds (the server writes it unbuffered)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if text in log.read_text():
            return True
        time.sleep(0.05)
    return False


def test_log_settings_change_what_the_server_writes(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "models"
    rb.add_python(repo, "a", max_batch=4)
    rb.add_python(repo, "b", max_batch=4)
    rb.add_python(repo, "cached", max_batch=4, extra="response_cache { enable: true }")
    log = tmp_path / "server.log"
    server = start_server(repo, log, "--model-control-mode", "explicit", "--load-model", "a")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert "logging" in client.get_server_metadata()["extensions"]
            assert client.get_log_settings() == DEFAULTS
            assert client.update_log_settings({"log_info": False}) == {**DEFAULTS,
                                                                       "log_info": False}
            client.load_model("b")  # its "ready" line is info: not written
            client.load_model("cached")  # its warning about the missing cache is written
            assert _logged(log, "model cached: its config enables response_cache, but the "
                                "server has no cache")
            assert "model b v1 ready" not in log.read_text()
            with pytest.raises(InferenceServerException,
                               match="log setting 'log_info' must be true or false"):
                client.update_log_settings({"log_info": "yes"})
            with pytest.raises(InferenceServerException, match="log setting 'log_file' cannot "
                                                               "be changed over the API"):
                client.update_log_settings({"log_file": str(tmp_path / "elsewhere.log")})
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            settings = client.get_log_settings(as_json=True)["settings"]
            assert settings["log_info"] == {"bool_param": False}
            assert settings["log_format"] == {"string_param": "default"}
            client.update_log_settings({"log_info": True, "log_format": "ISO8601"})
            settings = client.get_log_settings(as_json=True)["settings"]
            assert settings["log_info"] == {"bool_param": True}
            assert settings["log_format"] == {"string_param": "ISO8601"}
            with pytest.raises(InferenceServerException, match="unknown log setting 'colour'"):
                client.update_log_settings({"colour": True})
            client.unload_model("b")
            client.load_model("b")  # info again, with the ISO 8601 time
        assert _logged(log, "model b v1 ready")
        line = next(line for line in log.read_text().splitlines() if "model b v1 ready" in line)
        assert line[10] == "T" and line[19] == "Z", line
        assert not (tmp_path / "elsewhere.log").exists()
    finally:
        assert stop_server(server) == 0
