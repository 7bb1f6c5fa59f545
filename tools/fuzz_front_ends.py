"""Coverage-guided fuzzing of the HTTP/1.1 and gRPC (HTTP/2) front ends, over real sockets.

The server runs in this process (on its own thread and loop), so that atheris sees which of
its lines each input reached; each input is a connection on 127.0.0.1: requests or frames
made from the fuzzer's bytes — mostly well formed, so that inputs get past the first check —
sent, answered, then the connection dropped. System shared memory is on, with a region of the
harness's own that inputs register at offsets and sizes in it, at its edges and past them, and
name as their tensors' place; CUDA regions are registered too, with handles of the right
length and others, device ids and sizes at and past their edges (the server has no GPU here:
what it checks before opening a handle). Model control is explicit and uploads are allowed:
inputs load, upload (files at paths in the model's folder and out of it, in base64 short and
long enough to be decoded in slices, and not base64) and unload the models `up` (not in the
repository) and `spare` (a copy of `ident`). A finding is anything the server did not mean: an
exception it logged as unexpected (any record with a traceback), an exception the loop caught,
more HTTP requests run on an input's connection than it framed as their bytes are (one run
twice, or a body's bytes run as a request: where one ended was misread), the server no longer
answering a plain request on a connection of its own, or, every 500 inputs
(TG_FUZZ_CHECK_EVERY), anything held once every connection has closed (held_after_quiet), an
upload's folder among them; automatic collections are off, so that a check sees every
reference cycle made since the last. `grpc-tls` sends the gRPC inputs over TLS
(the server has --grpc-use-ssl, with a test CA's certificate): the ssl layer's reads and writes
in place of the plain socket's, and one input in eight sent in plaintext to the TLS port (a
handshake that fails).

    .venv/bin/python tools/fuzz_front_ends.py grpc -max_total_time=600 [corpus folder]
    .venv/bin/python tools/fuzz_front_ends.py http -max_total_time=600 [corpus folder]
    .venv/bin/python tools/fuzz_front_ends.py grpc-tls -max_total_time=600 [corpus folder]

A run's RSS grows (283 to 645 MB in 600 s of http): atheris 3.0.0's hook on `==` keeps
each result of comparing a numpy array (`(a == 3).any()` on a 1 MB array, instrumented, grew
RSS 300 MB in 300 calls; `np.equal(a, 3)` nothing), as load_body.py's scan for quotes does.
Nothing else grew so: replaying the http corpus four times, the objects the collector
tracks did not grow after the first pass, and 31.3 MB of a pass's 31.4 MB traced growth was
those two comparisons'; uninstrumented, 6,000 load bodies left nothing traced.

Arguments after the front end's name are libFuzzer's (atheris comes with the test extra on
Linux x86_64). A finding stops the run with the input that made it written to crash-<hash>
(libFuzzer's own file), and replaying that file (`tools/fuzz_front_ends.py grpc
crash-<hash>`) shows it again. The saved corpora, tests/testdata/fuzz/{http,grpc}, are
replayed by the suite (tests/network/test_fuzz_corpus.py); after a run has found more, merge
its corpus into them, keeping only inputs that add coverage (libFuzzer runs this file again
for it, the front end passed on in TG_FUZZ_FRONT_END):

    mkdir /tmp/merged && .venv/bin/python tools/fuzz_front_ends.py http -merge=1 /tmp/merged \
        tests/testdata/fuzz/http MY_CORPUS && rm -r tests/testdata/fuzz/http \
        && mv /tmp/merged tests/testdata/fuzz/http
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import os
import pathlib
import shlex
import shutil
import socket
import ssl
import struct
import sys
import tempfile
import threading
import time
from multiprocessing import shared_memory
from typing import Any

import atheris

with atheris.instrument_imports(include=["tensorgate"]):
    from tensorgate.config import ServerConfig
    from tensorgate.network.http2 import Http2Connection
    from tensorgate.server import Server
    from tensorgate.tensor.pool import default_pool

import hpack  # noqa: E402
import torch  # noqa: E402
import trustme  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.garbage import cyclic_garbage  # noqa: E402
TESTDATA = HERE.parent / "tests" / "testdata" / "triton_python"
MODELS = ["ident", "add_sub", "repeat", "seq", "pair", "bls", "nope", ""]
INPUT_NAMES = ["INPUT__0", "INPUT0", "INPUT1", "IN", "X", "x"]
DATATYPES = ["FP32", "INT32", "BYTES", "BOOL", "FP16", "BF16", "INT64", "UINT8", "X", ""]
# Each model's inputs as its config has them (name, datatype, shape): half the inference
# requests to such a model are made of them, values from the input, so that they reach its
# execute and answers (made of random names and shapes, hardly any did: a Triton Python
# model's answered requests were never run, and the cycle each left went unseen)
WELL_FORMED: dict[str, list[tuple[str, str, list[int]]]] = {
    "ident": [("INPUT__0", "FP32", [1, 4])], "seq": [("INPUT__0", "FP32", [1, 4])],
    "pair": [("IN", "FP32", [1, 4])], "bls": [("X", "FP32", [4])],
    "add_sub": [("INPUT0", "FP32", [1, 4]), ("INPUT1", "FP32", [1, 4])],
    "repeat": [("IN", "INT32", [1])]}  # (IN: how many responses, negative for errors)


# -- the server --------------------------------------------------------------------------------

class Findings(logging.Handler):
    """What the server did not mean: a record with a traceback, or one the loop caught."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.found.append(self.format(record))

    def loop_caught(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        self.found.append(f"the loop caught: {context.get('message')} {error!r}")


class _Ident(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def write_repository(root: pathlib.Path) -> None:
    """ident (TorchScript, FP32 [-1], batching), seq (the same, sequence batching), pair (an
    ensemble of ident twice) and three Triton Python models of tests/testdata: add_sub, the
    decoupled repeat and bls (which calls them)."""
    folder = root / "ident" / "1"
    folder.mkdir(parents=True)
    torch.jit.script(_Ident()).save(str(folder / "model.pt"))
    (root / "ident" / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'dynamic_batching { }\n')
    seq = root / "seq" / "1"
    seq.mkdir(parents=True)
    shutil.copy(folder / "model.pt", seq / "model.pt")
    (root / "seq" / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'sequence_batching { max_sequence_idle_microseconds: 2000000 }\n')
    (root / "pair" / "1").mkdir(parents=True)
    step = ('{{ model_name: "ident" model_version: -1 input_map {{ key: "INPUT__0" value: "{}" }}'
            ' output_map {{ key: "OUTPUT__0" value: "{}" }} }}')
    (root / "pair" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f'ensemble_scheduling {{ step [ {step.format("IN", "MID")}, '
        f'{step.format("MID", "OUT")} ] }}\n')
    for name in ("add_sub", "repeat", "bls"):
        shutil.copytree(TESTDATA / name, root / name)
    shutil.copytree(root / "ident", root / "spare")


SHM_KEY = f"tg_fuzz_{os.getpid()}"  # the region inputs register (and misregister)
SHM_BYTES = 4096
_region: list[shared_memory.SharedMemory] = []  # held for the run


_ROOT_PREFIX = "tg-fuzz-"  # then the pid of the run that made it


def _remove_stale_roots() -> None:
    """Remove the repositories (and uploads) of earlier runs whose process is gone: libFuzzer
    ends a run with C's exit(), which runs no Python cleanup, so each run left its folder."""
    for folder in pathlib.Path(tempfile.gettempdir()).glob(f"{_ROOT_PREFIX}*-*"):
        pid = folder.name[len(_ROOT_PREFIX):].split("-", 1)[0]
        if pid.isdecimal() and not pathlib.Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def start_server(findings: Findings, tls: ssl.SSLContext | None = None) -> Server:
    """The server, started on a thread of its own; with `tls` (a client context), gRPC over
    TLS with a certificate `tls` trusts."""
    _remove_stale_roots()
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}-"))
    write_repository(root)
    certificates: dict[str, Any] = {}
    if tls is not None:
        ca = trustme.CA()
        ca.configure_trust(tls)
        issued = ca.issue_cert("127.0.0.1")
        certificates = {"grpc_use_ssl": True, "grpc_server_cert": root / "server.pem",
                        "grpc_server_key": root / "server.key"}
        for i, blob in enumerate(issued.cert_chain_pems):
            blob.write_to_path(str(root / "server.pem"), append=i > 0)
        issued.private_key_pem.write_to_path(str(root / "server.key"))
    region = shared_memory.SharedMemory(SHM_KEY, create=True, size=SHM_BYTES)
    region.buf[:] = bytes(range(256)) * (SHM_BYTES // 256)
    _region.append(region)
    # Removed at exit by multiprocessing's resource tracker, which says so ("1 leaked
    # shared_memory objects to clean up"): libFuzzer ends the process with C's exit(), which
    # runs no Python atexit handler, so an unlink registered there never ran.
    tempfile.tempdir = str(root / "tmp")  # where uploads go: held_after_quiet counts them
    os.mkdir(tempfile.tempdir)
    server = Server(ServerConfig(model_repository=(root,), http_port=0, grpc_port=0,
                                 metrics_port=0, allow_metrics=False, log_level="ERROR",
                                 read_timeout_s=2.0, allow_shared_memory=True,
                                 model_control_mode="explicit", load_models=("*",),
                                 allow_model_upload=True, **certificates))
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("tensorgate").addHandler(findings)
    started = threading.Event()

    def main() -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(findings.loop_caught)
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    threading.Thread(target=main, name="server", daemon=True).start()
    if not started.wait(120):
        raise RuntimeError("the server did not start")
    return server


def exchange(port: int, data: bytes, done: Any = None, quiet_s: float = 0.01,
             limit_s: float = 1.0, tls: ssl.SSLContext | None = None) -> bytes:
    """Send `data` on a new connection (over TLS with `tls`); read until `done(answer)` and
    then `quiet_s` without bytes (or the server closes, or `limit_s`); drop the connection
    (over TLS, without a close_notify)."""
    answer = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as plain:
        _CLIENT_PORT[0] = plain.getsockname()[1]
        sock = plain
        if tls is not None:
            plain.settimeout(10.0)  # a bound for a busy server, as still_serving's
            try:
                sock = tls.wrap_socket(plain, server_hostname="127.0.0.1")
            except OSError as error:  # a server that serves completes every handshake
                raise RuntimeError(f"TLS handshake failed: {error!r}") from error
            sock.settimeout(limit_s)
        try:
            sock.sendall(data)
        except OSError:  # refused midway: what it answered is still read
            pass
        deadline = time.monotonic() + limit_s
        finished = done is None
        while time.monotonic() < deadline:
            sock.settimeout(quiet_s if finished else max(0.001, deadline - time.monotonic()))
            try:
                chunk = sock.recv(1 << 16)
            except socket.timeout:
                if finished:
                    break
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
            finished = finished or done(answer)
    return bytes(answer)


_PLAIN = (b"POST /v2/models/ident/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n%s")
_PLAIN_BODY = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3], "datatype": "FP32",
                                      "data": [1, 2, 3]}]}).encode()


