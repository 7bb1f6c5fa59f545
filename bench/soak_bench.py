"""Soak: one server under a mixed, partly hostile load for minutes — does anything grow?

Starts `tensorgate serve` on the built-in repository plus two streaming models (a
tensorgate Model generator and a Triton Python model sending from its own threads) and a
Triton Python model that is not decoupled, with system shared memory allowed, and runs
client processes side by side until the time is up:

- http-binary: identity over HTTP with the binary tensor extension, keep-alive (a lean
  socket client), a new connection every 200 requests;
- http-json: detector in JSON (its post-processing runs in the pool), a new connection
  every 20;
- grpc-unary: identity through a grpcio stub, a new channel every 100 calls;
- grpc-stream: ModelStreamInfer to both streaming models, 16 responses a request; every
  fifth stream is cancelled after 3 responses;
- python-model: the Triton Python model `scale` (dynamic batching) over HTTP binary, 64 KB
  a request; one in ten raises its execute and one in ten is answered with an error; one in
  ten goes to `via_bls`, a Triton Python model that calls `scale` through BLS and answers
  with what came back;
- shm: register a system shared-memory region, infer identity from and into it,
  unregister (tritonclient);
- hostile: a malformed request line, a body over --max-request-bytes, a body cut short, a
  JSON tensor of the wrong shape, an unknown model over HTTP and gRPC, garbage on the gRPC
  port, a JSON body of 1.6 MB of `{}` (past the JSON value bound), a gRPC request of 20,000
  parameters (past the bound on a message's parts), an image in typed contents (served
  exactly) and typed contents among 70,000 unknown fields (past the bound), 20,000 strings
  of quotes, backslashes and brackets as JSON data to a text echo (served exactly) and the
  same with a lone surrogate among them (refused); each must get its error (or a close),
  never a hang or a 5xx;
- floods: 500 health checks pipelined in one write (all answered in order), then a gRPC
  connection resetting each call as it opens it ("rapid reset") until the server ends it
  with GOAWAY(ENHANCE_YOUR_CALM), again and again, a tenth of a second apart.

Every few seconds: the server's RSS, open file descriptors, threads, the host pool's bytes
in use and idle, and the connections it counts open. The table gives each after a warm-up
fifth and at the end, and the least-squares slope over the second half (per minute), with
every client's answers checked: what is right, what was the expected error, what was not.

    .venv/bin/python bench/soak_bench.py [--minutes 5] [--quick] [--grpc-max-connection-age MS]

With --grpc-max-connection-age the gRPC clients' connections are retired as they go (the
`retired` row counts them).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare_wire import OIP_BINARY, Connection, raw_request  # noqa: E402
from interleaved_bench import bls_caller  # noqa: E402
from server_bench import serve_logged  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from tensorgate.protocol.protobuf_wire import varint_bytes  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
MAX_REQUEST_BYTES = 4 << 20
STREAM_RESPONSES = 16

GENERATOR = '''
import torch

from tensorgate import Model


class Tokens(Model):
    """n responses for an input n, the k-th holding k."""

    def forward(self, inputs):
        n = int(inputs["N"].flatten()[0].item())
        for k in range(n):
            yield {"TOKEN": torch.tensor([k], dtype=torch.int32)}
'''

THREADED = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self._send, args=(request.get_response_sender(), n),
                             daemon=True).start()
        return None

    def _send(self, sender, n):
        for k in range(n):
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("TOKEN", np.array([k], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

SCALE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT__0 = 2 * INPUT__0, as a Triton user writes it, its requests batched. A first
    value of -1 raises (the whole execute fails); of -2, that request's answer is an error."""

    def execute(self, requests):
        values = [pb_utils.get_input_tensor_by_name(r, "INPUT__0").as_numpy() for r in requests]
        if any(value[0, 0] == -1 for value in values):
            raise pb_utils.TritonModelException("asked to raise")
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("asked to refuse"))
                if value[0, 0] == -2 else
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT__0", value * 2)])
                for value in values]
'''

SCALE_CONFIG = """\
name: "scale"
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 200 }
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16384 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 16384 ] } ]
"""

ECHO_TEXT = '''
from tensorgate import Model


