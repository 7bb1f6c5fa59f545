"""KServe v2 inference bodies over HTTP: JSON, and Triton's binary tensor data extension.

Decoding turns a request body (already in one pooled, aligned buffer) into views at their
offsets: binary inputs are never copied; JSON `data` is decoded vectorised by numpy and that
copy is counted. Encoding returns the JSON header and the output views to write after it, so
a response never joins header and tensor bytes. A request's parameters are read in
request_parameters.py (gRPC's too), JSON `data` in json_tensors.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorgate.errors import InvalidArgumentError, UnimplementedError
from tensorgate.protocol import json_text
from tensorgate.protocol.json_tensors import json_data, json_tensor
from tensorgate.protocol.request_parameters import (classification_count, is_count,
                                                   request_priority, request_sequence,
                                                   request_timeout, shm_parameters)
from tensorgate.protocol.steps import run_through
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.dtypes import DataType, datatype
from tensorgate.tensor.shm import SharedMemoryRegistry
from tensorgate.tensor.view import TensorView, checked_shape

__all__ = ["ERROR_CHARACTERS", "MAX_BYTES_ELEMENTS", "MAX_JSON_VALUES", "MAX_TENSORS",
           "TENSORS_A_STEP", "DecodedRequest", "RequestedOutput", "counted_strings",
           "decode_infer_body", "decode_infer_steps", "encode_infer_response",
           "header_values_refused", "json_error", "json_object", "json_parameters",
           "json_values_bounded", "parse_header", "parse_json", "tensor_count"]

# Inputs, and outputs, one request may name. A model has its config's few; each named costs
# ~18 µs of decoding on the event loop and ~1.3 KB held (views, arrays) before the model's
# own checks refuse what it lacks: 200,000 one-number inputs in a 13 MB JSON body held the
# loop for 3.5 s and 263 MB.
MAX_TENSORS = 4096

# Elements of a request's BYTES inputs, all together. Each becomes a Python bytes object on
# the event loop (checked when the request is decoded, cut out when it is batched): 13
# million one-byte elements (a 61 MB body) held the loop for 10 s. A million of one length
# take ~30 ms, of mixed lengths ~0.25 s.
MAX_BYTES_ELEMENTS = 1 << 20


def counted_strings(so_far: int, dt: DataType, shape: tuple[int, ...]) -> int:
    """`so_far` BYTES elements plus those of an input of `dt` and `shape`; refused past
    MAX_BYTES_ELEMENTS, before the input's bytes are looked at."""
    if not dt.is_bytes:
        return so_far
    total = so_far + math.prod(shape)
    if total > MAX_BYTES_ELEMENTS:
        raise InvalidArgumentError(
            f"the request's BYTES inputs hold {total:,} elements; at most "
            f"{MAX_BYTES_ELEMENTS:,} are accepted (each becomes a Python bytes "
            "object)")
    return total


# JSON values and keys read from one text (counted as json_text.marks_over does). Each is a
# Python object made by one GIL-holding call on the event loop: 57 MB of `{},` parsed into
# 1.7 GB in 2 s (5 s beside other clients), everyone else waiting. A million is ~90 MB and
# ~70 ms; the numbers of `data` arrays of 16 KiB or more are read a slice at a time
# (json_slices) and are not counted.
MAX_JSON_VALUES = 1 << 20


def tensor_count(count: int, what: str) -> None:
    """Refuse a request that names more than MAX_TENSORS `what` ("inputs", "outputs")."""
    if count > MAX_TENSORS:
        raise InvalidArgumentError(f"the request names {count:,} {what}; at most "
                                   f"{MAX_TENSORS:,} are accepted")


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: the request-level default decides
    classification: int = 0
    shm: tuple[str, int, int] | None = None  # (region, offset, byte_size) to write it into


@dataclass
class DecodedRequest:
    id: str
    inputs: dict[str, TensorView]
    outputs: list[RequestedOutput] | None
    binary_default: bool
    timeout_us: int | None
    parameters: dict[str, Any] = field(default_factory=dict)
    raw_binary: bool = False  # Inference-Header-Content-Length: 0, the body is one tensor
    priority: int = 0  # the `priority` parameter: 1 is the highest, 0 the model's default
    # (sequence_id, sequence_start, sequence_end) of a request in a sequence
    sequence: tuple[int | str, bool, bool] | None = None
    # headers the server forwards to the model as parameters (--*-header-forward-pattern)
    forwarded: dict[str, str] | None = None


