"""The metrics port speaks Prometheus text with Triton's names and counts what happened."""

from __future__ import annotations

import pathlib
import re
import socket
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tensorgate.tensor.pool import QUIET_IDLE_BYTES
from tests.e2e.conftest import RunningServer, scrape, start_server, stop_server, value
from tests.pipeline import repo_builder as rb


def test_metrics_count_requests(server: RunningServer) -> None:
    before = scrape(server)
    item = httpclient.InferInput("INPUT__0", [1, 8], "FP32")
    item.set_data_from_numpy(np.zeros((1, 8), np.float32))
    with httpclient.InferenceServerClient(server.url) as client:
        for _ in range(3):
            client.infer("linear", [item])
    after = scrape(server)
    labels = {"model": "linear", "version": "1"}
    for metric in ("nv_inference_request_success", "nv_inference_count"):
        assert value(after, metric, **labels) == value(before, metric, **labels) + 3
    assert value(after, "nv_inference_exec_count", **labels) >= 1
    assert value(after, "nv_inference_compute_infer_duration_us", **labels) > 0
    assert value(after, "nv_inference_pending_request_count", **labels) == 0
    assert value(after, "tensorgate_batch_rows_limit", **labels) == 8  # cheap: never capped
    # each version's load, start to ready, as Triton's gauge; an ensemble's without its steps'
    assert "# TYPE nv_model_load_duration_secs gauge" in after
    assert 0 < value(after, "nv_model_load_duration_secs", **labels) < 60
    ensemble = value(after, "nv_model_load_duration_secs", model="params_ensemble", version="1")
    assert 0 < ensemble < value(after, "nv_model_load_duration_secs", model="params",
                                version="1")
    assert value(after, "nv_inference_request_failure", **labels, reason="BACKEND") >= 0
    assert "# TYPE tensorgate_copied_bytes_total counter" in after
    assert value(after, "tensorgate_copied_bytes_total", **labels) >= 0
    # a body larger than a header window is received into a pooled buffer; what the pool
    # keeps idle stays under its own bound
    large = httpclient.InferInput("INPUT__0", [16, 3, 4], "FP32")
    large.set_data_from_numpy(np.ones((16, 3, 4), np.float32))
    with httpclient.InferenceServerClient(server.url) as client:
        for _ in range(2):
            client.infer("identity", [large])
    after = scrape(server)
    hits, misses = (value(after, "tensorgate_pool_acquires_total", result=r) for r in ("hit", "miss"))
    assert hits + misses >= 2 and hits >= 1
    assert value(after, "tensorgate_pool_bytes", state="idle") <= value(
        after, "tensorgate_pool_limit_bytes", bound="idle")
    assert re.search(r"^tensorgate_pool_evictions_total \d+$", after, re.M)
    # a JSON tensor is decoded into an array: a copy, counted under its reason, and the
    # reasons add up to the process total
    as_json = httpclient.InferInput("INPUT__0", [1, 8], "FP32")
    as_json.set_data_from_numpy(np.ones((1, 8), np.float32), binary_data=False)
    with httpclient.InferenceServerClient(server.url) as client:
        client.infer("linear", [as_json])
    after = scrape(server)
    reasons = {k: int(v) for k, v in re.findall(
        r'^tensorgate_copies_by_reason_bytes_total\{reason="(\w+)"\} (\d+)$', after, re.M)}
    assert reasons.get("decode", 0) >= 32
    assert sum(reasons.values()) == value(after, "tensorgate_copied_bytes_total", model="")


