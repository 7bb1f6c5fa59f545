"""Request bytes for each wire format a benchmarked server speaks, a lean HTTP/1.1 client,
and two load generators driven with those same bytes: wrk, and a multi-process socket client
for machines without wrk (the GPU device has no package registry).

Requests are built once per server and workload and sent as they are, so the client costs
the same for every server; `Wire.decode` reads an answer back for the correctness check and
`Wire.min_body` is the smallest well-formed answer, which every measured answer must reach.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import pathlib
import re
import resource
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

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


def _oip_nested_json_request(path: str, model: str, x: np.ndarray
                             ) -> tuple[str, dict[str, str], bytes]:
    """`data` as nested lists in the tensor's shape, as a hand-written client's
    `x.tolist()` sends it."""
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.tolist()}]})
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
OIP_NESTED_JSON = Wire("V2 JSON, data nested in the tensor's shape", _oip_nested_json_request,
                       _oip_json_decode, lambda n: 2 * n)
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
        with memoryview(buffer) as whole:  # one copy out; the export ends before the del
            body = memoryview(bytes(whole[end + 4:total]))
        del buffer[:total]
        return status, headers, body

    def _recv(self, buffer: bytearray) -> None:
        n = self.sock.recv_into(self._chunk)
        if n == 0:
            raise ConnectionError("the server closed the connection")
        buffer += self._chunk[:n]


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
  if ({status} ~= 0 and status ~= {status}) or #body < {smallest} then bad = bad + 1 end
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


def _children_cpu_s() -> float:
    """User + system seconds of this process's waited-for children: the load generator's."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_exchange(connection: Connection, raw: bytes, smallest: int, what: str) -> int:
    """One exchange of `raw` on `connection`: its time in ns; the answer's status and size
    checked (`what` names it in the error)."""
    begin = time.perf_counter_ns()
    status, _, body = connection.exchange(raw)
    took = time.perf_counter_ns() - begin
    if status != 200 or len(body) < smallest:
        raise RuntimeError(f"{what}: bad answer {status}, {len(body)} bytes")
    return took


def timed_call(call: Callable[[], object]) -> int:
    """One call of `call` (a floor): its time in ns."""
    begin = time.perf_counter_ns()
    call()
    return time.perf_counter_ns() - begin


def sequential_exchanges(port: int, raw: bytes, n: int, warmup: int, smallest: int,
                         what: str, between: Callable[[], object] | None = None
                         ) -> dict[str, Any]:
    """`raw` sent n times one after another on one connection to `port`, after `warmup`
    unmeasured: each latency in µs and the client's CPU a request; every answer's status
    and size checked (`what` names it in the error).

    With `between`, it is called and timed after each measured exchange ("paired_us"): a
    floor measured in the same seconds as the server, on a machine whose speed swings from
    one minute to the next (alternating slowed neither side measurably here: bench/RESULTS.md,
    2026-12-06). Its CPU is not the client's."""
    connection = Connection(port)
    samples = np.empty(n, dtype=np.int64)
    paired = np.empty(n if between is not None else 0, dtype=np.int64)
    other_cpu = 0.0
    try:
        for _ in range(warmup):
            connection.exchange(raw)
        cpu = time.process_time()
        for i in range(n):
            samples[i] = timed_exchange(connection, raw, smallest, what)
            if between is not None:
                other = time.process_time()
                paired[i] = timed_call(between)
                other_cpu += time.process_time() - other
        cpu = time.process_time() - cpu - other_cpu
    finally:
        connection.close()
    out = {"us": (samples / 1e3).round(1).tolist(), "client_cpu_us": cpu / n * 1e6}
    if between is not None:
        out["paired_us"] = (paired / 1e3).round(1).tolist()
    return out


