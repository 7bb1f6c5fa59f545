"""Requests that would have the server make millions of Python objects: do they stall
everyone else? For one or two source trees.

A probe asks the server's /v2/health/live every 5 ms while one client sends one request, to
a model that counts the strings of its BYTES input. Cases, each sent as prebuilt bytes (so
that the client's own work does not stall the probe, which shares its process):
- BYTES over HTTP (binary extension): a million one-byte elements; a million of mixed
  lengths (0, 1 and 2 bytes); 13 million one-byte elements (a 61 MB body, under the
  default 64 MiB limit). Each becomes a Python bytes object.
- BYTES over HTTP as JSON `data`: a million token-like strings ("w0", "w1", ...; 9 MB), a
  million of mixed lengths, 160,000 empty strings (469 KiB: a body under the size from
  which JSON is parsed in slices whatever it holds), 300,000 as x.tolist() sends a
  [300000, 1] tensor (lists of one); a small request with a parameter of
  1.1 million commas and 20 MB of escaped backslashes (its JSON counted outside strings);
  16,000 BYTES inputs of one string each (past the bound on inputs); 24 FP32 inputs of
  40,000 numbers each (960,000 values, under the value bound; refused by the model's
  inputs once decoded); 48 MB of random INT64 in a gzipped binary body, to the sum.
- gRPC ModelInfer: 1.5 million request parameters (26 MB; upb parses a map in time that
  grows with the square of its entries), 1.5 million parameters of one input, a million
  requested outputs, an input shape of 20 million dims.
- gRPC typed contents, to a model that sums an INT64 input: 60 million one-byte varints
  (60 MB, 480 MB as a tensor), 5 million of full width (10 bytes each, negative); 60 MB in
  raw_input_contents, for what the transport alone costs; and the 60 million varints in a
  request of a sequence, on a stream (ModelStreamInfer), to the same sum in a sequence.
Reported per tree and case: the request's time and status (HTTP status, or the gRPC code),
the probe's worst wait while it ran, and how much the server's peak RSS grew.

    git worktree add /tmp/tg-old <commit>
    .venv/bin/python bench/object_stall_bench.py [--before /tmp/tg-old/src] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gzip
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
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, serve, trees_of  # noqa: E402
from json_stall_bench import peak_rss_mb  # noqa: E402
from tensorgate.protocol.protobuf_wire import varint_bytes  # noqa: E402

_MODEL = '''
import numpy as np

from tensorgate import Model


class Count(Model):
    def forward(self, inputs):
        return {"N": np.array([inputs["T"].size], dtype=np.int64)}
'''
_SUM = '''
import torch

from tensorgate import Model


class Sum(Model):
    def forward(self, inputs):
        return {"N": inputs["X"].sum().reshape(1)}
'''
_SUM_CONFIG = '''name: "sum"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT64 dims: [-1] } ]
output [ { name: "N" data_type: TYPE_INT64 dims: [1] } ]
'''
# the same, in a sequence (its requests keep their order: decoded in steps all the same)
_SUM_SEQUENCE_CONFIG = '''name: "sum_sequence"
backend: "python"
max_batch_size: 1
input [ { name: "X" data_type: TYPE_INT64 dims: [-1] } ]
output [ { name: "N" data_type: TYPE_INT64 dims: [1] } ]
sequence_batching { }
'''
_CONFIG = '''name: "count"
backend: "python"
max_batch_size: 0
input [ { name: "T" data_type: TYPE_STRING dims: [-1] } ]
output [ { name: "N" data_type: TYPE_INT64 dims: [1] } ]
'''
Send = Callable[[int, int], tuple[str, float]]  # (HTTP port, gRPC port) -> (status, s)


def _bytes_body(count: int, mixed: bool) -> tuple[bytes, dict[str, str]]:
    if mixed:
        pieces = [struct.pack("<I", size) + b"ab"[:size] for size in (0, 1, 2)]
        tensor = b"".join(pieces) * (count // 3) + b"".join(pieces[:count % 3])
    else:
        tensor = (struct.pack("<I", 1) + b"a") * count
    head = json.dumps({"inputs": [{"name": "T", "datatype": "BYTES", "shape": [count],
                                   "parameters": {"binary_data_size": len(tensor)}}]}).encode()
    return head + tensor, {"Inference-Header-Content-Length": str(len(head))}


def _json_body(count: int, mixed: bool | str) -> tuple[bytes, dict[str, str]]:
    """The strings as V2 JSON `data`, as a client sends BYTES without the binary extension:
    token-like ("w0", "w1", ...), mixed lengths (0, 1 and 2 bytes), or all empty."""
    data: list[Any] = [("" if mixed == "empty" else "ab"[:i % 3] if mixed else f"w{i}")
                       for i in range(count)]
    if mixed == "nested":  # as x.tolist() sends a [count, 1] tensor
        data = [[f"w{i}"] for i in range(count)]
    return json.dumps({"inputs": [{"name": "T", "datatype": "BYTES", "shape": [count],
                                   "data": data}]}, separators=(",", ":")).encode(), {}


def _escapes_body(count: int, mixed: bool | str) -> tuple[bytes, dict[str, str]]:
    """A small request whose parameter is a string of 1.1 million commas (so the quick count
    of JSON marks is over the bound, and they are counted again outside strings) and then
    `count` backslashes, each written as two."""
    note = "," * 1_100_000 + "\\" * count
    return json.dumps({"inputs": [{"name": "T", "datatype": "BYTES", "shape": [1],
                                   "data": ["x"]}], "parameters": {"note": note}},
                      separators=(",", ":")).encode(), {}


def _inputs_body(count: int, mixed: bool | str) -> tuple[bytes, dict[str, str]]:
    """`count` BYTES inputs of one string each (past the bound on inputs: refused, after
    each array is looked at for its end)."""
    return json.dumps({"inputs": [{"name": f"T{i}", "datatype": "BYTES", "shape": [1],
                                   "data": ["a"]} for i in range(count)]}).encode(), {}


def _arrays_body(count: int, mixed: bool | str) -> tuple[bytes, dict[str, str]]:
    """`count` FP32 inputs of 40,000 numbers each (235 KB of JSON apiece): decoded, then
    refused (the model has no such inputs)."""
    values = [round(v, 3) for v in np.random.default_rng(0).random(40_000).tolist()]
    return json.dumps({"inputs": [{"name": f"X{i}", "datatype": "FP32", "shape": [40_000],
                                   "data": values} for i in range(count)]},
                      separators=(",", ":")).encode(), {}


def _tensors_body(count: int, wire: bool | str) -> tuple[bytes, dict[str, str]]:
    """`count` FP32 inputs of one number each and as many outputs (MAX_TENSORS: decoded,
    then refused, the model has no such inputs), as JSON or binary."""
    binary = wire == "binary"
    header = json.dumps({"inputs": [
        {"name": f"X{i}", "datatype": "FP32", "shape": [1],
         **({"parameters": {"binary_data_size": 4}} if binary else {"data": [1.5]})}
        for i in range(count)], "outputs": [{"name": f"Y{i}"} for i in range(count)]},
        separators=(",", ":")).encode()
    if not binary:
        return header, {}
    return header + bytes(4 * count), {"Inference-Header-Content-Length": str(len(header))}


def _decoy_body(count: int, lone: bool | str) -> tuple[bytes, dict[str, str]]:
    """`count` FP32 inputs of 250 numbers (1.3 KB each, too small to be cut out), a NaN
    (so orjson refuses the text and json parses it) and a parameter whose text may hold a
    surrogate's escape: an escaped backslash before "ud800" (a decoy), or a lone one."""
    values = [1.5] * 250
    header = json.dumps({"inputs": [{"name": f"X{i}", "datatype": "FP32", "shape": [250],
                                     "data": values} for i in range(count)],
                         "parameters": {"note": "\ud800" if lone == "lone" else "\\ud800"}},
                        separators=(",", ":")).replace('"data":[1.5', '"data":[NaN', 1)
    return header.encode(), {}