def test_pool_gives_its_idle_excess_back_once_quiet(e2e_repo: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    """Busy, the pool keeps what it reuses (256 MB bound); a second or two after the last
    request it keeps QUIET_IDLE_BYTES, smallest buffers first."""
    server = start_server(e2e_repo, tmp_path / "server.log", "--max-request-bytes", str(32 << 20))
    try:
        _fill_and_wait_for_quiet(server)
    finally:
        assert stop_server(server) == 0


def _fill_and_wait_for_quiet(server: RunningServer) -> None:
    sizes = [2_500_000, 3_500_000, 4_500_000, 5_500_000, 6_500_000]  # floats: 10…26 MB
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        for n in sizes:  # one after another: each leaves a buffer of its own size class idle
            item = httpclient.InferInput("INPUT__0", [n], "FP32")
            item.set_data_from_numpy(np.ones(n, np.float32))
            answer = client.infer("wide", [item]).as_numpy("OUTPUT__0")
            assert answer.shape == (n,) and float(answer[-1]) == 1.0
    busy = value(scrape(server), "tensorgate_pool_bytes", state="idle")
    assert busy > QUIET_IDLE_BYTES  # the trim runs only after a whole period without requests
    deadline = time.monotonic() + 10
    while (idle := value(scrape(server), "tensorgate_pool_bytes", state="idle")) \
            > QUIET_IDLE_BYTES and time.monotonic() < deadline:
        time.sleep(0.2)
    assert idle <= QUIET_IDLE_BYTES < busy


def test_other_paths_are_404(server: RunningServer) -> None:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/other", timeout=10)
    except urllib.error.HTTPError as error:
        error.close()
        assert error.code == 404
    else:
        raise AssertionError("expected 404")


def test_the_response_cache_answers_repeats_and_says_so(server: RunningServer) -> None:
    """"memo" enables response_cache and the shared server has one: the same request over
    HTTP and gRPC is run once; statistics and metrics count the hits."""
    values = np.full((1, 4), 0.25, np.float32)
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(values)
    with httpclient.InferenceServerClient(server.url) as client:
        answers = [client.infer("memo", [item]).as_numpy("OUTPUT__0") for _ in range(2)]
    grpc_item = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
    grpc_item.set_data_from_numpy(values)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answers.append(client.infer("memo", [grpc_item]).as_numpy("OUTPUT__0"))
        stats = client.get_inference_statistics("memo", as_json=True)["model_stats"][0]
    assert all(np.array_equal(a, values * 2 + 1) for a in answers)
    assert stats["execution_count"] == "1"  # int64 fields are strings in protobuf's JSON
    assert stats["inference_stats"]["cache_hit"]["count"] == "2"
    text = scrape(server)
    labels = {"model": "memo", "version": "1"}
    assert value(text, "nv_cache_num_hits_per_model", **labels) == 2
    assert value(text, "nv_cache_num_misses_per_model", **labels) == 1
    assert value(text, "nv_inference_request_success", **labels) == 3
    assert value(text, "nv_inference_count", **labels) == 1
    assert value(text, "tensorgate_response_cache_bytes", state="limit") == 1 << 20
    assert re.search(r"^tensorgate_response_cache_entries (\d+)$", text, re.M)
    # Triton's local cache's server-wide gauges (the shared server: other tests add to them)
    cache = {name: _unlabelled(text, f"nv_cache_{name}") for name in (
        "num_entries", "num_lookups", "num_hits", "num_misses", "num_evictions",
        "lookup_duration", "insertion_duration", "util")}
    assert cache["num_lookups"] == cache["num_hits"] + cache["num_misses"]
    assert cache["num_hits"] >= 2 and cache["num_misses"] >= 1 and cache["num_entries"] >= 1
    assert cache["lookup_duration"] > 0 and cache["insertion_duration"] > 0  # µs
    used = value(text, "tensorgate_response_cache_bytes", state="used")
    assert abs(cache["util"] - used / (1 << 20)) < 1e-6


def _buckets(text: str, metric: str, model: str) -> list[tuple[float, int]]:
    found = re.findall(rf'^{metric}_bucket\{{model="{model}",version="1",le="([^"]+)"\}} (\d+)$',
                       text, re.M)
    return [(float(le), int(count)) for le, count in found]


def test_latency_histograms_count_each_request_in_its_bucket(server: RunningServer) -> None:
    item = httpclient.InferInput("INPUT__0", [1, 8], "FP32")
    item.set_data_from_numpy(np.zeros((1, 8), np.float32))
    before = scrape(server)
    labels = {"model": "linear", "version": "1"}
    with httpclient.InferenceServerClient(server.url) as client:
        for _ in range(5):
            client.infer("linear", [item])
    after = scrape(server)
    assert "# TYPE tensorgate_request_duration_seconds histogram" in after
    for metric in ("tensorgate_request_duration_seconds", "tensorgate_queue_duration_seconds",
                   "tensorgate_compute_infer_duration_seconds"):
        buckets = _buckets(after, metric, "linear")
        bounds = [le for le, _ in buckets]
        counts = [count for _, count in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf")
        assert counts == sorted(counts)  # cumulative
        count = value(after, f"{metric}_count", **labels)
        assert counts[-1] == count == value(before, f"{metric}_count", **labels) + 5
    # the histogram's sum is the same time Triton's µs counter adds up (no failures here)
    added_s = (value(after, "tensorgate_request_duration_seconds_sum", **labels)
               - value(before, "tensorgate_request_duration_seconds_sum", **labels))
    added_us = (value(after, "nv_inference_request_duration_us", **labels)
                - value(before, "nv_inference_request_duration_us", **labels))
    assert added_s > 0 and abs(added_s * 1e6 - added_us) <= 1


def test_a_decoupled_models_first_response_time_is_measured(server: RunningServer) -> None:
    def first_responses() -> float:
        text = scrape(server)
        if "tensorgate_first_response_duration_seconds_count{model=\"words\"" not in text:
            return 0
        return value(text, "tensorgate_first_response_duration_seconds_count",
                     model="words", version="1")

    before = first_responses()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answers: list[object] = []
        client.start_stream(callback=lambda result, error: answers.append(error or result))
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"three words here"]], dtype=object))
        client.async_stream_infer("words", [text])
        client.stop_stream()  # waits for the stream's responses
    assert len(answers) == 3 and not any(isinstance(a, Exception) for a in answers), answers
    assert first_responses() == before + 1


