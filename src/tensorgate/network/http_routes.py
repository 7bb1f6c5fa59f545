"""The HTTP/1.1 routes of the Open Inference Protocol: path → handler, and the handlers.

A handler takes the data plane, the request (http_request.py) and its path arguments and
returns (status, headers, body parts) — or a `StreamedResponse` whose parts the connection
writes as they come (Server-Sent Events: generate_stream, in http_generate.py). Handlers
decode, call the data plane, and encode; the connection (`http.py`) owns the socket. Routes
follow Triton's (`src/http_server.cc`): versions are decimal; a wrong method is 405.
"""

from __future__ import annotations

import base64
import functools
import urllib.parse
from typing import Any

from tensorgate.dataplane import DataPlane
from tensorgate.errors import InvalidArgumentError
from tensorgate.network import in_steps
from tensorgate.network.http_generate import generate, generate_stream
from tensorgate.network.http_request import (JSON_HEADERS, Handler, HttpRequest, Routed, Routes,
                                             body_json, compressed, decompressed, header_int,
                                             json_answer, request_trace)
from tensorgate.protocol.compression import deflate_steps, worth_compressing
from tensorgate.protocol.infer_codec import (TENSORS_A_STEP, decode_infer_body, decode_infer_steps,
                                             encode_infer_response, json_error)
from tensorgate.protocol.json_answers import encode_in_slices, large_json_outputs
from tensorgate.protocol.json_slices import decode_in_slices, worth_slicing
from tensorgate.protocol.load_body import load_parameters_steps
from tensorgate.protocol.request_parameters import forward_headers
from tensorgate.repository.upload import decode_base64_file, uploaded_files
from tensorgate.tensor.copies import record_copy

__all__ = ["API_GROUP", "INFERENCES", "OIP_ROUTES", "route"]


# Health answers carry the Open Inference Protocol's bodies: tritonclient reads the status
# alone, KServe's SDK (`is_server_live`, `is_server_ready`) the JSON, and an empty body
# labelled JSON failed to parse there.
_LIVE = [b'{"live":true}']
_READY = [b'{"ready":true}']


async def _live(dp: DataPlane, request: HttpRequest) -> Any:
    if dp.live():
        return 200, JSON_HEADERS, _LIVE
    return 503, JSON_HEADERS, [json_error("server is not live")]


async def _ready(dp: DataPlane, request: HttpRequest) -> Any:
    if dp.ready():
        return 200, JSON_HEADERS, _READY
    return 503, JSON_HEADERS, [json_error("server is not ready")]


async def _server_metadata(dp: DataPlane, request: HttpRequest) -> Any:
    return json_answer(dp.server_metadata())


