"""tensorgate side by side with real peers: the seed's table, regenerated on this machine.

Servers (each in its own virtual environment, installed by `bash bench/peers/install.sh`):
tensorgate, Triton's Python backend (the `tritonserver` binary inside nvidia-pytriton), MLServer,
LitServe and a hand-written FastAPI + uvicorn server. All run the same TorchScript files
(`identity`, `resnet50` with seed-0 weights) with the same torch thread count; the floor is
the same file called in this process. Servers run one at a time, in alternating order over
the rounds. Peers that are not installed are skipped with a message.

Per server and workload: sequential batch-1 latency over one keep-alive connection (a lean
socket client with the request bytes built once; its CPU per request is reported), QPS and
latency at 1/4/16/64 connections with `wrk` (its CPU share is reported), RSS and PSS of the
server's whole process tree after load, start-up from launch to the first good resnet50
answer. Every answer is checked: its size on every request (wrk counts bad ones), its values
against the floor's on the first.

    .venv/bin/python bench/compare.py [--quick] [--servers tensorgate,triton] [--rounds N]
    .venv/bin/python bench/compare.py --render-only        (re-render from the JSON)

Raw numbers go to bench/results/compare.json (or --json); the table, plots and the block in
bench/RESULTS.md are rendered from that file by bench/compare_report.py.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS = HERE / "peers"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))

import compare_report  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from tensorgate.pipeline.executor import default_intra_op_threads  # noqa: E402

WORKLOADS = {"identity": (3, 224, 224), "resnet50": (1000,)}
INPUT_SHAPE = (1, 3, 224, 224)
VENVS = pathlib.Path(os.environ.get("TENSORGATE_PEERS_DIR", PEERS / ".venvs"))


# ---------------------------------------------------------------------------------------------
# Request bytes and answer checks, one codec per wire format


@dataclass(frozen=True)
class Wire:
    """How one server wants a tensor: request bytes built once, and how to read an answer."""

    name: str
    build: Callable[[str, str, np.ndarray], tuple[str, dict[str, str], bytes]]
    decode: Callable[[dict[str, str], bytes], np.ndarray]
    min_body: Callable[[int], int]  # smallest well-formed answer body for `n` output floats


def _oip_binary_request(path: str, model: str, x: np.ndarray) -> tuple[str, dict[str, str], bytes]:
    header = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}]})
    return (path.format(model=model),
            {"Content-Type": "application/octet-stream",
             "Inference-Header-Content-Length": str(len(header))},
            header.encode() + x.astype("<f4").tobytes())


def _oip_binary_decode(headers: dict[str, str], body: bytes) -> np.ndarray:
    split = int(headers.get("inference-header-content-length", len(body)))
    header = json.loads(body[:split])
    output = header["outputs"][0]
    return np.frombuffer(body, dtype="<f4", offset=split).reshape(output["shape"])


def _oip_json_request(path: str, model: str, x: np.ndarray) -> tuple[str, dict[str, str], bytes]:
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]})
    return path.format(model=model), {"Content-Type": "application/json"}, body.encode()


def _oip_json_decode(headers: dict[str, str], body: bytes) -> np.ndarray:
    output = json.loads(body)["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def _base64_request(path: str, model: str, x: np.ndarray) -> tuple[str, dict[str, str], bytes]:
    body = json.dumps({"shape": list(x.shape),
                       "data": base64.b64encode(x.astype("<f4").tobytes()).decode()})
    return path.format(model=model), {"Content-Type": "application/json"}, body.encode()


def _base64_decode(headers: dict[str, str], body: bytes) -> np.ndarray:
    answer = json.loads(body)
    return np.frombuffer(base64.b64decode(answer["data"]), dtype="<f4").reshape(answer["shape"])


OIP_BINARY = Wire("binary tensor extension", _oip_binary_request, _oip_binary_decode,
                  lambda n: 4 * n)
OIP_JSON = Wire("V2 JSON (no binary extension)", _oip_json_request, _oip_json_decode,
                lambda n: 2 * n)
BASE64_JSON = Wire("JSON with base64 tensor", _base64_request, _base64_decode,
                   lambda n: (4 * n * 4) // 3)


def raw_request(port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class Connection:
    """One keep-alive HTTP/1.1 connection that sends prebuilt bytes and reads whole answers."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._chunk = memoryview(bytearray(1 << 18))
        self._buffer = bytearray()

    def close(self) -> None:
        self.sock.close()

    def exchange(self, raw: bytes) -> tuple[int, dict[str, str], memoryview]:
        """Send one request; return status, lower-cased headers and the body (valid until
        the next call)."""
        self.sock.sendall(raw)
        buffer = self._buffer
        if buffer:
            raise RuntimeError("bytes left over from the previous answer")
        end = -1
        while end < 0:
            self._recv(buffer)
            end = buffer.find(b"\r\n\r\n")
        lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise RuntimeError(f"answer without Content-Length: {lines[:6]}")
        total = end + 4 + int(headers["content-length"])
        while len(buffer) < total:
            self._recv(buffer)
        body = memoryview(bytes(buffer[end + 4:total]))
        del buffer[:total]
        return status, headers, body

    def _recv(self, buffer: bytearray) -> None:
        n = self.sock.recv_into(self._chunk)
        if n == 0:
            raise ConnectionError("the server closed the connection")
        buffer += self._chunk[:n]


