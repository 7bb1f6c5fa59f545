"""Send the same requests to Triton and to tensorgate, serving the same repository, and say
where their answers differ.

"tritonclient and existing Triton model repositories work unchanged" is a claim about
behaviour no test of ours alone can check: this starts Triton's own `tritonserver` (the
binary in the nvidia-pytriton wheel that `bash bench/peers/install.sh triton` installs) and
`tensorgate serve` on one Python-backend repository, sends each request of a corpus —
health, metadata, statistics, model control, and inference over HTTP (JSON, binary,
compressed, malformed) and gRPC (raw and typed contents, wrong fields, every datatype, and
raw HTTP/2 frames: a client's PINGs; answers compressed at each level, on server pairs of
their own) — to both, and compares status and answer (errors by status only; their words
differ). The Python backend's side is compared from within: a probe model
(tools/triton_diff_probe.py) reports what a model sees — initialize's args, its config,
pb_utils's names and helpers, its requests, tensors, BLS calls — and answers in the ways a
server must handle (errors of each code, raises, outputs not as configured, answers through
the response sender).

Each difference is either listed in KNOWN with the reason it is deliberate (a malformed
request is the client's error, 400 here where Triton answers 500; an integer out of its
datatype's range is refused here where Triton wraps it), or in SUPERSET where ours holds all
of Triton's and more, or printed as unexplained, and the exit status is 1. Run it after a
change to the protocol layers or to the Python backend:

    .venv/bin/python tools/triton_diff.py [--only TEXT] [--show] [--show-same]

The repository is tools/triton_diff_models.py's, the requests tools/triton_diff_cases.py's;
this module starts the two servers, sends each case to both, compares, and holds KNOWN.

Nothing here is a test: it needs Triton, which CI does not install. Its findings became
tests that run without it (their commits say so).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Callable
from typing import Any

from triton_diff_cases import (F4, SAGEMAKER_MODEL, Frames, Grpc, Http, Packed, Stream,
                               failure_cases, frames_cases, grpc_cases, grpc_upload_cases,
                               http_cases, multi_model_cases, packed_cases, probe_cases,
                               sagemaker_cases, shm_cases, stream_cases, upload_cases)
from triton_diff_models import CONFIG_NAME, ROOT, write_repository

# case name -> (Triton's status, ours, why the difference is deliberate, and where the two
# statuses are the same, the answer's keys that may differ: None, the whole answer;
# "content-type", an HTTP answer's Content-Type)
KNOWN: dict[str, tuple[Any, Any, str, frozenset[str] | None]] = {}


# case name -> why tensorgate's answer may hold more than Triton's (a name list, an
# object's keys) where it holds all of Triton's: our pb_utils has what Triton's has, and more
SUPERSET: dict[str, str] = {}


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
       "priority a string", "timeout a string", "timeout negative",
       "upload without a config", "upload content not a string",
       "upload with a path out of its folder", "upload with an empty path")
_known("an integer out of its datatype's range is refused here; Triton wraps it (2**40 as "
       "INT32 is 0 there)", 200, 400, "int overflow", "int neg overflow", "uint8 past range",
       "int8 past range")
_known("a malformed request is the client's error: INVALID_ARGUMENT here, INTERNAL on Triton",
       "INTERNAL", "INVALID_ARGUMENT", "grpc shm register bad key",
       "grpc upload without a config")
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
       "upload: ready of the second uploaded version", differing=None)
_SERVED = {"versions_all": (1, 2, 3), "versions_latest": (3,), "versions_specific": (1, 3)}
_known("health answers carry OIP's JSON bodies ({\"name\": ..., \"ready\": true})", 200, 200,
       *[f"{model} v{v} ready" for model, served in _SERVED.items() for v in served],
       differing=None)
_known("a model version not ready is 503 here (KServe's status); Triton answers 400", 400, 503,
       *[f"{model} v{v} ready" for model, served in _SERVED.items() for v in (1, 2, 3, 4)
         if v not in served])
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
       404, "POST /v2/repository/models/nope/load",
       "upload: load the uploaded model again without files")
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
_known("Triton's ensemble answers carry sequence parameters (sequence_id 0, start and end "
       "false) for a request that sent none", 200, 200, "ensemble infer",
       "ensemble one output", "multi-model invoke the ensemble", differing=("parameters",))
_known("ensemble_scheduling shows max_inflight_requests, a field of newer Triton configs",
       200, 200, "ensemble config", differing=("max_inflight_requests",))
_known("index entries carry \"reason\" (empty when ready), as KServe's do", 200, 200,
       "POST /v2/repository/index", "repo index ready", "index after the load works",
       "upload: index after unloading the uploaded model", differing=("reason",))
_known("a model unloaded at a client's request leaves the server ready here (it was asked "
       "to go); Triton's strict readiness counts it as a model not ready (400)", 400, 200,
       "upload: server ready after it is unloaded", differing=None)
_known("a model loaded from an upload is in the index while it is served (READY) here; "
       "Triton's index lists the repositories' models only", 200, 200,
       "upload: index after an upload", differing=None)
_known("binary_data_output makes listed outputs binary too here; Triton 2.51 applies it "
       "only when no output is listed", 200, 200, "json binary_data_output listed",
       differing=None)
_known("an unload returns here once the model is unloaded (its requests drained, "
       "UNAVAILABLE); Triton's returns at once and lists the model UNLOADING for a while",
       "OK", "OK", "grpc index after an unload", differing=("state", "reason"))
_known("JSON answers stay JSON: BYTES that are not UTF-8 are written with U+FFFD in their "
       "place (binary_data keeps them exact); Triton writes the raw bytes, which no JSON "
       "parser reads", 200, 200, "bytes not UTF-8 answered as JSON", differing=None)
_known("a raw binary body is one BYTES element for an input of dims [-1] too here; Triton "
       "takes it only for dims [1]", 400, 200, "raw binary request, BYTES of dims [-1]")
SUPERSET.update(dict.fromkeys((
    "probe api module", "probe api classes", "probe api request", "probe constants"),
    "tensorgate's pb_utils has every name Triton 2.51's has, and more: its own helpers and "
    "imports, response parameters (newer Triton's), Tensor.value(), a request's model_name()"))
SUPERSET["metrics"] = ("tensorgate writes every nv_* family Triton 2.51 does, with its labels "
                       "and type, and nv_model_load_duration_secs, which newer Triton writes "
                       "(its core's kModelLoadTimeMetric) and 2.51 does not")
_known("a BLS call's error carries its kind (NOT_FOUND, INVALID_ARG) here; Triton's are all "
       "INTERNAL", 200, 200, "probe bls", differing=("code",))
_known("a Tensor made of a list is taken here (Triton's wants a numpy array); one of a "
       "strided array stays a view here, where Triton copies it into one piece", 200, 200,
       "probe tensors", differing=("list", "contiguous"))
_known("TritonModelException has message() here, as Triton's docs show it", 200, 200,
       "probe response", differing=("exception message",))
_known("a model's error it calls UNKNOWN is 500 here (not the client's fault); Triton "
       "answers 400", 400, 500, "probe answer: error code UNKNOWN")
_known("an output the request asked for and the model did not make is an error naming it "
       "here; Triton answers 200 without it", 200, 500, "probe answer: output missing")
_known("an output the model made twice is answered once here; Triton sends both", 200, 200,
       "probe answer: output twice", differing=("outputs",))
_known("a request a Python model answered with an error (InferenceResponse(error=...), sent "
       "or returned, or an output its client asked for missing) is a failed request here: "
       "Triton's Python backend counts it a success, with its queue and compute times",
       "OK", "OK", "probe statistics after its answers",
       "stream_probe statistics after its streams", "stream_count statistics after its streams",
       differing=("success", "fail", "queue", "compute_infer"))
_known("a gRPC call's deadline bounds its request here as a timeout would (the queue drops it "
       "when it passes), so request.timeout() says it; Triton's is the timeout parameter alone",
       "OK", "OK", "grpc probe request with typed parameters",
       "grpc probe request with a string sequence id", differing=("timeout",))
_known("uint64 request parameters (a newer protocol field) are taken here; Triton 2.51 "
       "refuses them", "INVALID_ARGUMENT", "OK", "grpc probe request with a uint64 parameter")
_known("a model's model_warmup runs are not counted in its statistics here (they served no "
       "one); Triton counts them in batch_stats", 200, 200, "GET /v2/models/stats",
       differing=("batch_stats",))
_known("Accept-Encoding answers compress the same bytes with another gzip header", 200, 200,
       "json accept gzip", "json accept deflate", differing=None)
_known(MALFORMED, 500, 400, "sagemaker bad json")
_known("a path SageMaker's routes do not have is 404 here, naming the two they have; Triton "
       "answers 400 with no body", 400, 404, "sagemaker /invocations/", "sagemaker v2 path")
_known("SageMaker's multi-model endpoint routes are not served here (404 saying so); "
       "Triton's, not in multi-model mode, lists no models", 200, 404, "sagemaker GET /models")
_known("404s carry an error body here; Triton's are empty", 404, 404, "sagemaker GET /models/x",
       "sagemaker invoke", "multi-model describe another", "multi-model invoke another",
       "multi-model describe unloaded", "multi-model invoke unloaded",
       "multi-model unload again", differing=None)
_known("the multi-model routes' JSON answers are labelled application/json here; Triton "
       "labels them text/plain (their bodies are the same)", 200, 200,
       "multi-model list none", "multi-model load", "multi-model list", "multi-model describe",
       "multi-model unload", "multi-model list after", "multi-model load after unload",
       "multi-model load an ensemble", "multi-model unload the ensemble",
       differing=("content-type",))
_known("a model loaded by a name other than SageMaker's (X-Amzn-SageMaker-Target-Model) is "
       "listed here; Triton 2.51 asks whether a model of SageMaker's name is ready, and lists "
       "it as {}", 200, 200, "multi-model list with the ensemble", differing=None)
_known("a step model loaded from a multi-model archive and unloaded with its ensemble is no "
       "model here (404, its folder forgotten); Triton keeps it as one not ready (400)", 400,
       404, "multi-model step unloaded with it")
_known("a method a route does not take is 405 here, naming those it takes; Triton answers "
       "400 with no body", 400, 405, "multi-model PUT")


def _triton(venv: pathlib.Path, repo: pathlib.Path, work: pathlib.Path,
            ports: tuple[int, int, int, int], sagemaker: dict[str, str] | None = None,
            extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """tritonserver on `ports` (HTTP, gRPC, metrics, SageMaker: the last on 0.0.0.0, which
    Triton's SageMaker server always binds); `sagemaker`: its variables (default: the
    endpoint serves SAGEMAKER_MODEL); `extra`: more of its command line."""
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
           "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",  # the stub's python: numpy < 2
           **(sagemaker or _ONE_MODEL)}
    command = [str(home / "bin" / "tritonserver"), "--model-repository", str(repo),
               "--backend-directory", str(work / "backends"), "--model-control-mode",
               "explicit", "--load-model", "*", "--http-address", "127.0.0.1",
               "--http-port", str(ports[0]), "--grpc-address", "127.0.0.1", "--grpc-port",
               str(ports[1]), "--metrics-address", "127.0.0.1", "--metrics-port",
               str(ports[2]), "--exit-timeout-secs", "2", "--model-config-name", CONFIG_NAME,
               "--allow-sagemaker", "true", "--sagemaker-port", str(ports[3]), *extra]
    return subprocess.Popen(command, env=env, stdout=(work / "triton.log").open("wb"),
                            stderr=subprocess.STDOUT)


_ONE_MODEL = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": SAGEMAKER_MODEL}


def _tensorgate(repo: pathlib.Path, work: pathlib.Path, ports: tuple[int, int, int, int],
                sagemaker: dict[str, str] | None = None, extra: tuple[str, ...] = ()
                ) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tensorgate", "serve", "--model-repository", str(repo),
               "--model-control-mode", "explicit", "--load-model", "*",
               "--allow-shared-memory",  # off by default here, on in Triton
               "--allow-model-upload",  # off by default here, on in Triton's explicit mode
               "--model-config-name", CONFIG_NAME,
               "--http-port",
               str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
               "--allow-sagemaker", "true", "--sagemaker-port", str(ports[3]), *extra]
    return subprocess.Popen(command, stdout=(work / "tensorgate.log").open("wb"),
                            stderr=subprocess.STDOUT,
                            env={**os.environ, **(sagemaker or _ONE_MODEL)})


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
    if "json-header-size=" in headers.get("content-type", ""):  # SageMaker's binary answers
        length = headers["content-type"].rpartition("=")[2]
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
        if case.probe and status == 200:  # the probe model's report is what is compared
            document = json.loads(document["outputs"][0]["data"][0])
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


def _custom_metrics(port: int) -> tuple[Any, Any]:
    """The probe model's own metric families on /metrics, every line (their values too:
    both servers saw the same requests)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return "OK", sorted(line for line in text.splitlines()
                        if line.startswith(("probe_", "# HELP probe_", "# TYPE probe_")))


