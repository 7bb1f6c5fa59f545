"""The Python backend's tensors and the helpers that name their types
(`pb_utils.Tensor`, `triton_to_numpy_type`, `serialize_byte_tensor`, ...), as Triton's
`triton_python_backend_utils` has them; python_backend.py is the module models import and
gives these under its name.

A Tensor holds a numpy array or a torch tensor (on any device) as given: the server's inputs
are views of the request's bytes, and `as_numpy()` / `to_dlpack()` copy nothing.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack  # type: ignore[attr-defined]
from tritonclient.grpc import model_config_pb2 as _config_pb

from tensorgate.errors import DatatypeError, TritonModelException
from tensorgate.tensor.dtypes import (DATATYPES, DataType, datatype, datatype_of_numpy,
                                      datatype_of_torch)


# A config's type names as numpy types, as Triton's module has them (TYPE_BOOL is Python's
# bool there, TYPE_BF16 absent: numpy has no such type)
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# The config enum's numbers (TYPE_FP32 = 11) for each datatype, from Triton's own schema
_TYPE_NUMBER: dict[str, int] = {dt.name: int(_config_pb.DataType.Value(dt.config_name))
                                for dt in DATATYPES}
_BY_NUMBER = {number: name for name, number in _TYPE_NUMBER.items()}


class Tensor:
    """A named tensor: a request's input, a response's output. Holds a numpy array or a
    torch tensor (on any device) and converts between them without copying."""

    __slots__ = ("_name", "_value", "_datatype")

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        if isinstance(numpy_array, torch.Tensor):  # a tensor handed in directly
            self._init_torch(name, numpy_array)
            return
        array = np.asarray(numpy_array)
        if array.dtype.kind in "UV":
            raise TritonModelException(
                f"tensor '{name}': numpy dtype {array.dtype} is not supported; use "
                "np.object_ for BYTES (elements bytes or str)")
        if triton_dtype is not None:
            wanted = triton_to_numpy_type(triton_dtype)
            if array.dtype != wanted:  # as Triton: the bytes read as the given type
                array = array.view(wanted)
        self._name = name
        self._value: np.ndarray | torch.Tensor = array
        try:
            self._datatype = datatype_of_numpy(array.dtype, name)
        except DatatypeError as error:  # what Triton raises for a dtype it has no type for
            raise TritonModelException(str(error)) from None

    def _init_torch(self, name: str, tensor: torch.Tensor) -> None:
        self._name = name
        self._value = tensor
        try:
            self._datatype = datatype_of_torch(tensor.dtype, name)
        except DatatypeError as error:  # as for a numpy dtype (above)
            raise TritonModelException(str(error)) from None

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor of another framework's memory (a DLPack capsule, or an object with
        `__dlpack__`), not copied."""
        return Tensor(name, from_dlpack(capsule))

    def name(self) -> str:
        return self._name

    def triton_dtype(self) -> int:
        return _TYPE_NUMBER[self._datatype.name]

    def shape(self) -> list[int]:
        return list(self._value.shape)

    def is_cpu(self) -> bool:
        return not isinstance(self._value, torch.Tensor) or self._value.device.type == "cpu"

    def as_numpy(self) -> np.ndarray:
        """The data as numpy, without a copy (a CPU tensor only, as in Triton)."""
        if isinstance(self._value, np.ndarray):
            return self._value
        if self._value.device.type != "cpu":
            raise TritonModelException(f"tensor '{self._name}' is on {self._value.device}; "
                                       "as_numpy() needs a CPU tensor (use to_dlpack())")
        if self._datatype.numpy is None:  # BF16: numpy has no such type
            raise TritonModelException(f"tensor '{self._name}' is BF16, which numpy cannot "
                                       "hold; use to_dlpack()")
        return self._value.numpy()

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (torch.utils.dlpack.from_dlpack takes it), no copy."""
        return to_dlpack(self._torch())

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._torch().__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        device: tuple[int, int] = self._torch().__dlpack_device__()
        return device

    def _torch(self) -> torch.Tensor:
        if isinstance(self._value, torch.Tensor):
            return self._value
        if self._datatype.is_bytes:
            raise TritonModelException(f"tensor '{self._name}' is BYTES, which DLPack cannot "
                                       "carry; use as_numpy()")
        return torch.from_numpy(self._value)

    def value(self) -> np.ndarray | torch.Tensor:
        """What it holds, as given (the server reads outputs through this)."""
        return self._value

    def datatype(self) -> DataType:
        return self._datatype

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype.name}, {self.shape()})"


def triton_to_numpy_type(data_type: int) -> Any:
    """numpy's type for a config enum number (TYPE_FP32 = 11 → np.float32); None for a
    number that has none (BF16's, or no type's), as Triton's."""
    name = _BY_NUMBER.get(data_type)
    if name is None:
        return None
    if name == "BYTES":
        return np.object_
    found = datatype(name).numpy
    return None if found is None else found.type


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The config enum number for a numpy dtype, None when the protocol has none."""
    try:
        found = np.dtype(data_type)
    except TypeError:
        return None
    if found.kind == "U":  # Triton's has no type for numpy's str_ (Tensor refuses it)
        return None
    if found.kind in "OS":
        return _TYPE_NUMBER["BYTES"]
    try:
        return _TYPE_NUMBER[datatype_of_numpy(found).name]
    except DatatypeError:  # a dtype the protocol lacks
        return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """numpy's type for a config's type name ("TYPE_FP32" → np.float32); KeyError for one
    numpy has no type for (TYPE_BF16) or no config has, as Triton's."""
    found = TRITON_STRING_TO_NUMPY.get(triton_type_string)
    if found is None:
        raise KeyError(f"no numpy type for config type '{triton_type_string}' (there is "
                       f"one for {', '.join(TRITON_STRING_TO_NUMPY)})")
    return found


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """BYTES elements in the wire layout (4-byte little-endian length, then the bytes), in C
    order, as Triton's: bytes; () for an empty tensor; None for one neither of objects
    (bytes kept, anything else its str() in UTF-8) nor of numpy bytes."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.kind != "S":
        return None
    parts: list[bytes] = []
    for item in input_tensor.flat:
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += (struct.pack("<I", len(data)), data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray) -> np.ndarray:
    """The elements of a BYTES wire layout, as a flat object array of bytes."""
    data = memoryview(bytes(encoded_tensor) if isinstance(encoded_tensor, np.ndarray)
                      else encoded_tensor).cast("B")
    items = []
    position = 0
    while position < len(data):
        if position + 4 > len(data):
            raise TritonModelException("a BYTES length prefix runs past the end")
        (length,) = struct.unpack_from("<I", data, position)
        position += 4
        if position + length > len(data):
            raise TritonModelException("a BYTES element runs past the end")
        items.append(bytes(data[position:position + length]))
        position += length
    return np.array(items, dtype=np.object_)
