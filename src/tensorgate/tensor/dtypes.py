"""The protocol's datatypes: one table, with byte sizes and their numpy and torch equivalents.

Wire layout is little-endian and row-major, so every numpy dtype here is explicitly `<`.
BF16 has no numpy dtype (torch only); BYTES has no torch dtype (numpy object arrays only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tensorgate.errors import DatatypeError

__all__ = [
    "DATATYPES",
    "DataType",
    "datatype",
    "datatype_from_config",
    "datatype_of_numpy",
    "datatype_of_torch",
]


@dataclass(frozen=True, slots=True)
class DataType:
    """One protocol datatype. `itemsize` is 0 for BYTES, whose elements vary in length."""

    name: str
    config_name: str
    itemsize: int
    numpy: np.dtype | None
    torch: torch.dtype | None
    # numpy dtype that holds this type's bits when `numpy` is None (BF16 → uint16).
    storage: np.dtype

    @property
    def is_bytes(self) -> bool:
        return self.itemsize == 0

    def __repr__(self) -> str:
        return f"DataType({self.name})"


def _row(name: str, config: str, itemsize: int, np_code: str | None, th: torch.dtype | None,
         storage: str | None = None) -> DataType:
    np_dtype = np.dtype(np_code) if np_code is not None else None
    storage_dtype = np.dtype(storage) if storage is not None else np_dtype
    assert storage_dtype is not None
    return DataType(name, config, itemsize, np_dtype, th, storage_dtype)


DATATYPES: tuple[DataType, ...] = (
    _row("BOOL", "TYPE_BOOL", 1, "?", torch.bool),
    _row("UINT8", "TYPE_UINT8", 1, "u1", torch.uint8),
    _row("UINT16", "TYPE_UINT16", 2, "<u2", torch.uint16),
    _row("UINT32", "TYPE_UINT32", 4, "<u4", torch.uint32),
    _row("UINT64", "TYPE_UINT64", 8, "<u8", torch.uint64),
    _row("INT8", "TYPE_INT8", 1, "i1", torch.int8),
    _row("INT16", "TYPE_INT16", 2, "<i2", torch.int16),
    _row("INT32", "TYPE_INT32", 4, "<i4", torch.int32),
    _row("INT64", "TYPE_INT64", 8, "<i8", torch.int64),
    _row("FP16", "TYPE_FP16", 2, "<f2", torch.float16),
    _row("BF16", "TYPE_BF16", 2, None, torch.bfloat16, storage="<u2"),
    _row("FP32", "TYPE_FP32", 4, "<f4", torch.float32),
    _row("FP64", "TYPE_FP64", 8, "<f8", torch.float64),
    _row("BYTES", "TYPE_STRING", 0, "O", None),
)

_BY_NAME = {dt.name: dt for dt in DATATYPES}
_BY_CONFIG = {dt.config_name: dt for dt in DATATYPES}
_BY_TORCH = {dt.torch: dt for dt in DATATYPES if dt.torch is not None}
# numpy dtypes compare equal across byte orders only when both are native; key on (kind, size).
_BY_NUMPY_KIND = {(dt.numpy.kind, dt.numpy.itemsize): dt for dt in DATATYPES
                  if dt.numpy is not None and not dt.is_bytes}
_NAMES = tuple(_BY_NAME)


def datatype(name: str, tensor: str = "tensor") -> DataType:
    """The datatype called `name` on the wire ("FP32"), or a DatatypeError listing the valid ones."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise DatatypeError(tensor, str(name), "unknown datatype", _NAMES) from None


def datatype_from_config(config_name: str, tensor: str = "tensor") -> DataType:
    """The datatype a config.pbtxt names ("TYPE_FP32", "TYPE_STRING")."""
    try:
        return _BY_CONFIG[config_name]
    except (KeyError, TypeError):
        raise DatatypeError(tensor, str(config_name), "unknown config data_type",
                            tuple(_BY_CONFIG)) from None


def datatype_of_numpy(dtype: np.dtype, tensor: str = "tensor") -> DataType:
    """The protocol datatype for a numpy dtype of either byte order; str/bytes/object → BYTES."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return _BY_NAME["BYTES"]
    found = _BY_NUMPY_KIND.get((dtype.kind, dtype.itemsize))
    if found is None:
        raise DatatypeError(tensor, str(dtype), "no protocol datatype for numpy dtype", _NAMES)
    return found


def datatype_of_torch(dtype: torch.dtype, tensor: str = "tensor") -> DataType:
    """The protocol datatype for a torch dtype."""
    found = _BY_TORCH.get(dtype)
    if found is None:
        raise DatatypeError(tensor, str(dtype), "no protocol datatype for torch dtype", _NAMES)
    return found
