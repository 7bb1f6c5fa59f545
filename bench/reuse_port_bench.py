"""One server, or several sharing the HTTP port (--reuse-http-port): identity's QPS and P99 at
16 and 64 connections, the servers' CPU a request, and how the kernel spread the
connections' requests among the processes.

In each round, for each count of processes in turn (alternating the order), that many
servers start on the built-in repository with --reuse-http-port on one port (each its own
metrics port), wrk drives `identity` [1,3,224,224] with the binary extension (after a
warm-up of 1 s at the same connection count), every answer checked; the servers stop before
the next count starts.

    .venv/bin/python bench/reuse_port_bench.py [--processes 1,2] [--rounds 2] [--seconds 5]
    (apt-get install wrk)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import server_cpu_s  # noqa: E402
from compare_servers import free_port  # noqa: E402
from compare_wire import OIP_BINARY, check_load, raw_request, wrk_load  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402



def _start(models: pathlib.Path, count: int, port: int, grpc_port: int
           ) -> list[tuple[subprocess.Popen[bytes], int]]:
    """`count` servers sharing `port` (HTTP) and `grpc_port`, ready: each process and its
    metrics port."""
    servers = []
    for _ in range(count):
        metrics = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(models),
             "--http-port", str(port), "--grpc-port", str(grpc_port),
             "--metrics-port", str(metrics), "--reuse-http-port", "true",
             "--reuse-grpc-port", "true"],
            env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append((process, metrics))
        deadline = time.monotonic() + 90
        while not _ready(metrics):  # each ready before the next starts: all take connections
            if process.poll() is not None or time.monotonic() > deadline:
                _stop(servers)
                raise RuntimeError("a server did not start")
            time.sleep(0.2)
    return servers


def _ready(metrics_port: int) -> bool:
    try:
        return "nv_inference_count" in _scrape(metrics_port)
    except OSError:
        return False


def _scrape(metrics_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as got:
        return str(got.read().decode())


def _answered(metrics_port: int) -> int:
    match = re.search(r'^nv_inference_request_success\{model="identity",version="1"\} (\S+)$',
                      _scrape(metrics_port), re.M)
    return int(float(match.group(1))) if match else 0


def _stop(servers: list[tuple[subprocess.Popen[bytes], int]]) -> None:
    for process, _ in servers:
        process.terminate()
    for process, _ in servers:
        process.wait(timeout=60)


def measure(models: pathlib.Path, count: int, connections: list[int], seconds: float,
            work: pathlib.Path) -> dict[int, dict[str, float]]:
    port = free_port()
    servers = _start(models, count, port, free_port())
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", "identity", x)
    raw = raw_request(port, path, headers, body)
    found = {}
    try:
        for n in connections:
            check_load(wrk_load(port, raw, n, 1, OIP_BINARY.min_body(x.size), work), "warm-up")
            before = [_answered(metrics) for _, metrics in servers]
            cpu = sum(server_cpu_s(process.pid) for process, _ in servers)
            point = wrk_load(port, raw, n, seconds, OIP_BINARY.min_body(x.size), work)
            check_load(point, f"{count} processes, {n} connections")
            cpu = sum(server_cpu_s(process.pid) for process, _ in servers) - cpu
            shares = [_answered(metrics) - b for (_, metrics), b in zip(servers, before)]
            found[n] = {"qps": point["qps"], "p99_ms": point["p99_us"] / 1e3,
                        "cpu_us": cpu / point["requests"] * 1e6,
                        "client_cpu": point["client_cpu_share"],
                        "busiest": max(shares) / max(1, sum(shares))}
    finally:
        _stop(servers)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2", help="counts of servers, comma-separated")
    parser.add_argument("--connections", default="16,64")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (apt-get install wrk)")
    counts = [int(c) for c in args.processes.split(",")]
    connections = [int(c) for c in args.connections.split(",")]
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-reuse-"))
    write_default_repository(work / "models")
    runs: dict[int, list[dict[int, dict[str, float]]]] = {c: [] for c in counts}
    try:
        for r in range(args.rounds):
            for count in counts if r % 2 == 0 else counts[::-1]:
                found = measure(work / "models", count, connections, args.seconds, work)
                runs[count].append(found)
                print(f"round {r + 1}, {count} process(es): " + "; ".join(
                    f"{n} conns {f['qps']:,.0f} QPS, P99 {f['p99_ms']:.1f} ms"
                    for n, f in found.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nidentity [1,3,224,224] binary over HTTP, wrk on 1 thread; medians of "
          f"{args.rounds} rounds; {os.cpu_count()} CPUs\n")
    print("| processes | connections | QPS | P99 ms | servers' CPU µs / request | wrk's CPU "
          "| busiest process's share |\n|---:|---:|---:|---:|---:|---:|---:|")
    for count, found in runs.items():
        for n in connections:
            def med(key: str) -> float:
                return statistics.median(f[n][key] for f in found)
            print(f"| {count} | {n} | {med('qps'):,.0f} | {med('p99_ms'):.1f} | "
                  f"{med('cpu_us'):,.0f} | {med('client_cpu'):.0%} | {med('busiest'):.0%} |")


if __name__ == "__main__":
    main()
