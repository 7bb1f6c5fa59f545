"""Send the same requests to Triton and to tensorgate, serving the same repository, and say
where their answers differ.

"tritonclient and existing Triton model repositories work unchanged" is a claim about
behaviour no test of ours alone can check: this starts Triton's own `tritonserver` (the
binary in the nvidia-pytriton wheel that `bash bench/peers/install.sh triton` installs)
and `tensorgate serve` on one Python-backend repository, sends each request of a corpus —
health, metadata, statistics, model control, and inference over HTTP (JSON, binary,
compressed, malformed) and gRPC (raw and typed contents, wrong fields, every datatype) — to
both, and compares status and answer (errors by status only; their words differ).

Each difference is either listed in KNOWN with the reason it is deliberate (a malformed
request is the client's error, 400 here where Triton answers 500; an integer out of its
datatype's range is refused here where Triton wraps it) or printed as unexplained, and the
exit status is 1. Run it after a change to the protocol layers:

    .venv/bin/python tools/triton_diff.py [--only TEXT] [--show-same]

Nothing here is a test: it needs Triton, which CI does not install. Its findings became
tests that run without it (their commits say so).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import http.client
import json
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import urllib.request
import zlib
from dataclasses import dataclass, field
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTDATA = ROOT / "tests" / "testdata" / "triton_python"
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT64", "INT8", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BF16", "STRING")


@dataclass
class Http:
    name: str
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    keys_only: bool = False  # compare the answer's structure, not its values (timings...)


@dataclass
class Grpc:
    name: str
    method: str
    message: Any
    keys_only: bool = False


@dataclass
class Stream:
    """Requests sent one after another on one ModelStreamInfer stream: (request id, model,
    IN value, ask for an empty final response)."""
    name: str
    requests: list[tuple[str, str, int, bool]]


# case name -> (Triton's status, ours, why the difference is deliberate, and where the two
# statuses are the same, the answer's keys that may differ: None, the whole answer)
KNOWN: dict[str, tuple[Any, Any, str, frozenset[str] | None]] = {}


def _known(reason: str, triton: Any, ours: Any, *names: str,
           differing: tuple[str, ...] | None = ()) -> None:
    for name in names:
        KNOWN[name] = (triton, ours, reason,
                       None if differing is None else frozenset(differing))


MALFORMED = "a malformed request is the client's error: 400 / INVALID_ARGUMENT here, 500 / " \
            "INTERNAL on Triton"
_known(MALFORMED, 500, 400, "repo index bad json", "json id number", "json output binary str",
       "json output no name", "json params bad", "json shape neg", "json shape str",
       "json shape float", "json shape missing", "json data short", "json data long",
       "json data str", "json data bool", "json data null", "json data scalar",
       "json name missing", "json datatype missing", "json inputs missing",
       "json inputs not list", "json body array", "json body garbage", "json body trailing",
       "json utf8 bad", "int float data", "int bool data", "int string data", "bytes nonstr",
       "bin size neg", "bin size str", "bin size float", "bin hcl plus", "bool ints",
       "bool strings", "uint8 negative", "uint8 fraction", "uint64 past 64 bits",
       "int64 past range", "int64 fraction", "logging bad", "load bad body",
       "json binary_data_output str", "shm register bad key", "repo index ready str",
       "bytes numbers", "classification negative", "sequence start not a bool",
       "load with a config that is not JSON", "load with a config not a string",
       "load with another model's config", "generate a string for a number",
       "shm register past its end", "shm input offset negative", "priority negative",
       "priority a string", "timeout a string", "timeout negative")
_known("an integer out of its datatype's range is refused here; Triton wraps it (2**40 as "
       "INT32 is 0 there)", 200, 400, "int overflow", "int neg overflow", "uint8 past range",
       "int8 past range")
_known("a malformed request is the client's error: INVALID_ARGUMENT here, INTERNAL on Triton",
       "INTERNAL", "INVALID_ARGUMENT", "grpc shm register bad key")
_known("an integer out of its datatype's range is refused here; Triton wraps it", "OK",
       "INVALID_ARGUMENT", "grpc int8 past range", "grpc uint8 past range",
       "grpc uint16 past range")
_known("a value past FP32's range is refused here; Triton makes it inf", 200, 400,
       "json data huge", "fp32 past range")
_known("FP32 values are written in JSON as the shortest text that reads back as the same "
       "FP32 (0.1); Triton writes the double (0.10000000149011612)", 200, 200, "fp32 ok",
       differing=("data",))
_known("FP16 travels as JSON here (Triton refuses it both ways)", 400, 200, "fp16 json")
_known("health answers carry OIP's JSON bodies ({\"live\": true}, {\"ready\": true}): "
       "KServe's SDK parses them",
       200, 200, "GET /v2/health/live", "GET /v2/health/ready", "GET /v2/models/add_sub/ready",
       differing=None)
_known("a model not ready is 503 here (KServe's status); Triton answers 400", 400, 503,
       "GET /v2/models/nope/ready", "GET /v2/models/add_sub/versions/2/ready",
       "ready after a failed load", "server ready after a failed load")
_known("a model whose load failed is 503 here, its reason said; Triton answers 404 (an "
       "unknown model)", 404, 503, "metadata after a failed load", "infer after a failed load")
_known("a failed load's reason in the index is the error's own words (Triton's adds its "
       "stub's traceback)", 200, 200, "index after a failed load", differing=("reason",))
_known("an unknown model or version is 404 / NOT_FOUND here; Triton answers 400 / "
       "INVALID_ARGUMENT", 400, 404, "GET /v2/models/nope/stats", "stats version 3")
_known("an unknown model or version is NOT_FOUND here", "INVALID_ARGUMENT", "NOT_FOUND",
       "grpc stats nope", "grpc stats version 3", "grpc trace nope", "grpc vx",
       "grpc metadata version x")
_known("a model the repository does not hold is 404 / NOT_FOUND here (Triton: 500)", 500,
       404, "POST /v2/repository/models/nope/load")
_known("a model the repository does not hold is NOT_FOUND here", "INTERNAL", "NOT_FOUND",
       "grpc load nope")
_known("a decoupled model called without a stream is the request's error here (400 / "
       "INVALID_ARGUMENT naming ModelStreamInfer); Triton answers 501 / UNIMPLEMENTED", 501,
       400, "decoupled infer")
_known("a decoupled model called without a stream is INVALID_ARGUMENT here",
       "UNIMPLEMENTED", "INVALID_ARGUMENT", "grpc decoupled unary")
_known("an unsupported Content-Encoding is 400 here (Triton: 501)", 501, 400, "json br")
_known("more raw_input_contents than inputs is refused here; Triton ignores the rest", "OK",
       "INVALID_ARGUMENT", "grpc three raw")
_known("a negative timeout is refused here; Triton ignores it", "OK", "INVALID_ARGUMENT",
       "grpc timeout neg")
_known("a request's non-object body is refused here; Triton ignores it", 200, 400,
       "repo index list")
_known("extensions and name are the server's own", 200, 200, "GET /v2",
       differing=("name", "version", "extensions"))
_known("extensions and name are the server's own", "OK", "OK", "grpc server metadata",
       differing=("name", "version", "extensions"))
_known("the served config lacks Triton's optimization defaults and preferred batch sizes",
       "OK", "OK", "grpc config", "grpc config of a batching model",
       differing=("optimization", "preferredBatchSize"))
_known("Triton's ensemble answers carry sequence parameters (sequence_id 0, start and end "
       "false) for a request that sent none", 200, 200, "ensemble infer",
       "ensemble one output", differing=("parameters",))
_known("ensemble_scheduling shows max_inflight_requests, a field of newer Triton configs",
       200, 200, "ensemble config", differing=("max_inflight_requests",))
_known("index entries carry \"reason\" (empty when ready), as KServe's do", 200, 200,
       "POST /v2/repository/index", "repo index ready", "index after the load works",
       differing=("reason",))
_known("the served config lacks Triton's optimization defaults and preferred batch sizes",
       200, 200, "GET /v2/models/add_sub/config", "config after a load with a config",
       differing=("optimization", "preferred_batch_size"))
_known("binary_data_output makes listed outputs binary too here; Triton 2.51 applies it "
       "only when no output is listed", 200, 200, "json binary_data_output listed",
       differing=None)
_known("an unload returns here once the model is unloaded (its requests drained, "
       "UNAVAILABLE); Triton's returns at once and lists the model UNLOADING for a while",
       "OK", "OK", "grpc index after an unload", differing=("state", "reason"))
_known("JSON answers stay JSON: BYTES that are not UTF-8 are written with U+FFFD in their "
       "place (binary_data keeps them exact); Triton writes the raw bytes, which no JSON "
       "parser reads", 200, 200, "bytes not UTF-8 answered as JSON", differing=None)
_known("Accept-Encoding answers compress the same bytes with another gzip header", 200, 200,
       "json accept gzip", "json accept deflate", differing=None)


def _repository(root: pathlib.Path) -> None:
    """Triton-compatible models of tests/testdata (add_sub, int_double) and an echo model
    per datatype, written against Triton 2.51's Python backend (no response parameters)."""
    for model in ("add_sub", "int_double"):
        shutil.copytree(TESTDATA / model, root / model)
    for datatype in DATATYPES:
        folder = root / f"echo_{datatype.lower()}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(f"""\
            name: "echo_{datatype.lower()}"
            backend: "python"
            max_batch_size: 0
            input [ {{ name: "IN" data_type: TYPE_{datatype} dims: [ -1 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_{datatype} dims: [ -1 ] }} ]
            """))
        (folder / "1" / "model.py").write_text(textwrap.dedent("""\
            import triton_python_backend_utils as pb_utils


            class TritonPythonModel:
                def execute(self, requests):
                    return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                        for r in requests]
            """))
    folder = root / "stream_echo"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "stream_echo"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        """))
    _stream_count(root)
    folder = root / "classes"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        (root / "echo_fp32" / "config.pbtxt").read_text().replace("echo_fp32", "classes")
        .replace('"OUT" data_type: TYPE_FP32 dims: [ -1 ]',
                 '"OUT" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt"'))
    (folder / "labels.txt").write_text("cat\ndog\nbird\n")  # fewer than the scores
    shutil.copy(root / "echo_fp32" / "1" / "model.py", folder / "1" / "model.py")
    folder = root / "sequence_sum"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "sequence_sum"
        backend: "python"
        max_batch_size: 4
        sequence_batching { max_sequence_idle_microseconds: 5000000 }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
        """))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
        import numpy as np
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def initialize(self, args):
                self.sums = {}

            def execute(self, requests):
                responses = []
                for request in requests:
                    key, flags = request.correlation_id(), request.flags()
                    if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                        self.sums[key] = 0
                    value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                    self.sums[key] = self.sums.get(key, 0) + int(value.sum())
                    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                        "SUM", np.array([[self.sums[key]]], np.int32))]))
                    if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                        self.sums.pop(key, None)
                return responses
        """))
    folder = root / "fragile"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        (root / "echo_int32" / "config.pbtxt").read_text().replace("echo_int32", "fragile"))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
        import os

        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def initialize(self, args):  # fails while its folder holds a file "fail"
                if os.path.exists(os.path.join(args["model_repository"], "fail")):
                    raise pb_utils.TritonModelException("asked to fail")

            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                    for r in requests]
        """))
    folder = root / "ensemble_add"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "ensemble_add"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
                 { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [ {
          model_name: "add_sub" model_version: -1
          input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
          output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" }
        } ] }
        """))