def still_serving(port: int) -> str | None:
    """None if `ident` answers a plain request exactly, else what went wrong."""
    try:
        answer = exchange(port, _PLAIN % (len(_PLAIN_BODY), _PLAIN_BODY),
                          lambda got: b"}]}" in got, quiet_s=0.0, limit_s=10.0)
    except OSError as error:
        return f"a plain request failed: {error!r}"
    if not answer.startswith(b"HTTP/1.1 200") or b"[1.0,2.0,3.0]" not in answer:
        return f"a plain request was answered {answer[:300]!r}"
    return None


# inputs between checks that nothing is held once all have gone (TG_FUZZ_CHECK_EVERY=1: after
# every input, slower, to tell which input made what a check found)
HELD_CHECK_EVERY = int(os.environ.get("TG_FUZZ_CHECK_EVERY", "500"))


def held_after_quiet(server: Server, wait_s: float = 5.0) -> str | None:
    """None once every connection has closed and every pooled buffer is back (within
    `wait_s`: a closing connection lingers up to 2 s), and nothing of tensorgate's waits in
    a reference cycle for the collector (the server freezes the GC's generations after
    loading: what a cycle holds waits for a collection, which is a pause); else what is
    held."""
    cycles = _cycles()  # before anything else, so that the inputs since the last check
    if cycles is not None:  # are all that may have made them
        return f"garbage in reference cycles: {cycles}"
    deadline = time.monotonic() + wait_s
    fronts = server.front_ends()
    while True:
        open_ = sum(front.budget.open for front in fronts)
        in_use = default_pool().statistics().bytes_in_use
        engine = server.engine
        queued = 0 if engine is None else sum(map(engine.pending, engine.model_names()))
        # (a load the input began may still run: its folder goes when it fails)
        folders = len(list(pathlib.Path(tempfile.gettempdir()).glob("tensorgate-upload-*")))
        served = 0 if engine is None else len(engine.upload_folders())
        if not (open_ or in_use or queued) and folders == served:
            return None
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if folders != served:
        return (f"{wait_s} s after the last input: {folders} upload folders on disk for "
                f"{served} models served from uploads")
    cycles = _cycles()
    if not default_pool().statistics().bytes_in_use and not open_ and not queued:
        return f"{in_use} pooled bytes were held by a reference cycle ({cycles})"
    return (f"{wait_s} s after the last input: {open_} connections open, {in_use} pooled "
            f"bytes in use, {queued} requests queued")


