"""Request bytes for each wire format a benchmarked server speaks, and a lean HTTP/1.1 client.

Requests are built once per server and workload and sent as they are, so the client costs
the same for every server; `Wire.decode` reads an answer back for the correctness check and
`Wire.min_body` is the smallest well-formed answer, which every measured answer must reach.
"""

from __future__ import annotations

import base64
import json
import socket
from dataclasses import dataclass
from typing import Callable

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
        with memoryview(buffer) as whole:  # one copy out; the export ends before the del
            body = memoryview(bytes(whole[end + 4:total]))
        del buffer[:total]
        return status, headers, body

    def _recv(self, buffer: bytearray) -> None:
        n = self.sock.recv_into(self._chunk)
        if n == 0:
            raise ConnectionError("the server closed the connection")
        buffer += self._chunk[:n]