def _stream_count(root: pathlib.Path) -> None:
    """IN = n: n responses (OUT = 0 .. n-1), then the final flag sent alone."""
    folder = root / "stream_count"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        (root / "stream_echo" / "config.pbtxt").read_text().replace("stream_echo",
                                                                      "stream_count"))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
        import numpy as np
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                    if count < 0:
                        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                            "IN must not be negative")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        continue
                    for value in range(count):
                        sender.send(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("OUT", np.array([value], np.int32))]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        """))


def _triton(venv: pathlib.Path, repo: pathlib.Path, work: pathlib.Path,
            ports: tuple[int, int, int]) -> subprocess.Popen[bytes]:
    site = next((venv / "lib").glob("python3*/site-packages"))
    home = site / "pytriton" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    backend = work / "backends" / "python"
    backend.mkdir(parents=True)
    for source in (home / "backends/python/libtriton_python.so",
                   home / "backends/python/triton_python_backend_utils.py",
                   home / f"python_backend_stubs/{version}/triton_python_backend_stub"):
        (backend / source.name).symlink_to(source)
    env = {**os.environ,
           "LD_LIBRARY_PATH": f"{site / 'nvidia_pytriton.libs'}:"
                              f"{sysconfig.get_config_var('LIBDIR')}",
           "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}  # the stub's python: numpy < 2
    command = [str(home / "bin" / "tritonserver"), "--model-repository", str(repo),
               "--backend-directory", str(work / "backends"), "--model-control-mode",
               "explicit", "--load-model", "*", "--http-address", "127.0.0.1",
               "--http-port", str(ports[0]), "--grpc-address", "127.0.0.1", "--grpc-port",
               str(ports[1]), "--metrics-address", "127.0.0.1", "--metrics-port",
               str(ports[2]), "--exit-timeout-secs", "2"]
    return subprocess.Popen(command, env=env, stdout=(work / "triton.log").open("wb"),
                            stderr=subprocess.STDOUT)


def _tensorgate(repo: pathlib.Path, work: pathlib.Path,
                ports: tuple[int, int, int]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(repo),
               "--model-control-mode", "explicit", "--load-model", "*",
               "--allow-shared-memory",  # off by default here, on in Triton
               "--http-port",
               str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    return subprocess.Popen(command, stdout=(work / "tensorgate.log").open("wb"),
                            stderr=subprocess.STDOUT)


def _wait_ready(port: int, process: subprocess.Popen[bytes], what: str,
                log: pathlib.Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{what} exited with {process.returncode} before it was ready; "
                             f"its log ends:\n{tail}")
        try:
            if _send(port, Http("", "GET", "/v2/health/ready"))[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} was not ready after 120 s")


def _send(port: int, case: Http) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(case.method, case.path, body=case.body, headers=case.headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def _masked(value: Any, keys_only: bool) -> Any:
    """An answer's JSON to compare: error text masked (the words differ), and with
    `keys_only` its leaves too."""
    if isinstance(value, dict):
        return {k: "<error>" if k == "error" else _masked(v, keys_only) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, keys_only) for v in value]
    return "<value>" if keys_only else value


def _http_outcome(port: int, case: Http) -> tuple[Any, Any]:
    """(status, what to compare) of one HTTP answer."""
    status, headers, body = _send(port, case)
    length = headers.get("inference-header-content-length")
    text, tail = (body[:int(length)], body[int(length):]) if length else (body, b"")
    if headers.get("content-encoding") in ("gzip", "deflate"):
        text = zlib.decompress(body, 47)  # either header
    document: Any
    try:
        if headers.get("content-type", "").startswith("text/event-stream"):
            document = [json.loads(line[5:]) for line in text.decode().splitlines()
                        if line.startswith("data:")]  # a generate_stream's events
        else:
            document = json.loads(text) if text else None
    except ValueError:
        document = f"<not JSON: {text[:40]!r}>"
    kind = headers.get("content-type") if status == 200 else None
    if isinstance(document, dict) and isinstance(document.get("outputs"), list):
        document["outputs"].sort(key=lambda o: str(o.get("name")))  # in any order
    return status, (_masked(document, case.keys_only), tail, kind)


def _metrics_outcome(port: int) -> tuple[Any, Any]:
    """The nv_* metric families Triton's dashboards read: each name, its label names and its
    type (their values differ by nature)."""
    import re
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    types = dict(re.findall(r"# TYPE (nv_\S+) (\S+)", text))
    families: set[tuple[str, tuple[str, ...], str]] = set()
    for line in text.splitlines():
        found = re.match(r"(nv_[a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if found:
            base = re.sub(r"_(bucket|count|sum)$", "", found.group(1))
            labels = tuple(sorted(re.findall(r'([a-zA-Z_]+)="', found.group(3) or "")))
            families.add((found.group(1), labels, types.get(base) or types.get(
                found.group(1)) or ""))
    return "OK", sorted(families)


def _grpc_outcome(stub: Any, case: Grpc) -> tuple[Any, Any]:
    import grpc
    from google.protobuf import json_format
    try:
        answer = getattr(stub, case.method)(case.message, timeout=30)
    except grpc.RpcError as error:
        return error.code().name, None
    document = json_format.MessageToDict(answer, always_print_fields_with_no_presence=True)
    raw = document.pop("rawOutputContents", None)
    return "OK", (_masked(document, case.keys_only), raw)


def _stream_outcome(url: str, case: Stream) -> tuple[Any, Any]:
    """Each request's responses in order (its outputs' values and triton_final_response),
    and an error where one came; "OK" when the stream ended by itself."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    by_id: dict[str, list[Any]] = {}
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id, model, value, asked in case.requests:
            given = grpcclient.InferInput("IN", [1], "INT32")
            given.set_data_from_numpy(np.array([value], np.int32))
            client.async_stream_infer(model, [given], request_id=request_id,
                                      enable_empty_final_response=asked)
        client.stop_stream()  # waits for every response
    while not answers.empty():
        result, error = answers.get_nowait()
        if error is not None:
            by_id.setdefault("errors", []).append("<error>")
            continue
        response = result.get_response()
        final = response.parameters.get("triton_final_response")
        by_id.setdefault(response.id, []).append((
            {o.name: result.as_numpy(o.name).tolist() for o in response.outputs},
            None if final is None else final.bool_param))
    return "OK", by_id