# ---------------------------------------------------------------------------------------------
# Servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """How to start one server and talk to it."""

    name: str
    wire: Wire
    infer_path: str  # with {model}
    python: pathlib.Path
    command: Callable[[Server, int, pathlib.Path], list[str]]
    environment: Callable[[Server, pathlib.Path], dict[str, str]] = lambda s, w: {}
    prepare: Callable[[Server, pathlib.Path, int], None] = lambda s, w, p: None
    note: str = ""
    batching: str = ""
    package: str = ""  # whose version the report shows; must import (as a module) to run

    def installed(self) -> str | None:
        """None when the server can run here, else why not."""
        if not self.python.exists():
            return f"not installed (bash bench/peers/install.sh {self.name})"
        module = self.package.replace("nvidia-pytriton", "pytriton").replace("-", "_")
        probe = subprocess.run([str(self.python), "-c", f"import {module}"], capture_output=True)
        if probe.returncode != 0:
            return f"{self.package} does not import in {self.python}"
        return None

    def version(self) -> str:
        package = self.package
        script = f"import importlib.metadata as m; print(m.version({package!r}))"
        out = subprocess.run([str(self.python), "-c", script], capture_output=True, text=True)
        return out.stdout.strip() or "?"


def _tensorgate_command(server: Server, port: int, work: pathlib.Path) -> list[str]:
    return [str(server.python), "-m", "tensorgate", "serve", "--model-repository",
            str(work / "models"), "--http-port", str(port), "--grpc-port", str(free_port()),
            "--metrics-port", str(_metrics_port(work))]


def _metrics_port(work: pathlib.Path) -> int:
    path = work / "tensorgate-metrics-port"
    if not path.exists():
        path.write_text(str(free_port()))
    return int(path.read_text())


def _triton_home(server: Server) -> pathlib.Path:
    site = next((server.python.parent.parent / "lib").glob("python3*/site-packages"))
    return site / "pytriton" / "tritonserver"


