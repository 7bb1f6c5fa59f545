"""Inputs the server makes itself, not a client: zeros of a model's configured shapes (its
warm-up, the checks of a compiled model's shapes, CUDA-graph captures), a `model_warmup`
sample's inputs, and tensors read from a repository's files (warm-up data, a stateful
model's initial state). Each is bounded: a config may come from a client's load request.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tensorgate.pipeline.ragged import one_request
from tensorgate.repository.model_config import (MAX_WARMUP_BYTES, ModelConfigError, ModelSpec,
                                                 WarmupSample)
from tensorgate.tensor.bytes_codec import decode_bytes_tensor
from tensorgate.tensor.dtypes import DataType

__all__ = ["read_model_file", "sample_inputs", "tensor_from_file", "warmup_inputs",
           "zeros_refused"]


def zeros_refused(spec: ModelSpec, rows: int) -> str | None:
    """Why zeros cannot stand in for the model's inputs, `rows` deep: a BYTES input, whose
    meaningful content we cannot invent, or one larger than a model_warmup sample may be
    (MAX_WARMUP_BYTES). A config's dims are not bounded otherwise, and a client's load
    `config` had a server allocate 4.8 GB of zeros for [3, 20000, 20000]: more would have
    had it killed for memory."""
    for item in spec.model_inputs:
        if item.datatype.torch is None:
            return f"input '{item.name}' is BYTES"
        nbytes = (rows if spec.max_batch_size else 1) * item.row_bytes()
        if nbytes > MAX_WARMUP_BYTES:
            return (f"input '{item.name}' would be {nbytes:,} bytes of zeros, more than a "
                    f"warm-up input may be ({MAX_WARMUP_BYTES:,})")
    return None


def warmup_inputs(spec: ModelSpec, rows: int,
                  device: torch.device) -> dict[str, torch.Tensor] | None:
    """Zero inputs of the configured shapes (variable dims at their least: 1, or where the
    model's code is bounded, its bound), `rows` deep when batching; None where
    `zeros_refused` says why not."""
    if zeros_refused(spec, rows) is not None:
        return None
    inputs = {}
    for item in spec.model_inputs:
        dims = _ragged_row(spec, item.name) or item.least_dims()
        shape: Sequence[int] = ([rows] + dims) if spec.max_batch_size else dims
        inputs[item.name] = torch.zeros(shape, dtype=item.datatype.torch, device=device)
    return _on_device(one_request(spec, inputs), device)


def _ragged_row(spec: ModelSpec, name: str) -> list[int] | None:
    """A warm-up row of a ragged input held by RaggedLimits: the fewest elements learned
    (`least`), else a*1 where the model sizes it a*n from one n with others; None where
    neither holds it."""
    limits = spec.ragged_limits
    if limits is None:
        return None
    least = dict(limits.least).get(name)
    if least is not None:
        return [least]
    scale = next((a for group in limits.ties for member, a in group if member == name), None)
    return None if scale is None else [scale]


def _on_device(inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Warm-up inputs all on `device` (batch inputs are computed on the CPU)."""
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in inputs.items()}


def sample_inputs(spec: ModelSpec, sample: WarmupSample, folder: pathlib.Path,
                  device: torch.device) -> dict[str, Any]:
    """The inputs of a `model_warmup` sample, `sample.batch_size` deep when batching; files
    come from `folder` (the model's `warmup/`). Inputs the sample does not name (a stateful
    model's controls and states) are zeros. BYTES random data is empty strings."""
    given = dict(sample.inputs)
    batched = spec.max_batch_size > 0
    rows = [sample.batch_size] if batched else []
    inputs: dict[str, Any] = {}
    for item in spec.model_inputs:
        data = given.get(item.name)
        if data is None:
            if spec.input(item.name) is not None:
                continue  # an optional input the sample leaves out
            dims = [1 if d == -1 else d for d in item.dims]
            nbytes = math.prod(rows) * item.row_bytes(reshaped=False)
            if nbytes > MAX_WARMUP_BYTES:  # as the inputs a sample names are bounded
                raise ModelConfigError(str(folder.parent), f"model '{spec.name}', warm-up "
                                       f"sample '{sample.name}' leaves out input "
                                       f"'{item.name}', whose zeros would be {nbytes:,} "
                                       f"bytes; a warm-up input may be at most "
                                       f"{MAX_WARMUP_BYTES:,}")
            if item.datatype.is_bytes:
                inputs[item.name] = np.full(rows + dims, b"0", dtype=object)
            else:
                inputs[item.name] = torch.zeros(rows + dims, dtype=item.datatype.torch,
                                                device=device)
            continue
        shape = rows + list(data.dims)
        what = f"model '{spec.name}', warm-up sample '{sample.name}', input '{item.name}'"
        if item.datatype.is_bytes:
            if data.data == "file":
                raw = read_model_file(folder / data.file, what)
                strings = decode_bytes_tensor(memoryview(raw), 0, len(raw), data.dims,
                                              item.name)
                inputs[item.name] = np.broadcast_to(strings, shape).copy()
            else:
                inputs[item.name] = np.full(shape, b"", dtype=object)
            continue
        dtype = item.datatype.torch
        assert dtype is not None
        if data.data == "zero":
            value = torch.zeros(shape, dtype=dtype)
        elif data.data == "random":
            value = (torch.rand(shape).to(dtype) if dtype.is_floating_point
                     else torch.randint(0, 2 if dtype == torch.bool else 100, shape).to(dtype))
        else:
            value = tensor_from_file(folder / data.file, item.datatype, data.dims, what)
            value = value.expand(shape).contiguous()
        inputs[item.name] = value.to(device)
    for item in spec.inputs:  # as a request's inputs are: in their `reshape` shape
        if item.reshape is not None and item.name in inputs:
            inputs[item.name] = inputs[item.name].reshape(rows + list(item.reshape))
    return _on_device(one_request(spec, inputs), device)


def read_model_file(path: pathlib.Path, what: str) -> bytes:
    """A data file of the repository (warm-up data, an initial state); `what` names its use
    in the error."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise ModelConfigError(str(path), f"{what}: {error.strerror}") from None


def tensor_from_file(path: pathlib.Path, datatype: DataType, dims: Sequence[int],
                     what: str) -> torch.Tensor:
    """A tensor of `dims` from a file of its raw bytes (row-major, little-endian)."""
    dtype = datatype.torch
    assert dtype is not None, "BYTES files are decoded with decode_bytes_tensor"
    raw = read_model_file(path, what)
    count = int(np.prod(dims))
    if len(raw) != count * datatype.itemsize:
        raise ModelConfigError(str(path), f"{what}: {datatype.name} {list(dims)} needs "
                                          f"{count * datatype.itemsize} bytes; the file has "
                                          f"{len(raw)}")
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(tuple(dims))
