"""Two source trees of tensorgate, before and after a change, under the same load.

Each round starts the server from one tree and then the other (alternating which goes first),
drives `identity` at 8 connections (--connections) in each request form — HTTP with the
binary tensor extension and with V2 JSON, flat or nested (wrk), gRPC ModelInfer with the
tensor in raw_input_contents or in typed contents (h2load, HTTP/2's default 16 KiB frames)
— and reads the server's own CPU time from /proc: server
CPU per request and QPS, medians over the rounds, and after/before. Every answer's size is
checked (wrk's script; h2load's DATA total against one reference answer).

    git worktree add /tmp/tg-old <commit>
    .venv/bin/python bench/ab_bench.py --before /tmp/tg-old/src [--after src] [--rounds 3]
        [--wires binary,json,nested,grpc,grpc-contents] [--connections 8]
    (apt-get install wrk nghttp2-client)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from compare_servers import free_port  # noqa: E402
from compare_wire import (OIP_BINARY, OIP_JSON, OIP_NESTED_JSON, grpc_infer_body,  # noqa: E402
                          grpc_reference_answer, h2load_grpc, raw_request, wrk_load)
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

LOADS = {"binary": OIP_BINARY, "json": OIP_JSON, "nested": OIP_NESTED_JSON}
WIRES = (*LOADS, "grpc", "grpc-contents")


def add_tree_options(parser: argparse.ArgumentParser) -> None:
    """--before (optional) and --after: the source trees a one-or-two-tree bench runs."""
    parser.add_argument("--before", type=pathlib.Path, default=None,
                        help="the src folder of a tree to compare with (before a change)")
    parser.add_argument("--after", type=pathlib.Path, default=HERE.parent / "src")


def trees_of(args: argparse.Namespace) -> dict[str, pathlib.Path]:
    """The trees named by add_tree_options' arguments, by the name the tables give them."""
    return {"tensorgate": args.after} if args.before is None \
        else {"before": args.before, "after": args.after}


def server_cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(src: pathlib.Path, models: pathlib.Path, *extra: str,
          wrap: Callable[[list[str]], list[str]] = list
          ) -> tuple[subprocess.Popen[bytes], int, int]:
    """The server from `src`, ready: its process, HTTP port and gRPC port; `extra`: more of
    its command line; `wrap`: the command as it is run (quota_bench.py: from a shell that
    first enters a cgroup)."""
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    process = subprocess.Popen(wrap(
        [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(models),
         "--http-port", str(port), "--grpc-port", str(grpc_port),
         "--metrics-port", str(free_port()), *extra]),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
            return process, port, grpc_port
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the server from {src} did not start")


def measure(src: pathlib.Path, models: pathlib.Path, work: pathlib.Path,
            seconds: float, wires: list[str], connections: int = 8
            ) -> dict[str, tuple[float, float]]:
    """Per request form: (QPS, server CPU µs per request)."""
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    process, port, grpc_port = serve(src, models)
    found = {}
    try:
        for name in wires:
            if name.startswith("grpc"):
                body = grpc_infer_body("identity", x, contents=name == "grpc-contents")
                answer = grpc_reference_answer(grpc_port, body, x.nbytes)
                def load(duration: float) -> dict[str, Any]:
                    return h2load_grpc(grpc_port, body, answer, connections, duration, work)
            else:
                path, headers, request = LOADS[name].build("/v2/models/{model}/infer",
                                                           "identity", x)
                raw = raw_request(port, path, headers, request)
                smallest = LOADS[name].min_body(x.size)
                def load(duration: float) -> dict[str, Any]:
                    return wrk_load(port, raw, connections, duration, smallest, work)
            load(1)  # warm-up
            before = server_cpu_s(process.pid)
            point = load(seconds)
            cpu = server_cpu_s(process.pid) - before
            requests = point["requests"]
            if point["bad"] or point["errors"] or not requests:
                raise RuntimeError(f"{src}, {name}: {point['bad']} bad answers, "
                                   f"{point['errors']} errors")
            found[name] = (point["qps"], cpu / requests * 1e6)
    finally:
        process.terminate()
        process.wait(timeout=30)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=pathlib.Path, required=True,
                        help="the src folder of the tree before the change")
    parser.add_argument("--after", type=pathlib.Path, default=HERE.parent / "src")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="of load per point")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--wires", default=",".join(WIRES),
                        help=f"request forms, comma-separated, of {', '.join(WIRES)}")
    args = parser.parse_args()
    wires = args.wires.split(",")
    if unknown := set(wires) - set(WIRES):
        parser.error(f"unknown request forms {sorted(unknown)}; choose from {WIRES}")
    for tool, package, needed in (("wrk", "wrk", set(LOADS)),
                                  ("h2load", "nghttp2-client", {"grpc", "grpc-contents"})):
        if needed & set(wires) and shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (apt-get install {package})")
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-ab-"))
    write_default_repository(work / "models")
    trees = {"before": args.before, "after": args.after}
    results: dict[str, dict[str, list[tuple[float, float]]]] = {t: {} for t in trees}
    try:
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for tree in order:
                for name, point in measure(trees[tree], work / "models", work,
                                           args.seconds, wires,
                                           args.connections).items():
                    results[tree].setdefault(name, []).append(point)
                    print(f"round {r + 1} {tree} {name}: {point[0]:,.0f} QPS, "
                          f"{point[1]:,.0f} µs server CPU a request", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n| identity, {args.connections} connections | before QPS | after QPS | before server µs/req "
          "| after server µs/req | after / before CPU |\n|---|---:|---:|---:|---:|---:|")
    for name in wires:
        qps = [statistics.median(p[0] for p in results[t][name]) for t in trees]
        cpu = [statistics.median(p[1] for p in results[t][name]) for t in trees]
        print(f"| {name} | {qps[0]:,.0f} | {qps[1]:,.0f} | {cpu[0]:,.0f} | {cpu[1]:,.0f} "
              f"| {cpu[1] / cpu[0]:.2f} |")


if __name__ == "__main__":
    main()
