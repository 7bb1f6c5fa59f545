"""gRPC over TLS (--grpc-use-ssl) against plain gRPC, the same server otherwise.

Starts `tensorgate serve` on the built-in repository twice, plain and with a test CA's
certificate (trustme), and measures each in alternating rounds: sequential batch-1
ModelInfer P50/P99 for `identity` (602 KB each way) and `resnet50` through a raw grpcio
stub (plain or TLS channel), and identity QPS at 1 and 8 connections with h2load (https
for TLS: ALPN h2; every answer's size checked), with the server's CPU per call from /proc
and the bytes its TLS layer handled per call (its `tls` copies, from /metrics). Writes
bench/results/tls_bench.json.

    .venv/bin/python bench/tls_bench.py [--quick]
    (apt-get install nghttp2-client for the QPS part)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare_wire import grpc_infer_body, grpc_reference_answer, h2load_grpc  # noqa: E402
from server_bench import grpc_sequential, server_cpu_load  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
OUTPUT_BYTES = {"identity": 3 * 224 * 224 * 4, "resnet50": 1000 * 4}


def certificates(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """A test CA and a server certificate for 127.0.0.1, as PEM files."""
    import trustme
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    for i, blob in enumerate(server.cert_chain_pems):
        blob.write_to_path(str(paths["cert"]), append=i > 0)
    return paths


def start_server(repo: pathlib.Path, extra: list[str]) -> tuple[subprocess.Popen[str], int, int]:
    process = subprocess.Popen([sys.executable, "-m", "tensorgate", "serve", "--model-repository",
                                str(repo), "--http-port", "0", "--grpc-port", "0",
                                "--metrics-port", "0", *extra], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    grpc_port = metrics_port = 0
    for line in process.stdout:
        match = re.search(r"gRPC on 127\.0\.0\.1:(\d+), metrics on 127\.0\.0\.1:(\d+)", line)
        if match:
            grpc_port, metrics_port = int(match.group(1)), int(match.group(2))
        if line.startswith("ready:"):
            return process, grpc_port, metrics_port
    raise RuntimeError("the server did not start")


def tls_bytes(metrics_port: int) -> int:
    """The server's `tls` copies so far (bytes its TLS layer decrypted and encrypted)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
        text = page.read().decode()
    match = re.search(r'^tensorgate_copies_by_reason_bytes_total\{reason="tls"\} (\d+)', text,
                      re.M)
    return int(match.group(1)) if match else 0


def measure(kind: str, port: int, metrics_port: int, pid: int, ca: bytes | None,
            answer: int, args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    before = tls_bytes(metrics_port)
    figures["identity_sequential"] = grpc_sequential(port, "identity", args.n_identity, ca)
    calls = args.n_identity + max(args.n_identity // 10, 5)
    figures["tls_bytes_per_identity_call"] = (tls_bytes(metrics_port) - before) / calls
    figures["resnet50_sequential"] = grpc_sequential(port, "resnet50", args.n_resnet, ca)
    if shutil.which("h2load") is None:
        figures["skipped"] = "h2load is not installed (apt-get install nghttp2-client)"
        return figures
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("<f4")
    body = grpc_infer_body("identity", x)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tg-tls-"))
    try:
        for connections in (1, 8):
            figures[f"identity_{connections}_connections"] = server_cpu_load(
                lambda: h2load_grpc(port, body, answer, connections, args.seconds, folder,
                                    "https" if kind == "tls" else "http"),
                args.seconds, pid)
    finally:
        shutil.rmtree(folder)
    return figures


def median_of(rounds: list[dict[str, Any]], *path: str) -> float:
    values = []
    for figures in rounds:
        value: Any = figures
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    return float(np.median(values)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.n_identity, args.n_resnet, args.seconds = (
        (300, 30, 2) if args.quick else (1500, 150, 5))
    rounds = 1 if args.quick else args.rounds
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tg-tls-bench-"))
    repo = folder / "models"
    write_default_repository(repo)
    paths = certificates(folder)
    ca = paths["ca"].read_bytes()
    tls_flags = ["--grpc-use-ssl", "--grpc-server-cert", str(paths["cert"]),
                 "--grpc-server-key", str(paths["key"])]
    servers = {"plain": start_server(repo, []), "tls": start_server(repo, tls_flags)}
    results: dict[str, list[dict[str, Any]]] = {"plain": [], "tls": []}
    try:
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("<f4")
        answer = grpc_reference_answer(servers["plain"][1], grpc_infer_body("identity", x),
                                       OUTPUT_BYTES["identity"])
        for round_ in range(rounds):
            order = ("plain", "tls") if round_ % 2 == 0 else ("tls", "plain")
            for kind in order:
                process, port, metrics_port = servers[kind]
                results[kind].append(measure(kind, port, metrics_port, process.pid,
                                             ca if kind == "tls" else None, answer, args))
    finally:
        for process, _, _ in servers.values():
            process.terminate()
            process.wait(timeout=30)
        shutil.rmtree(folder)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "tls_bench.json"
    out.write_text(json.dumps({"machine": platform.platform(), "python": sys.version.split()[0],
                               "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": rounds,
                               "quick": args.quick, "results": results}, indent=1))
    print(f"gRPC, plain and TLS (--grpc-use-ssl): medians of {rounds} round(s) in "
          "alternating order")
    print("| gRPC | identity P50 / P99 µs | resnet50 P50 / P99 µs | TLS bytes / identity call "
          "| h2load identity QPS, 1 conn. | server µs / call | QPS, 8 conn. | server µs / call |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in ("plain", "tls"):
        r = results[kind]
        print(f"| {kind} | {median_of(r, 'identity_sequential', 'p50_us'):,.0f} / "
              f"{median_of(r, 'identity_sequential', 'p99_us'):,.0f} | "
              f"{median_of(r, 'resnet50_sequential', 'p50_us'):,.0f} / "
              f"{median_of(r, 'resnet50_sequential', 'p99_us'):,.0f} | "
              f"{median_of(r, 'tls_bytes_per_identity_call'):,.0f} | "
              f"{median_of(r, 'identity_1_connections', 'qps'):,.0f} | "
              f"{median_of(r, 'identity_1_connections', 'server_cpu_us_per_request'):,.0f} | "
              f"{median_of(r, 'identity_8_connections', 'qps'):,.0f} | "
              f"{median_of(r, 'identity_8_connections', 'server_cpu_us_per_request'):,.0f} |")
    for path in (("identity_sequential", "p50_us"), ("identity_1_connections", "qps"),
                 ("identity_1_connections", "server_cpu_us_per_request"),
                 ("identity_8_connections", "qps"),
                 ("identity_8_connections", "server_cpu_us_per_request")):
        ratio = median_of(results["tls"], *path) / median_of(results["plain"], *path)
        print(f"TLS / plain, {' '.join(path)}: {ratio:.2f}")
    print(f"raw numbers: {out}")


if __name__ == "__main__":
    main()