def _statistics_counts(port: int, model: str) -> dict[str, int]:
    """`model`'s statistics as counts, without their durations (which differ by nature),
    each batch size's executions as "batch N". Read until two reads 0.2 s apart agree (at
    most 5 s): a decoupled model's execute is counted once it has returned, which may be
    after its client has its responses, on either server."""
    def read() -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats",
                                    timeout=30) as answer:
            stats = json.loads(answer.read())["model_stats"][0]
        counts = {key: int(stats[key]) for key in ("inference_count", "execution_count")}
        counts.update((stage, int(stats["inference_stats"][stage]["count"]))
                      for stage in ("success", "fail", "queue", "compute_infer"))
        counts.update((f"batch {entry['batch_size']}", int(entry["compute_infer"]["count"]))
                      for entry in stats["batch_stats"])
        return counts

    counts, deadline = read(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = read()
        if again == counts:
            break
        counts = again
    return counts


def _counted_since(port: int, model: str, before: dict[str, int]) -> tuple[Any, Any]:
    """What `model`'s statistics counted since `before` (_statistics_counts): after the same
    requests, which the two servers counted as what."""
    now = _statistics_counts(port, model)
    return "OK", {key: value - before.get(key, 0) for key, value in now.items()
                  if value != before.get(key, 0) or key in ("success", "fail")}


def _grpc_outcome(stub: Any, case: Grpc) -> tuple[Any, Any]:
    import grpc
    from google.protobuf import json_format
    try:
        answer = getattr(stub, case.method)(case.message, timeout=30)
    except grpc.RpcError as error:
        return error.code().name, None
    document = json_format.MessageToDict(answer, always_print_fields_with_no_presence=True)
    raw = document.pop("rawOutputContents", None)
    if case.probe:  # the probe model's report: its one BYTES element, after its length
        return "OK", _masked(json.loads(answer.raw_output_contents[0][4:]), False)
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
            text = isinstance(value, str)
            given = grpcclient.InferInput("IN", [1], "BYTES" if text else "INT32")
            given.set_data_from_numpy(np.array([value.encode()], np.object_) if text
                                      else np.array([value], np.int32))
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


def _frames_outcome(port: int, case: Frames) -> tuple[Any, Any]:
    """How the connection ended ("GOAWAY <code>", or "open" after 3 s) and what came back
    but the server's own SETTINGS and window: PING answers' payloads, the GOAWAY's debug."""
    import socket

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (len(payload).to_bytes(3, "big") + bytes([kind, flags])
                + stream.to_bytes(4, "big") + payload)

    with socket.create_connection(("127.0.0.1", port), timeout=3.0) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")
                     + b"".join(frame(*one) for one in case.frames))
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
    acks: list[str] = []
    ending = "open"
    debug = ""
    while len(received) >= 9:
        length = int.from_bytes(received[:3], "big")
        kind, flags, payload = received[3], received[4], received[9:9 + length]
        received = received[9 + length:]
        if kind == 6 and flags & 1:
            acks.append(payload.hex())
        elif kind == 7:
            ending, debug = f"GOAWAY {int.from_bytes(payload[4:8], 'big')}", \
                payload[8:].decode(errors="replace")
    return ending, {"acks": acks, "debug": debug}


