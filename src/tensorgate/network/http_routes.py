"""The HTTP/1.1 routes of the Open Inference Protocol: path → handler, and the handlers.

A handler takes the data plane, the request and its path arguments and returns (status,
headers, body parts) — or a `StreamedResponse` whose parts the connection writes as they come
(Server-Sent Events). Handlers decode, call the data plane, and encode; the connection
(`http.py`) owns the socket. Routes follow Triton's (`src/http_server.cc`): versions are
decimal; a wrong method is 405.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import re
import urllib.parse
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from tensorgate.dataplane import Answer, DataPlane
from tensorgate.errors import InternalError, InvalidArgumentError, TensorgateError
from tensorgate.network import in_steps
from tensorgate.protocol.compression import deflate_steps, inflate_steps, worth_compressing
from tensorgate.protocol.generate_codec import (decode_generate_body, encode_generate_response,
                                                sse_event)
from tensorgate.protocol.infer_codec import (TENSORS_A_STEP, decode_infer_body, decode_infer_steps,
                                             encode_infer_response, json_error, parse_json)
from tensorgate.protocol.request_parameters import forward_headers
from tensorgate.protocol.json_answers import encode_in_slices, large_json_outputs
from tensorgate.protocol.json_slices import decode_in_slices, worth_slicing
from tensorgate.protocol.load_body import load_parameters_steps
from tensorgate.repository.upload import decode_base64_file, uploaded_files
from tensorgate.tensor.buffer import ALIGNMENT, HostBuffer
from tensorgate.tensor.copies import CopyLedger, record_copy

if TYPE_CHECKING:
    from tensorgate.pipeline.trace import Trace

__all__ = ["API_GROUP", "INFERENCES", "OIP_ROUTES", "Handler", "HttpRequest", "Routed",
           "Routes", "StreamedResponse", "route"]

log = logging.getLogger("tensorgate.http")


class HttpRequest:
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


# -- routes ----------------------------------------------------------------------------------

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


def _header_int(headers: dict[str, str], name: str) -> int | None:
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


_JSON = [("Content-Type", "application/json")]


def _json(value: Any) -> tuple[int, list[tuple[str, str]], list[bytes]]:
    return 200, _JSON, [json.dumps(value, separators=(",", ":")).encode()]


# Health answers carry the Open Inference Protocol's bodies: tritonclient reads the status
# alone, KServe's SDK (`is_server_live`, `is_server_ready`) the JSON, and an empty body
# labelled JSON failed to parse there.
_LIVE = [b'{"live":true}']
_READY = [b'{"ready":true}']


async def _live(dp: DataPlane, request: HttpRequest) -> Any:
    if dp.live():
        return 200, _JSON, _LIVE
    return 503, _JSON, [json_error("server is not live")]


async def _ready(dp: DataPlane, request: HttpRequest) -> Any:
    if dp.ready():
        return 200, _JSON, _READY
    return 503, _JSON, [json_error("server is not ready")]


async def _server_metadata(dp: DataPlane, request: HttpRequest) -> Any:
    return _json(dp.server_metadata())


async def _model_metadata(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    return _json(dp.model_metadata(model, version))


async def _model_ready(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    if dp.model_ready(model, version):
        return _json({"name": model, "ready": True})
    return 503, _JSON, [json_error(f"model '{model}' version '{version or 'latest'}' is not "
                                   "ready")]


async def _model_config(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    return _json(dp.model_config(model, version))


async def _stats(dp: DataPlane, request: HttpRequest, model: str = "", version: str = "") -> Any:
    return _json(dp.statistics(model, version))


def _body_json(request: HttpRequest) -> dict[str, Any]:
    if not request.length:
        return {}
    value = parse_json(memoryview(request.body)[:request.length], "the request body")
    if not isinstance(value, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    return value


async def _log_settings(dp: DataPlane, request: HttpRequest) -> Any:
    """GET: the server's log settings; POST: change some (logging extension)."""
    if request.method == "GET":
        return _json(dp.log_settings.current())
    return _json(dp.log_settings.update(_body_json(request)))


async def _trace_settings(dp: DataPlane, request: HttpRequest, model: str = "") -> Any:
    """GET: the trace settings (of `model`, or the global ones); POST: change some (trace
    extension; a null value clears a setting)."""
    if request.method == "GET":
        return _json(dp.trace_settings(model))
    return _json(dp.trace_settings(model, _body_json(request)))