def _gzip_body(count: int, mixed: bool | str) -> tuple[bytes, dict[str, str]]:
    """`count` random INT64 values for the sum model, binary, the body gzipped (level 1:
    random values barely shrink, so the server decompresses about as much as it reads)."""
    values = np.random.default_rng(0).integers(-1000, 1000, count).astype("<i8").tobytes()
    head = json.dumps({"inputs": [{"name": "X", "datatype": "INT64", "shape": [count],
                                   "parameters": {"binary_data_size": len(values)}}]}).encode()
    return gzip.compress(head + values, 1), {"Inference-Header-Content-Length": str(len(head)),
                                             "Content-Encoding": "gzip"}


def _http(count: int, mixed: bool | str, as_json: bool | str = False,
          model: str = "count") -> Send:
    builder = {"escapes": _escapes_body, "inputs": _inputs_body, "arrays": _arrays_body,
               "gzip": _gzip_body, "tensors": _tensors_body, "decoy": _decoy_body,
               True: _json_body,
               False: _bytes_body}[as_json]
    body, headers = builder(count, mixed)

    def send(port: int, grpc_port: int) -> tuple[str, float]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        started = time.perf_counter()
        connection.request("POST", f"/v2/models/{model}/infer", body, headers)
        answer = connection.getresponse()
        answer.read()
        return str(answer.status), time.perf_counter() - started
    return send