# -- running -----------------------------------------------------------------------------------

def _verdict(name: str, triton: tuple[Any, Any], ours: tuple[Any, Any]) -> str:
    """"same", "known: why" (a difference KNOWN or SUPERSET lists, and no other), or
    "DIFFERENT"."""
    if triton == ours:
        return "same"
    if name in SUPERSET and triton[0] == ours[0] and _covers(ours[1], triton[1]):
        return f"known: {SUPERSET[name]}"
    known = KNOWN.get(name)
    if known is None or (known[0], known[1]) != (triton[0], ours[0]):
        return "DIFFERENT"
    differing = known[3]
    if triton[0] == ours[0] and differing is not None:
        one, two = triton[1], ours[1]
        if "content-type" in differing:  # an HTTP answer's label: (document, tail, kind)
            one, two = one[:2], two[:2]
        if _without(one, differing) != _without(two, differing):
            return "DIFFERENT"  # more differs than the keys KNOWN names
    return f"known: {known[2]}"


def _differences(triton: Any, ours: Any, path: str) -> list[str]:
    """Where two answers (as compared) differ, a line each: the path to the value, and
    each server's value (or that only one has it)."""
    if isinstance(triton, dict) and isinstance(ours, dict):
        lines = []
        for key in sorted(set(triton) | set(ours), key=str):
            where = f"{path}/{key}"
            if key not in ours:
                lines.append(f"{where}: only Triton's: {json.dumps(triton[key], default=repr)}")
            elif key not in triton:
                lines.append(f"{where}: only ours: {json.dumps(ours[key], default=repr)}")
            else:
                lines += _differences(triton[key], ours[key], where)
        return lines
    if isinstance(triton, (list, tuple)) and isinstance(ours, (list, tuple)) and \
            len(triton) == len(ours) and not all(isinstance(v, str) for v in triton):
        return [line for index, (one, two) in enumerate(zip(triton, ours))
                for line in _differences(one, two, f"{path}[{index}]")]
    if triton == ours:
        return []
    return [f"{path or '/'}: Triton {json.dumps(triton, default=repr)} | ours "
            f"{json.dumps(ours, default=repr)}"]


