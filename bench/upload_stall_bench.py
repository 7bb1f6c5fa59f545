"""Does a model upload stall everyone else? Small binary requests' latency, alone, beside a
client that reloads a large model from the repository, and beside one that uploads it.

A load over HTTP with `file:` parameters carries the model's files in base64 inside a JSON
body (tritonclient's `load_model(files=...)`): a 40 MB model is a 53 MB body the server
parses and decodes before writing the files and loading the model. The reload from the
repository is the same model's load without the body, so the difference between the two
is what receiving the upload costs the others. In each round, for each source tree in
turn (alternating the order), wrk drives `identity` [1,3,224,224] with the binary
extension at one connection, alone, then beside a client that loads `big` (a TorchScript model
holding MB megabytes of weights) from the repository back to back, then beside one that reloads
`big_py` (a Python model.py whose setup reads as many megabytes with
ModelContext.load_weights), then beside one that uploads `big` back to back over HTTP, then
over gRPC (tritonclient's `load_model(files=)`: the file as a protobuf bytes field, no base64).
Every answer is checked. A second table: the server's CPU for each upload it refuses, for the
model-control mode (none) and for the flag (explicit, no --allow-model-upload): what a client
may make a server do for nothing.

    .venv/bin/python bench/upload_stall_bench.py [--before /tmp/tg-old/src] [--megabytes 40]
    (apt-get install wrk)
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, serve, server_cpu_s, trees_of  # noqa: E402
from compare_wire import OIP_BINARY, check_load, raw_request, wrk_load  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

_PATH = "/v2/models/{model}/infer"
_CONFIG = {"name": "big", "platform": "pytorch_libtorch", "max_batch_size": 4,
           "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [4]}],
           "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [4]}]}


class _Big(torch.nn.Module):
    """Passes its input through, holding `megabytes` of weights it does not use."""

    def __init__(self, megabytes: int) -> None:
        super().__init__()
        self.register_buffer("weights", torch.rand(megabytes * 250_000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def write_big(models: pathlib.Path, megabytes: int) -> bytes:
    """Models `big` (TorchScript) and `big_py` (a model.py) in the repository, each with
    `megabytes` of weights; big's model.pt's bytes."""
    folder = _model_folder(models, "big", 'platform: "pytorch_libtorch"')
    torch.jit.script(_Big(megabytes)).save(str(folder / "model.pt"))
    folder = _model_folder(models, "big_py", 'backend: "python"')
    (folder / "model.py").write_text(_BIG_PY)
    torch.save({"weights": torch.rand(megabytes * 250_000)}, folder / "weights.pt")
    return (models / "big" / "1" / "model.pt").read_bytes()


def _model_folder(models: pathlib.Path, name: str, kind: str) -> pathlib.Path:
    """`name`'s config (FP32 [4] in and out, batches of up to 4) and its version folder."""
    folder = models / name / "1"
    folder.mkdir(parents=True)
    (models / name / "config.pbtxt").write_text(
        f'name: "{name}"\n{kind}\nmax_batch_size: 4\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    return folder


_BIG_PY = """
from tensorgate import Model


class Big(Model):
    \"\"\"Passes its input through, holding weights it does not use.\"\"\"

    def setup(self, context):
        self.weights = context.load_weights("weights.pt")["weights"]

    def preprocess(self, inputs):
        return inputs["INPUT__0"]

    def forward(self, batch):
        return batch

    def postprocess(self, outputs):
        return {"OUTPUT__0": outputs}
"""


def loads_back_to_back(port: int, model: str, body: bytes, stop: threading.Event,
                       times: list[float]) -> None:
    """POST the load of `model` with `body` until `stop`; each load's seconds into `times`."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        while not stop.is_set():
            start = time.perf_counter()
            _post_load(connection, model, body, 200)
            times.append(time.perf_counter() - start)
    finally:
        connection.close()


def _post_load(connection: http.client.HTTPConnection, model: str, body: bytes,
               status: int) -> None:
    """POST the load of `model` with `body`; raise unless it is answered `status`."""
    connection.request("POST", f"/v2/repository/models/{model}/load", body)
    answer = connection.getresponse()
    text = answer.read()
    if answer.status != status:
        raise RuntimeError(f"load of {model} answered {answer.status}: {text[:300]!r}")


def _grpc_loads(port: int, model: bytes, stop: threading.Event, times: list[float]) -> None:
    """Upload `big` over gRPC until `stop`; each load's seconds into `times`."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        while not stop.is_set():
            start = time.perf_counter()
            client.load_model("big", config=json.dumps(_CONFIG),
                              files={"file:1/model.pt": model})
            times.append(time.perf_counter() - start)


def measure(src: pathlib.Path, work: pathlib.Path, seconds: float, model: bytes
            ) -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    upload = _upload_body(model)
    process, port, grpc_port = serve(src, work / "models", "--model-control-mode", "explicit",
                             "--load-model", "*", "--allow-model-upload",
                             "--max-request-bytes", str(len(upload) + (1 << 20)))
    try:
        small = raw_request(port, *OIP_BINARY.build(_PATH, "identity", x))
        smallest = OIP_BINARY.min_body(x.size)
        (work / "small").mkdir(exist_ok=True)
        wrk_load(port, small, 1, 1, smallest, work / "small")
        found: dict[str, Any] = {"alone": wrk_load(port, small, 1, seconds, smallest,
                                                   work / "small"),
                                 "body_mb": len(upload) / 1e6}
        for name, target, body in (("reload", "big", b""), ("reload_py", "big_py", b""),
                                   ("upload", "big", upload), ("grpc", "big", b"")):
            stop, times = threading.Event(), []
            loader = threading.Thread(target=loads_back_to_back,
                                      args=(port, target, body, stop, times)) \
                if name != "grpc" else threading.Thread(target=_grpc_loads,
                                                        args=(grpc_port, model, stop, times))
            loader.start()
            try:
                found[name] = wrk_load(port, small, 1, seconds, smallest, work / "small")
            finally:
                stop.set()
                loader.join()
            if not times:
                raise RuntimeError(f"no {name} finished in {seconds} s")
            found[name + "_s"] = statistics.median(times)
            found[name + "_count"] = len(times)
    finally:
        process.terminate()
        process.wait(timeout=60)
    for name in ("alone", "reload", "reload_py", "upload", "grpc"):
        check_load(found[name], f"{src}, {name}")
    return found


def _upload_body(model: bytes) -> bytes:
    return json.dumps({"parameters": {"config": json.dumps(_CONFIG), "file:1/model.pt":
                                      base64.b64encode(model).decode()}}).encode()


def refused_cost(src: pathlib.Path, work: pathlib.Path, model: bytes, count: int = 5
                 ) -> dict[str, float]:
    """Server CPU ms for each upload refused for the mode (none) and for the flag (explicit
    without --allow-model-upload), median of `count`; every answer checked."""
    upload = _upload_body(model)
    found = {}
    for refusal, extra, status in (("mode", (), 503),
                                   ("flag", ("--model-control-mode", "explicit"), 400)):
        process, port, _ = serve(src, work / "models", "--max-request-bytes",
                                 str(len(upload) + (1 << 20)), *extra)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            costs = []
            for _ in range(count + 1):  # the first one warms up
                before = server_cpu_s(process.pid)
                _post_load(connection, "big", upload, status)
                costs.append(server_cpu_s(process.pid) - before)
            found[refusal] = statistics.median(costs[1:]) * 1e3
        finally:
            connection.close()
            process.terminate()
            process.wait(timeout=60)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--megabytes", type=int, default=40, help="of the model's weights")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (apt-get install wrk)")
    trees = trees_of(args)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-upload-"))
    write_default_repository(work / "models")
    model = write_big(work / "models", args.megabytes)
    runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    refused: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    try:
        for r in range(args.rounds):
            for tree in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                found = measure(trees[tree], work, args.seconds, model)
                runs[tree].append(found)
                refused[tree].append(refused_cost(trees[tree], work, model))
                print(f"round {r + 1} {tree}: small P99 alone {found['alone']['p99_us']:,} µs, "
                      f"beside reloads {found['reload']['p99_us']:,} µs (max "
                      f"{found['reload']['max_us']:,}), beside model.py reloads "
                      f"{found['reload_py']['p99_us']:,} µs (max "
                      f"{found['reload_py']['max_us']:,}), beside uploads "
                      f"{found['upload']['p99_us']:,} µs (max {found['upload']['max_us']:,}), "
                      f"beside gRPC uploads {found['grpc']['p99_us']:,} µs (max "
                      f"{found['grpc']['max_us']:,}); reload {found['reload_s']:.2f} s, "
                      f"upload {found['upload_s']:.2f} s, gRPC {found['grpc_s']:.2f} s",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nidentity [1,3,224,224] binary at 1 connection: alone, beside back-to-back loads "
          f"of a {len(model) / 1e6:.0f} MB TorchScript model from the repository, of a "
          f"model.py reading as many MB of weights (load_weights), and beside "
          f"back-to-back uploads of it ({runs[next(iter(trees))][0]['body_mb']:.0f} MB JSON "
          f"bodies over HTTP; over gRPC); medians of {args.rounds} rounds\n")
    print("| server | alone P50 / P99 / max µs | beside reloads P50 / P99 / max µs | beside "
          "model.py reloads P50 / P99 / max µs | beside HTTP uploads P50 / P99 / max µs | "
          "beside gRPC uploads P50 / P99 / max µs | reload s | model.py reload s | HTTP upload "
          "s | gRPC upload s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tree, found in runs.items():
        def cell(load: str) -> str:
            return " / ".join(f"{statistics.median(f[load][key] for f in found):,.0f}"
                              for key in ("p50_us", "p99_us", "max_us"))
        print(f"| {tree} | {cell('alone')} | {cell('reload')} | {cell('reload_py')} | "
              f"{cell('upload')} | {cell('grpc')} | " + " | ".join(
                  f"{statistics.median(f[key] for f in found):.2f}"
                  for key in ("reload_s", "reload_py_s", "upload_s", "grpc_s")) + " |")
    print("\nserver CPU for one refused upload (the same body; median of 5 a round, then of "
          "the rounds)\n\n| server | refused for the mode (none) ms | refused for the flag "
          "(explicit) ms |\n|---|---:|---:|")
    for tree, costs in refused.items():
        print(f"| {tree} | " + " | ".join(f"{statistics.median(c[key] for c in costs):.0f}"
                                         for key in ("mode", "flag")) + " |")


if __name__ == "__main__":
    main()
