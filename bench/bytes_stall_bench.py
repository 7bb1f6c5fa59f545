"""Does a request with many BYTES elements stall everyone else? For one or two source trees.

Each BYTES element becomes a Python bytes object, made on the event loop: a probe asks the
server's /v2/health/live every 5 ms while one client sends a BYTES tensor (binary extension)
to a model that counts its strings. Cases: a million one-byte elements; a million of mixed
lengths (0, 1 and 2 bytes); 13 million one-byte elements (a 61 MB body: what a client may
send under the default 64 MiB limit). Reported per tree and case: the request's time and
status, the probe's worst wait while it ran, and how much the server's peak RSS grew.

    git worktree add /tmp/tg-old <commit>
    .venv/bin/python bench/bytes_stall_bench.py [--before /tmp/tg-old/src] [--rounds 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import pathlib
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ab_bench import serve  # noqa: E402

_MODEL = '''
import numpy as np

from tensorgate import Model


class Count(Model):
    def forward(self, inputs):
        return {"N": np.array([inputs["T"].size], dtype=np.int64)}
'''
_CONFIG = '''name: "count"
backend: "python"
max_batch_size: 0
input [ { name: "T" data_type: TYPE_STRING dims: [-1] } ]
output [ { name: "N" data_type: TYPE_INT64 dims: [1] } ]
'''
CASES = {"1M one length": (1_000_000, False), "1M mixed lengths": (1_000_000, True),
         "13M one length": (13_000_000, False)}


def _body(count: int, mixed: bool) -> tuple[bytes, dict[str, str]]:
    if mixed:
        unit = b"".join(struct.pack("<I", size) + b"ab"[:size] for size in (0, 1, 2))
        tensor = unit * (count // 3) + b"".join(
            struct.pack("<I", size) + b"ab"[:size] for size in (0, 1, 2)[:count % 3])
    else:
        tensor = (struct.pack("<I", 1) + b"a") * count
    head = json.dumps({"inputs": [{"name": "T", "datatype": "BYTES", "shape": [count],
                                   "parameters": {"binary_data_size": len(tensor)}}]}).encode()
    return head + tensor, {"Inference-Header-Content-Length": str(len(head))}


def _peak_rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(src: pathlib.Path, models: pathlib.Path, body: bytes,
            headers: dict[str, str]) -> dict[str, Any]:
    process, port, _ = serve(src, models)
    waits: list[float] = []
    done = threading.Event()

    def probe() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while not done.is_set():
            started = time.perf_counter()
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()
            waits.append(time.perf_counter() - started)
            time.sleep(0.005)
        connection.close()
    try:
        before = _peak_rss_mb(process.pid)
        thread = threading.Thread(target=probe)
        thread.start()
        time.sleep(0.2)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        started = time.perf_counter()
        connection.request("POST", "/v2/models/count/infer", body, headers)
        answer = connection.getresponse()
        answer.read()
        seconds = time.perf_counter() - started
        done.set()
        thread.join()
        grown = _peak_rss_mb(process.pid) - before
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {"status": answer.status, "seconds": seconds, "worst_wait_ms": max(waits) * 1e3,
            "rss_growth_mb": grown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=pathlib.Path, default=None,
                        help="the src folder of a tree to compare with (before a change)")
    parser.add_argument("--after", type=pathlib.Path, default=HERE.parent / "src")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trees = {"tensorgate": args.after} if args.before is None \
        else {"before": args.before, "after": args.after}
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-bytes-"))
    (work / "models" / "count" / "1").mkdir(parents=True)
    (work / "models" / "count" / "config.pbtxt").write_text(_CONFIG)
    (work / "models" / "count" / "1" / "model.py").write_text(_MODEL)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for case, (count, mixed) in CASES.items():
            body, headers = _body(count, mixed)
            for r in range(args.rounds):
                for tree in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                    found = measure(trees[tree], work / "models", body, headers)
                    runs.setdefault((case, tree), []).append(found)
                    print(f"{case}, round {r + 1}, {tree}: {found}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nA BYTES tensor (binary) to a model counting its strings, a probe on "
          f"/v2/health/live every 5 ms; medians of {args.rounds} rounds\n")
    print("| case | server | status | request s | probe's worst wait ms | peak RSS growth MB |\n"
          "|---|---|---:|---:|---:|---:|")
    for (case, tree), found in runs.items():
        def median(key: str) -> float:
            return statistics.median(f[key] for f in found)
        print(f"| {case} | {tree} | {found[-1]['status']} | {median('seconds'):.2f} "
              f"| {median('worst_wait_ms'):,.0f} | {median('rss_growth_mb'):,.0f} |")


if __name__ == "__main__":
    main()