def _cycles() -> str | None:
    """What of tensorgate's a collection finds unreachable (in a reference cycle, or held
    by one), by type; None if nothing."""
    found = cyclic_garbage(_failed_handshakes)
    return ", ".join(f"{n} {name}" for name, n in found.most_common()) or None


def _failed_handshakes(garbage: list[Any]) -> set[int]:
    """The protocols (and what they hold) of TLS handshakes that failed, which asyncio's loop
    keeps in a cycle of its own: the failure is set on the handshake's waiter future, and
    raised in `_accept_connection2`, whose frame (with the protocol a local) the exception's
    traceback then holds, and the waiter the exception. uvloop, the server's default loop,
    keeps none (20 failed handshakes: none held there, 20 on asyncio's loop). A protocol that
    never saw its connection made (not `tls`) is all tensorgate has in it."""
    spared: set[int] = set()
    for item in garbage:
        if type(item).__name__ == "frame" and item.f_code.co_name == "_accept_connection2":
            protocol = item.f_locals.get("protocol")
            if isinstance(protocol, Http2Connection) and not protocol.tls:
                spared |= {id(protocol)} | {id(value) for value in vars(protocol).values()}
    return spared


# -- what an input becomes -----------------------------------------------------------------------

def _choice(fdp: atheris.FuzzedDataProvider, options: list[Any]) -> Any:
    return options[fdp.ConsumeIntInRange(0, len(options) - 1)]


def _well_formed(fdp: atheris.FuzzedDataProvider, model: str
                 ) -> list[tuple[str, str, list[int], list[float] | list[int]]]:
    """`model`'s inputs (WELL_FORMED) with values from the input: quarters from -25 to 25,
    INT32 from -3 to 5 (repeat sends that many responses)."""
    made: list[tuple[str, str, list[int], list[float] | list[int]]] = []
    for name, datatype, shape in WELL_FORMED[model]:
        count = shape[-1]
        values: list[float] | list[int] = (
            [fdp.ConsumeIntInRange(-3, 5) for _ in range(count)] if datatype == "INT32"
            else [fdp.ConsumeIntInRange(-100, 100) / 4 for _ in range(count)])
        made.append((name, datatype, shape, values))
    return made


def _raw(datatype: str, values: list[float] | list[int]) -> bytes:
    return struct.pack(f"<{len(values)}{'i' if datatype == 'INT32' else 'f'}", *values)


def _shape(fdp: atheris.FuzzedDataProvider) -> list[int]:
    return [_choice(fdp, [1, 2, 3, 0, -1, 4, 2**31, 2**62])
            for _ in range(fdp.ConsumeIntInRange(0, 3))]