# -- the corpus ------------------------------------------------------------------------------

F4 = [1.0, 2.0, 3.0, 4.0]
ADD: dict[str, Any] = {
    "inputs": [{"name": n, "shape": [1, 4], "datatype": "FP32", "data": F4}
               for n in ("INPUT0", "INPUT1")],
    "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]}
INFER = "/v2/models/add_sub/infer"


def _js(value: Any) -> bytes:
    return json.dumps(value).encode()


def _add(**changes: Any) -> bytes:
    document = copy.deepcopy(ADD)
    for key, value in changes.items():
        if value is None:
            document.pop(key, None)
        else:
            document[key] = value
    return _js(document)


def _first(**changes: Any) -> bytes:
    document = copy.deepcopy(ADD)
    for key, value in changes.items():
        if value is None:
            document["inputs"][0].pop(key)
        else:
            document["inputs"][0][key] = value
    return _js(document)


def _binary(sizes: tuple[Any, Any] = (16, 16), data: bytes | None = None,
            header_length: str | None = None) -> tuple[bytes, dict[str, str]]:
    header = _js({"inputs": [{"name": n, "shape": [1, 4], "datatype": "FP32",
                              "parameters": {"binary_data_size": s}}
                             for n, s in zip(("INPUT0", "INPUT1"), sizes)]})
    tensors = data if data is not None else struct.pack("<8f", *F4, *F4)
    return header + tensors, {"Inference-Header-Content-Length":
                              header_length or str(len(header))}


def _binary_one(datatype: str, shape: list[int], data: bytes) -> tuple[bytes, dict[str, str]]:
    """An echo model's request with its input as binary data, its output asked as JSON."""
    header = _js({"inputs": [{"name": "IN", "shape": shape, "datatype": datatype,
                              "parameters": {"binary_data_size": len(data)}}],
                  "outputs": [{"name": "OUT", "parameters": {"binary_data": False}}]})
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def _echo(datatype: str, data: list[Any]) -> bytes:
    return _js({"inputs": [{"name": "IN", "shape": [len(data)], "datatype": datatype,
                            "data": data}]})


def http_cases() -> list[Http]:
    cases = [Http(f"GET {path}", "GET", path, keys_only=path.endswith("stats")) for path in (
        "/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/add_sub",
        "/v2/models/add_sub/versions/1", "/v2/models/add_sub/versions/2",
        "/v2/models/add_sub/versions/x", "/v2/models/nope", "/v2/models/add_sub/ready",
        "/v2/models/nope/ready", "/v2/models/add_sub/versions/2/ready",
        "/v2/models/add_sub/config", "/v2/models/nope/config", "/v2/models/add_sub/stats",
        "/v2/models/nope/stats", "/v2/models/stats", "/v3", "/v2/models",
        "/v2/models/add_sub/infer", "/v2/models/int_double", "/v2/logging",
        "/v2/trace/setting", "/v2/models/add_sub/trace/setting")]
    cases += [Http(f"POST {path}", "POST", path) for path in (
        "/v2/health/live", "/v2/repository/index", "/v2/models/add_sub/ready",
        "/v2/repository/models/nope/load", "/v2/repository/models/nope/unload")]
    cases += [
        Http("GET /v2/models/add_sub/versions/1/stats", "GET",
             "/v2/models/add_sub/versions/1/stats", keys_only=True),
        Http("stats version 3", "GET", "/v2/models/add_sub/versions/3/stats"),
        Http("PUT infer", "PUT", INFER, _add()),
        Http("repo index ready", "POST", "/v2/repository/index", _js({"ready": True})),
        Http("repo index bad json", "POST", "/v2/repository/index", b"{"),
        Http("repo index list", "POST", "/v2/repository/index", b"[]"),
        Http("repo index ready str", "POST", "/v2/repository/index", _js({"ready": "yes"})),
        Http("load bad body", "POST", "/v2/repository/models/add_sub/load", b"{"),
        Http("logging bad", "POST", "/v2/logging", _js({"log_info": "x"})),
        Http("shm register bad key", "POST", "/v2/systemsharedmemory/region/r/register",
             _js({"key": "/tgdiff_none", "offset": 0, "byte_size": 16})),
        Http("ok json", "POST", INFER, _add()),
        Http("ok json v1", "POST", "/v2/models/add_sub/versions/1/infer", _add()),
        Http("json v7", "POST", "/v2/models/add_sub/versions/7/infer", _add()),
        Http("json no model", "POST", "/v2/models/nope/infer", _add()),
        Http("json id", "POST", INFER, _add(id="abc")),
        Http("json id empty", "POST", INFER, _add(id="")),
        Http("json id number", "POST", INFER, _add(id=5)),
        Http("json no outputs", "POST", INFER, _add(outputs=None)),
        Http("json output unknown", "POST", INFER, _add(outputs=[{"name": "NOPE"}])),
        Http("json output binary", "POST", INFER, _add(outputs=[
            {"name": "OUTPUT0", "parameters": {"binary_data": True}}])),
        Http("json output binary str", "POST", INFER, _add(outputs=[
            {"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}])),
        Http("json output classification", "POST", INFER, _add(outputs=[
            {"name": "OUTPUT0", "parameters": {"classification": 2}}])),
        Http("json output no name", "POST", INFER, _add(outputs=[{}])),
        Http("json binary_data_output", "POST", INFER,
             _add(outputs=None, parameters={"binary_data_output": True})),
        Http("json binary_data_output listed", "POST", INFER,
             _add(parameters={"binary_data_output": True})),
        Http("json binary_data_output str", "POST", INFER,
             _add(parameters={"binary_data_output": "yes"})),
        Http("json params bad", "POST", INFER, _add(parameters=[1])),
        Http("json dtype FP64", "POST", INFER, _first(datatype="FP64")),
        Http("json dtype bogus", "POST", INFER, _first(datatype="FLOAT")),
        Http("json shape 1x5", "POST", INFER, _first(shape=[1, 5], data=F4 + [5.0])),
        Http("json shape 4", "POST", INFER, _first(shape=[4])),
        Http("json shape 9x4", "POST", INFER, _js({"inputs": [
            {"name": n, "shape": [9, 4], "datatype": "FP32", "data": F4 * 9}
            for n in ("INPUT0", "INPUT1")]})),
        Http("json shape neg", "POST", INFER, _first(shape=[-1, 4])),
        Http("json shape str", "POST", INFER, _first(shape=["1", 4])),
        Http("json shape float", "POST", INFER, _first(shape=[1.0, 4])),
        Http("json shape missing", "POST", INFER, _first(shape=None)),
        Http("json data short", "POST", INFER, _first(data=F4[:3])),
        Http("json data long", "POST", INFER, _first(data=F4 + [1.0])),
        Http("json data nested", "POST", INFER, _first(data=[F4])),
        Http("json data str", "POST", INFER, _first(data=["1", "2", "3", "4"])),
        Http("json data bool", "POST", INFER, _first(data=[True, False, True, False])),
        Http("json data null", "POST", INFER, _first(data=[None, 1.0, 2.0, 3.0])),
        Http("json data int", "POST", INFER, _first(data=[1, 2, 3, 4])),
        Http("json data huge", "POST", INFER, _first(data=[1e300, 1, 2, 3])),
        Http("json data scalar", "POST", INFER, _first(data=1.0)),
        Http("json name missing", "POST", INFER, _first(name=None)),
        Http("json datatype missing", "POST", INFER, _first(datatype=None)),
        Http("json input unknown", "POST", INFER, _js({"inputs": ADD["inputs"] + [
            {"name": "X", "shape": [1, 4], "datatype": "FP32", "data": F4}]})),
        Http("json input twice", "POST", INFER, _js({"inputs": ADD["inputs"] +
                                                     [ADD["inputs"][0]]})),
        Http("json input missing", "POST", INFER, _js({"inputs": ADD["inputs"][:1]})),
        Http("json inputs missing", "POST", INFER, _js({})),
        Http("json inputs not list", "POST", INFER, _js({"inputs": {}})),
        Http("json body array", "POST", INFER, b"[]"),
        Http("json body empty", "POST", INFER, b""),
        Http("json body garbage", "POST", INFER, b"{not json"),
        Http("json body trailing", "POST", INFER, _add() + b"xx"),
        Http("json utf8 bad", "POST", INFER, b'{"inputs": "\xff"}'),
        Http("json gzip", "POST", INFER, gzip.compress(_add()), {"Content-Encoding": "gzip"}),
        Http("json deflate", "POST", INFER, zlib.compress(_add()),
             {"Content-Encoding": "deflate"}),
        Http("json br", "POST", INFER, _add(), {"Content-Encoding": "br"}),
        Http("json gzip bad", "POST", INFER, b"not gzip", {"Content-Encoding": "gzip"}),
        Http("json accept gzip", "POST", INFER, _add(), {"Accept-Encoding": "gzip"}),
        Http("json accept deflate", "POST", INFER, _add(), {"Accept-Encoding": "deflate"}),
        Http("bin ok", "POST", INFER, *_binary()),
        Http("bin size short", "POST", INFER, *_binary((12, 16), struct.pack("<7f", *F4[:3],
                                                                               *F4))),
        Http("bin body short", "POST", INFER, *_binary(data=struct.pack("<6f", *F4, 1, 2))),
        Http("bin body long", "POST", INFER, *_binary(data=struct.pack("<9f", *F4, *F4, 1))),
        Http("bin hcl big", "POST", INFER, *_binary(header_length="100000")),
        Http("bin hcl neg", "POST", INFER, *_binary(header_length="-1")),
        Http("bin hcl str", "POST", INFER, *_binary(header_length="abc")),
        Http("bin hcl plus", "POST", INFER, *_binary(header_length="+100")),
        Http("bin size neg", "POST", INFER, *_binary((-16, 16))),
        Http("bin size str", "POST", INFER, *_binary(("16", 16))),
        Http("bin size float", "POST", INFER, *_binary((16.0, 16))),
        Http("shm unknown region", "POST", INFER, _js({"inputs": [
            {"name": n, "shape": [1, 4], "datatype": "FP32", "parameters": {
                "shared_memory_region": "nope", "shared_memory_byte_size": 16}}
            for n in ("INPUT0", "INPUT1")]})),
        Http("decoupled infer", "POST", "/v2/models/stream_echo/infer", _js({"inputs": [
            {"name": "IN", "shape": [1], "datatype": "INT32", "data": [2]}]})),
    ]
    integer = "/v2/models/int_double/infer"
    for name, data, datatype in (("int ok", [3], "INT32"), ("int float data", [3.5], "INT32"),
                                 ("int overflow", [2**40], "INT32"),
                                 ("int neg overflow", [-2**40], "INT32"),
                                 ("int bool data", [True], "INT32"),
                                 ("int string data", ["3"], "INT32"),
                                 ("int dtype INT64", [3], "INT64")):
        cases.append(Http(name, "POST", integer, _js({"inputs": [
            {"name": "IN", "shape": [1], "datatype": datatype, "data": data}]})))
    for name, datatype, data in (
            ("bool ok", "BOOL", [True, False]), ("bool ints", "BOOL", [1, 0]),
            ("bool strings", "BOOL", ["true"]), ("uint8 ok", "UINT8", [0, 255]),
            ("uint8 past range", "UINT8", [256]), ("uint8 negative", "UINT8", [-1]),
            ("uint8 fraction", "UINT8", [1.0]), ("uint64 ok", "UINT64", [0, 2**64 - 1]),
            ("uint64 past 64 bits", "UINT64", [2**64]), ("uint64 high", "UINT64", [2**63]),
            ("int64 ok", "INT64", [-2**63, 2**63 - 1]), ("int64 past range", "INT64", [2**63]),
            ("int64 fraction", "INT64", [1.5]), ("int8 ok", "INT8", [-128, 127]),
            ("int8 past range", "INT8", [128]), ("fp16 json", "FP16", [0.5]),
            ("fp32 ok", "FP32", [0.1, 1e38, 1e-45]), ("fp32 past range", "FP32", [3.5e38]),
            ("fp64 ok", "FP64", [0.1, 1e308, 5e-324]), ("bf16 json", "BF16", [1.0]),
            ("bytes ok", "BYTES", ["a", "é", ""]), ("bytes numbers", "BYTES", [1])):
        model = "echo_string" if datatype == "BYTES" else f"echo_{datatype.lower()}"
        cases.append(Http(name, "POST", f"/v2/models/{model}/infer", _echo(datatype, data)))
    cases.append(Http("bytes nonstr", "POST", "/v2/models/echo_string/infer",
                      _echo("BYTES", [1, 2])))
    pair = [{"name": "A", "shape": [1, 4], "datatype": "FP32", "data": F4},
            {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]
    ensemble = "/v2/models/ensemble_add"
    cases += [Http("ensemble infer", "POST", f"{ensemble}/infer", _js({"inputs": pair})),
              Http("ensemble one output", "POST", f"{ensemble}/infer",
                   _js({"inputs": pair, "outputs": [{"name": "DIFF"}]})),
              Http("ensemble missing input", "POST", f"{ensemble}/infer",
                   _js({"inputs": pair[:1]})),
              Http("ensemble metadata", "GET", ensemble),
              Http("ensemble config", "GET", f"{ensemble}/config", keys_only=True)]
    parameters: dict[str, Any]
    for name, parameters in (  # in order: each goes on from the ones before it
            ("sequence without an id", {}), ("sequence id without start", {"sequence_id": 51}),
            ("sequence start", {"sequence_id": 52, "sequence_start": True}),
            ("sequence continues", {"sequence_id": 52}),
            ("sequence starts again", {"sequence_id": 52, "sequence_start": True}),
            ("sequence ends", {"sequence_id": 52, "sequence_end": True}),
            ("sequence after its end", {"sequence_id": 52}),
            ("sequence start and end", {"sequence_id": 53, "sequence_start": True,
                                        "sequence_end": True}),
            ("sequence id 0", {"sequence_id": 0, "sequence_start": True}),
            ("sequence start without an id", {"sequence_start": True}),
            ("sequence string id", {"sequence_id": "s", "sequence_start": True}),
            ("sequence string id continues", {"sequence_id": "s"}),
            ("sequence string id ends", {"sequence_id": "s", "sequence_end": True}),
            ("sequence empty string id", {"sequence_id": "", "sequence_start": True}),
            ("sequence id 2**64 - 1", {"sequence_id": 2**64 - 1, "sequence_start": True}),
            ("sequence id 2**64 - 1 ends", {"sequence_id": 2**64 - 1, "sequence_end": True}),
            ("sequence string '77'", {"sequence_id": "77", "sequence_start": True}),
            ("sequence number 77 is another", {"sequence_id": 77}),
            ("sequence string '77' ends", {"sequence_id": "77", "sequence_end": True}),
            ("sequence start not a bool", {"sequence_id": 54, "sequence_start": 1})):
        cases.append(Http(name, "POST", "/v2/models/sequence_sum/infer", _js({
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
            "parameters": parameters})))
    for name, model, route, document in (
            ("generate", "int_double", "generate", {"IN": [3]}),
            ("generate a scalar", "int_double", "generate", {"IN": 3}),
            ("generate batched", "add_sub", "generate", {"INPUT0": F4, "INPUT1": F4}),
            ("generate a field no input has", "int_double", "generate", {"IN": [3], "X": 1}),
            ("generate without an input", "int_double", "generate", {}),
            ("generate a string for a number", "int_double", "generate", {"IN": ["3"]}),
            ("generate a decoupled model", "stream_echo", "generate", {"IN": [3]}),
            ("generate_stream", "stream_echo", "generate_stream", {"IN": [3]}),
            ("generate_stream counts", "stream_count", "generate_stream", {"IN": [2]}),
            ("generate_stream not decoupled", "int_double", "generate_stream", {"IN": [3]}),
            ("generate unknown model", "nope", "generate", {"IN": [3]})):
        cases.append(Http(name, "POST", f"/v2/models/{model}/{route}", _js(document)))
    for name, parameters in (
            ("priority on a model without levels", {"priority": 3}),
            ("priority negative", {"priority": -1}),
            ("priority a string", {"priority": "high"}),
            ("timeout", {"timeout": 5_000_000}),
            ("timeout a string", {"timeout": "5"}),
            ("timeout negative", {"timeout": -1}),
            ("a triton_ parameter", {"triton_custom": 1}),
            ("a headers parameter", {"headers": {"a": "b"}}),
            ("a custom parameter", {"mine": "yes", "count": 2, "ratio": 0.5})):
        cases.append(Http(name, "POST", INFER, _add(parameters=parameters)))
    binary_text = struct.pack("<I", 2) + b"\xff\xfe"
    cases.append(Http("bytes not UTF-8 answered as JSON", "POST", "/v2/models/echo_string/infer",
                      *_binary_one("BYTES", [1], binary_text)))
    load = "/v2/repository/models/add_sub/load"
    smaller = json.dumps({
        "name": "add_sub", "backend": "python", "max_batch_size": 2,
        "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0",
                                                                             "INPUT1")],
        "output": [{"name": n, "data_type": t, "dims": [d]} for n, t, d in (
            ("OUTPUT0", "TYPE_FP32", 4), ("OUTPUT1", "TYPE_FP32", 4),
            ("REQUESTS", "TYPE_INT32", 1))]})
    three = _js({"inputs": [{"name": n, "shape": [3, 4], "datatype": "FP32", "data": F4 * 3}
                            for n in ("INPUT0", "INPUT1")]})
    cases += [  # in order; the last loads add_sub as its repository has it again
        Http("load with a config", "POST", load, _js({"parameters": {"config": smaller}})),
        Http("config after a load with a config", "GET", "/v2/models/add_sub/config"),
        Http("infer past the loaded config's batch", "POST", INFER, three),
        Http("load with a config that is not JSON", "POST", load,
             _js({"parameters": {"config": "{"}})),
        Http("load with a config not a string", "POST", load,
             _js({"parameters": {"config": {"name": "add_sub"}}})),
        Http("load with another model's config", "POST", load,
             _js({"parameters": {"config": smaller.replace('"add_sub"', '"other"')}})),
        Http("load again without a config", "POST", load, b""),
        Http("infer after the load without a config", "POST", INFER, three),
    ]
    scores = [0.5, 3.0, -1.0, 3.0, 2.0]
    for name, model, datatype, data, count, binary in (
            ("classification labels", "classes", "FP32", scores, 4, False),
            ("classification past the count", "classes", "FP32", scores, 9, False),
            ("classification binary", "classes", "FP32", scores, 2, True),
            ("classification int", "echo_int64", "INT64", [2**24, 2**24 + 1, -3], 2, False),
            ("classification uint8", "echo_uint8", "UINT8", [8, 3, 9], 3, False),
            ("classification negative", "classes", "FP32", scores, -1, False)):
        cases.append(Http(name, "POST", f"/v2/models/{model}/infer", _js({
            "inputs": [{"name": "IN", "shape": [len(data)], "datatype": datatype,
                        "data": data}],
            "outputs": [{"name": "OUT", "parameters": {"classification": count,
                                                       "binary_data": binary}}]})))
    return cases


def shm_cases(keys: tuple[str, str]) -> list[Http]:
    """System shared memory, in order: two regions the client made (32 bytes each: INPUT0's
    values then INPUT1's, and room for outputs) registered, read, written, let go of."""
    region = "/v2/systemsharedmemory/region"
    floats = {"shape": [1, 4], "datatype": "FP32"}

    def placed(name: str, region_name: str, offset: int, size: int = 16) -> dict[str, Any]:
        return {"name": name, **floats, "parameters": {
            "shared_memory_region": region_name, "shared_memory_offset": offset,
            "shared_memory_byte_size": size}}

    def infer(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]] | None = None
              ) -> bytes:
        return _js({"inputs": inputs, **({"outputs": outputs} if outputs else {})})

    def output(offset: int) -> list[dict[str, Any]]:
        return [{"name": "OUTPUT1", "parameters": {
            "shared_memory_region": "diff_out", "shared_memory_offset": offset,
            "shared_memory_byte_size": 16}}]

    both = [placed("INPUT0", "diff_in", 0), placed("INPUT1", "diff_in", 16)]
    return [
        Http("shm register", "POST", f"{region}/diff_in/register",
             _js({"key": keys[0], "offset": 0, "byte_size": 32})),
        Http("shm register its name again", "POST", f"{region}/diff_in/register",
             _js({"key": keys[1], "offset": 0, "byte_size": 32})),
        Http("shm register past its end", "POST", f"{region}/diff_far/register",
             _js({"key": keys[1], "offset": 16, "byte_size": 32})),
        Http("shm register an output", "POST", f"{region}/diff_out/register",
             _js({"key": keys[1], "offset": 0, "byte_size": 32})),
        Http("shm status", "GET", "/v2/systemsharedmemory/status"),
        Http("shm status of one", "GET", f"{region}/diff_in/status"),
        Http("shm inputs", "POST", INFER, infer(both)),
        Http("shm inputs and an output", "POST", INFER, infer(both, output(16))),
        Http("shm output past the region", "POST", INFER, infer(both, output(24))),
        Http("shm input size not the shape's", "POST", INFER,
             infer([placed("INPUT0", "diff_in", 0, 12), both[1]])),
        Http("shm input past the region", "POST", INFER,
             infer([placed("INPUT0", "diff_in", 24), both[1]])),
        Http("shm input offset negative", "POST", INFER,
             infer([placed("INPUT0", "diff_in", -4), both[1]])),
        Http("shm input of a region not registered", "POST", INFER,
             infer([placed("INPUT0", "diff_none", 0), both[1]])),
        Http("shm unregister one", "POST", f"{region}/diff_out/unregister"),
        Http("shm status after one is gone", "GET", "/v2/systemsharedmemory/status"),
        Http("shm unregister all", "POST", "/v2/systemsharedmemory/unregister"),
        Http("shm status after all are gone", "GET", "/v2/systemsharedmemory/status"),
    ]


def failure_cases() -> list[Http]:
    """A model whose load fails (while the folder `fragile` holds a file "fail"), then
    loads again once it is gone (main makes the file before the failed load and removes it
    before the one that works)."""
    fragile = "/v2/models/fragile"
    infer = _js({"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]})
    return [
        Http("unload before a failed load", "POST", "/v2/repository/models/fragile/unload"),
        Http("a failed load", "POST", "/v2/repository/models/fragile/load"),
        Http("index after a failed load", "POST", "/v2/repository/index"),
        Http("ready after a failed load", "GET", f"{fragile}/ready"),
        Http("metadata after a failed load", "GET", fragile),
        Http("infer after a failed load", "POST", f"{fragile}/infer", infer),
        Http("server ready after a failed load", "GET", "/v2/health/ready"),
        Http("a load that works again", "POST", "/v2/repository/models/fragile/load"),
        Http("index after the load works", "POST", "/v2/repository/index"),
        Http("infer after the load works", "POST", f"{fragile}/infer", infer),
    ]


def grpc_cases() -> list[Grpc]:
    from tritonclient.grpc import service_pb2 as pb

    floats = struct.pack("<4f", *F4)

    def infer(model: str = "add_sub", version: str = "", names: tuple[str, ...] = (
              "INPUT0", "INPUT1"), shapes: tuple[list[int], ...] = ([1, 4], [1, 4]),
              datatypes: tuple[str, ...] = ("FP32", "FP32"),
              raw: list[bytes] | None = None) -> Any:
        request = pb.ModelInferRequest(model_name=model, model_version=version)
        for name, shape, datatype in zip(names, shapes, datatypes):
            request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.extend([floats, floats] if raw is None else raw)
        return request

    def typed(datatype: str, contents: str, values: list[Any]) -> Any:
        model = "echo_string" if datatype in ("BYTES", "STRING") else f"echo_{datatype.lower()}"
        request = pb.ModelInferRequest(model_name=model)
        item = request.inputs.add(name="IN", datatype=datatype.replace("STRING", "BYTES"),
                                  shape=[len(values)])
        getattr(item.contents, contents).extend(values)
        return request

    both = infer()
    both.inputs[0].contents.fp32_contents.extend(F4)
    neg_timeout = infer()
    neg_timeout.parameters["timeout"].int64_param = -5
    cases = [
        Grpc("grpc ok", "ModelInfer", infer()),
        Grpc("grpc v7", "ModelInfer", infer(version="7")),
        Grpc("grpc vx", "ModelInfer", infer(version="x")),
        Grpc("grpc no model", "ModelInfer", infer(model="nope")),
        Grpc("grpc short raw", "ModelInfer", infer(raw=[floats[:12], floats])),
        Grpc("grpc long raw", "ModelInfer", infer(raw=[floats + floats[:4], floats])),
        Grpc("grpc one raw", "ModelInfer", infer(raw=[floats])),
        Grpc("grpc three raw", "ModelInfer", infer(raw=[floats] * 3)),
        Grpc("grpc contents and raw", "ModelInfer", both),
        Grpc("grpc dtype bogus", "ModelInfer", infer(datatypes=("FLOAT", "FP32"))),
        Grpc("grpc shape 4", "ModelInfer", infer(shapes=([4], [1, 4]))),
        Grpc("grpc batch mismatch", "ModelInfer", infer(shapes=([2, 4], [1, 4]),
                                                        raw=[floats * 2, floats])),
        Grpc("grpc missing input", "ModelInfer", infer(names=("INPUT0",), raw=[floats])),
        Grpc("grpc unknown input", "ModelInfer", infer(names=("INPUT0", "X"))),
        Grpc("grpc input twice", "ModelInfer", infer(names=("INPUT0", "INPUT0"))),
        Grpc("grpc timeout neg", "ModelInfer", neg_timeout),
        Grpc("grpc decoupled unary", "ModelInfer", infer(
            model="stream_echo", names=("IN",), shapes=([1],), datatypes=("INT32",),
            raw=[struct.pack("<i", 2)])),
        Grpc("grpc uint64 contents", "ModelInfer", typed("UINT64", "uint64_contents",
                                                         [0, 2**64 - 1])),
        Grpc("grpc int8 past range", "ModelInfer", typed("INT8", "int_contents", [128])),
        Grpc("grpc uint8 past range", "ModelInfer", typed("UINT8", "uint_contents", [256])),
        Grpc("grpc uint16 past range", "ModelInfer", typed("UINT16", "uint_contents",
                                                           [70000])),
        Grpc("grpc bool contents", "ModelInfer", typed("BOOL", "bool_contents",
                                                       [True, False])),
        Grpc("grpc fp16 contents", "ModelInfer", typed("FP16", "fp32_contents", [1.0])),
        Grpc("grpc fp32 as fp64", "ModelInfer", typed("FP32", "fp64_contents", [1.0])),
        Grpc("grpc int32 as int64", "ModelInfer", typed("INT32", "int64_contents", [1])),
        Grpc("grpc bytes contents", "ModelInfer", typed("STRING", "bytes_contents",
                                                        [b"a", b"\xff"])),
        Grpc("grpc model ready nope", "ModelReady", pb.ModelReadyRequest(name="nope")),
        Grpc("grpc metadata nope", "ModelMetadata", pb.ModelMetadataRequest(name="nope")),
        Grpc("grpc metadata version x", "ModelMetadata",
             pb.ModelMetadataRequest(name="add_sub", version="x")),
        Grpc("grpc config nope", "ModelConfig", pb.ModelConfigRequest(name="nope")),
        Grpc("grpc stats nope", "ModelStatistics", pb.ModelStatisticsRequest(name="nope")),
        Grpc("grpc stats version 3", "ModelStatistics",
             pb.ModelStatisticsRequest(name="add_sub", version="3")),
        Grpc("grpc load nope", "RepositoryModelLoad",
             pb.RepositoryModelLoadRequest(model_name="nope")),
        Grpc("grpc unload nope", "RepositoryModelUnload",
             pb.RepositoryModelUnloadRequest(model_name="nope")),
        Grpc("grpc shm status nope", "SystemSharedMemoryStatus",
             pb.SystemSharedMemoryStatusRequest(name="nope")),
        Grpc("grpc shm register bad key", "SystemSharedMemoryRegister",
             pb.SystemSharedMemoryRegisterRequest(name="r", key="/tgdiff_none",
                                                  byte_size=16)),
        Grpc("grpc trace nope", "TraceSetting", pb.TraceSettingRequest(model_name="nope")),
        Grpc("grpc trace settings", "TraceSetting", pb.TraceSettingRequest(), keys_only=True),
        Grpc("grpc server live", "ServerLive", pb.ServerLiveRequest()),
        Grpc("grpc server ready", "ServerReady", pb.ServerReadyRequest()),
        Grpc("grpc server metadata", "ServerMetadata", pb.ServerMetadataRequest()),
        Grpc("grpc model ready", "ModelReady", pb.ModelReadyRequest(name="add_sub")),
        Grpc("grpc model ready version 2", "ModelReady",
             pb.ModelReadyRequest(name="add_sub", version="2")),
        Grpc("grpc metadata", "ModelMetadata", pb.ModelMetadataRequest(name="add_sub")),
        Grpc("grpc metadata of an ensemble", "ModelMetadata",
             pb.ModelMetadataRequest(name="ensemble_add")),
        Grpc("grpc config", "ModelConfig", pb.ModelConfigRequest(name="int_double")),
        Grpc("grpc config of a batching model", "ModelConfig",
             pb.ModelConfigRequest(name="add_sub")),
        Grpc("grpc statistics", "ModelStatistics", pb.ModelStatisticsRequest(name="add_sub"),
             keys_only=True),
        Grpc("grpc repository index", "RepositoryIndex", pb.RepositoryIndexRequest()),
        Grpc("grpc repository index ready", "RepositoryIndex",
             pb.RepositoryIndexRequest(ready=True)),
        Grpc("grpc log settings", "LogSettings", pb.LogSettingsRequest(), keys_only=True),
        Grpc("grpc shm status", "SystemSharedMemoryStatus",
             pb.SystemSharedMemoryStatusRequest()),
        Grpc("grpc unload", "RepositoryModelUnload",
             pb.RepositoryModelUnloadRequest(model_name="int_double")),
        Grpc("grpc ready after an unload", "ModelReady", pb.ModelReadyRequest(name="int_double")),
        Grpc("grpc index after an unload", "RepositoryIndex", pb.RepositoryIndexRequest()),
        Grpc("grpc load", "RepositoryModelLoad",
             pb.RepositoryModelLoadRequest(model_name="int_double")),
        Grpc("grpc ready after a load", "ModelReady", pb.ModelReadyRequest(name="int_double")),
    ]
    return cases


def stream_cases() -> list[Stream]:
    return [
        Stream("stream final flag with the response", [
            ("a", "stream_echo", 5, False), ("b", "stream_echo", 6, True)]),
        Stream("stream final flag alone", [
            ("a", "stream_count", 2, False), ("b", "stream_count", 2, True),
            ("c", "stream_count", 0, False), ("d", "stream_count", 0, True)]),
        Stream("stream not decoupled", [
            ("a", "int_double", 4, False), ("b", "int_double", 5, True)]),
        Stream("stream errors carry on", [
            ("a", "stream_count", -1, True), ("b", "nope", 1, False),
            ("c", "stream_count", 1, False)]),
    ]


# -- running -----------------------------------------------------------------------------------

def _verdict(name: str, triton: tuple[Any, Any], ours: tuple[Any, Any]) -> str:
    """"same", "known: why" (a difference KNOWN lists, and no other), or "DIFFERENT"."""
    if triton == ours:
        return "same"
    known = KNOWN.get(name)
    if known is None or (known[0], known[1]) != (triton[0], ours[0]):
        return "DIFFERENT"
    differing = known[3]
    if triton[0] == ours[0] and differing is not None and \
            _without(triton[1], differing) != _without(ours[1], differing):
        return "DIFFERENT"  # more differs than the keys KNOWN names
    return f"known: {known[2]}"


def _without(value: Any, keys: frozenset[str]) -> Any:
    """`value` (an answer as compared) without `keys`, wherever they are."""
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, (list, tuple)):
        return [_without(v, keys) for v in value]
    return value


def _shm_regions() -> tuple[tuple[str, str], list[Any]]:
    """Two 32-byte regions made as a client makes them, the first holding INPUT0's values
    and INPUT1's (Triton takes one region a key)."""
    import numpy as np
    import tritonclient.utils.shared_memory as shm

    keys = (f"/tgdiff_{os.getpid()}_in", f"/tgdiff_{os.getpid()}_out")  # "tensorgate..."
    handles = [shm.create_shared_memory_region(f"diff{i}", key, 32)  # keys are the server's
               for i, key in enumerate(keys)]
    shm.set_shared_memory_region(handles[0], [np.array(F4 + [1.0] * 4, np.float32)])
    return keys, handles


def _shm_release(handles: list[Any]) -> None:
    import tritonclient.utils.shared_memory as shm
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


def _free_ports(count: int) -> list[int]:
    import socket
    sockets = [socket.socket() for _ in range(count)]
    for item in sockets:
        item.bind(("127.0.0.1", 0))
    ports = [item.getsockname()[1] for item in sockets]
    for item in sockets:
        item.close()
    return ports


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triton-venv", type=pathlib.Path,
                        default=ROOT / "bench" / "peers" / ".venvs" / "triton",
                        help="where bench/peers/install.sh put nvidia-pytriton")
    parser.add_argument("--only", default="", help="only the cases whose name holds this")
    parser.add_argument("--show-same", action="store_true", help="list the same ones too")
    parser.add_argument("--show", action="store_true",
                        help="print both answers, as compared, of each case not the same")
    args = parser.parse_args(argv)
    if not (args.triton_venv / "bin").is_dir():
        print(f"no Triton at {args.triton_venv}: bash bench/peers/install.sh triton")
        return 2
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    with tempfile.TemporaryDirectory(prefix="triton-diff-") as scratch:
        work = pathlib.Path(scratch)
        repo = work / "models"
        repo.mkdir()
        _repository(repo)
        ports = _free_ports(6)
        triton = _triton(args.triton_venv, repo, work, (ports[0], ports[1], ports[2]))
        ours = _tensorgate(repo, work, (ports[3], ports[4], ports[5]))
        rows: list[tuple[str, Any, Any, str]] = []
        crashed: list[tuple[str, int | None, str]] = []
        try:
            _wait_ready(ports[0], triton, "tritonserver", work / "triton.log")
            _wait_ready(ports[3], ours, "tensorgate", work / "tensorgate.log")
            stubs = [service_pb2_grpc.GRPCInferenceServiceStub(
                grpc.insecure_channel(f"127.0.0.1:{port}")) for port in (ports[1], ports[4])]
            for case in http_cases():
                if args.only in case.name:
                    one, two = _http_outcome(ports[0], case), _http_outcome(ports[3], case)
                    rows.append((case.name, one, two, _verdict(case.name, one, two)))
            keys, handles = _shm_regions()
            try:
                for case in shm_cases(keys):
                    if args.only in case.name:
                        one, two = _http_outcome(ports[0], case), _http_outcome(ports[3], case)
                        rows.append((case.name, one, two, _verdict(case.name, one, two)))
            finally:
                _shm_release(handles)
            for number, case in enumerate(failure_cases()):
                marker = repo / "fragile" / "fail"
                if case.name == "a failed load":
                    marker.touch()
                elif marker.exists() and case.name == "a load that works again":
                    marker.unlink()
                if args.only in case.name:
                    one, two = _http_outcome(ports[0], case), _http_outcome(ports[3], case)
                    rows.append((case.name, one, two, _verdict(case.name, one, two)))
            if args.only in "metrics":
                one, two = _metrics_outcome(ports[2]), _metrics_outcome(ports[5])
                rows.append(("metrics", one, two, _verdict("metrics", one, two)))
            for stream in stream_cases():
                if args.only in stream.name:
                    one = _stream_outcome(f"127.0.0.1:{ports[1]}", stream)
                    two = _stream_outcome(f"127.0.0.1:{ports[4]}", stream)
                    rows.append((stream.name, one, two, _verdict(stream.name, one, two)))
            for grpc_case in grpc_cases():
                if args.only in grpc_case.name:
                    one, two = (_grpc_outcome(stubs[0], grpc_case),
                                _grpc_outcome(stubs[1], grpc_case))
                    rows.append((grpc_case.name, one, two,
                                 _verdict(grpc_case.name, one, two)))
            crashed = [(what, process.returncode, log) for what, process, log in (
                ("tritonserver", triton, "triton.log"), ("tensorgate", ours, "tensorgate.log"))
                if process.poll() is not None]
        finally:
            _stop(triton)
            _stop(ours)
            if crashed or any(row[3] == "DIFFERENT" for row in rows):
                for log in ("triton.log", "tensorgate.log"):
                    shutil.copy(work / log, pathlib.Path(tempfile.gettempdir()) /
                                f"triton-diff-{log}")
    for what, code, log in crashed:  # what came after its end means nothing
        print(f"{what} exited ({code}) during the run: see "
              f"{pathlib.Path(tempfile.gettempdir()) / f'triton-diff-{log}'}")
    if crashed:
        return 3
    width = max(len(row[0]) for row in rows)
    print(f"{'case':{width}}  {'Triton':>16}  {'tensorgate':>16}  verdict")
    for name, one, two, verdict in rows:
        if args.show_same or verdict != "same":
            print(f"{name:{width}}  {one[0]!s:>16}  {two[0]!s:>16}  {verdict}")
        if args.show and verdict != "same":
            for server, outcome in (("Triton", one), ("tensorgate", two)):
                print(f"    {server}: {json.dumps(outcome[1], default=repr)[:2000]}")
    counts = {kind: sum(row[3].startswith(kind) for row in rows)
              for kind in ("same", "known", "DIFFERENT")}
    print(f"{len(rows)} cases: {counts['same']} the same, {counts['known']} known and "
          f"deliberate, {counts['DIFFERENT']} unexplained")
    return 1 if counts["DIFFERENT"] else 0


if __name__ == "__main__":
    sys.exit(main())
