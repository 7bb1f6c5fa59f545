"""What --grpc-max-connection-age costs gRPC clients: N client processes, each making
sequential ModelInfer calls on its own grpcio channel (identity, the 602 KB image), against a
server with no age and with short ages (a connection retired every 100 ms is an extreme that
makes the races of a retirement show). Servers run one at a time, in alternating rounds;
`--before SRC` adds a server from another tree (`PYTHONPATH=SRC`) at the shortest age. Every
answer's size is checked; a failed call is counted, not retried by the bench. Prints calls,
P50 / P99 / max latency, failed calls and the connections the server retired.

    .venv/bin/python bench/connection_age_bench.py [--seconds 10] [--rounds 2] [--clients 4]
        [--before /tmp/tg-old/src]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import re
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from server_bench import grpc_request, serve_logged  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

AGES_MS = (0, 1000, 100)  # 0: no age


def _client(port: int, seconds: float, out: Any) -> None:
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
    request = grpc_request("identity")
    options = [("grpc.max_receive_message_length", 1 << 26),
               ("grpc.max_send_message_length", 1 << 26)]
    samples, failures = [], []
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(20):
            stub.ModelInfer(request)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            start = time.perf_counter_ns()
            try:
                answer = stub.ModelInfer(request)
            except grpc.RpcError as error:
                failures.append(f"{error.code().name}: {error.details()}")
                continue
            samples.append(time.perf_counter_ns() - start)
            if len(answer.raw_output_contents[0]) != 3 * 224 * 224 * 4:
                failures.append("an answer of the wrong size")
    out.put((samples, failures))


def _retired(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(r"^tensorgate_connections_retired_total (\d+)$", text, re.M)
    return int(found.group(1)) if found else 0


def _run(repo: pathlib.Path, age: int, src: str | None, args: argparse.Namespace
         ) -> tuple[list[int], list[str], int]:
    extra = ["--grpc-max-connection-age", str(age)] if age else []
    env = dict(os.environ, PYTHONPATH=src) if src else None
    log = pathlib.Path(tempfile.gettempdir()) / "tensorgate-age-bench.log"
    process, ports, _ = serve_logged(repo, log, *extra, env=env)
    try:
        out: Any = multiprocessing.Queue()
        clients = [multiprocessing.Process(target=_client, args=(ports["grpc"], args.seconds,
                                                                  out))
                   for _ in range(args.clients)]
        for client in clients:
            client.start()
        results = [out.get(timeout=args.seconds + 120) for _ in clients]
        for client in clients:
            client.join()
        return ([s for samples, _ in results for s in samples],
                [f for _, failures in results for f in failures], _retired(ports["metrics"]))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--before", help="another tree's src folder, run at the shortest age")
    args = parser.parse_args()
    repo = write_default_repository(pathlib.Path(tempfile.gettempdir()) / "tensorgate-bench-repo")
    runs: list[tuple[str, int, str | None]] = [("this tree", age, None) for age in AGES_MS]
    if args.before:
        runs.append(("before", AGES_MS[-1], args.before))
    rows: dict[tuple[str, int], list[tuple[list[int], list[str], int]]] = {
        (name, age): [] for name, age, _ in runs}
    for round_ in range(args.rounds):
        for name, age, src in runs if round_ % 2 == 0 else runs[::-1]:
            rows[name, age].append(_run(repo, age, src, args))
    print(f"identity over gRPC, {args.clients} clients each on its own grpcio channel, "
          f"{args.seconds:g} s a round, {args.rounds} rounds")
    print("| server | max connection age | calls | P50 µs | P99 µs | max µs | failed | "
          "retired |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    said: Counter[str] = Counter()
    for (name, age), results in rows.items():
        samples = np.array([s for run in results for s in run[0]]) / 1e3
        failures = [f for run in results for f in run[1]]
        said.update(failures)
        print(f"| {name} | {f'{age} ms' if age else 'none'} | {len(samples):,} | "
              f"{np.percentile(samples, 50):,.0f} | {np.percentile(samples, 99):,.0f} | "
              f"{samples.max():,.0f} | {len(failures)} | {sum(run[2] for run in results)} |")
    for failure, count in said.most_common(5):
        print(f"{count} × {failure}")


if __name__ == "__main__":
    main()