def _json_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 2 else 4)
    if kind == 0:
        return fdp.ConsumeIntInRange(-3, 300)
    if kind == 1:
        return fdp.ConsumeRegularFloat()
    if kind == 2:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 8))
    if kind == 3:
        return _choice(fdp, [True, False, None])
    if kind == 4:
        return fdp.ConsumeIntInRange(-2**63, 2**64)
    if kind in (5, 6):
        return [_json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {_choice(fdp, ["a", "binary_data_size", "shape", "datatype", "data"]):
            _json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}


def _register_body(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    """Mostly our region, at offsets and sizes in it, at its edges and past them."""
    if fdp.ConsumeProbability() < 0.2:
        return {_choice(fdp, ["key", "offset", "byte_size"]): _json_value(fdp)
                for _ in range(fdp.ConsumeIntInRange(0, 3))}
    edges = [0, 1, 12, 64, SHM_BYTES - 12, SHM_BYTES - 1, SHM_BYTES, SHM_BYTES + 1, 2**63]
    return {"key": _choice(fdp, [SHM_KEY, "/" + SHM_KEY, SHM_KEY + "x", "../" + SHM_KEY]),
            "offset": _choice(fdp, edges), "byte_size": _choice(fdp, edges)}


def _cuda_register_fields(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    """A CUDA region's registration: a handle of the right length and of others, device ids
    and sizes at and past their edges (this server has no GPU: what is checked before)."""
    handle = _choice(fdp, [bytes(range(64)), bytes(63), bytes(65), b"", None])
    return {"raw_handle": handle,
            "device_id": _choice(fdp, [0, 0, 1, -1, 2**63, "0", None]),
            "byte_size": _choice(fdp, [0, 4, SHM_BYTES, 2**40, -1, None])}


def _cuda_register_body(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    """_cuda_register_fields as Triton's JSON has them: the handle as {"b64": base64}."""
    fields = _cuda_register_fields(fdp)
    handle = fields.pop("raw_handle")
    way = fdp.ConsumeIntInRange(0, 3)
    if handle is not None and way < 2:
        fields["raw_handle"] = {"b64": base64.b64encode(handle).decode()}
    elif way == 2:
        fields["raw_handle"] = {"b64": _choice(fdp, ["not base64!", "QUJD", "", 7])}
    elif handle is not None:
        fields["raw_handle"] = _json_value(fdp)
    return {key: value for key, value in fields.items() if value is not None}


def _region_parameters(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    """A tensor's place in a registered region (Triton's shared-memory extension)."""
    place: dict[str, Any] = {"shared_memory_region": _choice(fdp, ["r", "r", "s", "c", ""])}
    if fdp.ConsumeBool():
        place["shared_memory_offset"] = _choice(fdp, [0, 4, 12, 4000, SHM_BYTES, -4])
    if fdp.ConsumeProbability() < 0.9:
        place["shared_memory_byte_size"] = _choice(fdp, [0, 4, 12, 48, SHM_BYTES, 2**40])
    return place


def _tensor_json(fdp: atheris.FuzzedDataProvider, tail: list[bytes]) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": _choice(fdp, INPUT_NAMES),
                              "datatype": _choice(fdp, DATATYPES), "shape": _shape(fdp)}
    if fdp.ConsumeProbability() < 0.2:  # its bytes in shared memory
        tensor["parameters"] = _region_parameters(fdp)
    elif fdp.ConsumeBool():
        data = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
        tail.append(data)
        size = len(data) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-1, 80)
        tensor["parameters"] = {"binary_data_size": size}
    else:
        tensor["data"] = _json_value(fdp)
    if fdp.ConsumeProbability() < 0.2:
        tensor[_choice(fdp, ["parameters", "shape", "data", "extra"])] = _json_value(fdp)
    return tensor


def _infer_body(fdp: atheris.FuzzedDataProvider, model: str) -> tuple[bytes, int | None]:
    """A JSON inference request for `model`, with binary tensor data after it or not; and
    the JSON's length (the Inference-Header-Content-Length) where there is binary data."""
    tail: list[bytes] = []
    header: dict[str, Any] = {}
    well_formed = model in WELL_FORMED and fdp.ConsumeBool()
    if well_formed:
        header["inputs"] = []
        for name, datatype, shape, values in _well_formed(fdp, model):
            tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
            if fdp.ConsumeBool():
                tail.append(_raw(datatype, values))
                tensor["parameters"] = {"binary_data_size": len(tail[-1])}
            else:
                tensor["data"] = values
            header["inputs"].append(tensor)
    else:
        header["inputs"] = [_tensor_json(fdp, tail) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if well_formed and fdp.ConsumeProbability() < 0.7:  # mostly as it is: random outputs,
        return _body(fdp, header, tail)  # parameters and ids are seldom the model's
    if fdp.ConsumeBool():
        header["outputs"] = [{"name": _choice(fdp, ["OUTPUT__0", "OUTPUT0", "OUT", "y"]),
                              "parameters": _region_parameters(fdp)
                              if fdp.ConsumeProbability() < 0.3 else
                              {_choice(fdp, ["binary_data", "classification"]):
                               _json_value(fdp)}}
                             for _ in range(fdp.ConsumeIntInRange(0, 2))]
    if fdp.ConsumeBool():
        header["parameters"] = {_choice(fdp, ["sequence_id", "priority", "timeout",
                                              "binary_data_output", "x"]): _json_value(fdp)}
    if fdp.ConsumeBool():
        header["id"] = _json_value(fdp)
    return _body(fdp, header, tail)


def _body(fdp: atheris.FuzzedDataProvider, header: dict[str, Any], tail: list[bytes]
          ) -> tuple[bytes, int | None]:
    """The request's JSON (cut or spoiled, one time in ten) and the binary data after it;
    and the JSON's length where there is binary data."""
    text = json.dumps(header).encode()
    if fdp.ConsumeProbability() < 0.1:  # cut or spoiled
        text = text[:fdp.ConsumeIntInRange(0, len(text))] + fdp.ConsumeBytes(4)
    return text + b"".join(tail), len(text) if tail else None


HTTP_PATHS = ["/v2/models/ident/infer", "/v2/models/ident/versions/1/infer",
              "/v2/models/add_sub/infer", "/v2/models/repeat/infer",
              "/v2/models/repeat/generate_stream", "/v2/models/ident/generate",
              "/v2/models/seq/infer", "/v2/models/pair/infer", "/v2/models/bls/infer",
              "/v2/models/nope/infer", "/v2", "/v2/health/ready", "/v2/health/live",
              "/v2/models/ident", "/v2/models/ident/config", "/v2/models/ident/ready",
              "/v2/models/ident/stats", "/v2/models/stats", "/v2/repository/index",
              "/v2/systemsharedmemory/status", "/v2/systemsharedmemory/region/r/register",
              "/v2/systemsharedmemory/region/r/unregister", "/v2/cudasharedmemory/status",
              "/v2/cudasharedmemory/region/c/register",
              "/v2/cudasharedmemory/region/c/unregister",
              "/v2/trace/setting", "/v2/logging", "/", "/v2/models//infer",
              "/v2/repository/models/up/load", "/v2/repository/models/up/load",
              "/v2/repository/models/up/unload", "/v2/repository/models/spare/load",
              "/v2/repository/models/spare/unload", "/v2/repository/models/nope/load",
              "/v2/models/up/infer", "/v2/models/spare/infer"]
METHODS = [b"POST", b"GET", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"P\x00ST"]
# setting calls that would change the server for later inputs (a log or trace file) are
# read only: GET
_READ_ONLY = ("/v2/trace/setting", "/v2/logging")


_CLIENT_PORT = [0]  # the local port of exchange's latest connection
# How many requests the last http_input framed as their bytes are (each Content-Length its
# body's, every chunked body ended, nothing appended): the server may run no more of them
# (one it ran twice, or bytes of a body it ran as a request, misread where one ended); None
# where the input's framing is its own to read.
_HTTP_FRAMED: list[int | None] = [None]


def http_input(data: bytes) -> bytes:
    fdp = atheris.FuzzedDataProvider(data)
    out = bytearray()
    count = fdp.ConsumeIntInRange(1, 3)
    framed = True
    for _ in range(count):
        if fdp.ConsumeProbability() < 0.1:  # empty lines, which may come before a request
            out += _choice(fdp, [b"\r\n", b"\n"]) * fdp.ConsumeIntInRange(1, 200)
        path = _choice(fdp, HTTP_PATHS)
        method = _choice(fdp, METHODS)
        if path in _READ_ONLY and method != b"GET":
            method = b"GET"
        if fdp.ConsumeProbability() < 0.1:
            path += fdp.ConsumeUnicodeNoSurrogates(6)
        if path.startswith("/v2/cudasharedmemory/") and path.endswith("register"):
            body = json.dumps(_cuda_register_body(fdp)).encode()
            json_length = None
        elif path.endswith("register"):
            body = json.dumps(_register_body(fdp)).encode()
            json_length = None
        elif path.endswith("/load") or path.endswith("/unload"):
            body = _load_body(fdp)
            json_length = None
        elif path.endswith("generate") or path.endswith("generate_stream"):
            body = json.dumps({_choice(fdp, ["IN", "text_input", "parameters", "id"]):
                               _json_value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))}
                              ).encode()
            json_length = None
        else:
            body, json_length = _infer_body(fdp, path.split("/")[3] if path.startswith(
                "/v2/models/") else "")
        headers = [b"Host: 127.0.0.1"]
        if json_length is not None and fdp.ConsumeProbability() < 0.9:
            value = json_length if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-1, len(body) + 2)
            headers.append(b"Inference-Header-Content-Length: %d" % value)
        encoding = _choice(fdp, [None, None, None, "gzip", "deflate", "br"])
        if encoding is not None:
            import gzip
            import zlib
            body = gzip.compress(body) if encoding == "gzip" else \
                zlib.compress(body) if encoding == "deflate" else body
            if fdp.ConsumeProbability() < 0.2:
                body = body[:fdp.ConsumeIntInRange(0, len(body))]
            headers.append(b"Content-Encoding: " + encoding.encode())
        if fdp.ConsumeBool():
            headers.append(b"Accept-Encoding: " + _choice(fdp, [b"gzip", b"deflate", b"x"]))
        if fdp.ConsumeProbability() < 0.2:
            headers.append(b"Expect: 100-continue")
        if fdp.ConsumeProbability() < 0.2:
            headers.append(b"Connection: " + _choice(fdp, [b"close", b"keep-alive", b"upgrade"]))
        if fdp.ConsumeProbability() < 0.1:
            headers.append(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)))
            framed = False  # (a second Content-Length, a Transfer-Encoding: refused or not)
        if fdp.ConsumeProbability() < 0.2:  # heads of any length: reads of 256 bytes end
            headers.append(b"X-Pad: " + b"p" * fdp.ConsumeIntInRange(0, 300))  # anywhere
        chunked = fdp.ConsumeProbability() < 0.2
        if chunked:
            headers.append(b"Transfer-Encoding: chunked")
            pieces, at = [], 0
            while at < len(body):
                size = fdp.ConsumeIntInRange(1, 64)
                pieces.append(b"%x\r\n%s\r\n" % (size, body[at:at + size]))
                at += size
            ended = fdp.ConsumeProbability() < 0.9
            body = b"".join(pieces) + (b"0\r\n\r\n" if ended else b"")
            framed = framed and ended
        else:
            length = len(body) if fdp.ConsumeProbability() < 0.9 else \
                fdp.ConsumeIntInRange(0, len(body) + 8)
            headers.append(b"Content-Length: %d" % length)
            framed = framed and length == len(body)
        out += method + b" " + path.encode("utf-8", "replace") + b" HTTP/1.1\r\n"
        out += b"\r\n".join(headers) + b"\r\n\r\n" + body
    if fdp.ConsumeProbability() < 0.1:  # all of it again, past the requests in a row that
        times = fdp.ConsumeIntInRange(2, 40)  # a connection answers before the loop turns
        out *= times
        count *= times
    if fdp.ConsumeProbability() < 0.1:  # raw bytes after it all
        out += fdp.ConsumeBytes(64)
        framed = False
    _HTTP_FRAMED[0] = count if framed else None
    return bytes(out)