def json_values_bounded(data: bytes | bytearray | memoryview, what: str,
                        hint: str = "") -> None:
    """Refuse JSON text `what` that would parse into more than MAX_JSON_VALUES values;
    `hint`, what the client can do instead."""
    if json_text.marks_over(data, MAX_JSON_VALUES):
        raise _too_many_json_values(what, hint)


def _too_many_json_values(what: str, hint: str = "") -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what} holds more than {MAX_JSON_VALUES:,} JSON values and keys, each a "
        f"Python object to parse{'; ' if hint else ''}{hint}")


_TENSORS_HINT = ("send a large tensor's elements as numbers in its 'data' or with the binary "
                 "tensor extension")
_HEADER = "the inference request header"


def header_values_refused() -> InvalidArgumentError:
    """The error for an inference request header past MAX_JSON_VALUES (json_slices counts
    a large one in steps)."""
    return _too_many_json_values(_HEADER, _TENSORS_HINT)


def parse_header(data: bytes | memoryview, counted: bool = False) -> Any:
    """An inference request's JSON (all of its body, or the header before binary tensors)
    parsed as parse_json parses it; `counted`: its values are bounded already."""
    return parse_json(data, _HEADER, _TENSORS_HINT, counted)


def parse_json(data: bytes | memoryview, what: str, hint: str = "",
               counted: bool = False) -> Any:
    """`data` parsed, or an InvalidArgumentError saying why `what` is not JSON (bad UTF-8,
    bad syntax, an integer of more than 4,300 digits, or nesting deeper than Python's
    recursion limit: a body of a few hundred KB of "[" raised RecursionError, answered as
    an internal error) or holds too many values to parse (json_values_bounded, with
    `hint`; not counted again when the caller has: `counted`)."""
    if not counted:
        json_values_bounded(data, what, hint)
    try:
        return json_text.loads(data)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidArgumentError(f"{what} is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidArgumentError(
            f"{what} is not valid JSON: it nests arrays or objects too deeply") from None


def json_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def json_parameters(value: Any, what: str) -> dict[str, Any]:
    return {} if value is None else json_object(value, f"'parameters' of {what}")


def decode_infer_body(body: Any, body_length: int, header_length: int | None,
                      ledger: CopyLedger, shm: SharedMemoryRegistry | None = None,
                      parsed: Any = None) -> DecodedRequest:
    """Decode a request body of `body_length` bytes held by `body` (a buffer).

    `header_length` is Inference-Header-Content-Length: None when the body is all JSON, 0 for
    a raw binary request (the caller shapes its single input from the model's config).
    `parsed`: the JSON already parsed (json_slices: large `data` arrays as numpy arrays).
    """
    if header_length and header_length <= _KEPT_HEADER_BYTES and \
            header_length <= body_length and parsed is None:
        kept = _kept_headers.get(bytes(memoryview(body)[:header_length]))
        if kept is not None and kept.body_length == body_length:
            return kept.request(body, ledger)
    decoded: DecodedRequest = run_through(decode_infer_steps(body, body_length, header_length,
                                                             ledger, shm, parsed))
    return decoded


# Inputs, or outputs, decoded between two yields of decode_infer_steps: a JSON input costs
# ~7 µs, a binary one ~3 (a body of 4,096 JSON inputs held the loop for 38 ms in one step)
TENSORS_A_STEP = 256