def _grpc(shape: str) -> Send:
    request = pb.ModelInferRequest(model_name="count")
    item = request.inputs.add(name="T", datatype="BYTES")
    item.shape.extend([1])
    request.raw_input_contents.append(struct.pack("<I", 1) + b"a")
    if shape == "request parameters":
        for i in range(1_500_000):
            request.parameters[f"p{i}"].int64_param = i
    elif shape == "input parameters":
        for i in range(1_500_000):
            item.parameters[f"p{i}"].bool_param = True
    elif shape == "outputs":
        for _ in range(1_000_000):
            request.outputs.add(name="N")
    elif shape == "empty outputs":  # under MAX_MESSAGE_PARTS: walked, parsed, then refused
        for _ in range(65_000):
            request.outputs.add()
    elif shape == "tensors":  # MAX_TENSORS of each: decoded, then refused by the model
        del request.inputs[:], request.raw_input_contents[:]
        for i in range(4096):
            request.inputs.add(name=f"X{i}", datatype="FP32", shape=[1])
            request.raw_input_contents.append(bytes(4))
            request.outputs.add(name=f"Y{i}")
    else:
        del item.shape[:]
        item.shape.extend([1] * 20_000_000)
    return _grpc_send(request.SerializeToString())


def _contents(count: int, full: bool | str) -> Send:
    request = pb.ModelInferRequest(model_name="sum")
    item = request.inputs.add(name="X", datatype="INT64", shape=[count])
    if full == "sequence":  # one request that starts and ends a sequence, on a stream
        request.model_name = "sum_sequence"
        item.shape[:] = [1, count]
        request.parameters["sequence_id"].int64_param = 7
        request.parameters["sequence_start"].bool_param = True
        request.parameters["sequence_end"].bool_param = True
        run = b"\x1a" + varint_bytes(count) + b"\x01" * count
        tensor = item.SerializeToString() + b"\x2a" + varint_bytes(len(run)) + run
        del request.inputs[:]
        head = request.SerializeToString()
        return _grpc_send(head + b"\x2a" + varint_bytes(len(tensor)) + tensor, stream=True)
    if full == "raw":  # the same bytes, 8 to a value: what the transport alone costs
        request.raw_input_contents.append(bytes(count))
        del item.shape[:]
        item.shape.append(count // 8)
        return _grpc_send(request.SerializeToString())
    if full:
        item.contents.int64_contents.extend([-1] * count)
        return _grpc_send(request.SerializeToString())
    # written by hand, as protobuf would (its extend of 60 million ints takes a minute)
    run = b"\x1a" + varint_bytes(count) + b"\x01" * count  # int64_contents, packed
    tensor = item.SerializeToString() + b"\x2a" + varint_bytes(len(run)) + run  # contents
    head = pb.ModelInferRequest(model_name="sum").SerializeToString()
    return _grpc_send(head + b"\x2a" + varint_bytes(len(tensor)) + tensor)  # inputs


def _strings(count: int, mixed: bool | str) -> Send:
    """`count` strings as typed bytes_contents (KServe's SDK sends BYTES so), to the count
    model: tokens, or lengths of 0-300 bytes."""
    request = pb.ModelInferRequest(model_name="count")
    item = request.inputs.add(name="T", datatype="BYTES", shape=[count])
    if mixed:
        lengths = np.random.default_rng(0).integers(0, 300, count)
        item.contents.bytes_contents.extend(b"s" * int(n) for n in lengths)
    else:
        item.contents.bytes_contents.extend(b"tok%d" % i for i in range(count))
    return _grpc_send(request.SerializeToString())


def _grpc_send(data: bytes, stream: bool = False) -> Send:
    def send(port: int, grpc_port: int) -> tuple[str, float]:
        limit = [("grpc.max_send_message_length", 1 << 30),
                 ("grpc.max_receive_message_length", 1 << 30)]
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=limit) as channel:
            started = time.perf_counter()
            try:
                if stream:
                    call = channel.stream_stream(
                        "/inference.GRPCInferenceService/ModelStreamInfer",
                        response_deserializer=pb.ModelStreamInferResponse.FromString)
                    answers = list(call(iter([data]), timeout=300))
                    code = answers[0].error_message or "OK" if answers else "no answer"
                else:
                    channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(
                        data, timeout=300)
                    code = "OK"
            except grpc.RpcError as error:
                code = error.code().name
            return code, time.perf_counter() - started
    return send


