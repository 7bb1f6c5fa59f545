"""An HTTP/1.1 answer with tensor bytes leaves in one writev, its head with them: written
apart, the head woke a waiting client alone, which then waited again for the bytes (a
client alternating sequential identity requests between the two forms: 1.5-1.7 fewer recv
calls and a P50 35-79 µs lower; bench/interleaved_bench.py, bench/RESULTS.md). A larger
answer leaves in slices of _SEND_SLICE, the head in the first.

The front end runs in this test's loop, so that os.writev, which the connection's
SocketSender calls, can be watched (and called through): what each call was offered."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
from typing import Any

import numpy as np
import pytest

from tensorgate.dataplane import DataPlane
from tensorgate.network import http_answers
from tests.network.served_http import served_http
from tests.pipeline import repo_builder as rb


def _infer(port: int, values: np.ndarray) -> tuple[bytes, bytes]:
    """One binary-extension request for model `identity`: the answer's head and body."""
    header = json.dumps({
        "inputs": [{"name": "INPUT__0", "shape": list(values.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes}}],
        "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}]}).encode()
    body = header + values.tobytes()
    request = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/octet-stream\r\n"
               b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
               % (len(header), len(body))) + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(1 << 16)
        head, _, body = got.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            data = sock.recv(1 << 20)
            assert data, "the connection closed before the whole answer came"
            body += data
        return head, body


def _answer(repo: pathlib.Path, values: np.ndarray, monkeypatch: pytest.MonkeyPatch
            ) -> tuple[bytes, bytes, list[list[tuple[bytes, int]]]]:
    """Serve `repo`, ask identity for `values`: the answer, and each os.writev call's
    buffers (the first 16 bytes of each, and its length) as offered."""
    calls: list[list[tuple[bytes, int]]] = []
    writev = os.writev

    def watched(fd: int, buffers: Any) -> int:
        calls.append([(bytes(memoryview(b)[:16]), len(b)) for b in buffers])
        return writev(fd, buffers)

    monkeypatch.setattr(os, "writev", watched)

    async def scenario() -> tuple[bytes, bytes]:
        async with served_http(repo, DataPlane, 64 << 20) as (_, _, port):
            return await asyncio.to_thread(_infer, port, values)

    head, body = asyncio.run(asyncio.wait_for(scenario(), 60))
    return head, body, calls


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("models")
    rb.add_torchscript(root, "identity", rb.Identity(), [-1], [-1])
    return root


def _tensor_bytes(body: bytes, values: np.ndarray) -> bytes:
    """The answer's tensor bytes: what follows its JSON header."""
    return body[len(body) - values.nbytes:]


def test_a_small_answer_leaves_in_one_writev_with_its_head(
        repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.arange(1000, dtype=np.float32).reshape(1, 1000)
    head, body, calls = _answer(repo, values, monkeypatch)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert _tensor_bytes(body, values) == values.tobytes()
    answer = len(head) + 4 + len(body)
    assert len(calls) == 1, calls  # head, JSON header and tensor bytes: one call
    (first, _), (_, tensor) = calls[0]
    assert first.startswith(b"HTTP/1.1 200")
    assert tensor == values.nbytes
    assert sum(length for _, length in calls[0]) == answer


def test_a_large_answer_leaves_in_slices_the_head_in_the_first(
        repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(0).standard_normal((1, 768 * 1024), dtype=np.float32)
    head, body, calls = _answer(repo, values, monkeypatch)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert _tensor_bytes(body, values) == values.tobytes()  # 3 MiB, whole and in order
    assert calls[0][0][0].startswith(b"HTTP/1.1 200")
    offered = [sum(length for _, length in call) for call in calls]
    # each call a slice; the first one whole (a socket that took less would leave the rest
    # to the transport, not to another call)
    assert offered[0] == http_answers._SEND_SLICE, offered
    assert all(size <= http_answers._SEND_SLICE for size in offered), offered
    assert not any(part.startswith(b"HTTP/") for call in calls[1:] for part, _ in call)