def _covers(ours: Any, triton: Any) -> bool:
    """Whether `ours` holds all of `triton`: an object's every key with a value that covers
    Triton's, a list of names every name, a list of records (of equal lengths, each covering
    Triton's in turn; else each of Triton's equal to one of ours), anything else the same
    value."""
    if isinstance(triton, dict) and isinstance(ours, dict):
        return all(k in ours and _covers(ours[k], v) for k, v in triton.items())
    if isinstance(triton, (list, tuple)) and isinstance(ours, (list, tuple)):
        if all(isinstance(v, str) for v in (*triton, *ours)):
            return set(triton) <= set(ours)
        if len(triton) == len(ours):
            return all(map(_covers, ours, triton))
        return all(any(record == one for one in ours) for record in triton)
    return bool(ours == triton)


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


def _multi_model_rows(venv: pathlib.Path, repo: pathlib.Path, work: pathlib.Path,
                      show: Callable[[str, Any, Any], tuple[str, Any, Any, str]],
                      only: str) -> list[tuple[str, Any, Any, str]]:
    """SageMaker's multi-model endpoint routes, on two servers of their own started with an
    empty repository: a model loaded from a folder (as SageMaker unpacks one under
    /opt/ml/models/NAME/model), listed, called, loaded again, unloaded; an ensemble and its
    step from one archive."""
    work.mkdir()
    (work / "models").mkdir()
    root = work / "opt-ml-models"
    shutil.copytree(repo / "echo_int32", root / "h2" / "model" / "echo_int32")
    for model in ("ensemble_add", "add_sub"):  # an ensemble and its step
        shutil.copytree(repo / model, root / "h3" / "model" / model)
    cases = [case for case in multi_model_cases(root) if only in case.name]
    if not cases:
        return []
    ports = _free_ports(8)
    triton = _triton(venv, work / "models", work, (ports[0], ports[1], ports[2], ports[6]),
                     {})  # Triton's SageMaker server always has the routes
    ours = _tensorgate(work / "models", work, (ports[3], ports[4], ports[5], ports[7]),
                       {"SAGEMAKER_MULTI_MODEL": "true",
                        "TENSORGATE_SAGEMAKER_MODELS_ROOT": str(root)})
    try:
        _wait_ready(ports[0], triton, "tritonserver", work / "triton.log")
        _wait_ready(ports[3], ours, "tensorgate", work / "tensorgate.log")
        return [show(case.name, _http_outcome(ports[6], case), _http_outcome(ports[7], case))
                for case in cases]
    finally:
        _stop(triton)
        _stop(ours)