def _unlabelled(text: str, metric: str) -> float:
    match = re.search(rf"^{metric} (\S+)$", text, re.M)
    assert match, f"{metric} not in:\n{text}"
    return float(match.group(1))


def test_cpu_metrics_as_tritons_sampled_every_interval(e2e_repo: pathlib.Path,
                                                       tmp_path: pathlib.Path) -> None:
    server = start_server(e2e_repo, tmp_path / "server.log", "--metrics-interval-ms", "100",
                          "--allow-gpu-metrics", "false")
    try:
        first = scrape(server)
        assert "# TYPE nv_cpu_utilization gauge" in first
        total = _unlabelled(first, "nv_cpu_memory_total_bytes")
        with open("/proc/meminfo") as info:  # the same host, read by this test
            assert total == int(info.readline().split()[1]) * 1024
        assert 0 < _unlabelled(first, "nv_cpu_memory_used_bytes") < total
        # busy both cores for a while: the next samples see it
        deadline = time.monotonic() + 10
        seen = 0.0
        while seen == 0.0 and time.monotonic() < deadline:
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                pass
            seen = _unlabelled(scrape(server), "nv_cpu_utilization")
        assert 0 < seen <= 1
        assert _unlabelled(first, "nv_pinned_memory_pool_used_bytes") == 0  # no CUDA here
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_metrics_and_cpu_metrics_can_be_turned_off(e2e_repo: pathlib.Path,
                                                   tmp_path: pathlib.Path) -> None:
    server = start_server(e2e_repo, tmp_path / "cpu.log", "--allow-cpu-metrics=false")
    try:
        text = scrape(server)
        assert "nv_inference_request_success" in text and "nv_cpu_utilization" not in text
    finally:
        assert stop_server(server) == 0, server.log.read_text()
    server = start_server(e2e_repo, tmp_path / "none.log", "--allow-metrics", "false")
    try:
        assert server.metrics_port == 0 and "metrics off" in server.log.read_text()
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_server_ready()
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_tritons_metrics_config_gives_latency_summaries(e2e_repo: pathlib.Path,
                                                        tmp_path: pathlib.Path) -> None:
    server = start_server(e2e_repo, tmp_path / "server.log",
                          "--metrics-config", "summary_latencies=true",
                          "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001",
                          "--metrics-config", "counter_latencies=false")
    try:
        item = httpclient.InferInput("INPUT__0", [1, 8], "FP32")
        item.set_data_from_numpy(np.zeros((1, 8), np.float32))
        with httpclient.InferenceServerClient(server.url) as client:
            for _ in range(20):
                client.infer("linear", [item])
            statistics = client.get_inference_statistics("linear")["model_stats"][0]
        text = scrape(server)
        labels = {"model": "linear", "version": "1"}
        assert "# TYPE nv_inference_request_summary_us summary" in text
        assert value(text, "nv_inference_request_summary_us_count", **labels) == 20
        # the summary's sum is the statistics extension's total, in µs
        success_us = statistics["inference_stats"]["success"]["ns"] / 1000
        assert abs(value(text, "nv_inference_request_summary_us_sum", **labels)
                   - success_us) <= 20  # each request's µs rounded down
        median = value(text, "nv_inference_request_summary_us", **labels, quantile="0.5")
        p99 = value(text, "nv_inference_request_summary_us", **labels, quantile="0.99")
        assert 0 < median <= p99 <= success_us
        assert value(text, "nv_inference_compute_infer_summary_us_count", **labels) == 20
        assert "nv_inference_request_duration_us" not in text  # counter_latencies=false
        assert value(text, "nv_inference_request_success", **labels) == 20
    finally:
        assert stop_server(server) == 0, server.log.read_text()


