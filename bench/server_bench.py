"""tensorgate over HTTP (binary tensor extension) and gRPC against the in-process engine.

Starts `tensorgate serve` on the built-in repository, then for `identity` and `resnet50`:
sequential batch-1 P50/P99 with a lean keep-alive socket client and with a raw grpcio stub
(each client's own CPU per request is printed beside it), QPS at 8 concurrent HTTP
connections with `wrk` and gRPC ModelInfer at 1 and 8 connections with `h2load` (Debian's
wrk and nghttp2-client; the server's and the load generator's CPU per request beside
each). The engine in-process is measured in the same run. Writes
bench/results/server_bench.json.

    .venv/bin/python bench/server_bench.py [--quick]
    (apt-get install wrk nghttp2-client for the QPS part)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare_wire import (OIP_BINARY, Connection, grpc_infer_body,  # noqa: E402
                          grpc_reference_answer, h2load_grpc, raw_request, wrk_load)
from tensorgate import Engine, InferenceRequest, TensorView  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
OUTPUT_BYTES = {"identity": 3 * 224 * 224 * 4, "resnet50": 1000 * 4}


def binary_request(model: str, port: int) -> bytes:
    """The bytes tritonclient sends for one FP32 [1,3,224,224] input, binary both ways."""
    tensor = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("<f4")
    path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", model, tensor)
    return raw_request(port, path, headers, body)


def latencies(port: int, raw: bytes, n: int) -> tuple[np.ndarray, float]:
    """`n` requests one after another on one keep-alive connection, after a warm-up: each
    one's latency (µs), and the client's own CPU per request (s)."""
    connection = Connection(port)
    try:
        for _ in range(max(n // 10, 5)):
            connection.exchange(raw)
        samples = []
        cpu_start = time.process_time()
        for _ in range(n):
            start = time.perf_counter_ns()
            status, _, _ = connection.exchange(raw)
            samples.append(time.perf_counter_ns() - start)
            if status != 200:
                raise RuntimeError(f"HTTP {status}")
        client_cpu = (time.process_time() - cpu_start) / n
    finally:
        connection.close()
    return np.array(samples) / 1e3, client_cpu


def sequential(port: int, raw: bytes, n: int) -> dict[str, float]:
    a, client_cpu = latencies(port, raw, n)
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "n": n, "client_cpu_us_per_request": client_cpu * 1e6}


def process_cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds used so far by process `pid` (all its threads)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def server_cpu_load(load: Any, seconds: int, server_pid: int) -> dict[str, Any]:
    """Run `load()` (wrk or h2load; answers checked) with the server's CPU from /proc around
    it, so every QPS figure comes with what it cost the server and the load generator."""
    server_before = process_cpu_s(server_pid)
    result = load()
    user, system = (a - b for a, b in zip(process_cpu_s(server_pid), server_before))
    requests = max(result["qps"] * seconds, 1.0)
    cpu = result["client_cpu_share"] * seconds
    return {"qps": result["qps"], "connections": result["connections"],
            "p50_us": result["p50_us"], "p99_us": result["p99_us"],
            "bad": result["bad"] + result["errors"],
            "client_cpu_share": result["client_cpu_share"],
            "client_cpu_us_per_request": cpu / requests * 1e6,
            "server_cpu_share": (user + system) / seconds,
            "server_cpu_us_per_request": (user + system) / requests * 1e6,
            "server_kernel_us_per_request": system / requests * 1e6}


def wrk_qps(port: int, raw: bytes, seconds: int, connections: int,
            server_pid: int) -> dict[str, Any]:
    """wrk at `connections` (answers checked: 200 and the identity or resnet50 size)."""
    if shutil.which("wrk") is None:
        return {"skipped": "wrk is not installed (apt-get install wrk)"}
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tg-wrk-"))
    try:
        return server_cpu_load(lambda: wrk_load(port, raw, connections, seconds, 4_000, folder),
                               seconds, server_pid)
    finally:
        shutil.rmtree(folder)


def h2load_qps(grpc_port: int, model: str, output_bytes: int, seconds: int, connections: int,
               server_pid: int) -> dict[str, Any]:
    """ModelInfer over HTTP/2 with h2load at `connections` (every answer's size checked
    against one reference call's)."""
    if shutil.which("h2load") is None:
        return {"skipped": "h2load is not installed (apt-get install nghttp2-client)"}
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("<f4")
    body = grpc_infer_body(model, x)
    answer = grpc_reference_answer(grpc_port, body, output_bytes)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tg-h2load-"))
    try:
        return server_cpu_load(
            lambda: h2load_grpc(grpc_port, body, answer, connections, seconds, folder),
            seconds, server_pid)
    finally:
        shutil.rmtree(folder)


def grpc_request(model: str) -> Any:
    from tritonclient.grpc import service_pb2 as pb
    tensor = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("<f4").tobytes()
    request = pb.ModelInferRequest(model_name=model)
    item = request.inputs.add(name="INPUT__0", datatype="FP32")
    item.shape.extend([1, 3, 224, 224])
    request.raw_input_contents.append(tensor)
    return request


def grpc_sequential(port: int, model: str, n: int, ca: bytes | None = None
                    ) -> dict[str, float]:
    """A raw grpcio stub with a prebuilt request message: as lean as a Python gRPC client is
    (over TLS, trusting the root certificate `ca`, when it is given)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
    request = grpc_request(model)
    options = [("grpc.max_receive_message_length", 1 << 26),
               ("grpc.max_send_message_length", 1 << 26)]
    target = f"127.0.0.1:{port}"
    channel = (grpc.insecure_channel(target, options=options) if ca is None else
               grpc.secure_channel(target, grpc.ssl_channel_credentials(ca), options=options))
    with channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(max(n // 10, 5)):
            stub.ModelInfer(request)
        samples = []
        cpu_start = time.process_time()
        for _ in range(n):
            start = time.perf_counter_ns()
            stub.ModelInfer(request)
            samples.append(time.perf_counter_ns() - start)
        client_cpu = (time.process_time() - cpu_start) / n
    a = np.array(samples) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "n": n, "client_cpu_us_per_request": client_cpu * 1e6}


async def engine_floor(repo: pathlib.Path, model: str, n: int) -> dict[str, float]:
    engine = Engine(repo, placement="auto")
    await engine.start([model])
    view = TensorView.from_torch(torch.randn(1, 3, 224, 224), name="INPUT__0")
    samples = []
    for i in range(n + 20):
        start = time.perf_counter_ns()
        await engine.infer(InferenceRequest(model, {"INPUT__0": view}))
        if i >= 20:
            samples.append(time.perf_counter_ns() - start)
    await engine.shutdown()
    a = np.array(samples) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)), "n": n}


def serve_logged(repo: pathlib.Path, log: pathlib.Path, *extra: str,
                 env: dict[str, str] | None = None, timeout_s: float = 180.0
                 ) -> tuple[subprocess.Popen[bytes], dict[str, int], float]:
    """`tensorgate serve` on `repo` (ports chosen by the system, `extra` flags, `env` for
    the process), its output in `log`, which is read, never a pipe left to fill: the
    process, its ports by name ("http", "grpc", "metrics") and its start-up seconds."""
    started = time.perf_counter()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(repo),
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *extra],
            stdout=sink, stderr=subprocess.STDOUT, env=env)
    while time.perf_counter() - started < timeout_s:
        text = log.read_text(errors="replace")
        match = re.search(r"HTTP on 127\.0\.0\.1:(\d+), gRPC on 127\.0\.0\.1:(\d+), "
                          r"metrics on 127\.0\.0\.1:(\d+)", text)
        if match and re.search(r"^ready:", text, re.M):
            ports = dict(zip(("http", "grpc", "metrics"), map(int, match.groups())))
            return process, ports, time.perf_counter() - started
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{text[-3000:]}")
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the server did not start:\n{log.read_text(errors='replace')[-3000:]}")


def start_server(repo: pathlib.Path) -> tuple[subprocess.Popen[bytes], int, int, float]:
    log = pathlib.Path(tempfile.gettempdir()) / f"tensorgate-bench-{os.getpid()}.log"
    process, ports, startup = serve_logged(repo, log)
    return process, ports["http"], ports["grpc"], startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repo = write_default_repository(pathlib.Path(tempfile.gettempdir()) / "tensorgate-bench-repo")
    counts = {"identity": 300 if args.quick else 3000, "resnet50": 20 if args.quick else 200}
    seconds = 3 if args.quick else 10
    process, port, grpc_port, startup = start_server(repo)
    rows: dict[str, Any] = {}
    try:
        for model, n in counts.items():
            raw = binary_request(model, port)
            output_bytes = OUTPUT_BYTES[model]
            rows[model] = {"http_sequential": sequential(port, raw, n),
                           "http_8_connections": wrk_qps(port, raw, seconds, 8, process.pid),
                           "grpc_sequential": grpc_sequential(grpc_port, model, n),
                           "grpc_1_connection": h2load_qps(grpc_port, model, output_bytes,
                                                           seconds, 1, process.pid),
                           "grpc_8_connections": h2load_qps(grpc_port, model, output_bytes,
                                                            seconds, 8, process.pid)}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    for model, n in counts.items():  # the floor, in the same run, after the server is gone
        rows[model]["engine_in_process"] = asyncio.run(engine_floor(repo, model, n))
    result = {"rows": rows, "startup_s": startup, "cores": os.cpu_count(),
              "python": platform.python_version(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d")}
    print(f"tensorgate HTTP (binary) vs in-process engine, batch 1; server start-up "
          f"{startup:.1f} s; {result['cores']} cores")
    print(f"{'model':<10}{'path':<22}{'P50 µs':>11}{'P99 µs':>11}{'QPS':>9}  notes")
    for model, r in rows.items():
        e, h, w = r["engine_in_process"], r["http_sequential"], r["http_8_connections"]
        g = r["grpc_sequential"]
        print(f"{model:<10}{'engine in-process':<22}{e['p50_us']:>11,.1f}{e['p99_us']:>11,.1f}")
        print(f"{model:<10}{'HTTP sequential':<22}{h['p50_us']:>11,.1f}{h['p99_us']:>11,.1f}"
              f"{'':>9}  client CPU {h['client_cpu_us_per_request']:.0f} µs/request")
        print(f"{model:<10}{'gRPC sequential':<22}{g['p50_us']:>11,.1f}{g['p99_us']:>11,.1f}"
              f"{'':>9}  client CPU {g['client_cpu_us_per_request']:.0f} µs/request")
        for path, load in (("HTTP 8 connections", w), ("gRPC 1 connection",
                                                       r["grpc_1_connection"]),
                           ("gRPC 8 connections", r["grpc_8_connections"])):
            if "qps" not in load:
                print(f"{model:<10}{path:<22}  {load['skipped']}")
                continue
            print(f"{model:<10}{path:<22}{load['p50_us']:>11,.1f}{load['p99_us']:>11,.1f}"
                  f"{load['qps']:>9,.0f}  CPU per request: server "
                  f"{load['server_cpu_us_per_request']:.0f} µs "
                  f"({load['server_kernel_us_per_request']:.0f} in the kernel), client "
                  f"{load['client_cpu_us_per_request']:.0f} µs; cores: server "
                  f"{load['server_cpu_share']:.2f}, client {load['client_cpu_share']:.2f}; "
                  f"bad answers {load['bad']}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "server_bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
