"""Malformed and hostile HTTP, over a raw socket: each gets a clear 4xx (or the connection is
closed for bytes we will not read) and the server keeps serving."""

from __future__ import annotations

import gzip
import json
import re
import socket
import struct
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorgate.network.http_parsing import HEAD_WINDOW
from tests.e2e.conftest import RunningServer, still_serving

IDENTITY = "/v2/models/identity/infer"


def exchange(server: RunningServer, raw: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """Send `raw`, read one response: (status, headers, body); status 0 if closed first."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return 0, {}, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        # bytes past Content-Length belong to a next response (an answer to trailing junk)
        return status, headers, body[:length] if "content-length" in headers else body


def request(path: str, body: bytes, headers: dict[str, str] | None = None,
            method: str = "POST", length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1",
             f"Content-Length: {len(body) if length is None else length}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def binary_body(header: dict, tensor: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + tensor, {"Inference-Header-Content-Length": str(len(head))}


def identity_header(size: int, shape: list[int] | None = None, datatype: str = "FP32") -> dict:
    return {"inputs": [{"name": "INPUT__0", "shape": shape or [1, 3, 4], "datatype": datatype,
                        "parameters": {"binary_data_size": size}}]}


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


TENSOR = np.arange(12, dtype="<f4").tobytes()
# a V2 JSON request to `paced` (it answers 2x+1): [1, 2, 3, 4] -> [3, 5, 7, 9]
PACED_BODY = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 4], "datatype": "FP32",
                                     "data": [1, 2, 3, 4]}]}).encode()


@pytest.mark.parametrize("raw, status, message", [
    (request(IDENTITY, b"{not json"), 400, r"^the inference request header is not valid JSON"),
    (request(IDENTITY, b"[1,2]"), 400, r"^the inference request must be a JSON object"),
    (request(IDENTITY, b'{"inputs": ' + b"[" * 100_000), 400,
     r"^the inference request header is not valid JSON: it nests arrays or objects too deeply"),
    (request("/v2/logging", b'{"a":' * 50_000), 400,
     r"^the request body is not valid JSON: it nests arrays or objects too deeply"),
    (request("/v2/models/identity/generate", b"[" * 100_000), 400,
     r"^the generate request is not valid JSON: it nests arrays or objects too deeply"),
    (request(IDENTITY, b'{"inputs": []}'), 400, r"needs an 'inputs' list"),
    (request(IDENTITY, json.dumps({"inputs": [{"name": f"x{i}", "shape": [1], "datatype": "FP32",
                                               "data": [1]} for i in range(5000)]}).encode()),
     400, r"^the request names 5,000 inputs; at most 4,096 are accepted$"),
    (request(IDENTITY, *binary_body({**identity_header(48),
                                     "outputs": [{"name": "OUTPUT__0"}] * 5000}, TENSOR)),
     400, r"^the request names 5,000 outputs; at most 4,096 are accepted$"),
    (request(IDENTITY, *binary_body(identity_header(48), TENSOR)), 200, None),
    (request(IDENTITY, binary_body(identity_header(48), TENSOR)[0],
             {"Inference-Header-Content-Length": "9999"}), 400,
     r"^Inference-Header-Content-Length 9999 exceeds the \d+-byte body$"),
    (request(IDENTITY, binary_body(identity_header(48), TENSOR)[0],
             {"Inference-Header-Content-Length": "x"}), 400,
     r"inference-header-content-length must be an integer"),
    (request(IDENTITY, binary_body(identity_header(48), TENSOR)[0]), 400,
     r"not valid JSON"),  # the header length is missing: the whole body is read as JSON
    (request(IDENTITY, *binary_body(identity_header(4800), TENSOR)), 400,
     r"^input 'INPUT__0': binary_data_size 4800 at byte \d+ runs past the \d+-byte body$"),
    (request(IDENTITY, *binary_body(identity_header(40), TENSOR)), 400,
     r"FP32 needs 48 bytes \(12 elements of 4\), found 40"),
    (request(IDENTITY, *binary_body(identity_header(48, [2**40, 2**40, 2**40]), TENSOR)), 400,
     r"the dims multiply to"),
    (request(IDENTITY, *binary_body(identity_header(48, [1, -3, 4]), TENSOR)), 400,
     r"dim -3 is negative"),
    (request(IDENTITY, *binary_body(identity_header(48, datatype="FP33"), TENSOR)), 400,
     r"unknown datatype 'FP33'"),
    (request("/v2/models/nope/infer", *binary_body(identity_header(48), TENSOR)), 404,
     r"unknown model 'nope'"),
    (request("/v2/models/identity/versions/01/infer", *binary_body(identity_header(48), TENSOR)),
     404, r"is not a version number"),
    (request("/v2/nowhere", b""), 404, r"no route for /v2/nowhere"),
    (request(IDENTITY, b"", method="GET"), 405, r"use POST"),
    (request(IDENTITY, b"x" * 16, length=2 << 20), 413,
     r"^request body of 2097152 bytes exceeds the 1048576-byte limit"),
    (request(IDENTITY, gzip.compress(json.dumps({"inputs": [{"name": "INPUT__0",
     "shape": [1, 3, 4], "datatype": "FP32", "data": list(range(12))}]}).encode()),
     {"Content-Encoding": "gzip"}), 200, None),
    (request(IDENTITY, zlib.compress(b" " * (2 << 20)), {"Content-Encoding": "deflate"}), 400,
     r"the decompressed body exceeds the 1048576-byte limit"),
    (request(IDENTITY, b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}), 400,
     r"cannot be decompressed"),
    (request(IDENTITY, gzip.compress(b'{"inputs": []}' + b" " * 1000)[:-12],
             {"Content-Encoding": "gzip"}), 400,
     r"^the gzip body is truncated: it ends before its compressed stream does$"),
    (b"GARBAGE / HTTP/1.1\r\n\r\n", 400, r"malformed HTTP request"),
])
def test_bad_requests(server: RunningServer, raw: bytes, status: int, message: str | None) -> None:
    got, _, body = exchange(server, raw)
    assert got == status, body
    if message is not None:
        import re
        assert re.search(message, error_of(body)), error_of(body)
    still_serving(server)


def test_bytes_element_past_the_end(server: RunningServer) -> None:
    elements = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 99) + b"x"
    header = {"inputs": [{"name": "INPUT__0", "shape": [2], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(elements)}}]}
    status, _, body = exchange(server, request(IDENTITY, *binary_body(header, elements)))
    assert status == 400
    assert "BYTES tensor 'INPUT__0': element 1 of 2 declares 99 bytes" in error_of(body)
    still_serving(server)


def test_truncated_body_then_disconnect(server: RunningServer) -> None:
    body, headers = binary_body(identity_header(48), TENSOR)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request(IDENTITY, body[:-10], headers, length=len(body)))
    still_serving(server)


def test_content_length_smaller_than_sent(server: RunningServer) -> None:
    body, headers = binary_body(identity_header(48), TENSOR)
    status, _, reply = exchange(server, request(IDENTITY, body + b"trailing", headers,
                                                length=len(body)))
    assert status == 200  # the first request is whole; the rest is a malformed second one
    assert json.loads(reply)["outputs"][0]["data"] == list(range(12))
    still_serving(server)


def test_a_client_that_expects_100_continue_is_told_to_send_its_body(
        server: RunningServer) -> None:
    """curl sends `Expect: 100-continue` before a body over 1 MiB and waits a second for the
    interim answer (a 3 MB request took 1.06 s): it comes once the body has its buffer, and
    a body refused by its headers gets the final answer instead."""
    body, headers = binary_body(identity_header(48), TENSOR)
    expecting = {**headers, "Expect": "100-continue"}
    head = request(IDENTITY, b"", expecting, length=len(body))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head)
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"  # before any body byte
        sock.sendall(body)
        answer = b""
        while b'"outputs"' not in answer or not answer.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["outputs"][0]["data"] == \
        list(range(12))
    # too large for --max-request-bytes: 413 at once, never 100
    status, _, reply = exchange(server, request(IDENTITY, b"", expecting, length=2 << 20))
    assert status == 413 and "exceeds the 1048576-byte limit" in error_of(reply)
    # HTTP/1.0 knows no interim answers
    status, _, _ = exchange(server, request(IDENTITY, body, expecting).replace(
        b"HTTP/1.1", b"HTTP/1.0", 1))
    assert status == 200
    still_serving(server)


def test_head_is_get_without_its_body_and_a_wrong_method_is_told_what_is_allowed(
        server: RunningServer) -> None:
    """Load balancers check health with HEAD (RFC 9110: a server MUST take GET and HEAD):
    GET's status and headers, Content-Length included, and no body, so the keep-alive
    connection carries on; a 405 says which methods the path takes (Allow)."""
    get = b"GET /v2/models/identity HTTP/1.1\r\nHost: x\r\n\r\n"
    status, headers, body = exchange(server, get)
    assert status == 200 and len(body) == int(headers["content-length"]) > 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(get.replace(b"GET", b"HEAD", 1))
        data = b""
        while not data.endswith(b"\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert f"Content-Length: {len(body)}".encode() in data and b"Connection" not in data
        sock.sendall(get)  # the same connection: nothing of a body came between
        data = b""
        while not data.endswith(body):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK")
    for method, path, allow in (("DELETE", IDENTITY, "POST"),
                                ("PUT", "/v2/logging", "GET, HEAD, POST"),
                                ("POST", "/v2/health/ready", "GET, HEAD")):
        status, headers, body = exchange(server, f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
                                                 f"Content-Length: 0\r\n\r\n".encode())
        assert (status, headers["allow"]) == (405, allow), body
    with socket.create_connection(("127.0.0.1", server.metrics_port), timeout=5) as sock:
        sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and rest == b""
    assert int(re.search(rb"Content-Length: (\d+)", head).group(1)) > 0
    still_serving(server)


def test_keep_alive_serves_many_requests_on_one_connection(server: RunningServer) -> None:
    body, headers = binary_body(identity_header(48), TENSOR)
    one = request(IDENTITY, body, headers)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(20):
            sock.sendall(one)
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(rest) < length:
                rest += sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200")
            assert json.loads(rest)["outputs"][0]["data"] == list(range(12))


def _read_response(sock: socket.socket, data: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """One response from `sock` (after `data` already read): head, body, what came after."""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    return head, rest[:length], rest[length:]


def test_a_request_sent_while_one_is_served_is_answered_after_it(server: RunningServer) -> None:
    """The second request's bytes arrive while `paced` (0.05 s) serves the first: they wait,
    and both are answered, in order, on the one connection."""
    body = PACED_BODY
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request("/v2/models/paced/infer", body))
        time.sleep(0.01)
        sock.sendall(request("/v2/models/paced", b"", method="GET"))
        head, first, rest = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
        assert json.loads(first)["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
        head, second, _ = _read_response(sock, rest)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(second)["name"] == "paced"


@pytest.mark.parametrize("kind", ["large", "small"])
def test_a_client_that_sends_requests_and_never_reads_is_not_answered_into_memory(
        server: RunningServer, kind: str) -> None:
    """Requests one after another for 3 s, no answer read: once the transport holds what
    the client has not read, the server reads no further request (it read 2.4 GB in 10 s
    and held the answers), so the client cannot send more than the sockets' buffers and a
    few requests; the server serves on. Small: health checks many to a read, each begun in
    the read that ended the one before, parsed in turn from the bytes held."""
    values = np.arange(200_000, dtype="<f4").tobytes()  # 800 KB each way
    header = {"inputs": [{"name": "INPUT__0", "shape": [200_000], "datatype": "FP32",
                          "parameters": {"binary_data_size": len(values)}}],
              "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}]}
    one = (request("/v2/models/wide/infer", *binary_body(header, values)) if kind == "large"
           else b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n" * 20_000)
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setblocking(False)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                offset = sent % len(one)
                sent += sock.send(one[offset:offset + (1 << 20)])
            except BlockingIOError:
                time.sleep(0.01)
    assert sent < 64 << 20, f"the server read {sent >> 20} MB of requests whose answers " \
                            "nobody read"
    still_serving(server)


def test_requests_pipelined_in_one_write_are_all_answered_in_order(
        server: RunningServer) -> None:
    """Small requests in one write, as wrk's pipeline script and health checkers send them:
    several begin in the read that ends the one before; each is answered, in order, on the
    one connection, which stays open (the first used to be answered with `Connection:
    close` and the rest dropped)."""
    body = PACED_BODY
    sent = [b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n",
            request("/v2/models/paced/infer", body),
            b"GET /v2/models/paced HTTP/1.1\r\nHost: t\r\n\r\n",
            b"GET /v2/no/such/route HTTP/1.1\r\nHost: t\r\n\r\n",
            b"HEAD /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n",
            request("/v2/models/paced/infer", body)] * 3
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"".join(sent))
        rest = b""
        for _ in range(3):
            head, answer, rest = _read_response(sock, rest)
            assert head.startswith(b"HTTP/1.1 200") and json.loads(answer) == {"ready": True}
            head, answer, rest = _read_response(sock, rest)
            assert json.loads(answer)["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
            head, answer, rest = _read_response(sock, rest)
            assert json.loads(answer)["name"] == "paced"
            head, answer, rest = _read_response(sock, rest)
            assert head.startswith(b"HTTP/1.1 404") and error_of(answer)
            head, answer, rest = _read_head(sock, rest)  # HEAD: a length, no body
            assert head.startswith(b"HTTP/1.1 200")
            head, answer, rest = _read_response(sock, rest)
            assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
            assert json.loads(answer)["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
        assert rest == b""
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")  # still open
        assert _read_response(sock, rest)[0].startswith(b"HTTP/1.1 200")
    still_serving(server)


@pytest.mark.parametrize("before_the_cut", [0, 1, 2, 3, 4])
def test_a_pipelined_request_after_a_blank_line_cut_across_reads_is_answered(
        server: RunningServer, before_the_cut: int) -> None:
    """The first request's header block ends across the server's first read (its head
    window) `before_the_cut` bytes of its blank line in the first, the rest with a body and
    the next request's start in the second: the server finds where the next begins from
    what the first read ended with, and answers both in order on the open connection."""
    body = PACED_BODY
    bare = request("/v2/models/paced/infer", body, {"X-Pad": ""})
    head = bare[:len(bare) - len(body) - 4]  # up to the blank line's \r\n\r\n
    pad = HEAD_WINDOW - before_the_cut - len(head)
    first = head.replace(b"X-Pad: ", b"X-Pad: " + b"p" * pad) + b"\r\n\r\n" + body
    assert first.index(b"\r\n\r\n") == HEAD_WINDOW - before_the_cut
    model = b"GET /v2/models/paced HTTP/1.1\r\nHost: t\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(first + model)
        head, answer, rest = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
        assert json.loads(answer)["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
        head, answer, rest = _read_response(sock, rest)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(answer)["name"] == "paced"
    still_serving(server)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["ready", "infer", "metadata", "missing"]),
                          st.integers(min_value=0, max_value=300),
                          st.sampled_from([b"", b"\r\n", b"\r\n\r\n"])), min_size=2, max_size=8))
def test_pipelined_requests_of_any_lengths_are_answered_in_order(
        server: RunningServer, sent: list[tuple[str, int, bytes]]) -> None:
    """Requests of any head and body lengths in one write (so the server's 256-byte reads
    end anywhere in them: in a blank line, a body, a next request's head), some after an
    empty line (which a request line may follow): every one is answered, in order."""
    body = PACED_BODY
    raw = b""
    for kind, pad, empty_line in sent:
        headers = {"X-Pad": "p" * pad}
        raw += empty_line + {
            "ready": request("/v2/health/ready", b"", headers, method="GET"),
            "infer": request("/v2/models/paced/infer", body, headers),
            "metadata": request("/v2/models/paced", b"", headers, method="GET"),
            "missing": request("/v2/no/such/route", b"", headers, method="GET")}[kind]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        rest = b""
        for kind, _, _ in sent:
            head, answer, rest = _read_response(sock, rest)
            assert b"Connection: close" not in head, (kind, head)
            if kind == "missing":
                assert head.startswith(b"HTTP/1.1 404") and error_of(answer)
                continue
            assert head.startswith(b"HTTP/1.1 200"), (kind, head, answer)
            if kind == "infer":
                assert json.loads(answer)["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
            elif kind == "ready":
                assert json.loads(answer) == {"ready": True}
            else:
                assert json.loads(answer)["name"] == "paced"


@pytest.mark.parametrize("blank_lines", [b"\r\n", b"\r\n\r\n", b"\n"])
def test_empty_lines_before_a_pipelined_request_across_reads_run_it_once(
        server: RunningServer, blank_lines: bytes) -> None:
    """Empty lines before a request line (which llhttp skips) fill the server's first read
    and begin its second, which holds the whole first request and the next one's start: the
    first request's end is found after its own header block, not in those lines (read as a
    blank line begun in the first read, the first request was parsed and answered twice)."""
    ahead = b"\r\n" * (HEAD_WINDOW // 2)  # the whole first read
    model = b"GET /v2/models/paced HTTP/1.1\r\nHost: t\r\n\r\n"
    last = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(ahead + blank_lines + model + last)
        answers = b""
        while chunk := sock.recv(65536):
            answers += chunk
    assert answers.count(b"HTTP/1.1 ") == 2, answers
    head, _, rest = answers.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b'"name":"paced"' in rest
    still_serving(server)


def test_a_request_pipelined_after_a_chunked_one_gets_the_first_answered_then_close(
        server: RunningServer) -> None:
    """After a chunked body, where the next request begins in the same read is not told:
    the first is answered with `Connection: close` and the connection closes (a pipelining
    client sends the rest again, RFC 9112 §9.3.2)."""
    body = PACED_BODY
    chunked = (b"POST /v2/models/paced/infer HTTP/1.1\r\nHost: t\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    model = b"GET /v2/models/paced HTTP/1.1\r\nHost: t\r\n\r\n"
    assert len(chunked + model) <= 256  # one read of the server's head window
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(chunked + model)
        head, answer, rest = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head
        assert json.loads(answer)["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
        while chunk := sock.recv(65536):
            rest += chunk
        assert rest == b""  # closed, nothing more answered
    still_serving(server)


@pytest.mark.parametrize("first, after", [
    (b"GET /v2/models/paced HTTP/1.0\r\n\r\n", b"GET /v2/health/live HTTP/1.1\r\n\r\n"),
    (b"GET /v2/models/paced HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
     b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"),
    (b"GET /v2/models/paced HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", b"\0junk"),
])
def test_bytes_after_a_request_that_closes_are_not_read_and_it_is_answered(
        server: RunningServer, first: bytes, after: bytes) -> None:
    """A request that closes its connection (`Connection: close`, or HTTP/1.0 without
    keep-alive), with more bytes in the same write: it is answered, the rest is not read,
    and the connection closes (RFC 9112 §9.6). It was refused 400, "Data after
    `Connection: close`", for bytes the server must not process anyway."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(first + after)
        head, answer, rest = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head, head
        assert json.loads(answer)["name"] == "paced"
        while chunk := sock.recv(65536):
            rest += chunk
        assert rest == b""  # closed, nothing more answered
    still_serving(server)


def _read_head(sock: socket.socket, data: bytes) -> tuple[bytes, bytes, bytes]:
    """A response to HEAD: its head only (its Content-Length names a body not sent)."""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, b"", rest


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=1, max_value=600), min_size=1, max_size=6))
def test_two_requests_cut_anywhere_get_their_answers_in_order(
        server: RunningServer, cuts: list[int]) -> None:
    """Two identity requests on one connection, their bytes sent in pieces cut anywhere
    (some pieces arriving while the first is served, some with the end of the one before):
    both are answered, in order, and the connection stays open."""
    body, headers = binary_body(identity_header(48), TENSOR)
    one = request(IDENTITY, body, headers)
    raw = one + one
    points = sorted({min(cut, len(raw) - 1) for cut in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)]) if raw[a:b]]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for piece in pieces:
            sock.sendall(piece)
        head, first, rest = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head, head
        assert json.loads(first)["outputs"][0]["data"] == list(range(12))
        head, second, _ = _read_response(sock, rest)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head, head
        assert json.loads(second)["outputs"][0]["data"] == list(range(12))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=400))