def decode_infer_steps(body: Any, body_length: int, header_length: int | None,
                       ledger: CopyLedger, shm: SharedMemoryRegistry | None = None,
                       parsed: Any = None) -> Generator[None, None, DecodedRequest]:
    """decode_infer_body in steps (protocol.steps): a yield after each TENSORS_A_STEP inputs
    or outputs. Headers seen before are not looked up here (decode_infer_body does)."""
    if header_length is not None and header_length > body_length:
        raise InvalidArgumentError(f"Inference-Header-Content-Length {header_length} exceeds the "
                                   f"{body_length}-byte body")
    if header_length == 0:
        return DecodedRequest("", {"": TensorView(body, "UINT8", [body_length])}, None, True,
                              None, raw_binary=True)
    memory = memoryview(body)
    json_length = body_length if header_length is None else header_length
    keep = bool(header_length) and parsed is None and json_length <= _KEPT_HEADER_BYTES
    if parsed is None:
        parsed = parse_header(memory[:json_length])
    header = json_object(parsed, "the inference request")
    parameters = json_parameters(header.get("parameters"), "the request")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgumentError(
            f"request 'id' must be a string, got {type(request_id).__name__}")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidArgumentError("the request needs an 'inputs' list with at least one input")
    tensor_count(len(raw_inputs), "inputs")
    inputs: dict[str, TensorView] = {}
    position = json_length
    strings = 0  # BYTES elements
    for index, raw in enumerate(raw_inputs):
        if index and not index % TENSORS_A_STEP:
            yield
        view, position, strings = _decode_input(json_object(raw, f"input {index}"), body,
                                                body_length, position, strings, ledger, shm)
        if view.name in inputs:
            raise InvalidArgumentError(f"input '{view.name}' appears twice in the request")
        inputs[view.name] = view
    if position != body_length:
        raise InvalidArgumentError(
            f"the body has {body_length - position} bytes after the last binary input; "
            "binary_data_size values must add up to the binary part")
    outputs = yield from _decode_outputs(header.get("outputs"))
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidArgumentError("request parameter 'binary_data_output' must be true or false")
    decoded = DecodedRequest(request_id, inputs, outputs, binary_default,
                             request_timeout(parameters), parameters,
                             priority=request_priority(parameters),
                             sequence=request_sequence(parameters))
    if keep and _keeps(decoded, header):
        if len(_kept_headers) >= _KEPT_HEADERS:
            _kept_headers.clear()  # many distinct headers (ids, say): start again, never grow
        _kept_headers[bytes(memory[:json_length])] = _KeptHeader(decoded, body_length)
    return decoded


# A binary request's JSON header, decoded once, is looked up by its bytes: clients send the
# same header request after request (the same inputs' names, shapes and sizes), and parsing
# and checking it again cost more than the rest of decoding. Kept only for headers of binary
# inputs alone (no shared memory: a region's registration may change), at most this many.
_KEPT_HEADERS = 64
_KEPT_HEADER_BYTES = 4096


class _KeptHeader:
    """A decoded header: the request it makes of the next body of `body_length` bytes."""

    __slots__ = ("body_length", "_decoded", "_inputs")

    def __init__(self, decoded: DecodedRequest, body_length: int) -> None:
        self.body_length = body_length
        # what the request is, without its views: they hold its body's pooled buffer
        self._decoded = dataclasses.replace(decoded, inputs={})
        self._inputs = [(view.name, view.datatype, view.shape, view.offset, view.nbytes)
                        for view in decoded.inputs.values()]

    def request(self, body: Any, ledger: CopyLedger) -> DecodedRequest:
        """The request over `body`: its own views (checked as any are) and parameters."""
        d = self._decoded
        inputs = {name: TensorView(body, dt, shape, offset, nbytes=nbytes, name=name,
                                   ledger=ledger)
                  for name, dt, shape, offset, nbytes in self._inputs}
        return DecodedRequest(d.id, inputs, None if d.outputs is None else list(d.outputs),
                              d.binary_default, d.timeout_us, dict(d.parameters),
                              priority=d.priority, sequence=d.sequence)


_kept_headers: dict[bytes, _KeptHeader] = {}


def _keeps(decoded: DecodedRequest, header: dict[str, Any]) -> bool:
    """Whether `decoded` may be made again from its header's bytes alone: every input binary
    (not JSON data: its arrays are the request's own) and nothing in shared memory."""
    return (all("data" not in raw for raw in header["inputs"])
            and all(o.shm is None for o in decoded.outputs or ())
            and all(shm_parameters(json_parameters(raw.get("parameters"), ""), "") is None
                    for raw in header["inputs"]))


