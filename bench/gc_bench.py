"""What the garbage collector has to free per 1,000 requests, and the time it spends.

An object in a reference cycle is freed only by the collector: the server freezes its
generations after loading, so what such a cycle holds (a request's buffers, a connection)
stays until a collection, and each collection is a pause. This runs a server in a child
process of its own (one per source tree, `--before` for a before/after), drives it from
inside that process — gRPC through tritonclient (grpcio keeps nothing in cycles), HTTP
with prebuilt bytes on raw sockets (tritonclient.http makes a class per result) — and reads
`gc.get_stats()` and `gc.callbacks` around each workload: ok and failing requests, on one
connection and on a new connection every 10; and the paths that came later, each on a model
of its kind: a Triton Python model, a decoupled one streaming three responses a request, a
BLS call from a Python model, an ensemble of two steps, sequences of ten requests, and
answers from the response cache. The server's loop is uvloop, its default (`--loop asyncio`:
Python 3.11's selector transport keeps itself in a cycle, a bound method of its own, about 7
objects a connection).

The client runs in the server's process, so its cycles would count too: `--types` also
prints, for each workload that left any, the kinds of object the collector found (by module
and type, per 1,000 requests), which says whose they are.

    .venv/bin/python bench/gc_bench.py [--before OLD/src] [--requests 2000] [--loop asyncio]
        [--types]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pathlib
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
WORKLOADS = ["gRPC, one connection", "gRPC, a new connection every 10",
             "gRPC, the model fails", "HTTP, one connection",
             "HTTP, a new connection every 10", "HTTP, the model fails",
             "gRPC, a Triton Python model", "gRPC stream, a decoupled model (3 responses)",
             "gRPC, a Python model's BLS call", "HTTP, an ensemble of two steps",
             "gRPC, sequences of 10", "HTTP, answered from the response cache"]
_PYTHON = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT__0").as_numpy()
            if BLS:
                called = pb_utils.InferenceRequest(
                    model_name="m", requested_output_names=["OUTPUT__0"],
                    inputs=[pb_utils.Tensor("INPUT__0", x)]).exec()
                if called.has_error():
                    raise pb_utils.TritonModelException(called.error().message())
                x = pb_utils.get_output_tensor_by_name(called, "OUTPUT__0").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT__0", x)]))
        return answers
"""
_STREAMING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for i in range(3):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([i], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == 2 else 0)
        return None
"""
_VECTOR = """max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def _repository(root: pathlib.Path, script: Any) -> None:
    """The models: m (TorchScript `script`, failing on a negative input) and one a workload
    for the later paths, each in Triton's layout."""
    def model(name: str, config: str, files: dict[str, str] | None = None) -> None:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        if files is None:
            script.save(str(root / name / "1" / "model.pt"))
        for file, text in (files or {}).items():
            (root / name / "1" / file).write_text(text)

    model("m", 'platform: "pytorch_libtorch"\n' + _VECTOR + "dynamic_batching { }\n")
    model("py", 'backend: "python"\n' + _VECTOR, {"model.py": "BLS = False\n" + _PYTHON})
    model("bls", 'backend: "python"\n' + _VECTOR, {"model.py": "BLS = True\n" + _PYTHON})
    model("stream", 'backend: "python"\nmax_batch_size: 0\n'
          "model_transaction_policy { decoupled: true }\n"
          'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
          {"model.py": _STREAMING})
    model("ens", 'platform: "ensemble"\n' + _VECTOR + """ensemble_scheduling { step [
  { model_name: "m" model_version: -1 input_map { key: "INPUT__0" value: "INPUT__0" }
    output_map { key: "OUTPUT__0" value: "mid" } },
  { model_name: "m" model_version: -1 input_map { key: "INPUT__0" value: "mid" }
    output_map { key: "OUTPUT__0" value: "OUTPUT__0" } } ] }
""")
    model("seq", 'platform: "pytorch_libtorch"\n' + _VECTOR
          + "sequence_batching { max_sequence_idle_microseconds: 10000000 }\n")
    model("cached", 'platform: "pytorch_libtorch"\n' + _VECTOR
          + "response_cache { enable: true }\n")