async def _index(dp: DataPlane, request: HttpRequest, repository: str) -> Any:
    ready = _body_json(request).get("ready", False)
    if not isinstance(ready, bool):  # "false" would list only the ready ones
        raise InvalidArgumentError("repository index parameter 'ready' must be true or false")
    return _json(dp.repository_index(ready, repository))


async def _load(dp: DataPlane, request: HttpRequest, model: str, repository: str) -> Any:
    # refused for the mode before a byte of the body is parsed, and an upload's files are
    # decoded only where the server takes them: a client may not make it decode megabytes
    # of base64 it refuses; those it takes are decoded with the loop serving others
    dp.check_model_control("load")
    decode = dp.takes_uploads
    parameters = await in_steps(load_parameters_steps(request.body, request.length, decode))
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise InvalidArgumentError("load parameter 'config' must be a string: the model "
                                   "config as JSON text")
    files = uploaded_files(parameters, _file_content if decode else None)
    await dp.load(model, config, repository, files)
    return 200, _JSON, [b""]


def _file_content(key: str, value: Any) -> bytes | bytearray:
    """An HTTP load's file parameter: base64 text, or the bytes load_parameters_steps has
    decoded from it already."""
    return value if isinstance(value, bytearray) else decode_base64_file(key, value)


async def _unload(dp: DataPlane, request: HttpRequest, model: str, repository: str) -> Any:
    parameters = _body_json(request).get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("'parameters' of an unload request must be a JSON object")
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidArgumentError("unload parameter 'unload_dependents' must be true or false")
    await dp.unload(model, dependents, repository)
    return 200, _JSON, [b""]


def _compressed(request: HttpRequest) -> bool:
    """Whether the body must be decompressed (Content-Encoding gzip or deflate)."""
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("identity", "") or not request.length:
        return False
    if encoding not in ("gzip", "deflate"):
        raise InvalidArgumentError(f"Content-Encoding '{encoding}' is not supported; use gzip, "
                                   "deflate or none")
    return True


async def _decompressed(request: HttpRequest) -> tuple[Any, int]:
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


# JSON of more bytes than this may name more tensors than a step decodes, and is decoded in
# steps (an input takes ~40 bytes of JSON at least; an output, `{"name":"a"}`, 12 and ~3 µs)
_STEPPED_JSON = 40 * TENSORS_A_STEP


