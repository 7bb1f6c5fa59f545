"""What a kubelet's probes see while a server starts: when /v2/health/live first answers,
when /v2/health/ready does, and how long the live probe's answers take while the models load
(a probe that waits past its timeoutSeconds, 1 s by default, counts as failed).

For each source tree in turn (alternating the order over the rounds), the server starts on
the built-in repository, with `--megabytes` > 0 also `big` (a TorchScript model holding that
many megabytes of weights) and `big_py` (a model.py that reads as many with load_weights),
both from bench/upload_stall_bench.py. A prober sends GET /v2/health/live, then
/v2/health/ready, each on a new connection as a kubelet does, every `--period` seconds from
launch until ready; times are from launch.

    .venv/bin/python bench/probe_bench.py [--before /tmp/tg-old/src] [--megabytes 1000]
"""

from __future__ import annotations

import argparse
import http.client
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, trees_of  # noqa: E402
from compare_servers import free_port  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from upload_stall_bench import write_big  # noqa: E402

_LIMIT_S = 300.0  # a start that takes longer is a failure of the run


def probe(port: int, path: str, timeout_s: float) -> tuple[int, float]:
    """One probe on a new connection: (HTTP status, or 0 where none came; seconds taken)."""
    began = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        status = connection.getresponse().status
    except OSError:
        status = 0
    finally:
        connection.close()
    return status, time.perf_counter() - began


def start(src: pathlib.Path, models: pathlib.Path, period_s: float) -> dict[str, Any]:
    """Launch the server from `src` and probe it until ready; its probes and times."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    launched = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(models),
         "--http-port", str(port), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port())],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    live: list[tuple[float, int, float]] = []  # (sent, status, seconds taken)
    ready_s = None
    try:
        while ready_s is None:
            sent = time.perf_counter() - launched
            if sent > _LIMIT_S or process.poll() is not None:
                raise RuntimeError(f"the server from {src} was not ready in {sent:.0f} s "
                                   f"(exit {process.poll()})")
            status, took = probe(port, "/v2/health/live", 10.0)
            live.append((sent, status, took))
            if status == 200 and probe(port, "/v2/health/ready", 10.0)[0] == 200:
                ready_s = time.perf_counter() - launched
            time.sleep(period_s)
    finally:
        process.terminate()
        process.wait(timeout=60)
    answered = [(sent, took) for sent, status, took in live if status == 200]
    first_live = answered[0][0] + answered[0][1] if answered else None
    loading = [took for _, took in answered[:-1]]  # those before the server was ready
    return {"live_s": first_live, "ready_s": ready_s, "loading_probes": len(loading),
            "loading_max_s": max(loading, default=0.0),
            "loading_over_1s": sum(took > 1.0 for took in loading)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=0,
                        help="add models big and big_py holding this many MB of weights")
    parser.add_argument("--period", type=float, default=0.05, help="seconds between probes")
    args = parser.parse_args()
    trees = trees_of(args)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-probe-"))
    try:
        models = write_default_repository(work / "models")
        if args.megabytes:
            write_big(models, args.megabytes)
        found: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for name, src in order:
                found[name].append(start(src, models, args.period))
                print(f"round {r + 1}, {name}: {found[name][-1]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    added = f" + big, big_py ({args.megabytes} MB each)" if args.megabytes else ""
    print(f"\nbuilt-in repository{added}; "
          f"a live and a ready probe every {args.period:g} s from launch; medians of "
          f"{args.rounds} starts (max over them for the probes' time)\n")
    print("| tree | first live answer s | ready s | live probes answered while loading "
          "| slowest of them ms | over 1 s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in found.items():
        lives = [r["live_s"] for r in runs if r["live_s"] is not None]
        print(f"| {name} | {statistics.median(lives):.2f} | "
              f"{statistics.median(r['ready_s'] for r in runs):.2f} | "
              f"{statistics.median(r['loading_probes'] for r in runs):.0f} | "
              f"{max(r['loading_max_s'] for r in runs) * 1e3:,.0f} | "
              f"{sum(r['loading_over_1s'] for r in runs)} |")


if __name__ == "__main__":
    main()