def _decode_input(raw: dict[str, Any], body: Any, body_length: int, position: int,
                  strings: int, ledger: CopyLedger,
                  shm: SharedMemoryRegistry | None) -> tuple[TensorView, int, int]:
    """The input's view, where the next binary input starts, and the BYTES elements of the
    request so far."""
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("every input needs a 'name' string")
    kind = raw.get("datatype")
    dt = datatype(kind, name) if isinstance(kind, str) else None
    if dt is None:
        raise InvalidArgumentError(f"input '{name}' needs a 'datatype' string")
    shape_value = raw.get("shape")
    if not isinstance(shape_value, list):
        raise InvalidArgumentError(f"input '{name}' needs a 'shape' list")
    shape = checked_shape(shape_value, name)
    strings = counted_strings(strings, dt, shape)
    parameters = json_parameters(raw.get("parameters"), f"input '{name}'")
    region = shm_parameters(parameters, name)
    if region is not None:
        if "data" in raw or "binary_data_size" in parameters:
            raise InvalidArgumentError(
                f"input '{name}' names a shared-memory region and also carries data")
        if shm is None:
            raise UnimplementedError("shared memory is not available on this front end")
        return (shm.input_view(region[0], region[1], region[2], dt, shape, name, ledger),
                position, strings)
    size = parameters.get("binary_data_size")
    if size is not None:
        if "data" in raw:
            raise InvalidArgumentError(f"input '{name}' has both 'data' and binary_data_size")
        if not is_count(size):
            raise InvalidArgumentError(
                f"input '{name}': binary_data_size must be a non-negative integer")
        if position + size > body_length:
            raise InvalidArgumentError(
                f"input '{name}': binary_data_size {size} at byte {position} runs past "
                f"the {body_length}-byte body")
        view = TensorView(body, dt, shape, position, nbytes=size, name=name, ledger=ledger)
        return view, position + size, strings
    if "data" not in raw:
        raise InvalidArgumentError(f"input '{name}' has neither 'data' nor binary_data_size")
    return json_tensor(raw["data"], dt, shape, name, ledger), position, strings


def _decode_outputs(raw: Any) -> Generator[None, None, list[RequestedOutput] | None]:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidArgumentError("'outputs' must be a list")
    tensor_count(len(raw), "outputs")
    outputs = []
    for index, item in enumerate(raw):
        if index and not index % TENSORS_A_STEP:
            yield
        item = json_object(item, f"output {index}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("every requested output needs a 'name' string")
        parameters = json_parameters(item.get("parameters"), f"output '{name}'")
        region = shm_parameters(parameters, name)
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidArgumentError(f"output '{name}': binary_data must be true or false")
        outputs.append(RequestedOutput(name, binary, classification_count(parameters, name),
                                       region))
    return outputs


def encode_infer_response(model: str, version: int, request_id: str,
                          outputs: dict[str, TensorView], binary: dict[str, bool],
                          parameters: dict[str, Any] | None = None,
                          in_shm: dict[str, tuple[str, int, int]] | None = None,
                          placeholders: Mapping[str, str] | None = None
                          ) -> tuple[bytes, list[memoryview]]:
    """(JSON header, tensor bytes to write after it) for an inference response; outputs
    already written to shared memory carry only their name, datatype and shape, as
    Triton's do (the C++ client, perf_analyzer's, reads `parameters` as binary data's).
    An output in `placeholders` has that string as its `data` (json_answers writes it)."""
    entries = []
    tail: list[memoryview] = []
    all_finite = True
    for name, view in outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": view.datatype.name,
                                 "shape": list(view.shape)}
        if in_shm and name in in_shm:
            pass  # the client reads it from its region
        elif binary.get(name, False):
            entry["parameters"] = {"binary_data_size": view.nbytes}
            tail.append(view.memoryview())
        elif placeholders and name in placeholders:
            entry["data"] = placeholders[name]
        else:
            entry["data"] = data = json_data(view)
            if isinstance(data, np.ndarray):  # not BYTES, whose strings need no look
                all_finite = all_finite and json_text.finite(data)
        entries.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": str(version),
                                "outputs": entries}
    if request_id:
        response["id"] = request_id
    if parameters:
        response["parameters"] = parameters
        all_finite = all_finite and json_text.finite(parameters)
    return json_text.dumps(response, all_finite=all_finite), tail


# Characters of an error message an HTTP answer carries. Messages name what the client sent,
# and a 30 MB input name came back as a 30 MB error; gRPC's are cut at 4 KiB too (grpcio
# drops larger trailers), so both front ends say the same.
ERROR_CHARACTERS = 4096


def json_error(message: str) -> bytes:
    """Triton's error body; a message past ERROR_CHARACTERS cut, saying how much was."""
    if len(message) > ERROR_CHARACTERS:
        message = (f"{message[:ERROR_CHARACTERS]} ... "
                   f"({len(message) - ERROR_CHARACTERS:,} more characters)")
    return json_text.dumps({"error": message})