def _triton_prepare(server: Server, work: pathlib.Path, threads: int) -> None:
    """A Python-backend repository and a backend folder holding the stub for the venv's
    Python, as PyTriton itself arranges them."""
    home = _triton_home(server)
    backend = work / "triton-backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([str(server.python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    for source in [home / "backends/python/libtriton_python.so",
                   home / "backends/python/triton_python_backend_utils.py",
                   home / f"python_backend_stubs/{version}/triton_python_backend_stub"]:
        link = backend / source.name
        if not link.exists():
            link.symlink_to(source)
    for model, dims in WORKLOADS.items():
        folder = work / "triton-models" / model
        (folder / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(PEERS / "triton_model.py", folder / "1" / "model.py")
        (folder / "config.pbtxt").write_text(textwrap.dedent(f"""\
            name: "{model}"
            backend: "python"
            max_batch_size: 64
            input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
            output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: {list(dims)} }} ]
            dynamic_batching {{ }}
            instance_group [ {{ kind: KIND_CPU count: 1 }} ]
            """))


def _triton_command(server: Server, port: int, work: pathlib.Path) -> list[str]:
    return [str(_triton_home(server) / "bin" / "tritonserver"),
            "--model-repository", str(work / "triton-models"),
            "--backend-directory", str(work / "triton-backends"),
            "--http-address", "127.0.0.1", "--http-port", str(port),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(free_port()),
            "--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()),
            "--log-info", "false"]


def _triton_environment(server: Server, work: pathlib.Path) -> dict[str, str]:
    libs = _triton_home(server).parent.parent / "nvidia_pytriton.libs"
    libdir = subprocess.run([str(server.python), "-c",
                             "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return {"LD_LIBRARY_PATH": f"{libs}:{libdir}",
            # the stub imports from the environment of the first python3 on PATH
            "PATH": f"{server.python.parent}:{os.environ['PATH']}"}


def _mlserver_prepare(server: Server, work: pathlib.Path, threads: int) -> None:
    folder = work / "mlserver"
    for model in WORKLOADS:
        (folder / model).mkdir(parents=True, exist_ok=True)
        (folder / model / "model-settings.json").write_text(json.dumps({
            "name": model, "implementation": "mlserver_runtime.TorchScriptRuntime",
            "max_batch_size": 64, "max_batch_time": 0.0005}))


def _mlserver_command(server: Server, port: int, work: pathlib.Path) -> list[str]:
    (work / "mlserver" / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": port, "grpc_port": free_port(),
        "metrics_port": free_port(), "debug": False}))
    return [str(server.python.parent / "mlserver"), "start", str(work / "mlserver")]


def _asgi_command(server: Server, port: int, work: pathlib.Path) -> list[str]:
    return [str(server.python), str(HERE / "asgi_front.py"), str(work / "models"), str(port)]


def _litserve_command(server: Server, port: int, work: pathlib.Path) -> list[str]:
    return [str(server.python), str(PEERS / "litserve_app.py"), str(port)]


def _fastapi_command(server: Server, port: int, work: pathlib.Path) -> list[str]:
    return [str(server.python), "-m", "uvicorn", "--app-dir", str(PEERS), "fastapi_app:app",
            "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"]


def servers() -> dict[str, Server]:
    venv = lambda name: VENVS / name / "bin" / "python"  # noqa: E731
    return {
        "tensorgate": Server("tensorgate", OIP_BINARY, "/v2/models/{model}/infer",
                             pathlib.Path(sys.executable), _tensorgate_command,
                             note="HTTP, binary tensor extension",
                             batching="dynamic batching (max delay 0)", package="tensorgate"),
        "tensorgate-asgi": Server("tensorgate-asgi", OIP_BINARY, "/v2/models/{model}/infer",
                                  pathlib.Path(sys.executable), _asgi_command,
                                  note="tensorgate's engine and data plane behind uvicorn "
                                       "(httptools, asyncio loop) and a raw ASGI app "
                                       "(bench/asgi_front.py): the HTTP-layer alternative",
                                  batching="dynamic batching (max delay 0)", package="uvicorn"),
        "triton": Server("triton", OIP_BINARY, "/v2/models/{model}/infer", venv("triton"),
                         _triton_command, _triton_environment, _triton_prepare,
                         note="tritonserver 2.51 (nvidia-pytriton 0.7.0), Python backend, "
                              "binary tensor extension",
                         batching="dynamic batching (max delay 0)", package="nvidia-pytriton"),
        "mlserver": Server("mlserver", OIP_JSON, "/v2/models/{model}/infer", venv("mlserver"),
                           _mlserver_command, prepare=_mlserver_prepare,
                           note="custom runtime; V2 JSON (MLServer has no binary extension "
                                "over REST); default parallel workers",
                           batching="adaptive batching (max 64, 0.5 ms)", package="mlserver"),
        "litserve": Server("litserve", BASE64_JSON, "/predict/{model}", venv("litserve"),
                           _litserve_command,
                           note="JSON with base64 tensors (LitServe takes JSON)",
                           batching="batching (max 64, timeout 0)", package="litserve"),
        "fastapi": Server("fastapi", OIP_BINARY, "/v2/models/{model}/infer", venv("fastapi"),
                          _fastapi_command,
                          note="uvicorn[standard] (uvloop, httptools); hand-written OIP "
                               "subset, binary tensor extension",
                          batching="none", package="fastapi"),
    }


