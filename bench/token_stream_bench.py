"""Token streaming over gRPC: one decoupled Triton Python model (`model.py` with `class
TritonPythonModel`, the same file and config for every server), served by tensorgate and by
Triton's Python backend (bench/peers/install.sh triton) one after the other.

The model streams TOKENS responses a request (an INT32 each), then its final flag; `threads`
sends them from a thread of its own per request (Triton's decoupled examples), `async` from
an `async def execute`. `--step-ms` is the model's time per token (0: the server's own cost
per response is all there is). The client is grpcio's asyncio API, `k` ModelStreamInfer
streams on one channel, each sending a prebuilt request and reading its TOKENS responses
before the next, for a few seconds; every response is checked (an answer, not an error).
Beside tokens/s and the time to the first and to the last token: the server's CPU per token
(its process tree, from /proc) and the client's. Writes bench/results/token_stream_bench.json.

    .venv/bin/python bench/token_stream_bench.py [--quick] [--step-ms 0] [--servers tensorgate,triton]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare import Running, tree_cpu_s  # noqa: E402
from compare_servers import Ports, Server, servers  # noqa: E402
from tensorgate.pipeline.executor import default_intra_op_threads  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
TOKENS = 64
MODELS = ("threads", "async")

THREADS = '''
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            threading.Thread(target=self._stream, args=(request.get_response_sender(), count),
                             daemon=True).start()
        return None

    def _stream(self, sender, count):
        for token in range(count):
            if {step_s}:
                time.sleep({step_s})
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("TOKEN", np.array([token], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

ASYNC = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for token in range(count):
                await asyncio.sleep({step_s})
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("TOKEN", np.array([token], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def _same(data: bytes) -> bytes:
    return data


def write_repository(root: pathlib.Path, step_s: float) -> None:
    for name, code in (("threads", THREADS), ("async", ASYNC)):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(code.format(step_s=step_s)))


def request_message(model: str, tokens: int) -> bytes:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="COUNT", datatype="INT32")
    tensor.shape.append(1)
    request.raw_input_contents.append(np.array([tokens], np.int32).tobytes())
    return request.SerializeToString()


class Launched:
    def __init__(self, server: Server, work: pathlib.Path) -> None:
        self.server = server
        self.ports = Ports.free()
        env = dict(os.environ)
        env.update(server.environment(server, work))
        self.log = work / f"{server.name}.log"
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(server.command(server, self.ports, work), env=env,
                                            cwd=work, stdout=sink, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def wait_ready(self, deadline_s: float = 180.0) -> None:
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with {self.process.returncode}; see {self.log}")
            try:
                ready = all(urllib.request.urlopen(
                    f"http://127.0.0.1:{self.ports.http}/v2/models/{m}/ready", timeout=5
                ).status == 200 for m in MODELS)
                if ready:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"not ready within {deadline_s:.0f} s; see {self.log}")

    def stop(self) -> None:
        Running(self.server, self.process, self.ports, self.log).stop()


async def _client(channel: grpc.aio.Channel, message: bytes, deadline: float,
                  first: list[float], last: list[float], counts: list[int]) -> None:
    call = channel.stream_stream(STREAM, request_serializer=_same,
                                 response_deserializer=_same)()
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        await call.write(message)
        for index in range(TOKENS):
            answer = await call.read()
            if answer is grpc.aio.EOF or answer[:1] != b"\x12":  # infer_response, no error
                raise RuntimeError(f"a bad stream answer: {answer!r:.300}")
            if index == 0:
                first.append(time.perf_counter() - started)
        last.append(time.perf_counter() - started)
        counts.append(TOKENS)
    await call.done_writing()


async def measure(port: int, pid: int, model: str, streams: int, seconds: float
                  ) -> dict[str, float]:
    message = request_message(model, TOKENS)
    first: list[float] = []
    last: list[float] = []
    counts: list[int] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await _client(channel, message, time.perf_counter() + 0.5, [], [], [])  # warm-up
        server_before, client_before = tree_cpu_s(pid), time.process_time()
        wall = time.perf_counter()
        await asyncio.gather(*(_client(channel, message, wall + seconds, first, last, counts)
                               for _ in range(streams)))
        wall = time.perf_counter() - wall
        server = tree_cpu_s(pid) - server_before
        client = time.process_time() - client_before
    tokens = sum(counts)
    return {"tokens": tokens, "tokens_per_s": tokens / wall,
            "first_p50_ms": float(np.percentile(first, 50) * 1e3),
            "first_p99_ms": float(np.percentile(first, 99) * 1e3),
            "last_p50_ms": float(np.percentile(last, 50) * 1e3),
            "server_cpu_us_per_token": server / tokens * 1e6,
            "client_cpu_us_per_token": client / tokens * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--servers", default="tensorgate,triton",
                        help="comma-separated; peers not installed are skipped")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else 5.0
    levels = [1, 8]
    available = servers()
    chosen = []
    for name in args.servers.split(","):
        why = available[name].installed() if name in available else "unknown server"
        if why:
            print(f"skipping {name}: {why}", flush=True)
        else:
            chosen.append(available[name])
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-token-bench-"))
    results: dict[str, Any] = {}
    try:
        for server in chosen:
            server.prepare(server, work, default_intra_op_threads())
            for repository in ("models", "triton-models"):  # its own models only
                shutil.rmtree(work / repository, ignore_errors=True)
                write_repository(work / repository, args.step_ms / 1e3)
            launched = Launched(server, work)
            try:
                launched.wait_ready()
                results[server.name] = {
                    f"{model} {k}": asyncio.run(measure(launched.ports.grpc,
                                                        launched.process.pid, model, k, seconds))
                    for model in MODELS for k in levels}
            finally:
                launched.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"token streaming over gRPC ModelStreamInfer: {TOKENS} responses a request, "
          f"{args.step_ms:g} ms a token; grpcio asyncio client; {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print(f"{'server':<12}{'model, streams':<16}{'tokens/s':>10}{'first P50 ms':>14}"
          f"{'first P99 ms':>14}{'last P50 ms':>13}{'server µs/token':>17}"
          f"{'client µs/token':>17}")
    for name, rows in results.items():
        for row, r in rows.items():
            print(f"{name:<12}{row:<16}{r['tokens_per_s']:>10,.0f}{r['first_p50_ms']:>14.2f}"
                  f"{r['first_p99_ms']:>14.2f}{r['last_p50_ms']:>13.2f}"
                  f"{r['server_cpu_us_per_token']:>17,.0f}{r['client_cpu_us_per_token']:>17,.0f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "token_stream_bench.json").write_text(json.dumps(
        {"results": results, "tokens": TOKENS, "step_ms": args.step_ms,
         "cores": os.cpu_count(), "python": platform.python_version(),
         "date": time.strftime("%Y-%m-%d %H:%M")}, indent=2))


if __name__ == "__main__":
    main()
