"""A tritonserver command line carries over: Triton's logging flags and --id act, its
tuning flags start the server and are named at start as not acted on, and its flags for
what tensorgate does not serve (other clouds' APIs, model namespacing) are refused with the
reason (its gRPC TLS flags act: test_grpc_tls.py)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tensorgate.cli import parse_serve
from tensorgate.cli_triton import NO_EFFECT, REFUSED, no_effect, triton_settings
from tests.e2e.conftest import start_server, stop_server
from tests.pipeline import repo_builder as rb


def test_a_tritonserver_command_line_starts_and_its_flags_act(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4])
    log_file = tmp_path / "server.log.txt"
    server = start_server(repo, tmp_path / "out.log", "--id", "edge-triton",
                          "--log-file", str(log_file), "--log-warning", "false",
                          "--log-format", "ISO8601", "--http-thread-count", "8",
                          "--pinned-memory-pool-byte-size", "268435456",
                          "--backend-config", "python,shm-default-byte-size=1048576",
                          "--grpc-use-ssl", "false", "--http-max-input-size", "4096")
    try:
        with httpclient.InferenceServerClient(server.url) as http, \
                grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            assert http.get_server_metadata()["name"] == "edge-triton"
            assert grpc.get_server_metadata().name == "edge-triton"
            settings = http.get_log_settings()
        assert settings["log_file"] == str(log_file)
        assert (settings["log_info"], settings["log_warning"], settings["log_error"]) == (
            True, False, True)
        assert settings["log_format"] == "ISO8601"
        # the log went to the file, its times as ISO 8601; the console kept the start lines
        written = log_file.read_text()
        assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO tensorgate\.engine: model "
                         r"identity v1 ready", written, re.M), written
        console = server.log.read_text()
        assert "INFO tensorgate.engine" not in console
        assert ("Triton's flags taken and not acted on: --http-thread-count (the event loop "
                "serves every HTTP connection); --pinned-memory-pool-byte-size" in console)
        # --http-max-input-size is --max-request-bytes
        request = urllib.request.Request(f"http://{server.url}/v2/models/identity/infer",
                                         data=b"{" + b" " * 5000 + b"}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 413
        assert "4096" in json.loads(refused.value.read())["error"]
    finally:
        assert stop_server(server) == 0, server.log.read_text()


@pytest.mark.parametrize("flag, value, reason", [
    ("--allow-vertex-ai", "1", "Vertex AI's API is not served"),
    ("--model-namespacing", "true", "model names are one namespace"),
])
def test_what_is_not_served_is_refused_with_the_reason(flag: str, value: str,
                                                        reason: str) -> None:
    answer = subprocess.run([sys.executable, "-m", "tensorgate", "serve", flag, value],
                            capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2 and f"tensorgate: {flag}: {reason}" in answer.stderr, (
        answer.stderr)


@pytest.mark.parametrize("repository, said", [
    ("{tmp}/missing", "model repository '{tmp}/missing' is not a directory"),
    ("s3://bucket/models", "model repository 's3://bucket/models': cloud storage is not read "
                           "here; copy the repository to a local folder (KServe's storage "
                           "initializer does) and serve that"),
])
def test_a_repository_that_is_not_a_local_folder_stops_the_start_saying_so(
        repository: str, said: str, tmp_path: pathlib.Path) -> None:
    """It was a traceback from the first model scan (exit 1); Triton's command lines give
    s3:// and gs:// repositories, which are not read here."""
    answer = subprocess.run([sys.executable, "-m", "tensorgate", "serve", "--model-repository",
                             repository.format(tmp=tmp_path)], capture_output=True, text=True,
                            timeout=60)
    assert (answer.returncode, answer.stderr) == (2, f"tensorgate: {said.format(tmp=tmp_path)}\n")