def count_dispatches() -> list[int]:
    """A counter of the HTTP requests the server has parsed whole and started to answer on
    the connection of the input being sent (not one an earlier input left behind)."""
    from tensorgate.network import http
    counted = [0]
    dispatch = http._Connection._dispatch

    def counting(connection: Any) -> None:
        if connection.transport.get_extra_info("peername")[1] == _CLIENT_PORT[0]:
            counted[0] += 1
        dispatch(connection)

    http._Connection._dispatch = counting
    return counted


# -- gRPC over HTTP/2 --------------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SERVICE = "/inference.GRPCInferenceService/"
GRPC_METHODS = ["ModelInfer", "ModelStreamInfer", "ServerLive", "ServerReady", "ModelReady",
                "ServerMetadata", "ModelMetadata", "ModelConfig", "ModelStatistics",
                "RepositoryIndex", "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
                "SystemSharedMemoryUnregister", "RepositoryModelLoad",
                "RepositoryModelLoad", "RepositoryModelUnload",
                "CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
                "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings", "Nope"]
_PING_MARK = b"tg-fuzz!"
MOST_PIECES = 4096  # DATA frames a message is sent in, at most (grpc_input)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream & 0xFFFFFFFF) + payload


def _infer_message(fdp: atheris.FuzzedDataProvider, method: str) -> bytes:
    if method in ("ModelInfer", "ModelStreamInfer"):
        model = _choice(fdp, MODELS)
        request = pb.ModelInferRequest(model_name=model,
                                       model_version=_choice(fdp, ["", "1", "2", "x"]),
                                       id=_choice(fdp, ["", "a", "b"]))
        if model in WELL_FORMED and fdp.ConsumeBool():
            for name, datatype, shape, values in _well_formed(fdp, model):
                request.inputs.add(name=name, datatype=datatype, shape=shape)
                request.raw_input_contents.append(_raw(datatype, values))
        for _ in range(0 if request.inputs else fdp.ConsumeIntInRange(0, 3)):
            tensor = request.inputs.add(name=_choice(fdp, INPUT_NAMES),
                                        datatype=_choice(fdp, DATATYPES))
            tensor.shape.extend(_shape(fdp))
            way = fdp.ConsumeIntInRange(0, 3)
            if way == 0:
                request.raw_input_contents.append(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 48)))
            elif way == 1:
                tensor.contents.fp32_contents.extend(
                    fdp.ConsumeRegularFloat() for _ in range(fdp.ConsumeIntInRange(0, 8)))
            elif way == 2:
                tensor.contents.int_contents.extend(
                    fdp.ConsumeIntInRange(-2**31, 2**31 - 1)
                    for _ in range(fdp.ConsumeIntInRange(0, 8)))
            else:
                tensor.contents.bytes_contents.extend(
                    fdp.ConsumeBytes(4) for _ in range(fdp.ConsumeIntInRange(0, 4)))
            if fdp.ConsumeProbability() < 0.2:
                for key, value in _region_parameters(fdp).items():
                    if isinstance(value, str):
                        tensor.parameters[key].string_param = value
                    else:
                        tensor.parameters[key].int64_param = max(-2**63, min(value, 2**63 - 1))
        for _ in range(fdp.ConsumeIntInRange(0, 2)):
            request.outputs.add(name=_choice(fdp, ["OUTPUT__0", "OUTPUT0", "OUT", "y"]))
        if fdp.ConsumeBool():
            key = _choice(fdp, ["sequence_id", "sequence_start", "sequence_end", "priority",
                                "timeout", "triton_enable_empty_final_response", "x"])
            way = fdp.ConsumeIntInRange(0, 3)
            if way == 0:
                request.parameters[key].int64_param = fdp.ConsumeIntInRange(-2**63, 2**63 - 1)
            elif way == 1:
                request.parameters[key].bool_param = fdp.ConsumeBool()
            elif way == 2:
                request.parameters[key].string_param = fdp.ConsumeUnicodeNoSurrogates(6)
            else:
                request.parameters[key].uint64_param = fdp.ConsumeIntInRange(0, 2**64 - 1)
        message = request.SerializeToString()
    elif method == "SystemSharedMemoryRegister":
        body = _register_body(fdp)
        fields = {"name": _choice(fdp, ["r", "s", ""])}
        for key, value in body.items():
            if key == "key" and isinstance(value, str):
                fields["key"] = value
            elif key in ("offset", "byte_size") and isinstance(value, int) and 0 <= value < 2**64:
                fields[key] = value
        message = pb.SystemSharedMemoryRegisterRequest(**fields).SerializeToString()
    elif method == "CudaSharedMemoryRegister":
        fields = {"name": _choice(fdp, ["c", "r", ""])}
        for key, value in _cuda_register_fields(fdp).items():  # (device_id is an int64)
            low = -2**63 if key == "device_id" else 0
            if key == "raw_handle" and value is not None:
                fields[key] = value
            elif isinstance(value, int) and low <= value < 2**63:
                fields[key] = value
        message = pb.CudaSharedMemoryRegisterRequest(**fields).SerializeToString()
    elif method == "CudaSharedMemoryUnregister":
        message = pb.CudaSharedMemoryUnregisterRequest(
            name=_choice(fdp, ["c", "r", ""])).SerializeToString()
    elif method == "RepositoryModelLoad":
        request = pb.RepositoryModelLoadRequest(model_name=_choice(fdp, CONTROLLED))
        for key, value in _load_parameters(fdp).items():
            if isinstance(value, bytes) and fdp.ConsumeProbability() < 0.9:
                request.parameters[key].bytes_param = value
            elif isinstance(value, str):
                request.parameters[key].string_param = value
            else:
                request.parameters[key].int64_param = 5
        message = request.SerializeToString()
    elif method == "RepositoryModelUnload":
        request = pb.RepositoryModelUnloadRequest(model_name=_choice(fdp, CONTROLLED))
        if fdp.ConsumeBool():
            request.parameters["unload_dependents"].bool_param = fdp.ConsumeBool()
        message = request.SerializeToString()
    elif method == "SystemSharedMemoryUnregister":
        message = pb.SystemSharedMemoryUnregisterRequest(
            name=_choice(fdp, ["r", "s", ""])).SerializeToString()
    elif method in ("ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"):
        message = pb.ModelReadyRequest(name=_choice(fdp, MODELS),
                                       version=_choice(fdp, ["", "1", "x"])).SerializeToString()
    else:
        message = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 24))
    if fdp.ConsumeProbability() < 0.1:  # spoiled
        message = message[:fdp.ConsumeIntInRange(0, len(message))] + fdp.ConsumeBytes(6)
    return message


