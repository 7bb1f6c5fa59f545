"""What an idle client connection costs the server: its resident memory (RSS of the server's
process tree) with N idle HTTP/1.1 connections and with N idle gRPC (HTTP/2) connections,
against the same server with none. Each gRPC connection has done its HTTP/2 handshake (the
client's preface and SETTINGS, the server's SETTINGS read back); each HTTP/1.1 connection has
served one request and stays open (keep-alive). Prints a table and writes
bench/results/idle_connections_bench.json.

    .venv/bin/python bench/idle_connections_bench.py [--connections 1000]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import socket
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare import memory_tree  # noqa: E402
from server_bench import start_server  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: bench\r\n\r\n"


def _settle_rss(pid: int) -> float:
    time.sleep(1.5)  # the pool's quiet trim and the sweep have run
    return memory_tree(pid)["rss_mb"]


def _grpc(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(PREFACE + EMPTY_SETTINGS)
    if not sock.recv(9):
        raise RuntimeError("the server closed a gRPC connection")
    return sock


def _http(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(LIVE)
    if not sock.recv(4096).startswith(b"HTTP/1.1 200"):
        raise RuntimeError("the server did not answer a keep-alive request")
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000)
    args = parser.parse_args()
    repo = write_default_repository(pathlib.Path(tempfile.gettempdir()) / "tensorgate-bench-repo")
    rows = {}
    for kind, connect in (("http", _http), ("grpc", _grpc)):
        process, port, grpc_port, _ = start_server(repo)
        try:
            before = _settle_rss(process.pid)
            held = [connect(grpc_port if kind == "grpc" else port)
                    for _ in range(args.connections)]
            after = _settle_rss(process.pid)
            for sock in held:
                sock.close()
            rows[kind] = {"connections": args.connections, "rss_before_mb": before,
                          "rss_after_mb": after,
                          "kb_per_connection": (after - before) * 1024 / args.connections}
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(f"{'protocol':<10}{'connections':>12}{'RSS before':>12}{'RSS after':>11}"
          f"{'KB/conn':>9}")
    for kind, row in rows.items():
        print(f"{kind:<10}{row['connections']:>12}{row['rss_before_mb']:>10.0f}MB"
              f"{row['rss_after_mb']:>9.0f}MB{row['kb_per_connection']:>9.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "idle_connections_bench.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(),
         "python": platform.python_version(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