@dataclass
class Running:
    server: Server
    process: subprocess.Popen[bytes]
    port: int
    log: pathlib.Path
    raws: dict[str, bytes] = field(default_factory=dict)

    def stop(self) -> None:
        """SIGTERM to the process group we started (the server and its own workers)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        try:  # workers left behind in the group (LitServe, MLServer)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(server: Server, work: pathlib.Path, x: np.ndarray,
          deadline_s: float = 180.0) -> tuple[Running, float]:
    """Launch; return once a resnet50 answer of the right size came back, with the time."""
    port = free_port()
    env = dict(os.environ, TG_BENCH_MODELS=str(work / "models"), TG_BENCH_PEERS=str(PEERS),
               TG_BENCH_THREADS=str(default_intra_op_threads()), PYTHONPATH=str(PEERS))
    env.update(server.environment(server, work))
    log = work / f"{server.name}.log"
    started = time.perf_counter()
    with log.open("ab") as sink:
        process = subprocess.Popen(server.command(server, port, work), env=env, cwd=work,
                                   stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    running = Running(server, process, port, log)
    for model in WORKLOADS:
        path, headers, body = server.wire.build(server.infer_path, model, x)
        running.raws[model] = raw_request(port, path, headers, body)
    while time.perf_counter() - started < deadline_s:
        if process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {process.returncode}; see {log}")
        try:
            connection = Connection(port, timeout=30)
        except OSError:
            time.sleep(0.02)
            continue
        try:
            status, headers, body = connection.exchange(running.raws["resnet50"])
            if status == 200 and len(body) >= server.wire.min_body(1000):
                return running, time.perf_counter() - started
        except (OSError, RuntimeError, ValueError):
            pass
        finally:
            connection.close()
        time.sleep(0.02)
    running.stop()
    raise RuntimeError(f"{server.name} gave no good answer within {deadline_s:.0f} s; see {log}")


# ---------------------------------------------------------------------------------------------
# Measurements


def check_answers(running: Running, x: np.ndarray, expected: dict[str, np.ndarray]) -> dict[str, float]:
    """Each workload's answer against the floor's: identity bit for bit, resnet50 closely."""
    differences = {}
    connection = Connection(running.port)
    try:
        for model, raw in running.raws.items():
            status, headers, body = connection.exchange(raw)
            if status != 200:
                raise RuntimeError(f"{running.server.name}/{model}: HTTP {status} {bytes(body[:200])!r}")
            got = running.server.wire.decode(headers, bytes(body))
            want = expected[model]
            if got.shape != want.shape:
                raise RuntimeError(f"{running.server.name}/{model}: shape {got.shape}, want {want.shape}")
            differences[model] = float(np.max(np.abs(got - want)))
    finally:
        connection.close()
    if differences["identity"] != 0.0 or differences["resnet50"] > 1e-2:
        raise RuntimeError(f"{running.server.name}: answers differ from the floor: {differences}")
    return differences


def sequential(running: Running, model: str, n: int, warmup: int) -> dict[str, Any]:
    """n requests one after another on one connection; every answer's size checked."""
    raw = running.raws[model]
    smallest = running.server.wire.min_body(int(np.prod(WORKLOADS[model])))
    connection = Connection(running.port)
    samples = np.empty(n, dtype=np.int64)
    try:
        for _ in range(warmup):
            connection.exchange(raw)
        cpu = time.process_time()
        for i in range(n):
            begin = time.perf_counter_ns()
            status, _, body = connection.exchange(raw)
            samples[i] = time.perf_counter_ns() - begin
            if status != 200 or len(body) < smallest:
                raise RuntimeError(f"{running.server.name}/{model}: bad answer {status}, "
                                   f"{len(body)} bytes")
        cpu = time.process_time() - cpu
    finally:
        connection.close()
    return {"us": (samples / 1e3).round(1).tolist(), "client_cpu_us": cpu / n * 1e6}


