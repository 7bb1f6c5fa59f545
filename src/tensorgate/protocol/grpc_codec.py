"""KServe v2 gRPC messages (`inference.GRPCInferenceService`) ↔ the data plane's types.

A ModelInferRequest is not parsed whole by protobuf, which would copy every tensor into a
`bytes` of its own: `split_model_infer` walks the message's top-level fields, hands protobuf
only the small ones, and `raw_input_contents` become views of the received message (no
copy). A large input's typed `contents` are taken out too and read from the message's bytes
(protocol/grpc_contents.py), a piece at a time. A response is its small fields,
serialized by protobuf, followed by one `raw_output_contents` field per output written as a
tag, a length and a view of the output tensor: `encode_model_infer_parts` never joins them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import InvalidArgumentError, ShapeError, UnimplementedError
from tensorgate.model import NO_PARAMETERS, Parameter
from tensorgate.protocol.grpc_contents import (CONTENTS_APART, check_count, contents_array,
                                               contents_values_offset, split_contents_steps,
                                               wire_contents_steps, wire_strings_steps)
from tensorgate.protocol.infer_codec import (TENSORS_A_STEP, DecodedRequest, RequestedOutput,
                                             counted_strings, tensor_count)
from tensorgate.protocol.request_parameters import (classification_count, request_priority,
                                                    request_sequence, request_timeout,
                                                    shm_parameters)
from tensorgate.protocol.protobuf_wire import (MAX_MESSAGE_PARTS, PARTS_A_STEP, PartsBudget,
                                               fields, too_many_parts, varint_bytes)
from tensorgate.protocol.steps import run_through
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.dtypes import datatype
from tensorgate.tensor.shm import SharedMemoryRegistry
from tensorgate.tensor.view import MAX_DIMS, TensorView, checked_shape

__all__ = ["MAX_MESSAGE_PARTS", "TensorSpans", "decode_model_infer", "decode_model_infer_steps",
           "encode_model_infer_parts", "first_tensor_offset", "parameter_value",
           "PARTS_A_STEP", "parse_bounded_steps", "scan_for_tensor",
           "set_parameter", "split_model_infer", "split_model_infer_steps",
           "statistics_message", "stream_error_message", "stream_response_parts"]

_INPUTS_FIELD = 5       # ModelInferRequest.inputs
_RAW_INPUT_FIELD = 7    # ModelInferRequest.raw_input_contents
_RAW_OUTPUT_TAG = b"\x32"  # ModelInferResponse.raw_output_contents: field 6, length-delimited
_STREAM_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response: field 2, likewise

_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def parameter_value(parameter: pb.InferParameter) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def set_parameter(parameter: pb.InferParameter, value: Parameter) -> None:
    """`value` into `parameter`, as the field of its kind (int64 for int, double for float)."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value


def _parameters(message: Any) -> dict[str, Any]:
    return {k: parameter_value(v) for k, v in message.parameters.items()}


def first_tensor_offset(head: memoryview) -> int | None:
    """Where the first tensor's bytes start in a message whose first `len(head)` bytes
    have arrived, if that is known yet: the first raw_input_contents entry, or the values
    of a large input's typed contents (split_model_infer takes them out) when that input
    comes first. The receiver places the message so that this offset is 64-byte aligned."""
    return scan_for_tensor(head)[0]


def scan_for_tensor(head: memoryview, at: int = 0) -> tuple[int | None, int]:
    """first_tensor_offset, looked for from `at` (a field's start), and where to look from
    once more has arrived: the receiver asks after each 512 bytes, and a rescan from the
    start each time cost 86 ms on a head of 64 KiB of tiny fields (1.3 ms now)."""
    for number, _, start, stop, complete in fields(head, len(head), at):
        if number == _RAW_INPUT_FIELD:
            return start, at
        if number == _INPUTS_FIELD and stop - start >= CONTENTS_APART:
            offset = contents_values_offset(head, start, stop)
            if offset is not None or not complete:
                return offset, at
        if not complete:
            break
        at = stop
    return None, at


@dataclasses.dataclass(slots=True)
class TensorSpans:
    """Where a ModelInferRequest's tensors lie in its message, as (offset, length): each
    raw_input_contents entry, and the typed contents taken out of large inputs by input;
    with those, what is left of the message's count of fields to walk in Python."""

    raw: list[tuple[int, int]]
    contents: dict[int, tuple[int, int]] | None = None
    budget: PartsBudget | None = None