def _child(requests: int, loop_name: str, types: bool
           ) -> dict[str, tuple[float, float, dict[str, float]]]:
    """In the child: per workload, (objects the collector freed, ms it spent) per 1,000,
    and with `types` the kinds of those objects, per 1,000."""
    new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop_name == "uvloop":  # the server's own default (network/loop.py)
        import uvloop
        new_loop = uvloop.new_event_loop
    import numpy as np
    import torch
    import tritonclient.grpc as grpcclient

    from compare_wire import Connection
    from tensorgate.config import ServerConfig
    from tensorgate.server import Server

    class Failing(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if bool((x < 0).any()):
                raise RuntimeError("negative input")
            return x

    root = pathlib.Path(tempfile.mkdtemp(prefix="tg-gc-"))
    _repository(root, torch.jit.script(Failing()))
    server = Server(ServerConfig(model_repository=(root,), http_port=0, grpc_port=0,
                                 metrics_port=0, allow_metrics=False, log_level="CRITICAL",
                                 response_cache_bytes=1 << 20))
    started = threading.Event()

    def main() -> None:
        loop = new_loop()
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    threading.Thread(target=main, daemon=True).start()
    if not started.wait(120):
        raise RuntimeError("the server did not start")

    def grpc_load(n: int, every: int, value: float, model: str = "m",
                  sequence: int = 0) -> None:
        x = np.full((1, 3), value, np.float32)
        client = None
        for i in range(n):
            if client is None or (every and i % every == 0):
                if client is not None:
                    client.close()
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            item = grpcclient.InferInput("INPUT__0", [1, 3], "FP32")
            item.set_data_from_numpy(x)
            steps = {}
            if sequence:  # the i-th request is step i % sequence of sequence i // sequence
                steps = {"sequence_id": 1 + i // sequence,
                         "sequence_start": i % sequence == 0,
                         "sequence_end": i % sequence == sequence - 1}
            try:
                client.infer(model, [item], **steps)
            except grpcclient.InferenceServerException:
                if value >= 0:
                    raise
        assert client is not None
        client.close()

    def stream_load(n: int) -> None:
        """n requests on one stream, one at a time: each's three responses come back
        before the next is sent."""
        answers: queue.Queue = queue.Queue()
        x = np.array([1], np.int32)
        with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
            client.start_stream(callback=lambda result, error: answers.put(error))
            for _ in range(n):
                item = grpcclient.InferInput("IN", [1], "INT32")
                item.set_data_from_numpy(x)
                client.async_stream_infer("stream", [item])
                for _ in range(3):
                    error = answers.get(timeout=30)
                    if error is not None:
                        raise RuntimeError(f"the stream answered {error}")
            client.stop_stream()

    def http_load(n: int, every: int, value: float, model: str = "m") -> None:
        body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3], "datatype": "FP32",
                                       "data": [value] * 3}]}).encode()
        raw = (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
               % (model.encode(), len(body))) + body
        connection = None
        for i in range(n):
            if connection is None or (every and i % every == 0):
                if connection is not None:
                    connection.close()
                connection = Connection(server.http_port)
            status, _, _ = connection.exchange(raw)
            if status != (200 if value >= 0 else 500):
                raise RuntimeError(f"answered {status}")
        assert connection is not None
        connection.close()

    loads: dict[str, Callable[[int], None]] = {
        WORKLOADS[0]: lambda n: grpc_load(n, 0, 1.0),
        WORKLOADS[1]: lambda n: grpc_load(n, 10, 1.0),
        WORKLOADS[2]: lambda n: grpc_load(n, 0, -1.0),
        WORKLOADS[3]: lambda n: http_load(n, 0, 1.0),
        WORKLOADS[4]: lambda n: http_load(n, 10, 1.0),
        WORKLOADS[5]: lambda n: http_load(n, 0, -1.0),
        WORKLOADS[6]: lambda n: grpc_load(n, 0, 1.0, "py"),
        WORKLOADS[7]: stream_load,
        WORKLOADS[8]: lambda n: grpc_load(n, 0, 1.0, "bls"),
        WORKLOADS[9]: lambda n: http_load(n, 0, 1.0, "ens"),
        WORKLOADS[10]: lambda n: grpc_load(n, 0, 1.0, "seq", sequence=10),
        WORKLOADS[11]: lambda n: http_load(n, 0, 1.0, "cached")}
    spent = [0.0, 0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            spent[1] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - spent[1]

    found = {}
    for name, load in loads.items():
        load(100)  # warm-up
        time.sleep(0.3)  # connections closed, lingering ones too
        gc.collect()
        before = sum(s["collected"] for s in gc.get_stats())
        spent[0] = 0.0
        gc.callbacks.append(timed)
        if types:  # what the collector finds is kept in gc.garbage, to be told apart
            gc.set_debug(gc.DEBUG_SAVEALL)
        load(requests)
        time.sleep(2.5)  # (a closed HTTP connection lingers up to 2 s)
        gc.callbacks.remove(timed)  # the collections the load made: their time
        gc.collect()  # and what is left for the next one: counted, not timed
        freed = sum(s["collected"] for s in gc.get_stats()) - before
        kinds = _kinds(gc.garbage, requests)
        gc.set_debug(0)
        gc.garbage.clear()
        found[name] = (1000 * freed / requests, 1e6 * spent[0] / requests, kinds)
    return found


def _kinds(garbage: list[Any], requests: int) -> dict[str, float]:
    """How many of each kind of object (its type's module and name; a function's or
    frame's module for those) per 1,000 requests, most first."""
    counts: dict[str, int] = {}
    for thing in garbage:
        kind = type(thing)
        where = kind.__module__
        if kind.__name__ == "frame":
            where = thing.f_globals.get("__name__", "?")
        elif kind.__name__ in ("function", "method"):
            where = getattr(thing, "__module__", None) or "?"
        key = f"{where}.{kind.__qualname__}"
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return {key: 1000 * count / requests for key, count in ranked}


def main() -> None:
    from ab_bench import add_tree_options, trees_of  # (never in the child: see below)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                        help="the server's event loop (its default: uvloop)")
    parser.add_argument("--types", action="store_true",
                        help="also print the kinds of object the collector found")
    args = parser.parse_args()
    results = {}
    for name, src in trees_of(args).items():
        env = {**os.environ, "PYTHONPATH": str(src.resolve())}
        done = subprocess.run([sys.executable, __file__, "--child", str(args.requests),
                               args.loop, str(args.types)], env=env, capture_output=True,
                              text=True, timeout=1800)
        if done.returncode:
            raise SystemExit(f"{name} ({src}) failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    names = list(results)
    print(f"| per 1,000 requests ({args.requests} a workload, {args.loop}) | "
          + " | ".join(f"{n}: objects the GC freed | {n}: GC ms" for n in names) + " |")
    print("|---|" + "---:|" * (2 * len(names)))
    for workload in WORKLOADS:
        cells = []
        for name in names:
            freed, ms, _ = results[name][workload]
            cells += [f"{freed:,.0f}", f"{ms:.2f}"]
        print(f"| {workload} | " + " | ".join(cells) + " |")
    if args.types:
        for name in names:
            for workload, (_, _, kinds) in results[name].items():
                if kinds:
                    shown = ", ".join(f"{kind} {count:,.1f}"
                                      for kind, count in list(kinds.items())[:8])
                    print(f"{name}, {workload}: {shown}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # the tree PYTHONPATH names (ab_bench, which main
        # imports, puts this checkout's src first on the path: not here)
        print(json.dumps(_child(int(sys.argv[2]), sys.argv[3], sys.argv[4:5] == ["True"])))
    else:
        main()