async def _model_metadata(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    return json_answer(dp.model_metadata(model, version))


async def _model_ready(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    if dp.model_ready(model, version):
        return json_answer({"name": model, "ready": True})
    return 503, JSON_HEADERS, [json_error(
        f"model '{model}' version '{version or 'latest'}' is not ready")]


async def _model_config(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    return json_answer(dp.model_config(model, version))


async def _stats(dp: DataPlane, request: HttpRequest, model: str = "", version: str = "") -> Any:
    return json_answer(dp.statistics(model, version))


async def _log_settings(dp: DataPlane, request: HttpRequest) -> Any:
    """GET: the server's log settings; POST: change some (logging extension)."""
    if request.method == "GET":
        return json_answer(dp.log_settings.current())
    return json_answer(dp.log_settings.update(body_json(request)))


async def _trace_settings(dp: DataPlane, request: HttpRequest, model: str = "") -> Any:
    """GET: the trace settings (of `model`, or the global ones); POST: change some (trace
    extension; a null value clears a setting)."""
    if request.method == "GET":
        return json_answer(dp.trace_settings(model))
    return json_answer(dp.trace_settings(model, body_json(request)))


async def _index(dp: DataPlane, request: HttpRequest, repository: str) -> Any:
    ready = body_json(request).get("ready", False)
    if not isinstance(ready, bool):  # "false" would list only the ready ones
        raise InvalidArgumentError("repository index parameter 'ready' must be true or false")
    return json_answer(dp.repository_index(ready, repository))


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
    return 200, JSON_HEADERS, [b""]


def _file_content(key: str, value: Any) -> bytes | bytearray:
    """An HTTP load's file parameter: base64 text, or the bytes load_parameters_steps has
    decoded from it already."""
    return value if isinstance(value, bytearray) else decode_base64_file(key, value)


async def _unload(dp: DataPlane, request: HttpRequest, model: str, repository: str) -> Any:
    parameters = body_json(request).get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("'parameters' of an unload request must be a JSON object")
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidArgumentError("unload parameter 'unload_dependents' must be true or false")
    await dp.unload(model, dependents, repository)
    return 200, JSON_HEADERS, [b""]


# JSON of more bytes than this may name more tensors than a step decodes, and is decoded in
# steps (an input takes ~40 bytes of JSON at least; an output, `{"name":"a"}`, 12 and ~3 µs)
_STEPPED_JSON = 40 * TENSORS_A_STEP


async def _infer(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    body, length = request.body, request.length
    if compressed(request):  # (checked first: no coroutine for a plain body)
        body, length = await decompressed(request)
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
    trace = request_trace(dp, request, model)
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
    headers = JSON_HEADERS if not tail else [
        ("Content-Type", "application/octet-stream"),
        ("Inference-Header-Content-Length", str(head_length))]
    encoding = _accepted_encoding(request.headers.get("accept-encoding", ""))
    if encoding is None or not worth_compressing(tail):
        return 200, headers, [*heads, *tail]
    # Compressing reads every tensor byte into a new buffer: a copy, counted. The
    # Inference-Header-Content-Length stays the uncompressed JSON length, as Triton's does.
    packed = await in_steps(deflate_steps([*heads, *tail], encoding))
    record_copy(head_length + sum(t.nbytes for t in tail), "encode", request.ledger)
    return 200, [*headers, ("Content-Encoding", encoding)], [packed]


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
    return json_answer(dp.shm.status(region or None))


async def _shm_register(dp: DataPlane, request: HttpRequest, region: str) -> Any:
    body = body_json(request)
    dp.shm.register(region, body.get("key"), body.get("offset", 0), body.get("byte_size"))
    return 200, JSON_HEADERS, [b""]


async def _shm_unregister(dp: DataPlane, request: HttpRequest, region: str = "") -> Any:
    dp.shm.unregister(region or None)
    return 200, JSON_HEADERS, [b""]


async def _cuda_shm_status(dp: DataPlane, request: HttpRequest, region: str = "") -> Any:
    return json_answer(dp.shm.status(region or None, "cuda"))


async def _cuda_shm_register(dp: DataPlane, request: HttpRequest, region: str) -> Any:
    body = body_json(request)
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
    return 200, JSON_HEADERS, [b""]


async def _cuda_shm_unregister(dp: DataPlane, request: HttpRequest, region: str = "") -> Any:
    dp.shm.unregister(region or None, "cuda")
    return 200, JSON_HEADERS, [b""]


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
INFERENCES: dict[str, Handler] = {"infer": _infer, "generate": generate,
                                  "generate_stream": generate_stream}
_MODEL_ACTIONS: dict[str, tuple[str, Handler]] = {
    "": ("GET", _model_metadata), "ready": ("GET", _model_ready),
    "config": ("GET", _model_config), "stats": ("GET", _stats), "infer": ("POST", _infer),
    "generate": ("POST", generate), "generate_stream": ("POST", generate_stream)}


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
    _infer: "inference", generate: "inference", generate_stream: "inference",
    _model_config: "model-config", _stats: "statistics",
    _index: "model-repository", _load: "model-repository", _unload: "model-repository",
    _shm_status: "shared-memory", _shm_register: "shared-memory",
    _shm_unregister: "shared-memory", _cuda_shm_status: "shared-memory",
    _cuda_shm_register: "shared-memory", _cuda_shm_unregister: "shared-memory",
    _log_settings: "logging", _trace_settings: "trace"}


def _inference_header(headers: dict[str, str]) -> int | None:
    return header_int(headers, "inference-header-content-length")


# The Open Inference Protocol's /v2 routes (Triton's binary tensor extension's header)
OIP_ROUTES = Routes(route, API_GROUP, _inference_header)