def grpc_input(data: bytes) -> bytes:
    fdp = atheris.FuzzedDataProvider(data)
    encoder = hpack.Encoder()
    out = bytearray(PREFACE)
    out += _frame(4, 0, 0, b"")  # SETTINGS
    stream = 1
    opened: list[int] = []
    for _ in range(fdp.ConsumeIntInRange(1, 6)):
        kind = fdp.ConsumeIntInRange(0, 9)
        if kind <= 3:  # a call: HEADERS, then its message in DATA frames
            method = _choice(fdp, GRPC_METHODS)
            fields = [(":method", _choice(fdp, ["POST", "POST", "GET"])),
                      (":scheme", "http"), (":path", SERVICE + method),
                      (":authority", "127.0.0.1"),
                      ("content-type", _choice(fdp, ["application/grpc",
                                                     "application/grpc+proto", "text/plain"])),
                      ("te", "trailers")]
            if fdp.ConsumeProbability() < 0.3:
                fields.append((_choice(fdp, ["grpc-encoding", "grpc-timeout",
                                             "grpc-accept-encoding", "x-extra"]),
                               _choice(fdp, ["gzip", "deflate", "identity", "snappy",
                                             "10m", "1S", "99999999H", "0n", "x"])))
            if fdp.ConsumeProbability() < 0.1:
                del fields[fdp.ConsumeIntInRange(0, len(fields) - 1)]
            block = encoder.encode(fields)
            if fdp.ConsumeProbability() < 0.2:  # in two: HEADERS, CONTINUATION
                cut = fdp.ConsumeIntInRange(0, len(block))
                out += _frame(1, 0, stream, block[:cut]) + _frame(9, 4, stream, block[cut:])
            else:
                out += _frame(1, 4, stream, block)
            for _ in range(1 if method != "ModelStreamInfer" else fdp.ConsumeIntInRange(0, 3)):
                message = _infer_message(fdp, method)
                compressed = 1 if fdp.ConsumeProbability() < 0.1 else 0
                length = len(message) if fdp.ConsumeProbability() < 0.95 else \
                    fdp.ConsumeIntInRange(0, 2**32 - 1)
                body = bytes([compressed]) + struct.pack(">I", length) + message
                # in DATA frames of any size, but at most MOST_PIECES of them: an upload of
                # ident's model.pt (~200 KB) in 1-byte frames was 196,684 frames, which the
                # server took 5-6 s to parse under atheris (~25 us a frame), longer than
                # held_after_quiet waits after the client has gone (its bytes still read)
                least = -(-len(body) // MOST_PIECES)
                while body:
                    size = fdp.ConsumeIntInRange(min(least, len(body)), max(1, len(body)))
                    out += _frame(0, 0, stream, body[:size])
                    body = body[size:]
            if fdp.ConsumeProbability() < 0.9:
                out += _frame(0, 1, stream, b"")  # END_STREAM
            opened.append(stream)
            stream += 2
        elif kind == 4:  # any frame
            out += _frame(fdp.ConsumeIntInRange(0, 10), fdp.ConsumeIntInRange(0, 255),
                          _choice(fdp, [0, 1, stream, stream + 2, *opened]) if
                          fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 2**32 - 1),
                          fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)))
        elif kind == 5:  # SETTINGS
            out += _frame(4, 0, 0, b"".join(
                struct.pack(">HI", fdp.ConsumeIntInRange(0, 8),
                            _choice(fdp, [0, 1, 100, 16_384, 65_535, 2**24, 2**31 - 1, 2**32 - 1]))
                for _ in range(fdp.ConsumeIntInRange(0, 3))))
        elif kind == 6:  # WINDOW_UPDATE
            out += _frame(8, 0, _choice(fdp, [0, *opened, stream]),
                          struct.pack(">I", _choice(fdp, [0, 1, 65_535, 2**31 - 1, 2**32 - 1])))
        elif kind == 7 and opened:  # RST_STREAM
            out += _frame(3, 0, _choice(fdp, opened),
                          struct.pack(">I", fdp.ConsumeIntInRange(0, 13)))
        elif kind == 8:  # PRIORITY, PING
            out += _frame(2, 0, _choice(fdp, [0, stream, *opened]), fdp.ConsumeBytes(5)) \
                if fdp.ConsumeBool() else _frame(6, 0, 0, fdp.ConsumeBytes(8).ljust(8, b"\0"))
        else:  # GOAWAY
            out += _frame(7, 0, 0, struct.pack(">II", stream, 0))
    out += _frame(6, 0, 0, _PING_MARK)  # answered once all before it is read
    return bytes(out)