_WRK_SCRIPT = """
wrk.method = "POST"
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
{headers}
local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) bad = 0 end
function response(status, headers, body)
  if status ~= 200 or #body < {smallest} then bad = bad + 1 end
end
function done(summary, latency, requests)
  local total = 0
  for _, t in ipairs(threads) do total = total + t:get("bad") end
  io.write(string.format("TG bad %d\\n", total))
  for _, p in ipairs({{50, 90, 99}}) do
    io.write(string.format("TG p%d %d\\n", p, latency:percentile(p)))
  end
  io.write(string.format("TG max %d\\nTG requests %d\\nTG errors %d\\n", latency.max,
                         summary.requests, summary.errors.connect + summary.errors.read
                         + summary.errors.write + summary.errors.timeout))
end
"""


def concurrent(running: Running, model: str, connections: int, seconds: float,
               work: pathlib.Path) -> dict[str, Any]:
    """wrk with `connections` keep-alive connections on one thread; answers' sizes checked."""
    raw = running.raws[model]
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")[1:]
    path = raw.split(b" ", 2)[1].decode()
    headers = "\n".join(f'wrk.headers["{k}"] = "{v.strip()}"' for k, _, v in
                        (line.partition(":") for line in lines)
                        if k not in ("Host", "Content-Length"))
    (work / "wrk-body.bin").write_bytes(body)
    smallest = running.server.wire.min_body(int(np.prod(WORKLOADS[model])))
    (work / "wrk.lua").write_text(_WRK_SCRIPT.format(body=work / "wrk-body.bin", headers=headers,
                                                     smallest=smallest))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{max(1, round(seconds))}s",
                          "--timeout", "30s", "-s", str(work / "wrk.lua"),
                          f"http://127.0.0.1:{running.port}{path}"],
                         capture_output=True, text=True, timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    values = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"TG (\w+) (\d+)", out.stdout))
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    if rate is None or "requests" not in values:
        raise RuntimeError(f"wrk failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"connections": connections, "seconds": seconds, "qps": float(rate.group(1)),
            "p50_us": values["p50"], "p90_us": values["p90"], "p99_us": values["p99"],
            "max_us": values["max"], "requests": values["requests"], "bad": values["bad"],
            "errors": values["errors"], "client_cpu_share": cpu / seconds}