def test_fuzzed_bodies_never_break_the_server(server: RunningServer, junk: bytes) -> None:
    status, _, body = exchange(server, request(IDENTITY, junk,
                                               {"Inference-Header-Content-Length":
                                                str(min(len(junk), 50))}))
    assert status in (200, 400, 404, 501), (status, body)
    if status != 200:
        assert error_of(body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["inputs", "name", "shape", "datatype",
                                                       "data", "parameters", "outputs",
                                                       "binary_data_size", "id"]), inner,
                                      max_size=5), max_leaves=20))
def test_fuzzed_json_headers_get_clear_errors(server: RunningServer, header: object) -> None:
    status, _, body = exchange(server, request(IDENTITY, json.dumps(header).encode()))
    assert status in (200, 400, 501), (status, body)
    if status != 200:
        assert error_of(body)


_REGISTER_VALUES = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=12)
                    | st.dictionaries(st.just("b64"), st.text(max_size=100), max_size=1))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["system", "cuda"]),
       body=st.dictionaries(st.sampled_from(["key", "offset", "byte_size", "raw_handle",
                                             "device_id"]), _REGISTER_VALUES, max_size=5))
def test_fuzzed_shared_memory_registrations_get_clear_errors(server: RunningServer, kind: str,
                                                             body: dict) -> None:
    path = f"/v2/{kind}sharedmemory/region/fuzzed/register"
    status, _, answer = exchange(server, request(path, json.dumps(body).encode()))
    if status == 200:  # a key that happens to name a real object: leave nothing behind
        exchange(server, request(f"/v2/{kind}sharedmemory/region/fuzzed/unregister", b""))
    else:
        assert status in (400, 503), (status, answer)
        assert error_of(answer)
    still_serving(server)