def test_flag_tables_and_aliases() -> None:
    assert not set(NO_EFFECT) & set(REFUSED)
    args: dict[str, object] = {"no_effect_http_thread_count": "4", "max_request_bytes": None,
                               "http_max_input_size": 2048, "response_cache_bytes": 7,
                               "response_cache_byte_size": 9, "refused_allow_vertex_ai": "False"}
    assert no_effect(args) == ["--http-thread-count (the event loop serves every HTTP "
                               "connection)"]
    # Triton's name fills tensorgate's setting; tensorgate's own flag wins when both are given
    assert triton_settings(args) == {"max_request_bytes": 2048}
    assert "refused_allow_vertex_ai" not in args and "http_max_input_size" not in args


# every flag `tritonserver --help` lists (Triton 2.51, the binary bench/peers/install.sh
# fetches with nvidia-pytriton), without its leading dashes
TRITON_2_51_FLAGS = """
    allow-cpu-metrics allow-gpu-metrics allow-grpc allow-http allow-metrics
    allow-sagemaker allow-vertex-ai backend-config backend-directory
    buffer-manager-thread-count cache-config cache-directory
    cuda-memory-pool-byte-size cuda-virtual-address-size
    disable-auto-complete-config enable-peer-access exit-on-error exit-timeout-secs
    grpc-address grpc-header-forward-pattern grpc-http2-max-ping-strikes
    grpc-http2-max-pings-without-data grpc-http2-min-recv-ping-interval-without-data
    grpc-infer-allocation-pool-size grpc-infer-response-compression-level
    grpc-keepalive-permit-without-calls grpc-keepalive-time grpc-keepalive-timeout
    grpc-max-connection-age grpc-max-connection-age-grace grpc-port
    grpc-restricted-protocol grpc-root-cert grpc-server-cert grpc-server-key
    grpc-use-ssl grpc-use-ssl-mutual host-policy http-address
    http-header-forward-pattern http-port http-restricted-api http-thread-count id
    load-model log-error log-file log-format log-info log-verbose log-warning
    metrics-address metrics-config metrics-interval-ms metrics-port
    min-supported-compute-capability model-config-name model-control-mode
    model-load-gpu-limit model-load-retry-count model-load-thread-count
    model-namespacing model-repository model-store pinned-memory-pool-byte-size
    rate-limit rate-limit-resource repoagent-directory repository-poll-secs
    response-cache-byte-size reuse-grpc-port reuse-http-port sagemaker-port
    sagemaker-safe-port-range sagemaker-thread-count strict-model-config
    strict-readiness trace-config trace-count trace-file trace-level
    trace-log-frequency trace-rate vertex-ai-default-model vertex-ai-port
    vertex-ai-thread-count
""".split()


def test_every_flag_of_tritonserver_2_51_is_known() -> None:
    """Each is tensorgate's own, a Triton name for one of its settings, taken and named as
    not acted on, or refused with the reason: none fails as an unknown argument."""
    done = subprocess.run([sys.executable, "-m", "tensorgate", "serve", "--help"],
                          capture_output=True, text=True, timeout=60)
    listed = set(re.findall(r"(?:^|[ ,])--([a-z0-9-]+)", done.stdout, re.M))
    assert len(TRITON_2_51_FLAGS) == 86
    assert sorted(set(TRITON_2_51_FLAGS) - listed) == []


def test_triton_s_deprecated_trace_flags_are_its_trace_config(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "trace.json"
    config = parse_serve(["serve", "--trace-file", str(trace), "--trace-level", "TIMESTAMPS",
                          "--trace-level", "TENSORS", "--trace-rate", "10", "--trace-count",
                          "5", "--trace-log-frequency", "2"], {})
    assert (config.trace_file, set(config.trace_level), config.trace_rate, config.trace_count,
            config.trace_log_frequency) == (trace, {"TIMESTAMPS", "TENSORS"}, 10, 5, 2)
    # --trace-config, given too, says the last word on a setting
    assert parse_serve(["serve", "--trace-file", str(trace), "--trace-rate", "10",
                        "--trace-config", "rate=20"], {}).trace_rate == 20
    refused = subprocess.run([sys.executable, "-m", "tensorgate", "serve",
                              "--model-load-gpu-limit", "0:0.8"],
                             capture_output=True, text=True, timeout=60)
    assert (refused.returncode, refused.stderr) == (
        2, "tensorgate: --model-load-gpu-limit: a load is not refused for the GPU memory in "
           "use; leave it out\n")