def memory_tree(pid: int) -> dict[str, float]:
    """RSS and PSS in MB summed over `pid` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    todo, rss, pss, count = [pid], 0, 0, 0
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            text = pathlib.Path(f"/proc/{current}/smaps_rollup").read_text()
        except OSError:
            continue
        count += 1
        rss += int(re.search(r"^Rss:\s+(\d+)", text, re.M).group(1))
        pss += int(re.search(r"^Pss:\s+(\d+)", text, re.M).group(1))
    return {"rss_mb": rss / 1024, "pss_mb": pss / 1024, "processes": count}


def tensorgate_details(running: Running, work: pathlib.Path, requests: dict[str, int]) -> dict[str, Any]:
    """Bytes copied per request (metrics) and the per-stage times (statistics extension)."""
    details: dict[str, Any] = {}
    metrics = urlopen_text(f"http://127.0.0.1:{_metrics_port(work)}/metrics")
    for model in WORKLOADS:
        copied = re.search(rf'tensorgate_copied_bytes_total{{model="{model}"}} (\S+)', metrics)
        count = re.search(rf'nv_inference_request_success{{model="{model}",version="1"}} (\S+)',
                          metrics)
        stats = json.loads(urlopen_text(f"http://127.0.0.1:{running.port}/v2/models/{model}/stats"))
        inference = stats["model_stats"][0]["inference_stats"]
        per_stage = {stage: inference[stage]["ns"] / max(inference[stage]["count"], 1) / 1e3
                     for stage in ("queue", "compute_input", "compute_infer", "compute_output")}
        details[model] = {
            "copied_bytes_per_request": (float(copied.group(1)) / float(count.group(1))
                                         if copied and count and float(count.group(1)) else None),
            "stage_us": per_stage, "requests": requests.get(model)}
    return details


def urlopen_text(url: str) -> str:
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def floor(models: pathlib.Path, x: np.ndarray, counts: dict[str, int],
          warmup: dict[str, int]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The same TorchScript files called in this process with the same thread count."""
    torch.set_num_threads(default_intra_op_threads())
    results, outputs = {}, {}
    for model in WORKLOADS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(models / model / "1" / "model.pt")).eval()
        tensor = torch.from_numpy(x)
        samples = np.empty(counts[model], dtype=np.int64)
        with torch.inference_mode():
            for _ in range(warmup[model]):
                module(tensor)
            for i in range(counts[model]):
                begin = time.perf_counter_ns()
                module(tensor).numpy()
                samples[i] = time.perf_counter_ns() - begin
            outputs[model] = module(tensor).numpy().copy()
        results[model] = {"us": (samples / 1e3).round(1).tolist()}
    return results, outputs


# ---------------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class Plan:
    rounds: int
    counts: dict[str, int]  # sequential requests per workload, all rounds together
    warmup: dict[str, int]
    levels: dict[str, tuple[int, ...]]  # concurrent connections per workload
    seconds: dict[str, float]  # wrk duration per point; resnet50's grows with the connections
    startups: int  # start-up samples per server (rounds beyond the measuring ones start only)


FULL = Plan(rounds=2, counts={"identity": 2000, "resnet50": 300},
            warmup={"identity": 200, "resnet50": 10},
            levels={"identity": (1, 4, 16, 64), "resnet50": (1, 4, 16, 64)},
            seconds={"identity": 3.0, "resnet50": 6.0}, startups=3)
QUICK = Plan(rounds=1, counts={"identity": 200, "resnet50": 10},
             warmup={"identity": 20, "resnet50": 2},
             levels={"identity": (1, 16), "resnet50": (1,)},
             seconds={"identity": 1.0, "resnet50": 2.0}, startups=1)


def duration(plan: Plan, model: str, connections: int) -> float:
    """Long enough for several full rounds of `connections` requests: a resnet50 batch of 64
    takes seconds on two cores, and wrk counts only finished requests."""
    per_request = {"identity": 0.0, "resnet50": 0.16}[model]  # about two batches of 64
    return max(plan.seconds[model], connections * per_request)


