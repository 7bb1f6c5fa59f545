"""What the garbage collector has to free per 1,000 requests, and the time it spends.

An object in a reference cycle is freed only by the collector: the server freezes its
generations after loading, so what such a cycle holds (a request's buffers, a connection)
stays until a collection, and each collection is a pause. This runs a server in a child
process of its own (one per source tree, `--before` for a before/after), drives it from
inside that process — gRPC through tritonclient (grpcio keeps nothing in cycles), HTTP
with prebuilt bytes on raw sockets (tritonclient.http makes a class per result) — and reads
`gc.get_stats()` and `gc.callbacks` around each workload: ok and failing requests, on one
connection and on a new connection every 10. The server's loop is uvloop, its default
(`--loop asyncio`: Python 3.11's selector transport keeps itself in a cycle, a bound method
of its own, about 7 objects a connection).

    .venv/bin/python bench/gc_bench.py [--before OLD/src] [--requests 2000] [--loop asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pathlib
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
             "HTTP, a new connection every 10", "HTTP, the model fails"]


def _child(requests: int, loop_name: str) -> dict[str, tuple[float, float]]:
    """In the child: per workload, (objects the collector freed, ms it spent) per 1,000."""
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
    (root / "m" / "1").mkdir(parents=True)
    torch.jit.script(Failing()).save(str(root / "m" / "1" / "model.pt"))
    (root / "m" / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'dynamic_batching { }\n')
    server = Server(ServerConfig(model_repository=(root,), http_port=0, grpc_port=0,
                                 metrics_port=0, allow_metrics=False, log_level="CRITICAL"))
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

    def grpc_load(n: int, every: int, value: float) -> None:
        x = np.full((1, 3), value, np.float32)
        client = None
        for i in range(n):
            if client is None or (every and i % every == 0):
                if client is not None:
                    client.close()
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            item = grpcclient.InferInput("INPUT__0", [1, 3], "FP32")
            item.set_data_from_numpy(x)
            try:
                client.infer("m", [item])
            except grpcclient.InferenceServerException:
                if value >= 0:
                    raise
        assert client is not None
        client.close()

    def http_load(n: int, every: int, value: float) -> None:
        body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3], "datatype": "FP32",
                                       "data": [value] * 3}]}).encode()
        raw = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
               % len(body)) + body
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
        WORKLOADS[5]: lambda n: http_load(n, 0, -1.0)}
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
        load(requests)
        time.sleep(2.5)  # (a closed HTTP connection lingers up to 2 s)
        gc.callbacks.remove(timed)  # the collections the load made: their time
        gc.collect()  # and what is left for the next one: counted, not timed
        freed = sum(s["collected"] for s in gc.get_stats()) - before
        found[name] = (1000 * freed / requests, 1e6 * spent[0] / requests)
    return found


def main() -> None:
    from ab_bench import add_tree_options, trees_of  # (never in the child: see below)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                        help="the server's event loop (its default: uvloop)")
    args = parser.parse_args()
    results = {}
    for name, src in trees_of(args).items():
        env = {**os.environ, "PYTHONPATH": str(src.resolve())}
        done = subprocess.run([sys.executable, __file__, "--child", str(args.requests),
                               args.loop], env=env, capture_output=True, text=True,
                              timeout=1800)
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
            freed, ms = results[name][workload]
            cells += [f"{freed:,.0f}", f"{ms:.2f}"]
        print(f"| {workload} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # the tree PYTHONPATH names (ab_bench, which main
        # imports, puts this checkout's src first on the path: not here)
        print(json.dumps(_child(int(sys.argv[2]), sys.argv[3])))
    else:
        main()
