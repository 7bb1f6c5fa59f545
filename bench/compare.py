"""tensorgate side by side with real peers: the seed's table, regenerated on this machine.

Servers (bench/compare_servers.py; the peers each in their own virtual environment, installed
by `bash bench/peers/install.sh`): tensorgate, tensorgate's data plane behind uvicorn + ASGI
(bench/asgi_front.py), Triton's Python backend (the `tritonserver` binary inside
nvidia-pytriton), MLServer, LitServe and a hand-written FastAPI + uvicorn server. All run the
same TorchScript files (`identity`, `resnet50` with seed-0 weights) with the same torch
thread count; the floor is the same file called in this process, in a row each round and,
for resnet50, once after each of a server's sequential requests (the paired floor: the same
seconds as the server's, on a machine whose speed swings). Servers run one at a time, in
alternating order over the rounds; at the end tensorgate and Triton run side by side once
more, their identity requests interleaved one by one with the network floor's and the
floor's (`interleaved`: the identity goal read in the same seconds). Peers that are not
installed are skipped with a message.

Per server and workload: sequential batch-1 latency over one keep-alive connection (a lean
socket client with the request bytes built once; its CPU per request is reported), QPS and
latency at 1/4/16/64 connections with `wrk` (its CPU share is reported), RSS and PSS of the
server's whole process tree after load (once the tree has been idle for 2 s) and its peak RSS,
start-up from launch to the first good resnet50
answer. Every answer is checked: its size on every request (wrk counts bad ones), its values
against the floor's on the first.

    .venv/bin/python bench/compare.py [--quick] [--servers tensorgate,triton] [--rounds N]
    .venv/bin/python bench/compare.py --render-only        (re-render from the JSON)
    python3 bench/compare.py --device cuda --servers tensorgate,triton   (on the GPU device,
        from bench/gpu_check.sh: every model on the GPU, the floor with a CUDA graph, the socket
        client where wrk is missing; numbers in compare-cuda.json and their own RESULTS.md block)

Raw numbers go to bench/results/compare.json (or --json); the table, plots and the block in
bench/RESULTS.md are rendered from that file by bench/compare_report.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import compare_report  # noqa: E402
import network_floor  # noqa: E402
from compare_servers import PEERS, WORKLOADS, Ports, Server, free_port, servers  # noqa: E402
from compare_wire import (OIP_BINARY, OIP_JSON, Connection, NothingAnswered,  # noqa: E402
                          grpc_infer_body, grpc_reference_answer, h2load_grpc,
                          interleaved_exchanges, raw_request,
                          sequential_exchanges, socket_load, timed_call, wrk_load)
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from tensorgate.pipeline.executor import default_intra_op_threads  # noqa: E402

INPUT_SHAPE = (1, 3, 224, 224)


# ---------------------------------------------------------------------------------------------
# Running one server

@dataclass
class Running:
    server: Server
    process: subprocess.Popen[bytes]
    ports: Ports
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
    ports = Ports.free()
    env = dict(os.environ, TG_BENCH_MODELS=str(work / "models"), TG_BENCH_PEERS=str(PEERS),
               TG_BENCH_THREADS=str(default_intra_op_threads()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(PEERS), os.environ.get("PYTHONPATH")])))
    env.update(server.environment(server, work))
    log = work / f"{server.name}.log"
    started = time.perf_counter()
    with log.open("ab") as sink:
        process = subprocess.Popen(server.command(server, ports, work), env=env, cwd=work,
                                   stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    running = Running(server, process, ports, log)
    for model in WORKLOADS:
        path, headers, body = server.wire.build(server.infer_path, model, x)
        running.raws[model] = raw_request(ports.http, path, headers, body)
    while time.perf_counter() - started < deadline_s:
        if process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {process.returncode}; see {log}")
        try:
            connection = Connection(ports.http, timeout=30)
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
    connection = Connection(running.ports.http)
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
    # on a GPU, TF32 convolutions and per-batch-size kernels differ more: a relative bound
    scale = (max(1.0, float(np.max(np.abs(expected["resnet50"]))))
             if os.environ.get("TG_BENCH_DEVICE") == "cuda" else 1.0)
    if differences["identity"] != 0.0 or differences["resnet50"] > 1e-2 * scale:
        raise RuntimeError(f"{running.server.name}: answers differ from the floor: {differences}")
    return differences


def sequential(running: Running, model: str, n: int, warmup: int,
               paired: Callable[[], object] | None = None) -> dict[str, Any]:
    """n requests one after another on one connection; every answer's size checked; with
    `paired`, the floor's call timed after each (see PAIRED)."""
    return sequential_exchanges(
        running.ports.http, running.raws[model], n, warmup,
        running.server.wire.min_body(int(np.prod(WORKLOADS[model]))),
        f"{running.server.name}/{model}", paired)