def measure_server(server: Server, work: pathlib.Path, x: np.ndarray,
                   expected: dict[str, np.ndarray], plan: Plan, record: dict[str, Any],
                   rounds: int) -> None:
    running, startup = start(server, work, x)
    record["startup_s"].append(startup)
    try:
        record["check_max_abs_diff"] = check_answers(running, x, expected)
        for model in WORKLOADS:
            began = time.perf_counter()
            part = sequential(running, model, plan.counts[model] // rounds, plan.warmup[model])
            entry = record["workloads"].setdefault(model, {"sequential": [], "concurrent": []})
            entry["sequential"].append(part)
            print(f"  {model}: {len(part['us'])} sequential, P50 {np.median(part['us']):,.0f} µs "
                  f"({time.perf_counter() - began:.0f} s)", flush=True)
            if shutil.which("wrk"):
                points = []
                for c in plan.levels[model]:
                    points.append(concurrent(running, model, c, duration(plan, model, c), work))
                    print(f"  {model}: {c} connections, {points[-1]['qps']:,.1f} QPS, "
                          f"P99 {points[-1]['p99_us'] / 1e3:,.1f} ms", flush=True)
                entry["concurrent"].append(points)
        record["memory"].append(memory_tree(running.process.pid))
        if server.name == "tensorgate":
            record["tensorgate"] = tensorgate_details(running, work, {})
    finally:
        running.stop()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through `finally`: servers stop


def run(plan: Plan, names: list[str], output: pathlib.Path) -> dict[str, Any]:
    signal.signal(signal.SIGTERM, _interrupt)
    available = servers()
    chosen = []
    for name in names:
        why = available[name].installed()
        if why:
            print(f"skipping {name}: {why}", flush=True)
        else:
            chosen.append(available[name])
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk): concurrency figures are skipped",
              flush=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-compare-"))
    write_default_repository(work / "models")
    shutil.rmtree(work / "models" / "detector")  # the peers serve identity and resnet50 only
    x = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype(np.float32)
    for server in chosen:
        server.prepare(server, work, default_intra_op_threads())
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "plan": plan.__dict__,
        "threads": default_intra_op_threads(), "wrk": shutil.which("wrk") is not None,
        "floor": {"workloads": {}}, "servers": {}}
    for server in chosen:
        result["servers"][server.name] = {
            "version": server.version(), "wire": server.wire.name, "note": server.note,
            "batching": server.batching, "startup_s": [], "memory": [], "workloads": {}}
    floor_parts: dict[str, list[Any]] = {model: [] for model in WORKLOADS}
    expected: dict[str, np.ndarray] = {}
    try:
        for r in range(max(plan.rounds, plan.startups)):
            order = chosen if r % 2 == 0 else chosen[::-1]
            if r < plan.rounds:
                part, expected = floor(work / "models", x,
                                       {m: c // plan.rounds for m, c in plan.counts.items()},
                                       plan.warmup)
                for model in WORKLOADS:
                    floor_parts[model].append(part[model])
            for server in order:
                record = result["servers"][server.name]
                print(f"round {r + 1}: {server.name}", flush=True)
                try:
                    if r < plan.rounds:
                        measure_server(server, work, x, expected, plan, record, plan.rounds)
                    else:
                        running, startup = start(server, work, x)
                        running.stop()
                        record["startup_s"].append(startup)
                except Exception as error:  # one broken peer must not lose the others' numbers
                    record.setdefault("errors", []).append(f"round {r + 1}: {error}")
                    print(f"  {server.name} failed: {error}", flush=True)
    finally:
        result["floor"]["workloads"] = {m: {"sequential": p} for m, p in floor_parts.items()}
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result))
        if any("errors" in r for r in result["servers"].values()):
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return result


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in
                  pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "kernel": platform.release(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of under two minutes")
    parser.add_argument("--servers",
                        default="tensorgate,tensorgate-asgi,triton,mlserver,litserve,fastapi")
    parser.add_argument("--rounds", type=int, help="override the plan's rounds")
    parser.add_argument("--json", type=pathlib.Path, help="raw numbers (default: "
                        "bench/results/compare.json, compare-quick.json with --quick)")
    parser.add_argument("--render-only", action="store_true",
                        help="re-render the table, plots and RESULTS.md block from the JSON")
    parser.add_argument("--no-results-md", action="store_true",
                        help="do not rewrite the block in bench/RESULTS.md")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = Plan(**{**plan.__dict__, "rounds": args.rounds,
                       "startups": max(args.rounds, plan.startups)})
    default = "compare-quick.json" if args.quick else "compare.json"
    output = args.json or HERE / "results" / default
    if not args.render_only:
        run(plan, [n.strip() for n in args.servers.split(",") if n.strip()], output)
    quiet = args.quick or args.no_results_md
    compare_report.render(output, None if quiet else HERE / "RESULTS.md")


if __name__ == "__main__":
    main()
