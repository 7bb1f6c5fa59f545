"""What common clients see: per-call latency of the same identity request through the
clients people use against a KServe v2 server, one call at a time. Each client sends what it
sends by default: tritonclient's HTTP client (geventhttpclient) nothing extra; its asyncio
client (aiohttp) `Accept-Encoding: gzip, deflate`; a JSON request as Python's requests, httpx
or Go's net/http send it (with that header too); curl with a 3 MB JSON body (it sends
`Expect: 100-continue` before a body over 1 MiB and waits for the answer); tritonclient's gRPC
client. With --before, the server from another source tree runs the same calls in the same
run, alternating which goes first. Writes bench/results/client_bench.json.

    .venv/bin/python bench/client_bench.py [--before /tmp/tg-old/src] [--calls 40] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import serve  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

RESULTS = HERE / "results"
X = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
X4 = np.random.default_rng(1).standard_normal((4, 3, 224, 224)).astype(np.float32)


def _timed(call: Callable[[], None], count: int) -> list[float]:
    for _ in range(3):
        call()
    ms = []
    for _ in range(count):
        begin = time.perf_counter_ns()
        call()
        ms.append((time.perf_counter_ns() - begin) / 1e6)
    return ms


def tritonclient_sync(module: Any, port: int, count: int) -> list[float]:
    """tritonclient's synchronous client, HTTP or gRPC (`module`)."""
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    item = module.InferInput("INPUT__0", list(X.shape), "FP32")
    item.set_data_from_numpy(X)

    def call() -> None:
        assert np.array_equal(client.infer("identity", [item]).as_numpy("OUTPUT__0"), X)
    try:
        return _timed(call, count)
    finally:
        client.close()


def tritonclient_http_aio(port: int, count: int) -> list[float]:
    import tritonclient.http.aio as aioclient

    async def scenario() -> list[float]:
        async with aioclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            item = aioclient.InferInput("INPUT__0", list(X.shape), "FP32")
            item.set_data_from_numpy(X)
            ms = []
            for i in range(count + 3):
                begin = time.perf_counter_ns()
                result = await client.infer("identity", [item])
                elapsed = (time.perf_counter_ns() - begin) / 1e6
                assert np.array_equal(result.as_numpy("OUTPUT__0"), X)
                if i >= 3:
                    ms.append(elapsed)
            return ms
    return asyncio.run(scenario())


def json_accepting_gzip(port: int, count: int) -> list[float]:
    """A V2 JSON request with `Accept-Encoding: gzip, deflate`, answer decompressed as
    requests, httpx and Go's net/http do."""
    import gzip
    import zlib
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(X.shape),
                                   "datatype": "FP32", "data": X.ravel().tolist()}]})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call() -> None:
        connection.request("POST", "/v2/models/identity/infer", body,
                           {"Content-Type": "application/json",
                            "Accept-Encoding": "gzip, deflate"})
        answer = connection.getresponse()
        data = answer.read()
        encoding = answer.getheader("Content-Encoding")
        if encoding == "gzip":
            data = gzip.decompress(data)
        elif encoding == "deflate":
            data = zlib.decompress(data)
        assert answer.status == 200 and json.loads(data)["outputs"][0]["shape"] == list(X.shape)
    try:
        return _timed(call, count)
    finally:
        connection.close()


def curl_large_json(port: int, count: int, folder: pathlib.Path) -> list[float]:
    """curl --data-binary @3MB.json: curl's own timing of each call (a new process each)."""
    path = folder / "x4.json"
    if not path.exists():
        path.write_text(json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(X4.shape),
                                                "datatype": "FP32",
                                                "data": X4.ravel().tolist()}]}))
    ms = []
    for i in range(count // 4 + 2):  # a process a call: fewer of them
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}",
                              "--data-binary", f"@{path}",
                              f"http://127.0.0.1:{port}/v2/models/identity/infer"],
                             capture_output=True, text=True, timeout=60, check=True)
        status, seconds = out.stdout.split()
        assert status == "200", out.stdout
        if i >= 2:
            ms.append(float(seconds) * 1e3)
    return ms


CLIENTS = ("tritonclient HTTP", "tritonclient HTTP asyncio", "JSON, Accept-Encoding gzip",
           "curl, 3 MB JSON body", "tritonclient gRPC")


def measure(src: pathlib.Path, models: pathlib.Path, folder: pathlib.Path,
            count: int) -> dict[str, list[float]]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    process, port, grpc_port = serve(src, models)
    try:
        runs: dict[str, Callable[[], list[float]]] = {
            CLIENTS[0]: lambda: tritonclient_sync(httpclient, port, count),
            CLIENTS[1]: lambda: tritonclient_http_aio(port, count),
            CLIENTS[2]: lambda: json_accepting_gzip(port, count),
            CLIENTS[3]: lambda: curl_large_json(port, count, folder),
            CLIENTS[4]: lambda: tritonclient_sync(grpcclient, grpc_port, count)}
        return {name: run() for name, run in runs.items()}
    finally:
        process.kill()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=pathlib.Path, default=None)
    parser.add_argument("--after", type=pathlib.Path, default=HERE.parent / "src")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trees = {"after": args.after, **({"before": args.before} if args.before else {})}
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tg-clients-"))
    models = write_default_repository(folder / "models")
    samples: dict[str, dict[str, list[float]]] = {t: {c: [] for c in CLIENTS} for t in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for tree in order:
            for client, ms in measure(trees[tree], models, folder, args.calls).items():
                samples[tree][client] += ms
            print(f"round {r + 1}: {tree} done", flush=True)
    rows: dict[str, Any] = {}
    print(f"\nidentity, one call at a time, P50 / P99 ms ({args.rounds} rounds)\n")
    names = list(trees)[::-1]
    print("| client | " + " | ".join(f"{t} P50 | {t} P99" for t in names) + " |")
    print("|---|" + "---:|---:|" * len(names))
    for client in CLIENTS:
        cells = []
        for tree in names:
            ms = np.array(samples[tree][client])
            p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
            rows.setdefault(client, {})[tree] = {"p50_ms": p50, "p99_ms": p99, "n": len(ms)}
            cells.append(f"{p50:.2f} | {p99:.2f}")
        print(f"| {client} | " + " | ".join(cells) + " |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "client_bench.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M"), "trees": {t: str(p) for t, p in trees.items()},
        "calls": args.calls, "rounds": args.rounds, "clients": rows,
        "median_of_all_ms": {t: {c: statistics.median(v) for c, v in s.items()}
                             for t, s in samples.items()}}))


if __name__ == "__main__":
    main()
