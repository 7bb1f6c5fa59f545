"""Amazon SageMaker's routes (Triton's --allow-sagemaker): what a SageMaker endpoint sends to
its container's port 8080, served by an HTTP front end of its own (server.py).

- `GET /ping`: 200 while the server is ready (or live: SAGEMAKER_TRITON_PING_MODE=live);
  SageMaker sends an instance no traffic until it answers 200.
- `POST /invocations`: one inference of the endpoint's model (SAGEMAKER_TRITON_DEFAULT_MODEL_
  NAME), its latest version, as the Open Inference Protocol's infer (or generate /
  generate_stream: SAGEMAKER_TRITON_INFERENCE_TYPE). The body is the protocol's; binary
  tensors after its JSON are marked by the Content-Type
  `application/vnd.sagemaker-triton.binary+json;json-header-size=N` (SageMaker passes the
  Content-Type through, not other headers), both ways. Answers are not compressed, as
  Triton's are not there.

As Triton's (src/sagemaker_server.cc, measured against tritonserver 2.51 by
tools/triton_diff.py): the same bodies, headers and routes. Where they differ: errors keep
their Open Inference Protocol codes (503 for a model not ready, where Triton answers 400), a
ping that fails is 503, and a path not served is 404. SageMaker's multi-model endpoint
routes (/models) are sagemaker_models.py's.
"""

from __future__ import annotations

import pathlib
from typing import Any

from tensorgate.dataplane import DataPlane
from tensorgate.errors import InvalidArgumentError, NotFoundError
from tensorgate.network.http_request import HttpRequest, Routed, Routes, StreamedResponse
from tensorgate.network.http_routes import INFERENCES
from tensorgate.network.sagemaker_models import MultiModels
from tensorgate.protocol.infer_codec import json_error

__all__ = ["BINARY_CONTENT_TYPE", "sagemaker_routes"]

BINARY_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size="

_PING_MODES = ("ready", "live")


async def _ping(dp: DataPlane, request: HttpRequest, mode: str) -> Any:
    if dp.ready() if mode == "ready" else dp.live():
        return 200, [("Content-Type", "text/plain")], [b""]
    return 503, [("Content-Type", "application/json")], [json_error(f"the server is not {mode}")]


async def _invocations(dp: DataPlane, request: HttpRequest, model: str, kind: str) -> Any:
    if not model:
        raise NotFoundError("this is a multi-model endpoint: call POST /models/NAME/invoke")
    request.headers.pop("accept-encoding", None)  # answers in identity, as Triton's here
    answer = await INFERENCES[kind](dp, request, model, "")
    if isinstance(answer, StreamedResponse):
        return answer
    status, headers, parts = answer
    for name, value in headers:
        if name == "Inference-Header-Content-Length":  # binary outputs after the JSON
            return status, [("Content-Type", BINARY_CONTENT_TYPE + value)], parts
    return answer


def _json_length(headers: dict[str, str]) -> int | None:
    """The json-header-size of a binary body's Content-Type; None for a JSON body."""
    content_type = headers.get("content-type", "")
    at = content_type.lower().find(BINARY_CONTENT_TYPE)
    if at < 0:
        return None
    if at:
        raise InvalidArgumentError(f"a binary body's Content-Type must start with "
                                   f"'{BINARY_CONTENT_TYPE}', got '{content_type}'")
    size = content_type[len(BINARY_CONTENT_TYPE):].strip()
    if not size.isdecimal():
        raise InvalidArgumentError(f"the json-header-size of Content-Type '{content_type}' "
                                   "must be the JSON's length in bytes")
    length = headers.get("content-length", "")
    if length.isdecimal() and int(size) > int(length):
        raise InvalidArgumentError(f"the json-header-size of Content-Type '{content_type}' "
                                   f"exceeds the {length}-byte body")
    return int(size)


def sagemaker_routes(model: str, inference_type: str = "infer", ping_mode: str = "ready",
                     models_root: pathlib.Path | None = None) -> Routes:
    """The routes of an endpoint serving `model`: /invocations is its `inference_type`
    (infer, generate or generate_stream), /ping its server's readiness (ping_mode ready) or
    liveness (live). `models_root`: a multi-model endpoint's (sagemaker_models.py), loading
    the folders under it; /invocations then has no model ("")."""
    if inference_type not in INFERENCES:
        raise ValueError(f"inference type must be one of {', '.join(INFERENCES)}, got "
                         f"'{inference_type}'")
    if ping_mode not in _PING_MODES:
        raise ValueError(f"ping mode must be ready or live, got '{ping_mode}'")

    def route(method: str, path: str) -> Routed:
        if path == "/ping":
            return (_ping, (ping_mode,)) if method == "GET" else (405, "use GET")
        if path == "/invocations":
            return (_invocations, (model, inference_type)) if method == "POST" else \
                (405, "use POST")
        if path == "/models" or path.startswith("/models/"):
            if multi is not None:
                return multi.route(method, path.split("/")[2:] if path != "/models" else [])
            return 404, ("SageMaker's multi-model endpoint routes (/models) are served only "
                         "with SAGEMAKER_MULTI_MODEL=true; this endpoint serves one model "
                         "(SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)")
        return 404, f"no route for {path}: SageMaker's are GET /ping and POST /invocations"

    multi = None if models_root is None else MultiModels(
        models_root, lambda dp, request, name: _invocations(dp, request, name, "infer"))
    groups = {_ping: "health", _invocations: "inference", **(multi.api_group if multi else {})}
    return Routes(route, groups, _json_length)
