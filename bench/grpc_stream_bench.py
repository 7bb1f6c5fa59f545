"""gRPC ModelStreamInfer against unary ModelInfer on the same server, same client: tensorgate,
and Triton's Python backend where bench/peers/install.sh has installed it.

Starts each server as bench/compare.py does (same models, seed and threads), one at a time.
The client is grpcio's asyncio API with
prebuilt request bytes (no protobuf work per request), the same for both ways of calling:
- ping-pong: one request at a time, P50/P99 (unary: a call each; stream: write, read);
- load: k requests in flight for a few seconds (unary: k concurrent calls on one channel;
  stream: one stream that keeps k outstanding), QPS and P99.
Beside every figure, the server's CPU per request (its whole process tree, from /proc) and the
client's: the client is Python and may be the bottleneck, the server's CPU per request says
what the protocol costs it either way. Every answer's size is checked. Writes
bench/results/grpc_stream_bench.json.

    .venv/bin/python bench/grpc_stream_bench.py [--quick] [--servers tensorgate,triton]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare import start, tree_cpu_s  # noqa: E402
from compare_servers import servers  # noqa: E402
from compare_wire import grpc_infer_body  # noqa: E402
from server_bench import OUTPUT_BYTES  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from tensorgate.pipeline.executor import default_intra_op_threads  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
UNARY = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_OPTIONS = [("grpc.max_receive_message_length", 1 << 26),
            ("grpc.max_send_message_length", 1 << 26)]


def _same(data: bytes) -> bytes:
    return data


class Checked:
    """Counts answers whose size is wrong (an error answer carries no tensor)."""

    def __init__(self, output_bytes: int) -> None:
        self.output_bytes = output_bytes
        self.bad = 0

    def unary(self, answer: bytes) -> None:
        self.bad += len(answer) < self.output_bytes

    def stream(self, answer: bytes) -> None:
        # ModelStreamInferResponse: field 2 (infer_response) first when it succeeded
        self.bad += answer[:1] != b"\x12" or len(answer) < self.output_bytes


async def ping_pong(channel: grpc.aio.Channel, message: bytes, check: Checked, n: int,
                    stream: bool) -> list[int]:
    samples = []
    if stream:
        call = channel.stream_stream(STREAM, request_serializer=_same,
                                     response_deserializer=_same)()
        for _ in range(n):
            start = time.perf_counter_ns()
            await call.write(message)
            check.stream(await call.read())
            samples.append(time.perf_counter_ns() - start)
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
    else:
        infer = channel.unary_unary(UNARY, request_serializer=_same, response_deserializer=_same)
        for _ in range(n):
            start = time.perf_counter_ns()
            check.unary(await infer(message))
            samples.append(time.perf_counter_ns() - start)
    return samples


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def answer_id(answer: bytes) -> bytes:
    """The request id in a ModelStreamInferResponse, read from its first fields without
    parsing the rest (the tensor): infer_response (field 2) holds model_name (1),
    model_version (2) and id (3) first, as tensorgate and protobuf write them."""
    _, at = _varint(answer, 1)
    while at < len(answer):
        key, at = _varint(answer, at)
        size, at = _varint(answer, at)
        if key >> 3 == 3:
            return answer[at:at + size]
        if key & 7 != 2 or key >> 3 > 3:
            break
        at += size
    return b""


async def load(channel: grpc.aio.Channel, messages: list[bytes], check: Checked,
               seconds: float, stream: bool) -> list[int]:
    """len(messages) requests outstanding until `seconds` have passed; latencies in ns.
    On the stream, message i carries id i: answers come back as they finish, in any order."""
    deadline = time.perf_counter() + seconds
    samples: list[int] = []
    if stream:
        call = channel.stream_stream(STREAM, request_serializer=_same,
                                     response_deserializer=_same)()
        sent: dict[bytes, int] = {}
        for slot, message in enumerate(messages):
            sent[str(slot).encode()] = time.perf_counter_ns()
            await call.write(message)
        while sent:
            answer = await call.read()
            now = time.perf_counter_ns()
            check.stream(answer)
            slot = answer_id(answer)
            if slot not in sent:
                raise RuntimeError(f"a stream answer for no request in flight: {answer[:200]!r}")
            samples.append(now - sent.pop(slot))
            if time.perf_counter() < deadline:
                sent[slot] = time.perf_counter_ns()
                await call.write(messages[int(slot)])
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        return samples
    infer = channel.unary_unary(UNARY, request_serializer=_same, response_deserializer=_same)

    async def worker(message: bytes) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter_ns()
            check.unary(await infer(message))
            samples.append(time.perf_counter_ns() - start)
    await asyncio.gather(*(worker(message) for message in messages))
    return samples


async def measured(server_pid: int, run: Callable[[], Awaitable[list[int]]],
                   check: Checked, seconds: float | None = None) -> dict[str, Any]:
    server_before, client_before = tree_cpu_s(server_pid), time.process_time()
    wall = time.perf_counter()
    samples = await run()
    wall = time.perf_counter() - wall
    server = tree_cpu_s(server_pid) - server_before
    client = time.process_time() - client_before
    us = np.array(samples) / 1e3
    n = max(len(samples), 1)
    return {"n": len(samples), "qps": len(samples) / wall, "p50_us": float(np.percentile(us, 50)),
            "p99_us": float(np.percentile(us, 99)), "bad": check.bad,
            "server_cpu_us_per_request": server / n * 1e6,
            "client_cpu_us_per_request": client / n * 1e6}


async def bench_model(grpc_port: int, server_pid: int, model: str, n: int, seconds: float,
                      levels: list[int]) -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    message = grpc_infer_body(model, x)[5:]
    slots = [grpc_infer_body(model, x, request_id=str(i))[5:] for i in range(max(levels))]
    rows: dict[str, Any] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}", options=_OPTIONS) as channel:
        for stream in (False, True):
            way = "stream" if stream else "unary"
            await ping_pong(channel, message, Checked(0), max(n // 10, 3), stream)  # warm-up
            check = Checked(OUTPUT_BYTES[model])
            rows[f"{way} ping-pong"] = await measured(
                server_pid, lambda: ping_pong(channel, message, check, n, stream), check)
        for k in levels:
            for stream in (False, True):  # alternating, so that drift hits both alike
                way = "stream" if stream else "unary"
                check = Checked(OUTPUT_BYTES[model])
                rows[f"{way} {k} in flight"] = await measured(
                    server_pid, lambda: load(channel, slots[:k], check, seconds, stream), check)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--servers", default="tensorgate,triton",
                        help="comma-separated; peers not installed are skipped")
    args = parser.parse_args()
    plan = {"identity": (200 if args.quick else 2000, [1, 4, 16, 64])}
    if not args.quick:
        plan["resnet50"] = (100, [1, 4, 16])
    seconds = 2.0 if args.quick else 8.0
    available = servers()
    chosen = []
    for name in args.servers.split(","):
        why = available[name].installed() if name in available else "unknown server"
        if why:
            print(f"skipping {name}: {why}", flush=True)
        else:
            chosen.append(available[name])
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-stream-bench-"))
    write_default_repository(work / "models")
    shutil.rmtree(work / "models" / "detector")  # the peers serve identity and resnet50 only
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    results: dict[str, Any] = {}
    try:
        for server in chosen:
            server.prepare(server, work, default_intra_op_threads())
            running, _ = start(server, work, x)
            try:
                results[server.name] = {
                    model: asyncio.run(bench_model(running.ports.grpc, running.process.pid,
                                                   model, n, seconds, levels))
                    for model, (n, levels) in plan.items()}
            finally:
                running.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"gRPC ModelStreamInfer vs unary ModelInfer, grpcio asyncio client with prebuilt "
          f"messages; {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{'server':<11}{'model':<10}{'calls':<22}{'QPS':>8}{'P50 µs':>10}{'P99 µs':>10}"
          f"{'server µs/req':>15}{'client µs/req':>15}{'bad':>5}")
    for name, models in results.items():
        for model, rows in models.items():
            for call, r in rows.items():
                print(f"{name:<11}{model:<10}{call:<22}{r['qps']:>8,.0f}{r['p50_us']:>10,.0f}"
                      f"{r['p99_us']:>10,.0f}{r['server_cpu_us_per_request']:>15,.0f}"
                      f"{r['client_cpu_us_per_request']:>15,.0f}{r['bad']:>5}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "grpc_stream_bench.json").write_text(json.dumps(
        {"results": results, "cores": os.cpu_count(), "python": platform.python_version(),
         "date": time.strftime("%Y-%m-%d %H:%M")}, indent=2))


if __name__ == "__main__":
    main()