def _packed_outcome(port: int, case: Packed) -> tuple[Any, Any]:
    """The encoding the answer names ("identity" when none), and whether its one message is
    flagged compressed, and inflates (where flagged) to a message that parses."""
    if str(ROOT) not in sys.path:  # (the raw HTTP/2 client the tests use)
        sys.path.insert(0, str(ROOT))
    from tests.e2e import h2_client as h2
    from tritonclient.grpc import service_pb2 as pb

    client = h2.H2Client(port)
    try:
        extra = [] if case.accept is None else [("grpc-accept-encoding", case.accept)]
        headers, data = client.response(client.call(case.method, case.message, extra))
    finally:
        client.close()
    encoding = headers.get("grpc-encoding", "identity")
    body = data[5:]
    if data[:1] == b"\x01":
        body = zlib.decompress(body, 16 + zlib.MAX_WBITS if encoding == "gzip"
                               else zlib.MAX_WBITS)
    kind = {"ModelInfer": pb.ModelInferResponse, "ModelStreamInfer": pb.ModelStreamInferResponse,
            "ServerLive": pb.ServerLiveResponse}[case.method]
    kind.FromString(body)  # (raises where it does not parse)
    return encoding, {"status": headers.get("grpc-status"), "flagged": data[:1] == b"\x01"}


