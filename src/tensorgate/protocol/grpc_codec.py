"""KServe v2 gRPC messages (`inference.GRPCInferenceService`) ↔ the data plane's types.

`raw_input_contents` become read-only views of the message's bytes (no copy); typed
`contents` are decoded by numpy and counted. Every output goes into `raw_output_contents`,
one slot per output, as Triton does — protobuf needs `bytes` there, so that copy is counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from tensorgate.errors import InvalidArgumentError, UnimplementedError
from tensorgate.protocol.infer_codec import (DecodedRequest, RequestedOutput,
                                             classification_count, request_timeout,
                                             shm_parameters)
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.dtypes import datatype
from tensorgate.tensor.shm import SharedMemoryRegistry
from tensorgate.tensor.view import TensorView, checked_shape

__all__ = ["decode_model_infer", "encode_model_infer", "parameter_value", "statistics_message"]

_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def parameter_value(parameter: pb.InferParameter) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def _parameters(message: Any) -> dict[str, Any]:
    return {k: parameter_value(v) for k, v in message.parameters.items()}


def decode_model_infer(request: pb.ModelInferRequest, ledger: CopyLedger,
                       shm: SharedMemoryRegistry | None = None) -> DecodedRequest:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgumentError(f"raw_input_contents has {len(raw)} entries for "
                                   f"{len(request.inputs)} inputs; give one per input")
    inputs: dict[str, TensorView] = {}
    for index, item in enumerate(request.inputs):
        name = item.name
        if not name:
            raise InvalidArgumentError("every input needs a name")
        dt = datatype(item.datatype, name)
        shape = checked_shape(list(item.shape), name)
        region = shm_parameters(_parameters(item), name)
        if region is not None:
            if shm is None:
                raise UnimplementedError("shared memory is not available on this front end")
            if raw and len(raw[index]):
                raise InvalidArgumentError(f"input '{name}' names a shared-memory region and "
                                           "also carries data")
            view = shm.input_view(region[0], region[1], region[2], dt, shape, name, ledger)
        elif raw:
            view = TensorView(raw[index], dt, shape, nbytes=len(raw[index]), name=name,
                              ledger=ledger)
        else:
            view = _from_contents(item, dt.name, shape, ledger)
        if name in inputs:
            raise InvalidArgumentError(f"input '{name}' appears twice in the request")
        inputs[name] = view
    if not inputs:
        raise InvalidArgumentError("the request has no inputs")
    parameters = _parameters(request)
    outputs = None
    if request.outputs:
        outputs = []
        for out in request.outputs:
            out_parameters = _parameters(out)
            outputs.append(RequestedOutput(out.name, True,
                                           classification_count(out_parameters, out.name),
                                           shm_parameters(out_parameters, out.name)))
    return DecodedRequest(request.id, inputs, outputs, True, request_timeout(parameters),
                          parameters)


def _from_contents(item: Any, name: str, shape: tuple[int, ...],
                   ledger: CopyLedger) -> TensorView:
    field = _CONTENTS.get(name)
    if field is None:
        raise InvalidArgumentError(f"input '{item.name}': {name} must be sent in "
                                   "raw_input_contents")
    values = getattr(item.contents, field)
    count = 1
    for dim in shape:
        count *= dim
    if len(values) != count:
        raise InvalidArgumentError(f"input '{item.name}': contents has {len(values)} elements; "
                                   f"shape [{','.join(map(str, shape))}] needs {count}")
    dt = datatype(name)
    if dt.is_bytes:
        array = np.array(list(values), dtype=object).reshape(shape)
    else:
        array = np.array(values, dtype=dt.numpy).reshape(shape)
        record_copy(array.nbytes, "decode", ledger)
    return TensorView.from_numpy(array, name=item.name, ledger=ledger)


def encode_model_infer(model: str, version: int, request_id: str,
                       outputs: dict[str, TensorView], ledger: CopyLedger,
                       report_copies: bool = False,
                       in_shm: dict[str, tuple[str, int, int]] | None = None
                       ) -> pb.ModelInferResponse:
    """The response; with `report_copies`, parameter tensorgate_copied_bytes counts every
    copy made for this request, the encoding's own included."""
    response = pb.ModelInferResponse(model_name=model, model_version=str(version), id=request_id)
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
            response.raw_output_contents.append(b"")
            continue
        data = view.memoryview().tobytes()
        record_copy(len(data), "encode", ledger)
        response.raw_output_contents.append(data)
    if report_copies:
        response.parameters["tensorgate_copied_bytes"].int64_param = ledger.bytes
    return response


def statistics_message(stats: dict[str, Any]) -> pb.ModelStatisticsResponse:
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)
