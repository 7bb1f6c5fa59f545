"""Triton's generate extension (`/generate`, `/generate_stream`): a flat JSON object in, a
flat JSON object out, for text models that a client drives without tensor plumbing.

A request's members that name a model input are that input's value — a JSON scalar or a
(nested) array, shaped by the input's config dims. Every other member is a request
parameter, as in Triton (`max_tokens`, `temperature`: what a Python model reads from its
`RequestInfo`s; `timeout`, `priority`, `sequence_*` as for /infer), and so is each member
of an optional `parameters` object; one name in both is an error. A response is
`model_name`, `model_version`, and each output by name: a scalar when it holds one
element, else its elements in row-major order; BYTES as text.
`/generate_stream` sends each response as one Server-Sent Event.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from tensorgate.errors import InvalidArgumentError
from tensorgate.protocol import json_text
from tensorgate.protocol.infer_codec import DecodedRequest, json_object, json_parameters, parse_json
from tensorgate.protocol.json_tensors import json_data, json_tensor
from tensorgate.protocol.request_parameters import (request_priority, request_sequence,
                                                    request_timeout)
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.dtypes import DataType
from tensorgate.tensor.view import TensorView

__all__ = ["GenerateInput", "decode_generate_body", "encode_generate_response",
           "generate_request", "sse_event"]


class GenerateInput(NamedTuple):
    """A model input as the generate extension fills it: its config dims, without the batch."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]


def decode_generate_body(body: Any, length: int) -> dict[str, Any]:
    """The request's JSON object."""
    if not length:
        raise InvalidArgumentError("the generate request has no body; send a JSON object with "
                                   "the model's inputs by name")
    return json_object(parse_json(memoryview(body)[:length], "the generate request"),
                       "the generate request")


def generate_request(model: str, fields: dict[str, Any], inputs: Sequence[GenerateInput],
                     batched: bool, ledger: CopyLedger) -> DecodedRequest:
    """The inference a generate request asks for: one row (batch 1 where the model batches).
    Inputs the request leaves out are left out; the pipeline says which of them it needs."""
    by_name = {item.name: item for item in inputs}
    parameters = dict(json_parameters(fields.get("parameters"), "the generate request"))
    views: dict[str, TensorView] = {}
    for name, value in fields.items():
        if name == "parameters":
            continue
        item = by_name.get(name)
        if item is None:
            if name in parameters:
                raise InvalidArgumentError(f"request parameter '{name}' is given twice: as a "
                                           "member of the request and in its 'parameters'")
            parameters[name] = value
            continue
        shape = _shape(model, item, value)
        views[name] = json_tensor(value, item.datatype, ((1,) if batched else ()) + shape,
                                  name, ledger)
    return DecodedRequest("", views, None, False, request_timeout(parameters), parameters,
                          priority=request_priority(parameters),
                          sequence=request_sequence(parameters))


def _shape(model: str, item: GenerateInput, value: Any) -> tuple[int, ...]:
    """The value's shape fitted to the input's dims: as it is where it matches them, else its
    elements laid out in the dims (at most one of them variable)."""
    try:
        given = np.shape(value)  # what is not a number or a string fails json_tensor's check
    except ValueError:  # numpy refuses ragged nesting
        raise InvalidArgumentError(f"input '{item.name}' of model '{model}': the value is not "
                                   "a scalar or a rectangular array") from None
    dims = item.dims
    if len(given) == len(dims) and all(d in (-1, g) for d, g in zip(dims, given, strict=True)):
        return tuple(given)
    count = math.prod(given)
    known = math.prod(d for d in dims if d != -1)
    variable = dims.count(-1)
    if variable == 0 and known == count:
        return dims
    if variable == 1 and known and count % known == 0:
        return tuple(count // known if d == -1 else d for d in dims)
    raise InvalidArgumentError(
        f"input '{item.name}' of model '{model}' takes dims [{','.join(map(str, dims))}]; the "
        f"value has {count} element{'s' if count != 1 else ''} "
        f"(shape [{','.join(map(str, given))}])")


def encode_generate_response(model: str, version: int, outputs: dict[str, TensorView]) -> bytes:
    response: dict[str, Any] = {"model_name": model, "model_version": str(version)}
    all_finite = True
    for name, view in outputs.items():
        values = json_data(view)
        if isinstance(values, np.ndarray):  # not BYTES, whose strings need no look
            all_finite = all_finite and json_text.finite(values)
        response[name] = values[0] if len(values) == 1 else values
    return json_text.dumps(response, all_finite=all_finite)


def sse_event(payload: bytes) -> bytes:
    """One Server-Sent Event carrying a JSON payload (which has no newlines)."""
    return b"data: " + payload + b"\n\n"