def split_model_infer(message: memoryview) -> tuple[pb.ModelInferRequest, TensorSpans]:
    """split_model_infer_steps run straight through."""
    split: tuple[pb.ModelInferRequest, TensorSpans] = run_through(
        split_model_infer_steps(message))
    return split


def split_model_infer_steps(message: memoryview
                            ) -> Generator[None, None, tuple[pb.ModelInferRequest, TensorSpans]]:
    """The request without its tensors (parsed by protobuf from the small fields) and where
    each `raw_input_contents` entry and each large input's typed contents are in `message`;
    a yield after each PARTS_A_STEP fields walked (an ordinary request has a few).
    Its top-level fields, and those of inputs looked into, count towards MAX_MESSAGE_PARTS;
    once an input is looked into, the count goes on in a PartsBudget that the decode of its
    contents spends too (an ordinary request makes none)."""
    spans = TensorSpans([])
    small: list[Any] = []
    field_start = inputs = walked = 0
    for number, _, start, stop, complete in fields(message, len(message)):  # the hot path:
        if not complete:  # whole_fields' checks, without its generator in between
            raise InvalidArgumentError(f"ModelInferRequest is malformed: field {number} runs "
                                       f"past the end of the {len(message)}-byte message")
        walked += 1
        if spans.budget is None:
            if walked > MAX_MESSAGE_PARTS:
                raise too_many_parts("ModelInferRequest")
        else:
            spans.budget.spend()
        if not walked % PARTS_A_STEP:
            yield
        if number == _RAW_INPUT_FIELD:
            spans.raw.append((start, stop - start))
        elif number == _INPUTS_FIELD and stop - start >= CONTENTS_APART:
            if spans.budget is None:
                spans.budget = PartsBudget("ModelInferRequest", MAX_MESSAGE_PARTS - walked)
            apart = yield from split_contents_steps(message, start, stop, spans.budget)
            if apart is None:
                small.append(message[field_start:stop])
            else:
                small.append(apart[0])
                if spans.contents is None:
                    spans.contents = {}
                spans.contents[inputs] = apart[1]
        else:
            small.append(message[field_start:stop])
        inputs += number == _INPUTS_FIELD
        field_start = stop
    if field_start != len(message):
        raise InvalidArgumentError("ModelInferRequest is malformed: it ends inside a field")
    request = yield from parse_bounded_steps(pb.ModelInferRequest, b"".join(small))
    return request, spans


_COUNTED_FROM = 16 << 10  # bytes from which a message's parts are counted before it is parsed
_SHAPE = "inference.ModelInferRequest.InferInputTensor.shape"


def parse_bounded_steps(message_type: Any, data: bytes) -> Generator[None, None, Any]:
    """`message_type` parsed from `data`, refused unparsed when it holds more than
    MAX_MESSAGE_PARTS fields and nested messages (counted on the wire, each nested message's
    own fields too, only for messages big enough to hold that many; a yield after each
    PARTS_A_STEP counted)."""
    if len(data) > _COUNTED_FROM:
        descriptor = message_type.DESCRIPTOR
        yield from _count_parts(descriptor, memoryview(data), descriptor.name)
    try:
        return message_type.FromString(data)
    except Exception as error:  # protobuf's DecodeError; its module path varies
        raise InvalidArgumentError(f"{message_type.DESCRIPTOR.name} is malformed: "
                                   f"{error}") from None


def _count_parts(descriptor: Any, data: memoryview, name: str) -> Generator[None, None, None]:
    """Raise unless the message in `data` has at most MAX_MESSAGE_PARTS fields, its nested
    messages' (map entries among them) counted with its own; stops counting there."""
    count = 0
    spans = [(descriptor, 0, len(data))]
    while spans:
        kind, begin, end = spans.pop()
        for number, _, start, stop, _ in fields(data, end, begin, name):
            count += 1
            if count > MAX_MESSAGE_PARTS:
                raise too_many_parts(name)
            if not count % PARTS_A_STEP:
                yield
            field = kind.fields_by_number.get(number)
            if field is None or stop > end:
                continue
            if field.message_type is not None:
                if stop > start:  # an empty one has no fields to walk
                    spans.append((field.message_type, start, stop))
            elif field.full_name == _SHAPE and stop - start > 10 * MAX_DIMS:
                # packed dims, at most 10 bytes each: 20 MB of them parsed into 160 MB
                raise InvalidArgumentError(f"{name} has an input shape of {stop - start:,} "
                                           f"bytes, more than {MAX_DIMS} dims")