def test_a_bad_metrics_config_names_what_is_wrong(e2e_repo: pathlib.Path) -> None:
    import subprocess
    import sys
    for setting, message in (("summary_latency=true", "is not SETTING=VALUE with a setting of"),
                             ("summary_quantiles=0.5", "is not QUANTILE:ERROR")):
        finished = subprocess.run(
            [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(e2e_repo),
             "--metrics-config", setting], capture_output=True, text=True, timeout=60)
        assert finished.returncode == 2 and message in finished.stderr, finished.stderr


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset), waiting at most its timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_the_metrics_port_is_bounded_like_the_client_ports(tmp_path: pathlib.Path) -> None:
    """A connection that never sends its request is closed after --read-timeout-s; past 64
    open at once a new one is closed at once; scrapes go on meanwhile, and stopping the
    server closes what is open (from Python 3.12 the listener's close waits for it)."""
    repo = tmp_path / "models"
    rb.add_torchscript(repo, "identity", rb.Identity(), [4], [4])
    server = start_server(repo, tmp_path / "server.log", "--read-timeout-s", "1")
    held: list[socket.socket] = []
    try:
        for _ in range(64):
            held.append(socket.create_connection(("127.0.0.1", server.metrics_port),
                                                 timeout=5))
        time.sleep(0.3)  # the server has made them all
        with socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5) as extra:
            assert _closed_by_server(extra)  # the 65th, at once
        started = time.monotonic()
        assert all(_closed_by_server(sock) for sock in held)  # silent: closed after 1 s
        assert 0.3 < time.monotonic() - started < 4.5
        assert "nv_inference_request_success" in scrape(server)
        with socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5):
            time.sleep(0.2)
            started = time.monotonic()
            assert stop_server(server) == 0, server.log.read_text()
            assert time.monotonic() - started < 5.0
    finally:
        for sock in held:
            sock.close()
        if server.process.poll() is None:
            stop_server(server)
