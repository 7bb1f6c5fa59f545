"""What tracing costs a request: identity over HTTP (binary, 602 KB each way), one keep-alive
connection, with tracing off, at Triton's default sampling (one request in 1,000), on every
request (TIMESTAMPS), and on every request with its tensors (TENSORS). One server, its
settings changed between rounds through the trace API; the modes alternate for `--rounds`
rounds so that machine noise falls on all of them. Writes bench/results/trace_bench.json.

    .venv/bin/python bench/trace_bench.py [--requests 2000] [--rounds 3]
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
import threading
import time
import urllib.request

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from server_bench import binary_request, latencies  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
# mode → (trace settings, share of the requests measured: TENSORS writes 2.4 MB of text a
# request, so it runs 50 a round)
MODES = {
    "off": ({"trace_level": ["OFF"]}, 1.0),
    "1 in 1000": ({"trace_level": ["TIMESTAMPS"], "trace_rate": "1000"}, 1.0),
    "every request": ({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, 1.0),
    "every request, TENSORS": ({"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1"},
                               0.025),
}


def _settings(port: int, changes: dict[str, object]) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/trace/setting",
                                     data=json.dumps(changes).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def _wait_written(file: pathlib.Path) -> None:
    """Until the trace file has stopped growing for a second (the server writes off its
    loop, and TENSORS text takes seconds)."""
    last, still = -1, time.monotonic()
    while time.monotonic() - still < 1.0:
        size = file.stat().st_size if file.exists() else 0
        if size != last:
            last, still = size, time.monotonic()
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tensorgate-trace-bench-"))
    repo = write_default_repository(work / "models")
    trace_file = work / "trace.json"
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(repo),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
         "--trace-config", f"triton,file={trace_file}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    port = 0
    for line in server.stdout:
        match = re.search(r"HTTP on 127\.0\.0\.1:(\d+)", line)
        if match:
            port = int(match.group(1))
        if line.startswith("ready:"):
            break
    # the server's output is read (and dropped) on: a full pipe would stall its logging
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    samples: dict[str, list[np.ndarray]] = {mode: [] for mode in MODES}
    try:
        raw = binary_request("identity", port)
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                changes, share = MODES[mode]
                _settings(port, changes)
                samples[mode].append(latencies(port, raw, max(50, int(args.requests * share)))[0])
                _settings(port, {"trace_level": ["OFF"]})  # what was held is written now
                _wait_written(trace_file)  # not while the next mode is measured
    finally:
        server.terminate()
        server.wait(timeout=60)
    size = trace_file.stat().st_size if trace_file.exists() else 0
    written = json.loads(trace_file.read_text()) if size else []
    traces = sum(1 for entry in written if "model_name" in entry)
    del written
    shutil.rmtree(work)
    rows = []
    print(f"identity over HTTP, one connection, {args.rounds} rounds; "
          f"{traces} traces written, {size:,} bytes")
    print(f"{'tracing':<24}{'P50 µs':>10}{'P99 µs':>10}{'n':>8}")
    for mode, parts in samples.items():
        joined = np.concatenate(parts)
        row = {"mode": mode, "p50_us": float(np.percentile(joined, 50)),
               "p99_us": float(np.percentile(joined, 99)), "n": int(joined.size)}
        rows.append(row)
        print(f"{mode:<24}{row['p50_us']:>10.1f}{row['p99_us']:>10.1f}{row['n']:>8}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trace_bench.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
        "cpus": len(__import__("os").sched_getaffinity(0)), "python": platform.python_version(),
        "torch": torch.__version__, "traces_written": traces, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