def decode_model_infer(request: pb.ModelInferRequest, ledger: CopyLedger,
                       shm: SharedMemoryRegistry | None = None, *,
                       message: Any = None,
                       spans: TensorSpans | None = None) -> DecodedRequest:
    """The data plane's request. Tensors come from `spans` of `message` as views when given
    (split_model_infer), else from the message's own `raw_input_contents`."""
    decoded: DecodedRequest = run_through(decode_model_infer_steps(request, ledger, shm,
                                                                   message=message,
                                                                   spans=spans))
    return decoded


def decode_model_infer_steps(request: pb.ModelInferRequest, ledger: CopyLedger,
                             shm: SharedMemoryRegistry | None = None, *,
                             message: Any = None, spans: TensorSpans | None = None
                             ) -> Generator[None, None, DecodedRequest]:
    """decode_model_infer in steps (protocol.steps): typed contents taken out of the message
    are decoded a piece at a time, and a yield follows each TENSORS_A_STEP inputs or outputs
    (4,096 of each held the loop for 19 ms in one step)."""
    tensor_count(len(request.inputs), "inputs")
    tensor_count(len(request.outputs), "outputs")
    # (owner, offset, length) of each input's bytes
    raw: list[tuple[Any, int, int]] = (
        [(data, 0, len(data)) for data in request.raw_input_contents] if spans is None
        else [(message, offset, length) for offset, length in spans.raw])
    contents = None if spans is None else spans.contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgumentError(f"raw_input_contents has {len(raw)} entries for "
                                   f"{len(request.inputs)} inputs; give one per input")
    inputs: dict[str, TensorView] = {}
    strings = 0  # BYTES elements
    for index, item in enumerate(request.inputs):
        if index and not index % TENSORS_A_STEP:
            yield
        name = item.name
        if not name:
            raise InvalidArgumentError("every input needs a name")
        dt = datatype(item.datatype, name)
        if len(item.shape) > MAX_DIMS:  # before a Python int is made of each
            raise ShapeError(name, list(item.shape[:4]) + ["..."],
                             f"{len(item.shape)} dims; at most {MAX_DIMS} are allowed")
        shape = checked_shape(list(item.shape), name)
        strings = counted_strings(strings, dt, shape)
        region = shm_parameters(_parameters(item), name)
        typed = (contents is not None and index in contents) or _has_contents(item)
        if region is not None:
            if shm is None:
                raise UnimplementedError("shared memory is not available on this front end")
            if typed or (raw and raw[index][2]):
                raise InvalidArgumentError(f"input '{name}' names a shared-memory region and "
                                           "also carries data")
            view = shm.input_view(region[0], region[1], region[2], dt, shape, name, ledger)
        elif raw:
            if typed:  # which of the two is the input? Triton refuses it too
                raise InvalidArgumentError(
                    f"input '{name}' has typed contents and the request has "
                    "raw_input_contents; send every input's data one way")
            owner, offset, length = raw[index]
            view = TensorView(owner, dt, shape, offset, nbytes=length, name=name, ledger=ledger)
        else:
            wire = contents.get(index) if contents else None
            view = yield from _from_contents(
                item, dt.name, shape, ledger,
                None if wire is None else memoryview(message)[wire[0]:wire[0] + wire[1]],
                None if spans is None else spans.budget)
        if name in inputs:
            raise InvalidArgumentError(f"input '{name}' appears twice in the request")
        inputs[name] = view
    if not inputs:
        raise InvalidArgumentError("the request has no inputs")
    parameters = _parameters(request)
    outputs = None
    if request.outputs:
        outputs = []
        for index, out in enumerate(request.outputs):
            if index and not index % TENSORS_A_STEP:
                yield
            out_parameters = _parameters(out)
            outputs.append(RequestedOutput(out.name, True,
                                           classification_count(out_parameters, out.name),
                                           shm_parameters(out_parameters, out.name)))
    return DecodedRequest(request.id, inputs, outputs, True, request_timeout(parameters),
                          parameters, priority=request_priority(parameters),
                          sequence=request_sequence(parameters))


def _has_contents(item: Any) -> bool:
    """Whether the input carries typed contents with values (an empty `contents` message,
    which some clients write, carries nothing and says nothing)."""
    return item.HasField("contents") and bool(item.contents.ListFields())


