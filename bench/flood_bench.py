"""One HTTP/2 client that floods streams or frames, and what another client's requests wait.

A gRPC client may open streams without waiting for any answer when it resets each as it
opens it (HTTP/2 "rapid reset", CVE-2023-44487) or opens more than the concurrent limit it
was told (each refused), or makes the server reset each (a WINDOW_UPDATE of 0 on it,
"MadeYouReset", CVE-2025-8671), and send frames that ask for no answer (PRIORITY, empty DATA,
CVE-2019-9518; empty CONTINUATIONs of a header block never ended, CVE-2024-27316): nothing
then holds it back but the server's own pace. This drives
a server from one or two source trees with such a client on its gRPC port (ModelMetadata
calls, prebuilt frames written as fast as the socket takes them, whatever comes back read
and dropped), or an HTTP/1.1 client that pipelines requests, while a second client sends
`GET /v2/health/ready` over HTTP/1.1 one after another, and prints per mode what the flood
wrote a second (streams; frames for priority, empty-data, ping, window and continuation;
requests answered for pipeline), the second client's checks, P50, P99 and max, the server's
CPU seconds and how much its RSS grew over the mode. Each mode's flood comes from its own
loopback address (127.0.0.10 on), so that a mode's connections do not start on the probation
an earlier mode's flood earned its address (network/flooders.py); `--flooders N` floods with
N such clients at once, from the mode's one address:

    none         no flood (the baseline)
    reset        each call reset as it is opened, on one connection
    reset-again  the same, connecting again whenever the server closes the connection
    beyond       calls opened beyond the concurrent limit, never reset (each refused)
    made-reset   calls opened, each followed by a WINDOW_UPDATE of 0 on it: the server's
                 stream error resets it
    priority     PRIORITY frames, one after another
    empty-data   empty DATA frames on one call that never ends
    ping         PINGs, one after another, their answers read (gRPC's ping policy ends the
                 connection after a few; with --grpc-http2-max-ping-strikes 0 nothing does)
    ping-unread  the same, their answers never read: what they cost the server's memory
    window       WINDOW_UPDATE frames of 1 byte for the connection, one after another
    continuation a call's HEADERS without END_HEADERS, then empty CONTINUATION frames
    *-again      (priority-again, empty-data-again, continuation-again, made-reset-again)
                 the same, connecting again whenever the server closes the connection
    pipeline     HTTP/1.1: 2,000 health checks in one write, their answers read, again

    git worktree add /tmp/tg-old <commit>
    .venv/bin/python bench/flood_bench.py [--before /tmp/tg-old/src] [--seconds 5]
        [--modes none,reset,reset-again,beyond,made-reset,made-reset-again,priority,
                 priority-again,empty-data,empty-data-again,ping,ping-unread,window,
                 continuation,continuation-again,pipeline] [--flooders 1]
        [-- SERVER FLAGS...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import pathlib
import platform
import socket
import struct
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, serve, server_cpu_s, trees_of  # noqa: E402
from compare_wire import latency_figures  # noqa: E402

from tensorgate.builtin.repository import write_default_repository  # noqa: E402

MODES = ("none", "reset", "reset-again", "beyond", "made-reset", "made-reset-again",
         "priority", "priority-again", "empty-data", "empty-data-again", "ping", "ping-unread",
         "window", "continuation", "continuation-again", "pipeline")
_CHECK = b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"


def _flood(port: int, seconds: float, mode: str, source: str,
           opened: multiprocessing.Value) -> None:
    """The flooding client (its own process), connecting from `source`: streams of
    ModelMetadata calls, 50 a write."""
    import hpack
    from tritonclient.grpc import service_pb2 as pb

    from tests.e2e.h2_client import (CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS,
                                     PING, PRIORITY, RST_STREAM, WINDOW_UPDATE, H2Client)

    block = hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":authority", "x"),
        (":path", "/inference.GRPCInferenceService/ModelMetadata"),
        ("content-type", "application/grpc"), ("te", "trailers")])
    message = pb.ModelMetadataRequest(name="resnet50").SerializeToString()
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    kind, again = mode.removesuffix("-again"), mode.endswith("-again")
    reads = kind != "ping-unread"
    kind = kind.removesuffix("-unread")

    def connect() -> H2Client:
        client = H2Client(port, source=source)
        if kind == "empty-data":  # one call, opened and never ended
            client.send(HEADERS, END_HEADERS, 1, block)
        elif kind == "continuation":  # one call's header block, never ended
            client.send(HEADERS, 0, 1, block)
        client.sock.setblocking(False)
        return client

    client, stream, pending, batch, count = connect(), 1, b"", 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pending and kind in ("priority", "empty-data", "ping", "window",
                                    "continuation"):
            frame = (client.frame(PRIORITY, 0, 1, b"\0\0\0\0\x10") if kind == "priority"
                     else client.frame(PING, 0, 0, b"12345678") if kind == "ping"
                     else client.frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\x01")
                     if kind == "window" else client.frame(CONTINUATION, 0, 1, b"")
                     if kind == "continuation" else client.frame(DATA, 0, 1, b""))
            pending, batch = frame * 5000, 5000
        if not pending:
            parts = []
            for _ in range(50):
                parts.append(client.frame(HEADERS, END_HEADERS, stream, block))
                if kind == "made-reset":  # broken before its request: a stream error
                    parts.append(client.frame(WINDOW_UPDATE, 0, stream, b"\0\0\0\0"))
                else:
                    parts.append(client.frame(DATA, END_STREAM, stream, body))
                if kind == "reset":
                    parts.append(client.frame(RST_STREAM, 0, stream, struct.pack(">I", 8)))
                stream += 2
            pending, batch = b"".join(parts), 50
        try:
            pending = pending[client.sock.send(pending):]
            if not pending:  # the batch written whole
                count += batch
            while reads and client.sock.recv(1 << 16):
                pass
        except BlockingIOError:
            time.sleep(0.0005)
        except OSError:  # closed by the server
            if not again:
                break
            client.close()
            client, stream, pending = connect(), 1, b""
    client.close()
    with opened.get_lock():
        opened.value += count


def _pipeline(port: int, seconds: float, answered: multiprocessing.Value) -> None:
    """The pipelining HTTP/1.1 client (its own process): 2,000 health checks a write, then
    their answers read, until `seconds` have passed."""
    count, batch = 0, 2000
    with socket.create_connection(("127.0.0.1", port), timeout=seconds + 30) as sock:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sock.sendall(_CHECK * batch)
            got, tail = 0, b""
            while got < batch:
                data = sock.recv(1 << 20)
                if not data:
                    raise RuntimeError("the server closed the pipelining connection")
                data = tail + data  # (a status line may be cut across reads: its first
                got += data.count(b"HTTP/1.1 200")  # 11 bytes cannot be a whole one)
                tail = data[-11:]
            count += got
    answered.value = count


def _checks(port: int, seconds: float) -> np.ndarray:
    """Health checks one after another on one connection for `seconds`: latencies in µs."""
    samples = []
    with socket.create_connection(("127.0.0.1", port), timeout=seconds + 30) as sock:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter_ns()
            sock.sendall(_CHECK)
            answer = b""
            while not answer.endswith(b"}"):
                answer += sock.recv(4096)
            samples.append(time.perf_counter_ns() - started)
    return np.array(samples) / 1e3


def _rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--flooders", type=int, default=1,
                        help="flooding clients at once, from the mode's one address")
    parser.add_argument("flags", nargs="*", help="more of the servers' command lines")
    args = parser.parse_args()
    modes = args.modes.split(",")
    models = write_default_repository(pathlib.Path(tempfile.gettempdir())
                                      / "tensorgate-bench-repo")
    print(f"{args.flooders} flooding HTTP/2 client(s) beside one sending health checks, "
          f"{args.seconds:g} s a mode; {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'tree':10} {'mode':16} {'sent/s':>14} {'checks':>8} {'P50 µs':>10} "
          f"{'P99 µs':>11} {'max µs':>11} {'CPU s':>6} {'RSS +MB':>8}")
    for name, src in trees_of(args).items():
        process, http_port, grpc_port = serve(src, models, *args.flags)
        try:
            for mode in modes:
                opened = multiprocessing.Value("q", 0)
                rss, cpu = _rss_mb(process.pid), server_cpu_s(process.pid)
                floods = []
                if mode == "pipeline":
                    floods = [multiprocessing.Process(
                        target=_pipeline, args=(http_port, args.seconds + 0.5, opened))]
                elif mode != "none":
                    source = f"127.0.0.{10 + MODES.index(mode)}"
                    floods = [multiprocessing.Process(
                        target=_flood, args=(grpc_port, args.seconds + 0.5, mode, source,
                                             opened)) for _ in range(args.flooders)]
                for flood in floods:
                    flood.start()
                if floods:
                    time.sleep(0.3)
                checks = latency_figures(_checks(http_port, args.seconds))
                grown = _rss_mb(process.pid) - rss  # (while an unread flood is still open)
                for flood in floods:
                    flood.join(timeout=args.seconds + 30)
                cpu = server_cpu_s(process.pid) - cpu
                print(f"{name:10} {mode:16} {opened.value / (args.seconds + 0.5):>14,.0f} "
                      f"{checks['requests']:>8,} {checks['p50_us']:>10,} "
                      f"{checks['p99_us']:>11,} {checks['max_us']:>11,} {cpu:>6.2f} "
                      f"{grown:>8,.1f}",
                      flush=True)
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
