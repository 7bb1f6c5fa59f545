"""An HTTP request as its handlers see it, what they answer with, and the helpers they share
(a JSON answer, a JSON body, a compressed body inflated, the request's trace).

The connection (http.py, http_parsing.py) fills an HttpRequest; a port's `Routes` names the
handler for a path (http_routes.py for the Open Inference Protocol's, sagemaker_routes.py
for SageMaker's); a handler answers (status, headers, body parts) or a `StreamedResponse`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from tensorgate.dataplane import DataPlane
from tensorgate.errors import InvalidArgumentError
from tensorgate.network import in_steps
from tensorgate.protocol.compression import inflate_steps
from tensorgate.protocol.infer_codec import parse_json
from tensorgate.tensor.buffer import ALIGNMENT, HostBuffer
from tensorgate.tensor.copies import CopyLedger

if TYPE_CHECKING:
    from tensorgate.pipeline.trace import Trace

__all__ = ["JSON_HEADERS", "Handler", "HttpRequest", "Routed", "Routes", "StreamedResponse",
           "body_json", "compressed", "decompressed", "header_int", "json_answer",
           "request_trace"]


class HttpRequest:
    """One request as its connection read it (http_parsing.py makes one a request): its head,
    its body (a pooled buffer of `length` bytes, or None), the bytes copied for it
    (`ledger`) and when it came."""

    __slots__ = ("method", "path", "headers", "body", "length", "json_length", "ledger", "limit",
                 "acquire", "forward", "began_ns", "received_ns", "trace")

    def __init__(self, limit: int, acquire: Callable[[int], HostBuffer],
                 forward: re.Pattern[str] | None = None) -> None:
        self.limit = limit
        self.acquire = acquire  # a pooled buffer (for the body decompressed), or refused
        self.forward = forward  # names of headers to pass to the model as parameters
        self.json_length: int | None = None  # Inference-Header-Content-Length
        self.method = ""
        self.path = ""
        self.headers: dict[str, str] = {}
        self.body: Any = None
        self.length = 0
        self.ledger = CopyLedger()
        self.began_ns = 0      # its first bytes arrived, and its last: for traces
        self.received_ns = 0
        self.trace: Trace | None = None  # when a trace setting sampled it


class StreamedResponse:
    """A response whose body comes in parts as they are made (Server-Sent Events): the
    connection writes each part as an HTTP/1.1 chunk as soon as it comes, and closes `parts`
    when the client goes away."""

    __slots__ = ("headers", "parts", "status")

    def __init__(self, status: int, headers: list[tuple[str, str]],
                 parts: AsyncGenerator[bytes, None]) -> None:
        self.status = status
        self.headers = headers
        self.parts = parts


# -- what a port serves, and what its handlers share ------------------------------------------

Handler = Callable[..., Any]
Routed = tuple[Handler, tuple[str, ...]] | tuple[int, str]


@dataclasses.dataclass(frozen=True)
class Routes:
    """What one HTTP port serves: `route(method, path)` (a handler and its path arguments,
    or the HTTP code and error of 404 / 405), each handler's API group (restricted APIs),
    and `json_length(headers)`, where the JSON of a body with binary tensors ends (None: the
    body is JSON; InvalidArgumentError: the header saying it is wrong)."""

    route: Callable[[str, str], Routed]
    api_group: dict[Handler, str]
    json_length: Callable[[dict[str, str]], int | None]


def header_int(headers: dict[str, str], name: str) -> int | None:
    """Header `name` (lower-case) as a count of bytes, None where absent."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgumentError(f"header {name} must be an integer, got '{value}'") from None
    if number < 0:
        raise InvalidArgumentError(f"header {name} must not be negative, got {number}")
    return number


JSON_HEADERS = [("Content-Type", "application/json")]


def json_answer(value: Any) -> tuple[int, list[tuple[str, str]], list[bytes]]:
    """200 with `value` as compact JSON."""
    return 200, JSON_HEADERS, [json.dumps(value, separators=(",", ":")).encode()]


def body_json(request: HttpRequest) -> dict[str, Any]:
    """The body as a JSON object ({} for none); InvalidArgumentError for anything else."""
    if not request.length:
        return {}
    value = parse_json(memoryview(request.body)[:request.length], "the request body")
    if not isinstance(value, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    return value


def compressed(request: HttpRequest) -> bool:
    """Whether the body must be decompressed (Content-Encoding gzip or deflate)."""
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("identity", "") or not request.length:
        return False
    if encoding not in ("gzip", "deflate"):
        raise InvalidArgumentError(f"Content-Encoding '{encoding}' is not supported; use gzip, "
                                   "deflate or none")
    return True


async def decompressed(request: HttpRequest) -> tuple[Any, int]:
    """The body decompressed a piece at a time (protocol.steps), and its length."""
    # binary tensors after a JSON header of known length land aligned, as a received body's
    pad = (-(request.json_length or 0)) % ALIGNMENT
    data = await in_steps(inflate_steps(memoryview(request.body)[:request.length],
                                        request.headers["content-encoding"].lower(),
                                        request.limit, "body", request.ledger,
                                        request.acquire, pad))
    if data is None:
        raise InvalidArgumentError(f"the decompressed body exceeds the {request.limit}-byte "
                                   "limit (--max-request-bytes)")
    return data, len(data)


def request_trace(dp: DataPlane, request: HttpRequest, model: str) -> Trace | None:
    """The request's trace when a trace setting samples it, with the times it arrived; the
    connection stamps its sending and finishes it."""
    trace = request.trace = dp.trace(model, request.headers.get("traceparent"))
    if trace is not None:
        trace.stamp("HTTP_RECV_START", request.began_ns)
        trace.stamp("HTTP_RECV_END", request.received_ns)
    return trace