CONTROLLED = ["up", "spare", "nope", ""]  # what inputs load, upload and unload (never ident)
_UPLOAD_PATHS = ["1/model.pt", "1/model.pt", "2/model.pt", "model.pt", "1", "1/labels.txt",
                 "../x/1/model.pt", "/abs", "", "1/./model.pt", "1/model.pt/x", "config.pbtxt"]
_IDENT_PT: list[bytes] = []  # ident's model.pt, read once the repository is written


def _config_text(fdp: atheris.FuzzedDataProvider) -> Any:
    config = {"name": _choice(fdp, ["up", "spare", "other", None]),
              "platform": _choice(fdp, ["pytorch_libtorch", "python", "ensemble", "x"]),
              "max_batch_size": _choice(fdp, [8, 0, -1]),
              "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [-1]}]}
    if config["name"] is None:
        del config["name"]
    return _choice(fdp, [json.dumps(config)] * 4 + ["{", "", 5])


def _load_parameters(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    """A load's parameters: maybe a config, files as bytes (the HTTP body makes them base64)."""
    parameters: dict[str, Any] = {}
    if fdp.ConsumeProbability() < 0.8:
        parameters["config"] = _config_text(fdp)
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        path = _choice(fdp, _UPLOAD_PATHS) if fdp.ConsumeProbability() < 0.9 else \
            fdp.ConsumeUnicodeNoSurrogates(8)
        parameters["file:" + path] = _choice(fdp, [*_IDENT_PT, *_IDENT_PT, b"", b"x = 1\n",
                                                   b"\x00" * (96 << 10)])
    if fdp.ConsumeProbability() < 0.1:
        parameters[_choice(fdp, ["unload_dependents", "other"])] = _json_value(fdp)
    return parameters


def _load_body(fdp: atheris.FuzzedDataProvider) -> bytes:
    """A load or unload request's JSON body: files in base64, long ones (decoded in slices),
    some spoiled (bad padding, not base64, an escape inside, not a string)."""
    parameters = {key: base64.b64encode(value).decode() if isinstance(value, bytes) else value
                  for key, value in _load_parameters(fdp).items()}
    for key, value in parameters.items():
        if key.startswith("file:") and isinstance(value, str) and fdp.ConsumeProbability() < 0.2:
            parameters[key] = _choice(fdp, [value[:-1], "é" + value, 7, None, value + "=="])
    body = json.dumps({"parameters": parameters} if fdp.ConsumeProbability() < 0.95 else
                      [parameters]).encode()
    if fdp.ConsumeProbability() < 0.1:  # a JSON escape (or a stray backslash) somewhere
        at = fdp.ConsumeIntInRange(0, len(body))
        body = body[:at] + _choice(fdp, [b"\\/", b"\\", b'\\"']) + body[at:]
    return body


def _pinged(answer: bytearray) -> bool:
    return _PING_MARK in answer


# -- the run -------------------------------------------------------------------------------------

FRONT_ENDS = ("http", "grpc", "grpc-tls")
_FRONT_END_VARIABLE = "TG_FUZZ_FRONT_END"


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] in FRONT_ENDS:
        front = sys.argv.pop(1)
        os.environ[_FRONT_END_VARIABLE] = front
    elif os.environ.get(_FRONT_END_VARIABLE) in FRONT_ENDS:  # libFuzzer's -merge child
        front = os.environ[_FRONT_END_VARIABLE]
    else:
        sys.exit(__doc__)
    # libFuzzer's -merge=1 and -fork=N run argv[0] again (`sh -c argv[0] flags...`), with its
    # flags and without the front end (the variable above says it): this interpreter and file
    sys.argv[0] = shlex.join([sys.executable, str(pathlib.Path(__file__).resolve())])
    findings = Findings()
    tls = None
    if front == "grpc-tls":
        tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        tls.set_alpn_protocols(["h2"])
    server = start_server(findings, tls)
    _IDENT_PT.append((server.config.model_repository[0] / "ident" / "1" / "model.pt"
                      ).read_bytes())
    port = server.http_port if front == "http" else server.grpc_port
    # no automatic collections: a reference cycle any input makes waits for the next check,
    # which finds it (a collection in between would have freed it unseen)
    gc.collect()
    gc.disable()
    make = http_input if front == "http" else grpc_input
    done = None if front == "http" else _pinged
    dispatched = count_dispatches() if front == "http" else [0]

    runs = 0

    def one(data: bytes) -> None:
        nonlocal runs
        dispatched[0] = 0
        if tls is not None and data[:1] and data[0] % 8 == 0:
            exchange(port, make(data), None)  # plaintext to the TLS port: refused
        else:
            exchange(port, make(data), done, tls=tls)
        runs += 1
        framed = _HTTP_FRAMED[0] if front == "http" else None
        if framed is not None and dispatched[0] > framed:
            findings.found.append(f"{dispatched[0]} requests run of {framed} sent")
        problem = findings.found[:1] or [still_serving(server.http_port)]
        if problem[0] is None and (runs % HELD_CHECK_EVERY == 0 or replaying):
            problem = [held_after_quiet(server)]
        if problem[0] is not None:
            raise RuntimeError(f"{front} input {make(data)[:2000]!r}:\n{problem[0]}")

    replaying = any(not arg.startswith("-") and pathlib.Path(arg).is_file()
                    for arg in sys.argv[1:])

    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
