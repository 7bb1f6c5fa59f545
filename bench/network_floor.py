"""The network floor: what moving a workload's request and answer bytes over loopback TCP
costs on this machine, with no server work between.

A bare answerer (this file, run as a process of its own) reads each request whole into one
buffer and answers, in one sendall, prebuilt bytes of the size a server's answer has: an
Open Inference Protocol binary answer of the workload's output (zeros). bench/compare.py
times it each round as it times the servers (compare_wire.sequential_exchanges: the same
client, connection and request bytes, each answer's size checked): a server's sequential
latency less this is its own work, where the in-process floor's difference also holds the
kernel's copies of ~1.2 MB a request for identity — a cost every server pays alike, which
grows on a slow machine and makes the servers' ratios closer.

    python bench/network_floor.py PORT identity=3,224,224 resnet50=1000
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import numpy as np

_HEAD_END = b"\r\n\r\n"


def answer(model: str, shape: tuple[int, ...]) -> bytes:
    """A whole HTTP answer: an OIP binary answer of FP32 zeros of `shape` (batch 1)."""
    size = 4 * int(np.prod(shape))
    header = json.dumps({"model_name": model, "model_version": "1", "outputs": [
        {"name": "OUTPUT__0", "datatype": "FP32", "shape": [1, *shape],
         "parameters": {"binary_data_size": size}}]}).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
            % (len(header), len(header) + size)) + header + bytes(size)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def serve(port: int, answers: dict[bytes, bytes]) -> None:
    """Answer the connections to 127.0.0.1:`port` one at a time, each request by the model
    its path names (`answers`: path → answer), until killed."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    buffer = bytearray(1 << 22)
    view = memoryview(buffer)
    while True:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        have = 0
        with connection:
            while True:
                end = buffer.find(_HEAD_END, 0, have)
                if end < 0:
                    got = connection.recv_into(view[have:])
                    if not got:
                        break
                    have += got
                    continue
                head = bytes(view[:end])
                total = end + 4 + _content_length(head)
                while have < total:
                    got = connection.recv_into(view[have:])
                    if not got:
                        break
                    have += got
                if have < total:
                    break
                connection.sendall(answers.get(head.split(b" ", 2)[1], b"HTTP/1.1 404 x\r\n"
                                                b"Content-Length: 0\r\n\r\n"))
                view[:have - total] = view[total:have]
                have -= total


def start(port: int, workloads: dict[str, tuple[int, ...]]) -> subprocess.Popen[bytes]:
    """The answerer in a process of its own, once it takes connections."""
    process = subprocess.Popen([sys.executable, __file__, str(port), *(
        f"{model}={','.join(map(str, shape))}" for model, shape in workloads.items())])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the network floor's answerer did not start")


def main() -> None:
    port = int(sys.argv[1])
    answers = {}
    for spec in sys.argv[2:]:
        model, _, dims = spec.partition("=")
        shape = tuple(int(d) for d in dims.split(","))
        answers[f"/v2/models/{model}/infer".encode()] = answer(model, shape)
    serve(port, answers)


if __name__ == "__main__":
    main()