def concurrent(running: Running, model: str, connections: int, seconds: float,
               work: pathlib.Path, client: str) -> dict[str, Any]:
    """`connections` keep-alive connections for `seconds`, from wrk (one thread) or the
    socket client; every answer's size checked."""
    smallest = running.server.wire.min_body(int(np.prod(WORKLOADS[model])))
    if client == "socket":
        return socket_load(running.ports.http, running.raws[model], connections, seconds,
                           smallest)
    return wrk_load(running.ports.http, running.raws[model], connections, seconds, smallest,
                    work)


def tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    todo, found = [pid], []
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid`'s process tree."""
    ticks = 0
    for member in tree_pids(pid):
        try:
            fields = pathlib.Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def settle(pid: int, idle_s: float = 2.0, limit_s: float = 60.0) -> float:
    """Wait until the tree has used under 5 % of a core for `idle_s` on end (a server may
    still be running the last batch of 64 that wrk left behind), at most `limit_s`; returns
    the seconds waited. Every server gets the same rule before its memory is read."""
    began = time.perf_counter()
    quiet_since = began
    last = tree_cpu_s(pid)
    while time.perf_counter() - began < limit_s:
        time.sleep(0.25)
        now, used = time.perf_counter(), tree_cpu_s(pid)
        if used - last > 0.05 * 0.25:
            quiet_since = now
        last = used
        if now - quiet_since >= idle_s:
            break
    return time.perf_counter() - began


def memory_tree(pid: int) -> dict[str, float]:
    """RSS, PSS and peak RSS (VmHWM; each process's own peak, summed) in MB over `pid` and
    all its descendants."""
    rss, pss, peak, count = 0, 0, 0, 0
    for member in tree_pids(pid):
        try:
            text = pathlib.Path(f"/proc/{member}/smaps_rollup").read_text()
            status = pathlib.Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        count += 1
        rss += int(re.search(r"^Rss:\s+(\d+)", text, re.M).group(1))
        pss += int(re.search(r"^Pss:\s+(\d+)", text, re.M).group(1))
        peak += int(re.search(r"^VmHWM:\s+(\d+)", status, re.M).group(1))
    return {"rss_mb": rss / 1024, "pss_mb": pss / 1024, "peak_rss_mb": peak / 1024,
            "processes": count}


def tensorgate_details(running: Running) -> dict[str, Any]:
    """Bytes copied per request (metrics) and the per-stage times (statistics extension).

    `stage_us` is per request as Triton counts it: each request in a batch is charged its
    whole batch's input, infer and output time, so under load it reads the batch's time, not
    a share of it. `batch_stage_us` is per batch run, with `mean_batch_rows` beside it."""
    details: dict[str, Any] = {}
    metrics = urlopen_text(f"http://127.0.0.1:{running.ports.metrics}/metrics")
    details["copies_by_reason"] = {reason: int(amount) for reason, amount in re.findall(
        r'^tensorgate_copies_by_reason_bytes_total\{reason="(\w+)"\} (\d+)$', metrics, re.M)}
    for model in WORKLOADS:
        copied = re.search(rf'tensorgate_copied_bytes_total{{model="{model}",version="1"}} (\S+)',
                           metrics)
        count = re.search(rf'nv_inference_request_success{{model="{model}",version="1"}} (\S+)',
                          metrics)
        stats = json.loads(urlopen_text(
            f"http://127.0.0.1:{running.ports.http}/v2/models/{model}/stats"))
        model_stats = stats["model_stats"][0]
        inference = model_stats["inference_stats"]
        per_stage = {stage: inference[stage]["ns"] / max(inference[stage]["count"], 1) / 1e3
                     for stage in ("queue", "compute_input", "compute_infer", "compute_output")}
        runs = max(model_stats["execution_count"], 1)
        per_batch = {stage: sum(b[stage]["ns"] for b in model_stats["batch_stats"]) / runs / 1e3
                     for stage in ("compute_input", "compute_infer", "compute_output")}
        details[model] = {
            "copied_bytes_per_request": (float(copied.group(1)) / float(count.group(1))
                                         if copied and count and float(count.group(1)) else None),
            "stage_us": per_stage, "batch_stage_us": per_batch,
            "mean_batch_rows": model_stats["inference_count"] / runs}
    return details


def urlopen_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def floor_calls(models: pathlib.Path, x: np.ndarray, device: str = "cpu"
                ) -> dict[str, Callable[[], np.ndarray]]:
    """Each workload's TorchScript file loaded in this process, as one request's call: on the
    CPU with the servers' thread count; on the GPU through `cuda_graph_call`, the best a
    server could do there. Loaded once a run: the floor rounds and the paired floor call
    them."""
    torch.set_num_threads(default_intra_op_threads())
    calls = {}
    for model in WORKLOADS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(models / model / "1" / "model.pt"),
                                    map_location=device).eval()
        calls[model] = cuda_graph_call(module, x) if device == "cuda" else cpu_call(module, x)
    return calls


def floor(calls: dict[str, Callable[[], np.ndarray]], counts: dict[str, int],
          warmup: dict[str, int]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Each workload's call timed `counts` times in a row after `warmup`; its answer too."""
    results, outputs = {}, {}
    for model, call in calls.items():
        for _ in range(warmup[model]):
            call()
        samples = np.array([timed_call(call) for _ in range(counts[model])], dtype=np.int64)
        outputs[model] = call().copy()
        results[model] = {"us": (samples / 1e3).round(1).tolist()}
    return results, outputs


def cpu_call(module: torch.jit.ScriptModule, x: np.ndarray) -> Callable[[], np.ndarray]:
    """One request on the CPU: a forward pass over a view of `x`."""
    tensor = torch.from_numpy(x)

    def call() -> np.ndarray:
        with torch.inference_mode():
            return module(tensor).numpy()
    return call


def cuda_graph_call(module: torch.jit.ScriptModule, x: np.ndarray) -> Callable[[], np.ndarray]:
    """One request, host to host: the input from pinned memory, one CUDA graph replay, the
    output back into pinned memory, on a stream of its own."""
    device = torch.device("cuda")
    host_in = torch.from_numpy(x).pin_memory()
    stream = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(stream):
        static_in = host_in.to(device)
        for _ in range(3):  # warm the kernels (and TorchScript's profiling) off the graph
            module(static_in)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = module(static_in)
    host_out = torch.empty(static_out.shape, dtype=static_out.dtype, pin_memory=True)

    def call() -> np.ndarray:  # inference tensors: written to in inference mode only
        with torch.inference_mode(), torch.cuda.stream(stream):
            static_in.copy_(host_in, non_blocking=True)
            graph.replay()
            host_out.copy_(static_out, non_blocking=True)
        stream.synchronize()
        return host_out.numpy()
    return call


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
    # seconds of load per connection, so that a point lasts several full rounds: a resnet50
    # batch of 64 takes seconds on two cores, and wrk counts only finished requests
    per_connection_s: dict[str, float] = field(
        default_factory=lambda: {"identity": 0.0, "resnet50": 0.16})
    # each point is first run unmeasured for this share of its length (at least 1 s), at
    # its own connection count: a server's first seconds at a new concurrency (new batch
    # sizes, the connections' set-up) are not its steady state; measured straight, a fresh
    # 64-connection identity point's P99 was 118 ms in one start and 20-30 ms in five
    # others (the forty-seventh session's note)
    warm_share: float = 1 / 3


FULL = Plan(rounds=2, counts={"identity": 2000, "resnet50": 300},
            warmup={"identity": 200, "resnet50": 10},
            levels={"identity": (1, 4, 16, 64), "resnet50": (1, 4, 16, 64)},
            seconds={"identity": 3.0, "resnet50": 6.0}, startups=3)
QUICK = Plan(rounds=1, counts={"identity": 200, "resnet50": 10},
             warmup={"identity": 20, "resnet50": 2},
             levels={"identity": (1, 16), "resnet50": (1,)},
             seconds={"identity": 1.0, "resnet50": 2.0}, startups=1)
# The GPU device: one round (its 15 minutes are shared with the CUDA tests), ≥ 1,000
# sequential requests a workload, and short points since a batch takes milliseconds there
CUDA = Plan(rounds=1, counts={"identity": 1000, "resnet50": 1000},
            warmup={"identity": 100, "resnet50": 100},
            levels={"identity": (1, 4, 16, 64), "resnet50": (1, 4, 16, 64)},
            seconds={"identity": 3.0, "resnet50": 3.0}, startups=1,
            per_connection_s={"identity": 0.0, "resnet50": 0.0})


def duration(plan: Plan, model: str, connections: int) -> float:
    return max(plan.seconds[model], connections * plan.per_connection_s[model])


def warm_duration(plan: Plan, model: str, connections: int) -> float:
    """The unmeasured run before a point; 0: none."""
    return max(1.0, plan.warm_share * duration(plan, model, connections)) \
        if plan.warm_share > 0 else 0.0


# Workloads whose sequential run calls the floor after each of the server's requests
# (compare_wire.sequential_exchanges): resnet50's goal is its P99 over the floor's, and this
# machine's speed swings from minute to minute (2026-12-06: the floor's own P99 168-306 ms in
# three runs), so a floor measured minutes apart from a server says more about those minutes
# than about the server. Identity's floor is microseconds: pairing it would measure nothing.
PAIRED = ("resnet50",)


def measure_server(server: Server, work: pathlib.Path, x: np.ndarray,
                   expected: dict[str, np.ndarray], plan: Plan, record: dict[str, Any],
                   rounds: int, client: str | None,
                   calls: dict[str, Callable[[], np.ndarray]]) -> None:
    running, startup = start(server, work, x)
    record["startup_s"].append(startup)
    try:
        record["check_max_abs_diff"] = check_answers(running, x, expected)
        for model in WORKLOADS:
            began = time.perf_counter()
            part = sequential(running, model, plan.counts[model] // rounds, plan.warmup[model],
                              calls[model] if model in PAIRED else None)
            entry = record["workloads"].setdefault(model, {"sequential": [], "concurrent": []})
            entry["sequential"].append(part)
            paired = (f", paired floor P50 {np.median(part['paired_us']):,.0f} µs"
                      if "paired_us" in part else "")
            print(f"  {model}: {len(part['us'])} sequential, P50 {np.median(part['us']):,.0f} µs"
                  f"{paired} ({time.perf_counter() - began:.0f} s)", flush=True)
            if client is not None:
                entry["concurrent"].append(points(model, "", plan, lambda c, seconds: concurrent(
                    running, model, c, seconds, work, client)))
            if server.grpc and shutil.which("h2load"):
                entry.setdefault("grpc", []).append(grpc_points(running, model, x, plan, work))
        waited = settle(running.process.pid)
        record["memory"].append({**memory_tree(running.process.pid), "settled_s": waited})
        if server.name == "tensorgate":
            record["tensorgate"] = tensorgate_details(running)
    finally:
        running.stop()


# The identity goal's two servers, measured once more at the end of a run with both running
# and their identity requests interleaved one by one with the network floor's and the floor's
# calls (`interleaved`): the goal is a ratio of their overheads, and on a machine whose speed
# swings two sequential runs a minute apart can read each other's minutes (2026-12-06: the
# same tree's P50 0.9 and 2.0 ms ten minutes apart).
INTERLEAVED = ("tensorgate", "triton")


def interleaved(pair: list[Server], work: pathlib.Path, x: np.ndarray, n: int, warmup: int,
                floor_call: Callable[[], object], network: tuple[int, bytes]
                ) -> dict[str, list[float]]:
    """`pair` started side by side; identity's requests to each, to the network floor's
    answerer (`network`: its port and request) and the floor's call, interleaved
    (compare_wire.interleaved_exchanges): each one's latencies in µs."""
    elements = int(np.prod(WORKLOADS["identity"]))
    running: list[Running] = []
    try:
        for server in pair:
            running.append(start(server, work, x)[0])
        targets = {r.server.name: (r.ports.http, r.raws["identity"],
                                   r.server.wire.min_body(elements)) for r in running}
        targets[compare_report.NETWORK_FLOOR] = (*network, OIP_BINARY.min_body(elements))
        return interleaved_exchanges(targets, n, warmup, floor_call)
    finally:
        for r in running:
            r.stop()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through `finally`: servers stop


def points(model: str, label: str, plan: Plan,
           measure: Callable[[int, float], dict[str, Any]]) -> list[dict[str, Any]]:
    """`measure(connections, seconds)` at each of the plan's connection counts, printed,
    each after an unmeasured warm-up at the same count (`warm_duration`), whose QPS and P99
    are kept beside the point's as "warmup" (None where nothing finished in it). A count at
    which no request finished within its duration ends the series there (more connections
    would only wait longer), and the server's round goes on: its memory is still measured
    (Triton's resnet50 at 64 gRPC connections, 6 QPS: 10 s a request)."""
    found = []
    for c in plan.levels[model]:
        warm_s = warm_duration(plan, model, c)
        warm: dict[str, Any] | None = None
        if warm_s:
            try:
                warm = measure(c, warm_s)
            except NothingAnswered:
                pass
        try:
            point = measure(c, duration(plan, model, c))
        except NothingAnswered as error:
            print(f"  {model}{label}: {c} connections: {error}".splitlines()[0], flush=True)
            break
        point["warmup"] = None if warm is None else {
            key: warm[key] for key in ("seconds", "qps", "p50_us", "p99_us", "max_us",
                                       "requests", "bad", "errors")}
        found.append(point)
        warmed = (f" (warm-up {warm['qps']:,.1f} QPS, P99 {warm['p99_us'] / 1e3:,.1f} ms)"
                  if warm is not None else " (warm-up: none finished)" if warm_s else "")
        print(f"  {model}{label}: {c} connections, {point['qps']:,.1f} QPS, "
              f"P99 {point['p99_us'] / 1e3:,.1f} ms{warmed}", flush=True)
    return found


def grpc_points(running: Running, model: str, x: np.ndarray, plan: Plan,
                work: pathlib.Path) -> list[dict[str, Any]]:
    """The concurrency points again over gRPC (ModelInfer, HTTP/2) with h2load, for the
    servers that speak the Open Inference Protocol's gRPC; one reference call first gives
    the answer's exact size, which every answer under load must reach."""
    body = grpc_infer_body(model, x)
    answer = grpc_reference_answer(running.ports.grpc, body, 4 * int(np.prod(WORKLOADS[model])))
    return points(model, " over gRPC", plan, lambda c, seconds: h2load_grpc(
        running.ports.grpc, body, answer, c, seconds, work))


def choose_client(choice: str) -> str | None:
    """"wrk" where it is installed, else the socket client (compare_wire.socket_load)."""
    if choice == "auto":
        return "wrk" if shutil.which("wrk") else "socket"
    if choice == "wrk" and shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk): concurrency figures are skipped",
              flush=True)
        return None
    return choice


def speaking_json(available: dict[str, Server]) -> dict[str, Server]:
    """The servers that speak V2 JSON, each set to send it: the Open Inference Protocol's
    servers over HTTP without the binary extension, MLServer as always. No gRPC points:
    gRPC carries tensors as protobuf, never JSON."""
    return {name: dataclasses.replace(
                server, wire=OIP_JSON, grpc=False,
                note=server.note.replace("binary tensor extension", "V2 JSON"))
            for name, server in available.items()
            if server.wire in (OIP_BINARY, OIP_JSON) and server.v2_json}


def run(plan: Plan, names: list[str], output: pathlib.Path, device: str = "cpu",
        client_choice: str = "auto", wire: str = "native") -> dict[str, Any]:
    signal.signal(signal.SIGTERM, _interrupt)
    os.environ["TG_BENCH_DEVICE"] = device  # the peers' workloads.py, Triton's instance kind
    available = servers()
    if wire == "json":
        json_servers = speaking_json(available)
        for name in [n for n in names if n not in json_servers]:
            print(f"skipping {name}: it does not speak V2 JSON", flush=True)
        names, available = [n for n in names if n in json_servers], json_servers
    chosen = []
    for name in names:
        why = available[name].installed()
        if why:
            print(f"skipping {name}: {why}", flush=True)
        else:
            chosen.append(available[name])
    client = choose_client(client_choice)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-compare-"))
    write_default_repository(work / "models")
    shutil.rmtree(work / "models" / "detector")  # the peers serve identity and resnet50 only
    x = np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype(np.float32)
    for server in chosen:
        server.prepare(server, work, default_intra_op_threads())
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "plan": plan.__dict__,
        "command": " ".join([".venv/bin/python" if ".venv" in sys.executable else "python3",
                             "bench/compare.py", *sys.argv[1:]]),
        "threads": default_intra_op_threads(), "wrk": client == "wrk", "client": client,
        "device": device, "wire": wire,
        "floor": {"workloads": {}}, "servers": {}}
    for server in chosen:
        result["servers"][server.name] = {
            "version": server.version(), "wire": server.wire.name, "note": server.note,
            "batching": server.batching, "startup_s": [], "memory": [], "workloads": {}}
    calls = floor_calls(work / "models", x, device)
    floor_parts: dict[str, list[Any]] = {model: [] for model in WORKLOADS}
    network_parts: dict[str, list[Any]] = {model: [] for model in WORKLOADS}
    expected: dict[str, np.ndarray] = {}
    # the same request bytes through loopback to a bare answerer (bench/network_floor.py);
    # for the binary form, the one the goals are for
    answerer, network_raws = None, {}
    if wire == "native":
        network_port = free_port()
        answerer = network_floor.start(network_port, WORKLOADS)
        for model in WORKLOADS:
            path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", model, x)
            network_raws[model] = raw_request(network_port, path, headers, body)
    try:
        for r in range(max(plan.rounds, plan.startups)):
            order = chosen if r % 2 == 0 else chosen[::-1]
            if r < plan.rounds:
                part, expected = floor(calls,
                                       {m: c // plan.rounds for m, c in plan.counts.items()},
                                       plan.warmup)
                for model in WORKLOADS:
                    floor_parts[model].append(part[model])
                for model, raw in network_raws.items():
                    network_parts[model].append(sequential_exchanges(
                        network_port, raw, plan.counts[model] // plan.rounds,
                        plan.warmup[model], OIP_BINARY.min_body(int(np.prod(WORKLOADS[model]))),
                        f"network floor/{model}"))
            for server in order:
                record = result["servers"][server.name]
                print(f"round {r + 1}: {server.name}", flush=True)
                try:
                    if r < plan.rounds:
                        measure_server(server, work, x, expected, plan, record, plan.rounds,
                                       client, calls)
                    else:
                        running, startup = start(server, work, x)
                        running.stop()
                        record["startup_s"].append(startup)
                except Exception as error:  # one broken peer must not lose the others' numbers
                    record.setdefault("errors", []).append(f"round {r + 1}: {error}")
                    print(f"  {server.name} failed: {error}", flush=True)
        pair = [s for name in INTERLEAVED for s in chosen if s.name == name]
        # (the identity goal is this machine's; on a GPU it would only spend device time)
        if answerer is not None and device == "cpu" and len(pair) == len(INTERLEAVED):
            print("interleaved: " + ", ".join(INTERLEAVED) + ", the network floor and the floor",
                  flush=True)
            try:
                found = interleaved(pair, work, x, plan.counts["identity"] // plan.rounds,
                                    plan.warmup["identity"], calls["identity"],
                                    (network_port, network_raws["identity"]))
                result["interleaved"] = {"identity": found}
                print("  identity P50 " + ", ".join(f"{name} {np.median(us):,.0f} µs"
                                                    for name, us in found.items()), flush=True)
            except Exception as error:  # a peer that fails here must not lose the run
                result["interleaved_error"] = str(error)
                print(f"  interleaved failed: {error}", flush=True)
    finally:
        if answerer is not None:
            answerer.kill()
            answerer.wait(timeout=10)
            result["network_floor"] = {"workloads": {m: {"sequential": p}
                                                     for m, p in network_parts.items() if p}}
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
    found = {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
             "torch": torch.__version__, "kernel": platform.release(),
             "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
        found["cuda"] = torch.version.cuda
    return found


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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where every server runs the models (cuda: the GPU plan)")
    parser.add_argument("--client", choices=["auto", "wrk", "socket"], default="auto",
                        help="load generator for the concurrency points (auto: wrk if found)")
    parser.add_argument("--wire", choices=["native", "json"], default="native",
                        help="native: each server's fastest HTTP form (the binary extension "
                             "where it has one); json: V2 JSON for every server that speaks it")
    args = parser.parse_args()
    if args.device == "cuda" and not args.render_only and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device here")
    plan = CUDA if args.device == "cuda" else QUICK if args.quick else FULL
    if args.rounds:
        plan = Plan(**{**plan.__dict__, "rounds": args.rounds,
                       "startups": max(args.rounds, plan.startups)})
    default = ("compare-cuda.json" if args.device == "cuda" else
               "compare-quick.json" if args.quick else
               "compare-json.json" if args.wire == "json" else "compare.json")
    output = args.json or HERE / "results" / default
    if not args.render_only:
        run(plan, [n.strip() for n in args.servers.split(",") if n.strip()], output,
            args.device, args.client, args.wire)
    quiet = args.quick or args.no_results_md
    compare_report.render(output, None if quiet else HERE / "RESULTS.md")


if __name__ == "__main__":
    main()