async def _infer(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    body, length = request.body, request.length
    if _compressed(request):  # (checked first: no coroutine for a plain body)
        body, length = await _decompressed(request)
    if not length:
        if request.json_length != 0:
            raise InvalidArgumentError("the inference request has no body")
        body = b""  # a raw binary request's one BYTES element may be empty
    if worth_slicing(body, length, request.json_length):
        decoded = await in_steps(decode_in_slices(body, length, request.ledger, dp.shm,
                                                  request.json_length))
    elif (length if request.json_length is None else request.json_length) > _STEPPED_JSON:
        decoded = await in_steps(decode_infer_steps(body, length, request.json_length,
                                                    request.ledger, dp.shm))
    else:
        decoded = decode_infer_body(body, length, request.json_length, request.ledger, dp.shm)
    # Binary inputs are views that hold the body's pooled buffer; JSON's are arrays of their
    # own: unless a view holds it, the body goes back to the pool while the request waits
    request.body = body = None
    decoded.forwarded = forward_headers(request.headers.items(), request.forward)
    trace = _trace(dp, request, model)
    result, outputs, binary, in_shm = await dp.infer(model, version, decoded, request.ledger,
                                                     trace)
    parameters = dict(result.parameters) if result.parameters else None
    if decoded.parameters.get("tensorgate_report_copies"):
        parameters = {**(parameters or {}), "tensorgate_copied_bytes": request.ledger.bytes}
    if large_json_outputs(outputs, binary, in_shm):
        heads, tail = await in_steps(encode_in_slices(
            result.model, result.version, result.id, outputs, binary, parameters, in_shm))
    else:
        head, tail = encode_infer_response(result.model, result.version, result.id, outputs,
                                           binary, parameters, in_shm)
        heads = [head]
    head_length = sum(len(part) for part in heads)
    headers = _JSON if not tail else [("Content-Type", "application/octet-stream"),
                                      ("Inference-Header-Content-Length", str(head_length))]
    encoding = _accepted_encoding(request.headers.get("accept-encoding", ""))
    if encoding is None or not worth_compressing(tail):
        return 200, headers, [*heads, *tail]
    # Compressing reads every tensor byte into a new buffer: a copy, counted. The
    # Inference-Header-Content-Length stays the uncompressed JSON length, as Triton's does.
    packed = await in_steps(deflate_steps([*heads, *tail], encoding))
    record_copy(head_length + sum(t.nbytes for t in tail), "encode", request.ledger)
    return 200, [*headers, ("Content-Encoding", encoding)], [packed]


async def _generate_answers(dp: DataPlane, request: HttpRequest, model: str,
                            version: str) -> AsyncGenerator[Answer, None]:
    """The responses to a generate request: one from a model that is not decoupled, any
    number from one that is (dp.infer_stream takes both). A compressed body is
    decompressed a piece at a time, as infer's (48 MB in one go held the loop 110 ms)."""
    body, length = request.body, request.length
    if _compressed(request):
        body, length = await _decompressed(request)
    decoded = dp.generate_request(model, version, decode_generate_body(body, length),
                                  request.ledger)
    decoded.forwarded = forward_headers(request.headers.items(), request.forward)
    answers = dp.infer_stream(model, version, decoded, request.ledger,
                              _trace(dp, request, model))
    try:
        async for answer in answers:
            yield answer
    finally:
        await answers.aclose()


def _trace(dp: DataPlane, request: HttpRequest, model: str) -> Trace | None:
    """The request's trace when a trace setting samples it, with the times it arrived; the
    connection stamps its sending and finishes it."""
    trace = request.trace = dp.trace(model, request.headers.get("traceparent"))
    if trace is not None:
        trace.stamp("HTTP_RECV_START", request.began_ns)
        trace.stamp("HTTP_RECV_END", request.received_ns)
    return trace


async def _generate(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    """Triton's generate extension: one JSON object in, one out (protocol/generate_codec.py).
    A decoupled model may answer it only with exactly one response."""
    answers = _generate_answers(dp, request, model, version)
    answer: bytes | None = None
    try:
        async for result, outputs, _, _ in answers:
            if result.error is not None:  # a decoupled model's error response
                try:
                    raise result.error
                finally:  # its traceback holds this frame: not the result too (a cycle)
                    del result
            if answer is not None:
                raise InvalidArgumentError(
                    f"model '{model}' is decoupled and sent more than one response; call "
                    "generate_stream to receive each as it comes")
            answer = encode_generate_response(result.model, result.version, outputs)
    finally:
        await answers.aclose()
    if answer is None:
        raise InternalError(f"model '{model}' sent no response; generate needs one")
    return 200, _JSON, [answer]


_EVENT_STREAM = [("Content-Type", "text/event-stream; charset=utf-8"),
                 ("Cache-Control", "no-cache")]


async def _generate_stream(dp: DataPlane, request: HttpRequest, model: str,
                           version: str) -> Any:
    """Each response as one Server-Sent Event, as the model makes it. The first is awaited
    before answering, so that a request that fails before it gets an HTTP error status; an
    error after it comes as an event `{"error": ...}` and ends the stream, but for a
    decoupled model's error response that is not its last, after which more come."""
    answers = _generate_answers(dp, request, model, version)
    try:
        first = await anext(answers, None)
    except BaseException:
        await answers.aclose()
        raise
    return StreamedResponse(200, _EVENT_STREAM, _events(first, answers, request))


async def _events(first: Answer | None, answers: AsyncGenerator[Answer, None],
                  request: HttpRequest) -> AsyncGenerator[bytes, None]:
    try:
        answer = first
        while answer is not None:
            result, outputs, _, _ = answer
            if result.error is not None:
                yield sse_event(json_error(result.error.message))
            else:
                yield sse_event(encode_generate_response(result.model, result.version, outputs))
            answer = await anext(answers, None)
    except TensorgateError as error:
        yield sse_event(json_error(error.message))
    except Exception as error:  # a bug: tell the client, log, keep serving
        log.exception("unexpected error streaming %s", request.path)
        yield sse_event(json_error(f"internal error: {type(error).__name__}: {error}"))
    finally:
        await answers.aclose()


@functools.lru_cache(maxsize=64)  # a client sends the same Accept-Encoding every time
def _accepted_encoding(accept: str) -> str | None:
    """gzip or deflate when the client accepts it (q > 0), else None (identity)."""
    offered = {}
    for item in accept.lower().split(","):
        name, _, params = item.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        offered[name.strip()] = q
    for name in ("gzip", "deflate"):
        if offered.get(name, 0.0) > 0:
            return name
    return None


async def _shm_status(dp: DataPlane, request: HttpRequest, region: str = "") -> Any:
    return _json(dp.shm.status(region or None))


async def _shm_register(dp: DataPlane, request: HttpRequest, region: str) -> Any:
    body = _body_json(request)
    dp.shm.register(region, body.get("key"), body.get("offset", 0), body.get("byte_size"))
    return 200, _JSON, [b""]


async def _shm_unregister(dp: DataPlane, request: HttpRequest, region: str = "") -> Any:
    dp.shm.unregister(region or None)
    return 200, _JSON, [b""]


async def _cuda_shm_status(dp: DataPlane, request: HttpRequest, region: str = "") -> Any:
    return _json(dp.shm.status(region or None, "cuda"))


async def _cuda_shm_register(dp: DataPlane, request: HttpRequest, region: str) -> Any:
    body = _body_json(request)
    handle = body.get("raw_handle")
    encoded = handle.get("b64") if isinstance(handle, dict) else None
    try:
        raw = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else None
    except ValueError:
        raw = None
    if raw is None:
        raise InvalidArgumentError(f"region '{region}': raw_handle must be {{\"b64\": the "
                                   "base64 of the CUDA IPC memory handle}")
    dp.shm.register_cuda(region, raw, body.get("device_id", 0), body.get("byte_size"))
    return 200, _JSON, [b""]


async def _cuda_shm_unregister(dp: DataPlane, request: HttpRequest, region: str = "") -> Any:
    dp.shm.unregister(region or None, "cuda")
    return 200, _JSON, [b""]


_SHM_HANDLERS = {"system": (_shm_status, _shm_register, _shm_unregister),
                 "cuda": (_cuda_shm_status, _cuda_shm_register, _cuda_shm_unregister)}


def _shm_route(kind: str, method: str, rest: list[str],
               path: str) -> Routed:
    """/v2/{system,cuda}sharedmemory[/region/{r}]/{status,register,unregister}"""
    status, register, unregister = _SHM_HANDLERS[kind]
    region: tuple[str, ...] = ()
    if len(rest) == 3 and rest[0] == "region":
        region, rest = (rest[1],), rest[2:]
    if len(rest) != 1:
        return 404, f"no route for {path}"
    action = rest[0]
    if action == "status":
        return (status, region) if method == "GET" else (405, "use GET")
    if action == "register" and region:
        return (register, region) if method == "POST" else (405, "use POST")
    if action == "unregister":
        return (unregister, region) if method == "POST" else (405, "use POST")
    return 404, f"no route for {path}"


# A model's inference handlers by the name of their route (SageMaker's /invocations calls one)
INFERENCES: dict[str, Handler] = {"infer": _infer, "generate": _generate,
                                  "generate_stream": _generate_stream}
_MODEL_ACTIONS: dict[str, tuple[str, Handler]] = {
    "": ("GET", _model_metadata), "ready": ("GET", _model_ready),
    "config": ("GET", _model_config), "stats": ("GET", _stats), "infer": ("POST", _infer),
    "generate": ("POST", _generate), "generate_stream": ("POST", _generate_stream)}


_ROUTED_KEPT = 256  # (method, path) pairs whose handler is kept: a client calls a few
_routed: dict[tuple[str, str], tuple[Handler, tuple[str, ...]]] = {}


def route(method: str, path: str) -> Routed:
    """(handler, path arguments) or (HTTP code, error) for 404 and 405. A path routed to a
    handler before is looked up: clients call the same few paths request after request."""
    found = _routed.get((method, path))
    if found is not None:
        return found
    routed = _route(method, path)
    if not isinstance(routed[0], int):
        if len(_routed) >= _ROUTED_KEPT:
            _routed.clear()  # many distinct paths: start again rather than grow
        _routed[(method, path)] = routed
    return routed


def _segments(path: str) -> list[str] | str:
    """The path's segments, each percent-decoded as UTF-8 (RFC 3986 §2.1), or what is wrong.
    tritonclient quotes model and region names in URLs (a space is %20, "+" is %2B), so a
    name is only reachable if it is decoded; it is decoded after the split, so %2F is part
    of a name (which then names no model), never a separator."""
    parts = path.strip("/").split("/")
    if "%" not in path:
        return parts
    decoded = []
    for part in parts:
        try:
            decoded.append(urllib.parse.unquote(part, errors="strict") if "%" in part else part)
        except UnicodeDecodeError:
            return f"the path segment '{part}' is not percent-encoded UTF-8"
    return decoded


def _route(method: str, path: str) -> Routed:
    parts = _segments(path)
    if isinstance(parts, str):
        return 400, parts
    if not parts or parts[0] != "v2":
        return 404, f"no route for {path}"
    rest = parts[1:]
    get, post = method == "GET", method == "POST"
    if rest == []:
        return (_server_metadata, ()) if get else (405, "use GET")
    if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
        return ((_live if rest[1] == "live" else _ready), ()) if get else (405, "use GET")
    if rest[0] == "repository":  # [/{repository}]/index, [/{repository}]/models/{m}/load
        body = rest[1:]
        index = body[-1:] == ["index"] and len(body) <= 2
        control = len(body) in (3, 4) and body[-3] == "models" and body[-1] in ("load", "unload")
        if not (index or control):
            return 404, f"no route for {path}"
        if not post:
            return 405, "use POST"
        repository = body[0] if len(body) in (2, 4) else ""
        if index:
            return _index, (repository,)
        return (_load if body[-1] == "load" else _unload), (body[-2], repository)
    if rest == ["logging"]:
        return (_log_settings, ()) if get or post else (405, "use GET or POST")
    if rest == ["trace", "setting"]:
        return (_trace_settings, ()) if get or post else (405, "use GET or POST")
    if rest[0] in ("systemsharedmemory", "cudasharedmemory"):
        return _shm_route(rest[0][:-len("sharedmemory")], method, rest[1:], path)
    if rest[0] != "models":
        return 404, f"no route for {path}"
    rest = rest[1:]
    if rest == ["stats"]:
        return (_stats, ()) if get else (405, "use GET")
    if not rest:
        return 404, f"no route for {path}"
    model, rest = rest[0], rest[1:]
    version = ""
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = rest[1], rest[2:]
        if not version.isdecimal():
            return 404, f"no route for {path}: versions are decimal numbers"
    if rest == ["trace", "setting"] and not version:
        return (_trace_settings, (model,)) if get or post else (405, "use GET or POST")
    action = rest[0] if rest else ""
    if len(rest) > 1:
        return 404, f"no route for {path}"
    if action not in _MODEL_ACTIONS:
        return 404, f"no route for {path}"
    wanted, handler = _MODEL_ACTIONS[action]
    if method != wanted:
        return 405, f"use {wanted} for {path}"
    return handler, (model, version)


# Each handler's API group, for restricted APIs (protocol/restricted.py)
API_GROUP: dict[Handler, str] = {
    _live: "health", _ready: "health", _model_ready: "health",
    _server_metadata: "metadata", _model_metadata: "metadata",
    _infer: "inference", _generate: "inference", _generate_stream: "inference",
    _model_config: "model-config", _stats: "statistics",
    _index: "model-repository", _load: "model-repository", _unload: "model-repository",
    _shm_status: "shared-memory", _shm_register: "shared-memory",
    _shm_unregister: "shared-memory", _cuda_shm_status: "shared-memory",
    _cuda_shm_register: "shared-memory", _cuda_shm_unregister: "shared-memory",
    _log_settings: "logging", _trace_settings: "trace"}


def _inference_header(headers: dict[str, str]) -> int | None:
    return _header_int(headers, "inference-header-content-length")


# The Open Inference Protocol's /v2 routes (Triton's binary tensor extension's header)
OIP_ROUTES = Routes(route, API_GROUP, _inference_header)
