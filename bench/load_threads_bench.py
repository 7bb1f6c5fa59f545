"""A large repository's start under --model-load-thread-count: when the first model serves,
when all do, and the server's peak memory.

A repository of `--models` copies of the built-in resnet50 (each its own name) is served
from this tree once for each count in turn (alternating the order over the rounds); the
repository index is polled every 50 ms from launch until every model is READY. The peak RSS
is the process's VmHWM then (compare.py's memory_tree, as the peer comparison reads it).

    .venv/bin/python bench/load_threads_bench.py [--models 12] [--counts 0 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from compare import memory_tree  # noqa: E402
from compare_servers import free_port  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

_LIMIT_S = 600.0


def write_copies(work: pathlib.Path, count: int) -> pathlib.Path:
    """`count` copies of the built-in resnet50, named resnet50_0 ..."""
    base = write_default_repository(work / "base")
    models = work / "models"
    for i in range(count):
        folder = models / f"resnet50_{i}"
        shutil.copytree(base / "resnet50", folder)
        config = folder / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "resnet50"',
                                                     f'name: "resnet50_{i}"'))
    return models


def _states(port: int) -> list[str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/repository/index", data=b"{}")
    with urllib.request.urlopen(request, timeout=2) as answer:
        return [model.get("state", "") for model in json.loads(answer.read())]


def start(models: pathlib.Path, count: int, expected: int) -> dict[str, Any]:
    """Launch with --model-load-thread-count `count`; seconds to the first and to every
    model READY, and the peak RSS then."""
    port = free_port()
    launched = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(models),
         "--http-port", str(port), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port()), "--model-load-thread-count", str(count)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    try:
        while True:
            elapsed = time.perf_counter() - launched
            if elapsed > _LIMIT_S or process.poll() is not None:
                raise RuntimeError(f"not ready in {elapsed:.0f} s (exit {process.poll()})")
            try:
                states = _states(port)
            except OSError:
                states = []
            if first is None and "READY" in states:
                first = elapsed
            if len(states) == expected and all(state == "READY" for state in states):
                break
            time.sleep(0.05)
        all_s = time.perf_counter() - launched
        memory = memory_tree(process.pid)
        return {"first_s": first, "all_s": all_s, "peak_mb": memory["peak_rss_mb"],
                "ready_mb": memory["rss_mb"]}
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-load-threads-"))
    runs: dict[int, list[dict[str, Any]]] = {count: [] for count in args.counts}
    try:
        models = write_copies(work, args.models)
        for r in range(args.rounds):
            for count in args.counts if r % 2 == 0 else args.counts[::-1]:
                found = start(models, count, args.models)
                runs[count].append(found)
                print(f"round {r + 1}, --model-load-thread-count {count}: first ready "
                      f"{found['first_s']:.2f} s, all {found['all_s']:.2f} s, peak RSS "
                      f"{found['peak_mb']:,.0f} MB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.models} copies of resnet50 (TorchScript, 103 MB each); medians of "
          f"{args.rounds} rounds\n")
    print("| --model-load-thread-count | first model ready s | all ready s | peak RSS MB | "
          "RSS when ready MB |\n|---:|---:|---:|---:|---:|")
    for count, found in runs.items():
        def median(key: str) -> float:
            return statistics.median(f[key] for f in found)
        print(f"| {count} | {median('first_s'):.2f} | {median('all_s'):.2f} | "
              f"{median('peak_mb'):,.0f} | {median('ready_mb'):,.0f} |")


if __name__ == "__main__":
    main()