CASES: dict[str, Callable[[], Send]] = {
    "HTTP BYTES, 1M one length": lambda: _http(1_000_000, False),
    "HTTP BYTES, 1M mixed lengths": lambda: _http(1_000_000, True),
    "HTTP BYTES, 13M one length": lambda: _http(13_000_000, False),
    "HTTP JSON BYTES, 1M tokens": lambda: _http(1_000_000, False, as_json=True),
    "HTTP JSON BYTES, 1M mixed lengths": lambda: _http(1_000_000, True, as_json=True),
    "HTTP JSON BYTES, 160K empty (469 KiB)": lambda: _http(160_000, "empty", as_json=True),
    "HTTP JSON BYTES, 300K nested [N,1]": lambda: _http(300_000, "nested", as_json=True),
    "HTTP JSON, 20 MB of backslashes": lambda: _http(10_000_000, False, as_json="escapes"),
    "HTTP JSON BYTES, 16,000 inputs of one string": lambda: _http(16_000, False,
                                                                  as_json="inputs"),
    "HTTP JSON, 24 FP32 arrays of 235 KB": lambda: _http(24, False, as_json="arrays"),
    "HTTP JSON, 4,096 inputs and outputs": lambda: _http(4096, "json", as_json="tensors"),
    "HTTP binary, 4,096 inputs and outputs": lambda: _http(4096, "binary", as_json="tensors"),
    "HTTP JSON, 1M numbers with a NaN and a surrogate decoy": lambda: _http(
        4000, "decoy", as_json="decoy"),
    "HTTP JSON, 1M numbers with a NaN and a lone surrogate": lambda: _http(
        4000, "lone", as_json="decoy"),
    "HTTP gzip, 48 MB of random INT64": lambda: _http(6_000_000, False, as_json="gzip",
                                                      model="sum"),
    "gRPC, 1.5M request parameters": lambda: _grpc("request parameters"),
    "gRPC, 1.5M input parameters": lambda: _grpc("input parameters"),
    "gRPC, 1M outputs": lambda: _grpc("outputs"),
    "gRPC, 65,000 empty outputs": lambda: _grpc("empty outputs"),
    "gRPC, 4,096 inputs and outputs": lambda: _grpc("tensors"),
    "gRPC, 20M dims": lambda: _grpc("dims"),
    "gRPC BYTES contents, 1M tokens": lambda: _strings(1_000_000, False),
    "gRPC BYTES contents, 300K of 0-300 bytes": lambda: _strings(300_000, True),
    "gRPC INT64 contents, 60M one-byte": lambda: _contents(60_000_000, False),
    "gRPC INT64 contents, 5M ten-byte": lambda: _contents(5_000_000, True),
    "gRPC INT64 raw contents, 60 MB": lambda: _contents(60_000_000, "raw"),
    "gRPC INT64 contents in a sequence, 60M one-byte": lambda: _contents(60_000_000,
                                                                         "sequence"),
}


def measure(src: pathlib.Path, models: pathlib.Path, send: Send) -> dict[str, Any]:
    process, port, grpc_port = serve(src, models)
    waits: list[float] = []
    done = threading.Event()

    def probe() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while not done.is_set():
            started = time.perf_counter()
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()
            waits.append(time.perf_counter() - started)
            time.sleep(0.005)
        connection.close()
    try:
        before = peak_rss_mb(process.pid)
        thread = threading.Thread(target=probe)
        thread.start()
        time.sleep(0.2)
        status, seconds = send(port, grpc_port)
        done.set()
        thread.join()
        grown = peak_rss_mb(process.pid) - before
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {"status": status, "seconds": seconds, "worst_wait_ms": max(waits) * 1e3,
            "rss_growth_mb": grown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", default="",
                        help="run only the cases whose names contain this text")
    args = parser.parse_args()
    trees = trees_of(args)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-objects-"))
    (work / "models" / "count" / "1").mkdir(parents=True)
    (work / "models" / "count" / "config.pbtxt").write_text(_CONFIG)
    (work / "models" / "count" / "1" / "model.py").write_text(_MODEL)
    (work / "models" / "sum" / "1").mkdir(parents=True)
    (work / "models" / "sum" / "config.pbtxt").write_text(_SUM_CONFIG)
    (work / "models" / "sum" / "1" / "model.py").write_text(_SUM)
    (work / "models" / "sum_sequence" / "1").mkdir(parents=True)
    (work / "models" / "sum_sequence" / "config.pbtxt").write_text(_SUM_SEQUENCE_CONFIG)
    (work / "models" / "sum_sequence" / "1" / "model.py").write_text(_SUM)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for case, build in CASES.items():
            if args.cases not in case:
                continue
            send = build()
            for r in range(args.rounds):
                for tree in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                    found = measure(trees[tree], work / "models", send)
                    runs.setdefault((case, tree), []).append(found)
                    print(f"{case}, round {r + 1}, {tree}: {found}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nOne request to a model counting its strings (summing its values), a probe on "
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
