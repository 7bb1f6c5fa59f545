"""What tracing costs a request: identity over HTTP (binary, 602 KB each way), one keep-alive
connection, with tracing off, at Triton's default sampling (one request in 1,000), on every
request (TIMESTAMPS), and on every request with its tensors (TENSORS). One server, its
settings changed between rounds through the trace API; the modes alternate for `--rounds`
rounds so that machine noise falls on all of them. Writes bench/results/trace_bench.json.
With `--otel`, the server runs Triton's opentelemetry trace mode instead, sending its spans
to a collector in this process (an OTLP/HTTP receiver on 127.0.0.1 that counts what it
gets; TENSORS has no place there) and writes bench/results/trace_bench_otel.json.

    .venv/bin/python bench/trace_bench.py [--requests 2000] [--rounds 3] [--otel]
"""

from __future__ import annotations

import argparse
import http.server
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
from collections.abc import Callable

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


def _until_still(read: Callable[[], int]) -> None:
    """Until `read()` (the trace file's size, the spans a collector got) has not changed
    for a second: the server writes and sends off its loop, and TENSORS text takes
    seconds; it sends spans every 200 ms or 512 of them."""
    last, still = -1, time.monotonic()
    while time.monotonic() - still < 1.0:
        now = read()
        if now != last:
            last, still = now, time.monotonic()
        time.sleep(0.1)


class _Collector:
    """An OTLP/HTTP receiver that counts the spans and bytes POSTed to it (the tests check
    what the spans hold: tests/e2e/test_trace_otlp.py)."""

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0
        counts = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                counts.bytes += len(body)
                # counted, not parsed: json.loads of a 300 KB batch would hold this
                # process's GIL for ms, and the client measuring latency lives here too
                counts.spans += body.count(b'"spanId"')
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--otel", action="store_true",
                        help="opentelemetry trace mode, to a collector in this process")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tensorgate-trace-bench-"))
    repo = write_default_repository(work / "models")
    trace_file = work / "trace.json"
    collector = _Collector() if args.otel else None
    modes = {mode: value for mode, value in MODES.items()
             if collector is None or "TENSORS" not in mode}
    tracing = (["--trace-config", f"triton,file={trace_file}"] if collector is None else
               ["--trace-config", "mode=opentelemetry",
                "--trace-config", f"opentelemetry,url=127.0.0.1:{collector.port}",
                "--trace-config", "opentelemetry,bsp_schedule_delay=200"])
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(repo),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *tracing],
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
    samples: dict[str, list[np.ndarray]] = {mode: [] for mode in modes}

    def written() -> int:
        return trace_file.stat().st_size if trace_file.exists() else 0

    def sent() -> int:
        return collector.spans if collector is not None else 0

    try:
        raw = binary_request("identity", port)
        for round_ in range(args.rounds):
            order = list(modes) if round_ % 2 == 0 else list(reversed(modes))
            for mode in order:
                changes, share = modes[mode]
                _settings(port, changes)
                samples[mode].append(latencies(port, raw, max(50, int(args.requests * share)))[0])
                _settings(port, {"trace_level": ["OFF"]})  # what was held is written now
                # not while the next mode is measured
                _until_still(sent if collector is not None else written)
    finally:
        server.terminate()
        server.wait(timeout=60)
    if collector is None:
        size = trace_file.stat().st_size if trace_file.exists() else 0
        written = json.loads(trace_file.read_text()) if size else []
        traces = sum(1 for entry in written if "model_name" in entry)
        del written
        what = f"{traces} traces written, {size:,} bytes"
    else:
        traces, size = collector.spans // 3, collector.bytes  # three spans a request
        what = f"{collector.spans} spans sent ({traces} traces), {size:,} bytes of OTLP JSON"
    shutil.rmtree(work)
    rows = []
    print(f"identity over HTTP, one connection, {args.rounds} rounds; {what}")
    print(f"{'tracing':<24}{'P50 µs':>10}{'P99 µs':>10}{'n':>8}")
    for mode, parts in samples.items():
        joined = np.concatenate(parts)
        row = {"mode": mode, "p50_us": float(np.percentile(joined, 50)),
               "p99_us": float(np.percentile(joined, 99)), "n": int(joined.size)}
        rows.append(row)
        print(f"{mode:<24}{row['p50_us']:>10.1f}{row['p99_us']:>10.1f}{row['n']:>8}")
    RESULTS.mkdir(exist_ok=True)
    name = "trace_bench_otel.json" if collector is not None else "trace_bench.json"
    (RESULTS / name).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
        "cpus": len(__import__("os").sched_getaffinity(0)), "python": platform.python_version(),
        "torch": torch.__version__, "traces_written": traces, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