def _from_contents(item: Any, name: str, shape: tuple[int, ...], ledger: CopyLedger,
                   wire: memoryview | None, budget: PartsBudget | None
                   ) -> Generator[None, None, TensorView]:
    """The input's typed contents: from `wire`, its serialized contents taken out of the
    message (split_model_infer), when given, its fields walked on the request's `budget`;
    else from the parsed message."""
    field = _CONTENTS.get(name)
    if field is None:
        raise InvalidArgumentError(f"input '{item.name}': {name} must be sent in "
                                   "raw_input_contents")
    dt = datatype(name)
    if wire is not None:
        assert budget is not None  # made by split_model_infer when it took contents out
        if dt.is_bytes:
            layout = yield from wire_strings_steps(wire, item.name, shape, budget)
            record_copy(len(layout), "decode", ledger)
            return TensorView(layout, dt, shape, name=item.name, ledger=ledger)
        read = yield from wire_contents_steps(wire, field, dt, item.name, shape, budget)
        if read is not None:
            array, copied = read
            if copied:
                record_copy(array.nbytes, "decode", ledger)
            return TensorView.from_numpy(array, name=item.name, ledger=ledger)
    contents = item.contents if wire is None else (
        yield from parse_bounded_steps(pb.InferTensorContents, bytes(wire)))
    if not dt.is_bytes:
        array = contents_array(contents, field, dt, item.name, shape)
        record_copy(array.nbytes, "decode", ledger)
        return TensorView.from_numpy(array, name=item.name, ledger=ledger)
    values = contents.bytes_contents
    check_count(len(values), item.name, shape, "bytes_contents",
                lambda: [field.name for field, _ in contents.ListFields()])
    array = np.array(list(values), dtype=object).reshape(shape)
    return TensorView.from_numpy(array, name=item.name, ledger=ledger)


def _length_prefix(value: int, tag: bytes = _RAW_OUTPUT_TAG) -> bytes:
    return tag + varint_bytes(value)


def encode_model_infer_parts(model: str, version: int, request_id: str,
                             outputs: dict[str, TensorView], ledger: CopyLedger,
                             report_copies: bool = False,
                             in_shm: dict[str, tuple[str, int, int]] | None = None,
                             copies_to_come: int = 0, final: bool | None = None,
                             parameters: Mapping[str, Parameter] = NO_PARAMETERS) -> list[Any]:
    """The serialized response as buffers to send one after another: protobuf's bytes for
    the small fields, then per output a field header and a view of the tensor (no copy).
    `copies_to_come`: tensor bytes the transport will still copy, counted here so that the
    reported total includes them. `final`: whether it is its request's last response (the
    `triton_final_response` parameter streaming clients ask for); None: not said.
    `parameters`: the model's own, sent as InferParameters."""
    response = pb.ModelInferResponse(model_name=model, model_version=str(version), id=request_id)
    for key, value in parameters.items():
        set_parameter(response.parameters[key], value)
    tensors: list[Any] = []
    for name, view in outputs.items():
        tensor = response.outputs.add()
        tensor.name = name
        tensor.datatype = view.datatype.name
        tensor.shape.extend(view.shape)
        if in_shm and name in in_shm:  # written into the client's region: an empty slot here
            region, offset, size = in_shm[name]
            tensor.parameters["shared_memory_region"].string_param = region
            tensor.parameters["shared_memory_offset"].int64_param = offset
            tensor.parameters["shared_memory_byte_size"].int64_param = size
            tensors += [_length_prefix(0)]
            continue
        data = view.memoryview()
        tensors += [_length_prefix(data.nbytes), data]
    if copies_to_come:
        record_copy(copies_to_come, "encode", ledger)
    if report_copies:
        response.parameters["tensorgate_copied_bytes"].int64_param = ledger.bytes
    if final is not None:
        response.parameters["triton_final_response"].bool_param = final
    return [response.SerializeToString(), *tensors]


def stream_response_parts(parts: list[Any]) -> list[Any]:
    """A ModelInferResponse's parts wrapped as ModelStreamInferResponse.infer_response
    (field 2): one field header in front, the parts themselves untouched."""
    size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    return [_length_prefix(size, _STREAM_RESPONSE_TAG), *parts]


def stream_error_message(message: str, model: str, version: str, request_id: str) -> bytes:
    """A ModelStreamInferResponse for a request that failed: the stream carries on. Its
    infer_response names the model and the request's id so that a client with many requests
    in flight knows which one failed (tritonclient reads only the message)."""
    data: bytes = pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(model_name=model, model_version=version,
                                             id=request_id)).SerializeToString()
    return data


def statistics_message(stats: dict[str, Any]) -> pb.ModelStatisticsResponse:
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)