class EchoText(Model):
    def forward(self, inputs):
        return {"U": inputs["T"]}
'''

ECHO_TEXT_CONFIG = """\
name: "echo_text"
backend: "python"
max_batch_size: 0
input [ { name: "T" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "U" data_type: TYPE_STRING dims: [ -1 ] } ]
"""

STREAM_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{extra}
"""


def write_repository(root: pathlib.Path) -> None:
    write_default_repository(root)
    for name, code, extra in (
            ("tokens", GENERATOR, 'parameters { key: "streams_per_instance" '
                                  'value { string_value: "4" } }'),
            ("threaded", THREADED, "")):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(STREAM_CONFIG.format(name=name, extra=extra))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(code))
    for name, code, config in (("echo_text", ECHO_TEXT, ECHO_TEXT_CONFIG),
                               ("scale", SCALE, SCALE_CONFIG),
                               ("via_bls", bls_caller("scale"), SCALE_CONFIG.replace('"scale"',
                                                                         '"via_bls"'))):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(code)


# -- clients (each in its own process; counts: ok, expected errors, wrong answers) ---------

def _image() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("<f4")


def http_binary(ports: dict[str, int], deadline: float, out: Any) -> None:
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", "identity", _image())
    raw = raw_request(ports["http"], path, headers, body)
    want = 4 * 3 * 224 * 224
    while time.monotonic() < deadline:
        connection = Connection(ports["http"])
        try:
            for _ in range(200):
                if time.monotonic() >= deadline:
                    break
                status, _, answer = connection.exchange(raw)
                counts["ok" if status == 200 and len(answer) > want else "wrong"] += 1
        finally:
            connection.sock.close()
    out.put(("http-binary", counts))


def python_model(ports: dict[str, int], deadline: float, out: Any) -> None:
    """The Triton Python model `scale` over HTTP binary, 64 KB a request, a new connection
    every 100: one in ten raises its execute, one in ten is answered with an error (both
    500s naming why), one in ten goes to `via_bls` (scale through BLS); the rest, and
    those, must come back doubled."""
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    values = np.random.default_rng(2).random((1, 16384)).astype("<f4")
    raws = []
    for first in (None, -1.0, -2.0):
        x = values.copy()
        if first is not None:
            x[0, 0] = first
        path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", "scale", x)
        raws.append(raw_request(ports["http"], path, headers, body))
    path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", "via_bls", values)
    raws.append(raw_request(ports["http"], path, headers, body))
    sent = 0
    while time.monotonic() < deadline:
        connection = Connection(ports["http"])
        try:
            for _ in range(100):
                if time.monotonic() >= deadline:
                    break
                kind = (0, 0, 0, 1, 0, 3, 0, 0, 2, 0)[sent % 10]
                sent += 1
                status, headers, answer = connection.exchange(raws[kind])
                if status == 200:
                    good = kind in (0, 3) and np.array_equal(
                        OIP_BINARY.decode(headers, bytes(answer)), values * 2)
                    counts["ok" if good else "wrong"] += 1
                else:
                    counts["expected" if status == 500 and b"asked to" in bytes(answer)
                           else "wrong"] += 1
        finally:
            connection.sock.close()
    out.put(("python-model", counts))


def http_json(ports: dict[str, int], deadline: float, out: Any) -> None:
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    image = np.random.default_rng(1).random((1, 3, 64, 64)).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1, 3, 64, 64], "datatype": "FP32",
                                   "data": image.flatten().round(4).tolist()}]})
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", ports["http"], timeout=60)
        try:
            for _ in range(20):
                if time.monotonic() >= deadline:
                    break
                connection.request("POST", "/v2/models/detector/infer", body,
                                   {"Content-Type": "application/json"})
                answer = connection.getresponse()
                data = answer.read()
                good = answer.status == 200 and {o["name"] for o in json.loads(data)["outputs"]} \
                    == {"BOXES", "SCORES", "CLASSES", "COUNT"}
                counts["ok" if good else "wrong"] += 1
        finally:
            connection.close()
    out.put(("http-json", counts))


def _grpc_identity_request() -> Any:
    from tritonclient.grpc import service_pb2 as pb
    request = pb.ModelInferRequest(model_name="identity")
    item = request.inputs.add(name="INPUT__0", datatype="FP32")
    item.shape.extend([1, 3, 224, 224])
    request.raw_input_contents.append(_image().tobytes())
    return request


_OPTIONS = [("grpc.max_receive_message_length", 1 << 26),
            ("grpc.max_send_message_length", 1 << 26)]


def grpc_unary(ports: dict[str, int], deadline: float, out: Any) -> None:
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    request = _grpc_identity_request()
    want = request.raw_input_contents[0]
    while time.monotonic() < deadline:
        with grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}", options=_OPTIONS) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(100):
                if time.monotonic() >= deadline:
                    break
                try:
                    answer = stub.ModelInfer(request, timeout=60)
                except grpc.RpcError:  # counted, so that the table shows it
                    counts["wrong"] += 1
                    continue
                counts["ok" if answer.raw_output_contents[0] == want else "wrong"] += 1
    out.put(("grpc-unary", counts))


def grpc_stream(ports: dict[str, int], deadline: float, out: Any) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    streams = 0
    with grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}", options=_OPTIONS) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < deadline:
            model = ("tokens", "threaded")[streams % 2]
            request = pb.ModelInferRequest(model_name=model)
            item = request.inputs.add(name="N", datatype="INT32")
            item.shape.append(1)
            request.raw_input_contents.append(np.array([STREAM_RESPONSES], np.int32).tobytes())
            cancel = streams % 5 == 4
            streams += 1
            call = stub.ModelStreamInfer(iter([request]), timeout=60)
            got = []
            try:
                for answer in call:
                    if answer.error_message:
                        break
                    got.append(int(np.frombuffer(
                        answer.infer_response.raw_output_contents[0], np.int32)[0]))
                    if cancel and len(got) == 3:
                        call.cancel()
                        break
            except grpc.RpcError as error:
                if not (cancel and error.code() == grpc.StatusCode.CANCELLED):
                    counts["wrong"] += 1
                    continue
            if cancel:
                counts["expected" if got == [0, 1, 2] else "wrong"] += 1
            else:
                counts["ok" if got == list(range(STREAM_RESPONSES)) else "wrong"] += 1
    out.put(("grpc-stream", counts))


def shm(ports: dict[str, int], deadline: float, out: Any) -> None:
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm_utils
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    image = _image()
    size = image.nbytes
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}")
    n = 0
    while time.monotonic() < deadline:
        name, key = f"soak_{os.getpid()}_{n}", f"/soak_{os.getpid()}_{n}"
        n += 1
        handle = shm_utils.create_shared_memory_region(name, key, 2 * size)
        try:
            shm_utils.set_shared_memory_region(handle, [image])
            client.register_system_shared_memory(name, key, 2 * size)
            item = httpclient.InferInput("INPUT__0", list(image.shape), "FP32")
            item.set_shared_memory(name, size)
            output = httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)
            output.set_shared_memory(name, size, offset=size)
            client.infer("identity", [item], outputs=[output])
            back = shm_utils.get_contents_as_numpy(handle, np.float32, list(image.shape),
                                                   offset=size)
            counts["ok" if np.array_equal(back, image) else "wrong"] += 1
            client.unregister_system_shared_memory(name)
        finally:
            shm_utils.destroy_shared_memory_region(handle)
        time.sleep(0.01)
    client.close()
    out.put(("shm", counts))


def _exchange(port: int, data: bytes, half_close: bool = False) -> bytes:
    """Send `data`, then read until the server closes or answers (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
                if not half_close and b"\r\n\r\n" in answer:
                    head, _, rest = answer.partition(b"\r\n\r\n")
                    length = re.search(rb"content-length: (\d+)", head, re.I)
                    if length and len(rest) >= int(length.group(1)):
                        break
        except (ConnectionResetError, socket.timeout):
            pass
        return answer


def hostile(ports: dict[str, int], deadline: float, out: Any) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    port = ports["http"]
    host = f"Host: 127.0.0.1:{port}\r\n"
    wrong_shape = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1, 3, 8, 8],
                                          "datatype": "FP32", "data": [0.0] * 192}]}).encode()
    unknown = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32",
                                      "data": [1.0]}]}).encode()
    objects = b'{"inputs": [], "junk": [' + b"{}," * 550_000 + b"{}]}"  # 1.1M values
    # 20,000 strings as JSON data, each with quotes, backslashes, brackets and commas:
    # parsed into the BYTES layout a slice at a time, answered exactly
    texts = [f'w{i}"\\,]["\u00e9' for i in range(20_000)]
    strings = json.dumps({"inputs": [{"name": "T", "shape": [len(texts)],
                                      "datatype": "BYTES", "data": texts}]}).encode()
    answer_texts = json.dumps(texts, separators=(",", ":"), ensure_ascii=False).encode()
    surrogate = strings.replace(b"w19999", b"\\ud800", 1)  # refused, naming where
    strings_request = (f"POST /v2/models/echo_text/infer HTTP/1.1\r\n{host}Content-Length: "
                       f"{len(strings)}\r\n\r\n").encode() + strings
    cases: list[tuple[bytes, bytes, bool]] = [
        ((f"POST /v2/models/echo_text/infer HTTP/1.1\r\n{host}Content-Length: "
          f"{len(surrogate)}\r\n\r\n").encode() + surrogate, b"HTTP/1.1 400", False),
        (b"GARBAGE / NOPE\r\n\r\n", b"HTTP/1.1 400", False),
        ((f"POST /v2/models/identity/infer HTTP/1.1\r\n{host}Content-Length: "
          f"{MAX_REQUEST_BYTES + 1}\r\n\r\n").encode(), b"HTTP/1.1 413", False),
        ((f"POST /v2/models/detector/infer HTTP/1.1\r\n{host}Content-Length: 5000\r\n\r\n"
          ).encode() + b"{\"inputs\":", b"", True),  # cut short: a close, no answer due
        ((f"POST /v2/models/detector/infer HTTP/1.1\r\n{host}Content-Type: application/json"
          f"\r\nContent-Length: {len(wrong_shape)}\r\n\r\n").encode() + wrong_shape,
         b"HTTP/1.1 400", False),
        ((f"POST /v2/models/nowhere/infer HTTP/1.1\r\n{host}Content-Length: "
          f"{len(unknown)}\r\n\r\n").encode() + unknown, b"HTTP/1.1 404", False),
        ((f"POST /v2/models/identity/infer HTTP/1.1\r\n{host}Content-Length: "
          f"{len(objects)}\r\n\r\n").encode() + objects, b"HTTP/1.1 400", False),
    ]
    many = pb.ModelInferRequest(model_name="identity")
    for i in range(20_000):
        many.parameters[f"p{i}"].int64_param = i
    many_parameters = many.SerializeToString()
    image = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    typed = pb.ModelInferRequest(model_name="identity")
    typed.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 3, 224, 224])
    typed.inputs[0].contents.fp32_contents.extend(image.ravel().tolist())
    typed_image = typed.SerializeToString()  # taken out of the message, read in place
    junk = typed.inputs[0].contents.SerializeToString() + bytes([9 << 3, 1]) * 70_000
    item = pb.ModelInferRequest.InferInputTensor(name="INPUT__0", datatype="FP32",
                                                 shape=[1, 3, 224, 224]).SerializeToString()
    item += b"\x2a" + varint_bytes(len(junk)) + junk  # contents among 70,000 unknown fields
    typed_junk = (pb.ModelInferRequest(model_name="identity").SerializeToString()
                  + b"\x2a" + varint_bytes(len(item)) + item)
    rng = np.random.default_rng(os.getpid())
    with grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < deadline:
            for data, want, half_close in cases:
                answer = _exchange(port, data, half_close)
                counts["expected" if answer.startswith(want) else "wrong"] += 1
            answer = _exchange(port, strings_request)
            counts["expected" if answer.startswith(b"HTTP/1.1 200")
                   and answer_texts in answer else "wrong"] += 1
            try:
                stub.ModelInfer(pb.ModelInferRequest(model_name="nowhere"), timeout=30)
                counts["wrong"] += 1
            except grpc.RpcError as error:
                counts["expected" if error.code() in (grpc.StatusCode.NOT_FOUND,
                                                      grpc.StatusCode.UNAVAILABLE,
                                                      grpc.StatusCode.INVALID_ARGUMENT)
                       else "wrong"] += 1
            try:
                channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(
                    many_parameters, timeout=30)
                counts["wrong"] += 1
            except grpc.RpcError as error:
                counts["expected" if error.code() == grpc.StatusCode.INVALID_ARGUMENT
                       else "wrong"] += 1
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                       response_deserializer=pb.ModelInferResponse.FromString)
            answer = call(typed_image, timeout=30)
            counts["expected" if answer.raw_output_contents[0] == image.tobytes()
                   else "wrong"] += 1
            try:
                call(typed_junk, timeout=30)
                counts["wrong"] += 1
            except grpc.RpcError as error:
                counts["expected" if error.code() == grpc.StatusCode.INVALID_ARGUMENT
                       else "wrong"] += 1
            garbage = bytes(rng.integers(0, 256, int(rng.integers(1, 4096)), np.uint8))
            _exchange(ports["grpc"], garbage, half_close=True)  # any close is right
            counts["expected"] += 1
            time.sleep(0.02)
    out.put(("hostile", counts))


def floods(ports: dict[str, int], deadline: float, out: Any) -> None:
    import hpack
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from tests.e2e.h2_client import GOAWAY, H2Client
    counts = {"ok": 0, "expected": 0, "wrong": 0}
    check = f"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1:{ports['http']}\r\n\r\n"
    block = hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":authority", "x"),
        (":path", "/inference.GRPCInferenceService/ServerLive"),
        ("content-type", "application/grpc"), ("te", "trailers")])
    resets = H2Client.streams(1, 1400, block, reset=True)  # past the 1,280 it may waste
    while time.monotonic() < deadline:
        with socket.create_connection(("127.0.0.1", ports["http"]), timeout=10) as sock:
            sock.sendall(check.encode() * 500)
            answers = b""
            try:
                while answers.count(b"HTTP/1.1 200") < 500:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    answers += chunk
            except OSError:
                pass
            counts["ok" if answers.count(b"HTTP/1.1 200") == 500 else "wrong"] += 1
        client = H2Client(ports["grpc"])
        calm = b"\0\0\0\x0b"  # ENHANCE_YOUR_CALM (not a retirement's NO_ERROR GOAWAY)
        try:  # told to calm down, or reset with the streams it did not read: either ends it
            client.sock.sendall(resets)
            frames = client.frames_until(lambda f: f.kind == GOAWAY and f.payload[4:8] == calm)
            ended = bool(frames) and frames[-1].kind == GOAWAY and \
                frames[-1].payload[4:8] == calm or client.read_frame() is None
        except ConnectionResetError:
            ended = True
        except OSError:
            ended = False
        finally:
            client.close()
        counts["expected" if ended else "wrong"] += 1
        time.sleep(0.1)
    out.put(("floods", counts))


CLIENTS = {"http-binary": http_binary, "http-json": http_json, "grpc-unary": grpc_unary,
           "grpc-stream": grpc_stream, "python-model": python_model, "shm": shm,
           "hostile": hostile, "floods": floods}


# -- the server and what is sampled -------------------------------------------------------

def start_server(repo: pathlib.Path, log: pathlib.Path, *extra: str
                 ) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    process, ports, _ = serve_logged(repo, log, "--allow-shared-memory",
                                     "--max-request-bytes", str(MAX_REQUEST_BYTES), *extra)
    return process, ports


def sample(pid: int, metrics_port: int) -> dict[str, float]:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as page:
        text = page.read().decode()

    def gauge(pattern: str) -> float:
        match = re.search(pattern + r" (\S+)$", text, re.M)
        return float(match.group(1)) if match else float("nan")

    return {"t": time.monotonic(), "rss_mb": rss, "fds": fds, "threads": threads,
            "pool_in_use_mb": gauge(r'^tensorgate_pool_bytes\{state="in_use"\}') / 2**20,
            "pool_idle_mb": gauge(r'^tensorgate_pool_bytes\{state="idle"\}') / 2**20,
            "connections": gauge(r"^tensorgate_connections_open"),
            "retired": gauge(r"^tensorgate_connections_retired_total")}


def slope_per_minute(samples: list[dict[str, float]], key: str) -> float:
    t = np.array([s["t"] for s in samples])
    y = np.array([s[key] for s in samples])
    if len(t) < 3 or np.ptp(t) == 0:
        return float("nan")
    return float(np.polyfit(t - t[0], y, 1)[0] * 60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="one minute")
    parser.add_argument("--every-s", type=float, default=3.0, help="sampling period")
    parser.add_argument("--grpc-max-connection-age", type=int, metavar="MS",
                        help="the server retires gRPC connections this old (default: never)")
    args = parser.parse_args()
    minutes = 1.0 if args.quick else args.minutes
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-soak-"))
    repo = work / "models"
    write_repository(repo)
    log = work / "server.log"
    age = args.grpc_max_connection_age
    process, ports = start_server(repo, log, *(("--grpc-max-connection-age", str(age))
                                               if age else ()))
    context = mp.get_context("spawn")
    answers = context.Queue()
    samples: list[dict[str, float]] = []
    counts: dict[str, dict[str, int]] = {}
    try:
        samples.append(sample(process.pid, ports["metrics"]))
        deadline = time.monotonic() + minutes * 60
        workers = [context.Process(target=client, args=(ports, deadline, answers), daemon=True)
                   for client in CLIENTS.values()]
        for worker in workers:
            worker.start()
        while time.monotonic() < deadline:
            time.sleep(min(args.every_s, max(deadline - time.monotonic(), 0.01)))
            samples.append(sample(process.pid, ports["metrics"]))
            if process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
        for _ in workers:
            name, got = answers.get(timeout=120)
            counts[name] = got
        for worker in workers:
            worker.join(30)
        time.sleep(2.0)  # in-flight work done, the pool's quiet trim has run
        samples.append(sample(process.pid, ports["metrics"]))
    finally:
        process.terminate()
        process.wait(timeout=60)
    server_log = log.read_text(errors="replace")
    shutil.rmtree(work, ignore_errors=True)
    tracebacks = server_log.count("Traceback")
    first = min(range(len(samples)), key=lambda i: abs(samples[i]["t"] - samples[0]["t"]
                                                      - minutes * 12))  # a fifth in
    second_half = [s for s in samples[:-1] if s["t"] - samples[0]["t"] >= minutes * 30]
    keys = ("rss_mb", "fds", "threads", "pool_in_use_mb", "pool_idle_mb", "connections",
            "retired")
    print(f"soak: {minutes:g} min, {len(CLIENTS)} client processes, {os.cpu_count()} cores, "
          f"Python {sys.version.split()[0]}; samples every {args.every_s:g} s")
    print("| server | at start | after a fifth | at the end of load | 2 s after | "
          "slope over the second half, per minute |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in keys:
        print(f"| {key} | {samples[0][key]:,.1f} | {samples[first][key]:,.1f} | "
              f"{samples[-2][key]:,.1f} | {samples[-1][key]:,.1f} | "
              f"{slope_per_minute(second_half, key):+,.2f} |")
    print()
    print("| client | right | expected errors | wrong |")
    print("|---|---:|---:|---:|")
    for name in CLIENTS:
        got = counts.get(name, {})
        print(f"| {name} | {got.get('ok', 0):,} | {got.get('expected', 0):,} | "
              f"{got.get('wrong', 0):,} |")
    print(f"\nserver log: {tracebacks} traceback(s)")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "soak_bench.json"
    out.write_text(json.dumps({"minutes": minutes, "samples": samples, "counts": counts,
                               "tracebacks": tracebacks, "date": time.strftime("%Y-%m-%d %H:%M")},
                              indent=1))
    print(f"raw numbers: {out}")
    if tracebacks:
        print(server_log[server_log.index("Traceback"):][:3000])


if __name__ == "__main__":
    main()