def interleaved_exchanges(targets: dict[str, tuple[int, bytes, int]], n: int, warmup: int,
                          floor: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """Sequential requests to several servers at once, interleaved one by one: `targets` is
    name → (port, prebuilt request, smallest good answer), one keep-alive connection each;
    n rounds after `warmup` unmeasured, each round one exchange with every target (and one
    call of `floor`, as "floor"), the order rotated from round to round. Each name's
    latencies in µs. A machine whose speed swings slows every target alike: they are
    measured in the same seconds, where runs one after the other can fall on different ones.
    Every answer's status and size checked."""
    connections: dict[str, Connection] = {}
    names = [*targets, *(["floor"] if floor is not None else [])]
    samples = {name: np.empty(n, dtype=np.int64) for name in names}

    def one(name: str) -> int:
        if name == "floor" and floor is not None:
            return timed_call(floor)
        _, raw, smallest = targets[name]
        return timed_exchange(connections[name], raw, smallest, name)

    try:
        for name, (port, _, _) in targets.items():
            connections[name] = Connection(port)
        for _ in range(warmup):
            for name in names:
                one(name)
        for i in range(n):
            turn = i % len(names)
            for name in names[turn:] + names[:turn]:
                samples[name][i] = one(name)
    finally:
        for connection in connections.values():
            connection.close()
    return {name: (taken / 1e3).round(1).tolist() for name, taken in samples.items()}


def latency_figures(us: np.ndarray) -> dict[str, int]:
    """wrk's latency figures from our own per-request samples (µs)."""
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    return {"p50_us": int(p50), "p90_us": int(p90), "p99_us": int(p99),
            "max_us": int(us.max()), "requests": int(us.size)}


def check_load(point: dict[str, Any], what: str) -> None:
    """Raise unless a wrk_load run had answers, all of them good."""
    if point["bad"] or point["errors"] or not point["requests"]:
        raise RuntimeError(f"{what}: {point['bad']} bad answers, {point['errors']} errors, "
                           f"{point['requests']} requests")


def wrk_load(port: int, raw: bytes, connections: int, seconds: float, smallest: int,
             folder: pathlib.Path, status: int = 200) -> dict[str, Any]:
    """Send `raw` (a prebuilt request) with wrk: `connections` keep-alive connections on one
    thread for `seconds`. Answers whose status is not `status` (0: any) or shorter than
    `smallest` bytes count as bad; wrk's own CPU share is measured (it is a child of this
    process)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")[1:]
    path = raw.split(b" ", 2)[1].decode()
    headers = "\n".join(f'wrk.headers["{k}"] = "{v.strip()}"' for k, _, v in
                        (line.partition(":") for line in lines)
                        if k not in ("Host", "Content-Length"))
    (folder / "wrk-body.bin").write_bytes(body)
    (folder / "wrk.lua").write_text(_WRK_SCRIPT.format(body=folder / "wrk-body.bin",
                                                       headers=headers, smallest=smallest,
                                                       status=status))
    before = _children_cpu_s()
    out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d",
                          f"{max(1, round(seconds))}s", "--timeout", "30s",
                          "-s", str(folder / "wrk.lua"), f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, timeout=seconds + 60)
    cpu = _children_cpu_s() - before
    values = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"TG (\w+) (\d+)", out.stdout))
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    if rate is None or "requests" not in values:
        raise RuntimeError(f"wrk failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    return {"connections": connections, "seconds": seconds, "qps": float(rate.group(1)),
            "p50_us": values["p50"], "p90_us": values["p90"], "p99_us": values["p99"],
            "max_us": values["max"], "requests": values["requests"], "bad": values["bad"],
            "errors": values["errors"], "client_cpu_share": cpu / seconds}


def _socket_worker(port: int, raw: bytes, connections: int, deadline: float, smallest: int,
                   sink: Any) -> None:
    """One client process: a thread per keep-alive connection, each sending `raw` until the
    deadline; sends back latencies (ns), bad answers and errors."""
    samples: list[list[int]] = []
    counts = {"bad": 0, "errors": 0}
    lock = threading.Lock()

    def drive() -> None:
        mine: list[int] = []
        bad = errors = 0
        try:
            connection = Connection(port, timeout=30.0)
        except OSError:
            with lock:
                counts["errors"] += 1
            return
        try:
            while time.perf_counter() < deadline:
                began = time.perf_counter_ns()
                try:
                    status, _, body = connection.exchange(raw)
                except (OSError, RuntimeError, ValueError):
                    errors += 1
                    break
                mine.append(time.perf_counter_ns() - began)
                if status != 200 or len(body) < smallest:
                    bad += 1
        finally:
            connection.close()
        with lock:
            samples.append(mine)
            counts["bad"] += bad
            counts["errors"] += errors

    threads = [threading.Thread(target=drive) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flat = np.array([x for part in samples for x in part], dtype=np.int64)
    sink.send((flat.tobytes(), counts["bad"], counts["errors"]))
    sink.close()


def socket_load(port: int, raw: bytes, connections: int, seconds: float, smallest: int,
                processes: int | None = None) -> dict[str, Any]:
    """wrk's figures from a client of our own: `connections` keep-alive connections spread
    over `processes` processes (default: one per connection, at most half the cores), each
    answer's status and size checked, the client's CPU share measured. Costs more CPU per
    request than wrk, so it is the choice only where wrk is missing."""
    if processes is None:
        processes = max(1, min(connections, (os.cpu_count() or 2) // 2))
    context = multiprocessing.get_context("fork")
    shares = [connections // processes + (1 if i < connections % processes else 0)
              for i in range(processes)]
    before = _children_cpu_s()
    started = time.perf_counter()
    deadline = started + seconds
    workers, pipes = [], []
    for share in shares:
        receiver, sender = context.Pipe(duplex=False)
        worker = context.Process(target=_socket_worker,
                                 args=(port, raw, share, deadline, smallest, sender))
        worker.start()
        sender.close()
        workers.append(worker)
        pipes.append(receiver)
    parts, bad, errors = [], 0, 0
    for receiver in pipes:
        if receiver.poll(seconds + 60):
            data, b, e = receiver.recv()
            parts.append(np.frombuffer(data, dtype=np.int64))
            bad, errors = bad + b, errors + e
        else:
            errors += 1
    for worker in workers:
        worker.join(timeout=30)
        if worker.is_alive():
            worker.kill()
            worker.join()
    elapsed = time.perf_counter() - started
    cpu = _children_cpu_s() - before
    latencies = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if latencies.size == 0:
        raise RuntimeError(f"the socket client got no answer on port {port}")
    return {"connections": connections, "seconds": seconds, "qps": latencies.size / elapsed,
            **latency_figures(latencies / 1e3), "bad": bad, "errors": errors,
            "client_cpu_share": cpu / elapsed, "client": f"socket client, {processes} process(es)"}


def grpc_infer_body(model: str, x: np.ndarray, request_id: str = "",
                    contents: bool = False) -> bytes:
    """One gRPC ModelInfer call's HTTP/2 DATA: the 5-byte length prefix and the protobuf
    message, the tensor in raw_input_contents (what tritonclient sends), or with `contents`
    in the typed fp32_contents (what KServe's SDK and hand-written clients send). The schema
    comes from tritonclient, imported here only: peers' venvs never load this module's
    callers."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    tensor = request.inputs.add(name="INPUT__0", datatype="FP32")
    tensor.shape.extend(x.shape)
    if contents:
        tensor.contents.fp32_contents.extend(np.asarray(x, dtype=np.float32).ravel().tolist())
    else:
        request.raw_input_contents.append(np.ascontiguousarray(x, dtype=np.float32).tobytes())
    message = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


def grpc_reference_answer(grpc_port: int, body: bytes, output_bytes: int) -> int:
    """One ModelInfer through grpcio with `body`'s message; checks the first output's size
    and returns the answer's size on the wire (prefix + message), which every answer under
    load must match: a gRPC error is HTTP 200 with a status trailer and no DATA, which h2load
    counts as a success."""
    import grpc
    from tritonclient.grpc import service_pb2

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        answer = call(body[5:], timeout=60)
    response = service_pb2.ModelInferResponse.FromString(answer)
    got = len(response.raw_output_contents[0]) if response.raw_output_contents else 0
    if got != output_bytes:
        raise RuntimeError(f"gRPC answer holds {got} output bytes, want {output_bytes}")
    return 5 + len(answer)


class NothingAnswered(RuntimeError):
    """No request of a load point finished within its duration (each took longer)."""


def h2load_grpc(grpc_port: int, body: bytes, answer_bytes: int, connections: int,
                seconds: float, folder: pathlib.Path, scheme: str = "http") -> dict[str, Any]:
    """gRPC ModelInfer over HTTP/2 with h2load (`scheme` https: over TLS, ALPN h2):
    `connections` connections, one stream each,
    for `seconds`; latencies from h2load's per-request log; answers that are not HTTP 200 or
    whose DATA falls short of `answer_bytes` (grpc_reference_answer) count as bad, from the
    DATA total h2load reports; h2load's own CPU share measured."""
    (folder / "grpc-body.bin").write_bytes(body)
    log = folder / "h2load.log"
    log.unlink(missing_ok=True)
    before = _children_cpu_s()
    out = subprocess.run(["h2load", "-c", str(connections), "-m", "1", "-t", "1",
                          "-D", str(max(1, round(seconds))), "-d", str(folder / "grpc-body.bin"),
                          "-H", "content-type: application/grpc", "-H", "te: trailers",
                          "--log-file", str(log),
                          f"{scheme}://127.0.0.1:{grpc_port}"
                          "/inference.GRPCInferenceService/ModelInfer"],
                         capture_output=True, text=True, timeout=seconds + 60)
    cpu = _children_cpu_s() - before
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()]
    if not rows:
        raise NothingAnswered(f"no request of {connections} connections finished within "
                              f"{seconds:g} s: {out.stdout[-300:]} {out.stderr[-300:]}")
    statuses = np.array([int(r[1]) for r in rows])
    us = np.array([int(r[2]) for r in rows], dtype=np.int64)
    errored = re.search(r"(\d+) errored, (\d+) timeout", out.stdout)
    data = re.search(r"\((\d+)\) data", out.stdout)
    if data is None:
        raise RuntimeError(f"h2load printed no traffic line: {out.stdout[-500:]}")
    short = us.size - int(data.group(1)) // answer_bytes  # answers without their tensor
    return {"connections": connections, "seconds": seconds, "qps": us.size / seconds,
            **latency_figures(us), "bad": max(int((statuses != 200).sum()), short),
            "errors": sum(map(int, errored.groups())) if errored else 0,
            "client_cpu_share": cpu / seconds}