def _packed_rows(venv: pathlib.Path, repo: pathlib.Path, work: pathlib.Path,
                 show: Callable[[str, Any, Any], tuple[str, Any, Any, str]],
                 only: str) -> list[tuple[str, Any, Any, str]]:
    """--grpc-infer-response-compression-level: for each level, two servers of their own."""
    rows = []
    for level in ("low", "medium", "high"):
        cases = [case for case in packed_cases() if case.level == level and only in case.name]
        if not cases:
            continue
        folder = work / level
        folder.mkdir(parents=True)
        ports = _free_ports(8)
        flag = ("--grpc-infer-response-compression-level", level)
        triton = _triton(venv, repo, folder, (ports[0], ports[1], ports[2], ports[6]),
                         extra=flag)
        ours = _tensorgate(repo, folder, (ports[3], ports[4], ports[5], ports[7]), extra=flag)
        try:
            _wait_ready(ports[0], triton, "tritonserver", folder / "triton.log")
            _wait_ready(ports[3], ours, "tensorgate", folder / "tensorgate.log")
            rows += [show(case.name, _packed_outcome(ports[1], case),
                          _packed_outcome(ports[4], case)) for case in cases]
        finally:
            _stop(triton)
            _stop(ours)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triton-venv", type=pathlib.Path,
                        default=ROOT / "bench" / "peers" / ".venvs" / "triton",
                        help="where bench/peers/install.sh put nvidia-pytriton")
    parser.add_argument("--only", default="", help="only the cases whose name holds this")
    parser.add_argument("--show-same", action="store_true", help="list the same ones too")
    parser.add_argument("--show", action="store_true",
                        help="print where the answers of each case not the same differ (both "
                             "answers where the statuses differ)")
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
        write_repository(repo)
        ports = _free_ports(8)
        triton = _triton(args.triton_venv, repo, work, (ports[0], ports[1], ports[2], ports[6]))
        ours = _tensorgate(repo, work, (ports[3], ports[4], ports[5], ports[7]))
        rows: list[tuple[str, Any, Any, str]] = []
        crashed: list[tuple[str, int | None, str]] = []
        running = [""]  # the case being sent, for a server that dies on it
        try:
            _wait_ready(ports[0], triton, "tritonserver", work / "triton.log")
            _wait_ready(ports[3], ours, "tensorgate", work / "tensorgate.log")
            stubs = [service_pb2_grpc.GRPCInferenceServiceStub(
                grpc.insecure_channel(f"127.0.0.1:{port}")) for port in (ports[1], ports[4])]

            def compare(name: str, outcome: Callable[[int], tuple[Any, Any]]) -> None:
                """Case `name`'s outcome from Triton (0) and tensorgate (1), its verdict."""
                if args.only in name:
                    running[0] = name
                    one, two = outcome(0), outcome(1)
                    rows.append((name, one, two, _verdict(name, one, two)))

            http_ports, grpc_ports = (ports[0], ports[3]), (ports[1], ports[4])
            counted = [_statistics_counts(port, "probe") for port in http_ports]
            for case in http_cases() + probe_cases():
                compare(case.name, lambda at: _http_outcome(http_ports[at], case))
            compare("probe statistics after its answers",
                    lambda at: _counted_since(http_ports[at], "probe", counted[at]))
            keys, handles = _shm_regions()
            try:
                for case in shm_cases(keys):
                    compare(case.name, lambda at: _http_outcome(http_ports[at], case))
            finally:
                _shm_release(handles)
            marker = repo / "fragile" / "fail"
            for case in failure_cases():
                if case.name == "a failed load":
                    marker.touch()
                elif case.name == "a load that works again":
                    marker.unlink(missing_ok=True)
                compare(case.name, lambda at: _http_outcome(http_ports[at], case))
            compare("metrics", lambda at: _metrics_outcome((ports[2], ports[5])[at]))
            compare("custom metrics", lambda at: _custom_metrics((ports[2], ports[5])[at]))
            streamed = ("stream_probe", "stream_count", "int_double")
            before = {model: [_statistics_counts(port, model) for port in http_ports]
                      for model in streamed}
            for stream in stream_cases():
                compare(stream.name,
                        lambda at: _stream_outcome(f"127.0.0.1:{grpc_ports[at]}", stream))
            for model in streamed:
                compare(f"{model} statistics after its streams",
                        lambda at: _counted_since(http_ports[at], model, before[model][at]))
            for grpc_case in grpc_cases():
                compare(grpc_case.name, lambda at: _grpc_outcome(stubs[at], grpc_case))
            for frames in frames_cases():
                compare(frames.name, lambda at: _frames_outcome(grpc_ports[at], frames))
            for case in sagemaker_cases():
                compare(case.name, lambda at: _http_outcome((ports[6], ports[7])[at], case))
            for case in upload_cases():
                compare(case.name, lambda at: _http_outcome(http_ports[at], case))
            for grpc_case in grpc_upload_cases():
                compare(grpc_case.name, lambda at: _grpc_outcome(stubs[at], grpc_case))
            rows += _multi_model_rows(args.triton_venv, repo, work / "multi-model",
                                      lambda name, one, two: (name, one, two,
                                                              _verdict(name, one, two)),
                                      args.only)
            rows += _packed_rows(args.triton_venv, repo, work / "compression",
                                 lambda name, one, two: (name, one, two,
                                                         _verdict(name, one, two)),
                                 args.only)
        except Exception:  # noqa: BLE001 - a dead server's connection fails any which way
            time.sleep(2)  # a server that dropped the connection as it died has exited now
            if triton.poll() is None and ours.poll() is None:
                raise
        finally:
            crashed = [(what, process.returncode, log) for what, process, log in (
                ("tritonserver", triton, "triton.log"), ("tensorgate", ours, "tensorgate.log"))
                if process.poll() is not None]
            _stop(triton)
            _stop(ours)
            if crashed or any(row[3] == "DIFFERENT" for row in rows):
                for log in ("triton.log", "tensorgate.log"):
                    shutil.copy(work / log, pathlib.Path(tempfile.gettempdir()) /
                                f"triton-diff-{log}")
    for what, code, log in crashed:  # what came after its end means nothing
        print(f"{what} exited ({code}) during the run, at or before case '{running[0]}': see "
              f"{pathlib.Path(tempfile.gettempdir()) / f'triton-diff-{log}'}")
    if crashed:
        return 3
    width = max((len(row[0]) for row in rows), default=4)
    print(f"{'case':{width}}  {'Triton':>16}  {'tensorgate':>16}  verdict")
    for name, one, two, verdict in rows:
        if args.show_same or verdict != "same":
            print(f"{name:{width}}  {one[0]!s:>16}  {two[0]!s:>16}  {verdict}")
        if args.show and verdict != "same":
            if one[0] != two[0]:
                for server, outcome in (("Triton", one), ("tensorgate", two)):
                    print(f"    {server}: {json.dumps(outcome[1], default=repr)[:2000]}")
            for line in _differences(one[1], two[1], ""):
                print(f"    {line[:2000]}")
    counts = {kind: sum(row[3].startswith(kind) for row in rows)
              for kind in ("same", "known", "DIFFERENT")}
    print(f"{len(rows)} cases: {counts['same']} the same, {counts['known']} known and "
          f"deliberate, {counts['DIFFERENT']} unexplained")
    return 1 if counts["DIFFERENT"] else 0


if __name__ == "__main__":
    sys.exit(main())
