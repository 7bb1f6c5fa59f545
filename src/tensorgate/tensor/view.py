"""TensorView: a datatype and shape laid over bytes someone else owns.

A view holds a memoryview of its owner, and every array or tensor it gives out holds that
memoryview in turn. So the owner lives as long as anything that reads it, a `bytearray`
owner cannot be resized under it, and a pooled buffer cannot go back to its pool early.

`.numpy()`, `.torch()` and `__dlpack__` never copy aligned data. Data at an address that is
not a multiple of its item size is copied once, through the counted copy function, into an
aligned pooled buffer, and the view then points there.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor  # the name `torch` is also TensorView's method, in the class body
from torch.utils.dlpack import from_dlpack

from tensorgate.errors import BufferBoundsError, DatatypeError, ShapeError
from tensorgate.tensor.buffer import ALIGNMENT, host_array
from tensorgate.tensor.bytes_codec import (BYTES_CHECKED_WHEN_DECODED, check_bytes_tensor,
                                           decode_bytes_tensor, encode_bytes_tensor)
from tensorgate.tensor.copies import CopyLedger, copy_into, record_copy
from tensorgate.tensor.dtypes import DataType, datatype, datatype_of_numpy, datatype_of_torch
from tensorgate.tensor.pool import BufferPool, default_pool

__all__ = ["MAX_DIMS", "TensorView", "checked_shape"]

MAX_DIMS = 64
_INT64_MAX = (1 << 63) - 1
_MAX_ELEMENTS = _INT64_MAX // 8
_DLPACK_CPU = 1


def checked_shape(shape: Sequence[Any], tensor: str = "tensor") -> tuple[int, ...]:
    """`shape` as a tuple of ints, each in [0, 2**63), with an element count that fits int64."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(tensor, [repr(shape)], "shape must be a list of integers") from None
    if len(dims) > MAX_DIMS:
        raise ShapeError(tensor, dims[:4] + ("...",),
                         f"{len(dims)} dims; at most {MAX_DIMS} are allowed")
    product = 1  # of the nonzero dims: numpy refuses an empty array whose other dims overflow
    for dim in dims:
        if type(dim) is not int:  # plain ints from a decoder skip this; numpy ints come here
            return checked_shape(tuple(_as_dim(d, dims, tensor) for d in dims), tensor)
        if dim < 0:
            raise ShapeError(tensor, dims, f"dim {dim} is negative")
        if dim > _INT64_MAX:
            raise ShapeError(tensor, dims, f"dim {dim} exceeds the int64 range")
        if dim:
            product *= dim
    if product > _MAX_ELEMENTS:
        raise ShapeError(tensor, dims, f"the dims multiply to {product}, past what 8-byte "
                                       "elements can address in the int64 range")
    return dims


def _as_dim(dim: Any, dims: tuple[Any, ...], tensor: str) -> int:
    if isinstance(dim, bool):
        raise ShapeError(tensor, dims, f"dim {dim!r} is not an integer")
    try:
        return operator.index(dim)
    except TypeError:
        raise ShapeError(tensor, dims, f"dim {dim!r} is not an integer") from None


def _byte_memory(owner: Any, tensor: str) -> memoryview:
    try:
        memory = memoryview(owner)
    except TypeError:
        raise TypeError(f"tensor '{tensor}': a {type(owner).__name__} does not expose the "
                        "buffer protocol") from None
    if memory.format == "B" and memory.ndim == 1:
        return memory
    if not memory.c_contiguous:
        raise ValueError(f"tensor '{tensor}': the buffer is not C-contiguous")
    if memory.nbytes == 0:
        return memoryview(b"")
    return memory.cast("B")


class TensorView:
    """(owner, offset, datatype, shape): numpy, torch and DLPack access without copying.

    `owner` is any object exposing the buffer protocol: a pooled `HostBuffer`, `bytes`,
    `bytearray`, `mmap`, a memoryview, a C-contiguous numpy array. For fixed-size datatypes
    the view covers shape × item size bytes (`nbytes`, if given, must equal that); a BYTES
    view covers `nbytes` (default: the rest of the buffer) and is checked element by element:
    here, or, from BYTES_CHECKED_WHEN_DECODED elements that the bytes could hold (a 4-byte
    length each), when `numpy()` decodes it, which raises the same error: the pipeline
    decodes large ones off the event loop, and a check here held it for ~75 ms a million
    elements of mixed lengths.
    `ledger` receives the count of any copy made on the view's behalf.
    """

    __slots__ = ("_memory", "_offset", "_datatype", "_shape", "_count", "_nbytes", "_name",
                 "_ledger")

    def __init__(self, owner: Any, datatype_: DataType | str, shape: Sequence[int],
                 offset: int = 0, *, nbytes: int | None = None, name: str = "tensor",
                 ledger: CopyLedger | None = None) -> None:
        dt = datatype_ if isinstance(datatype_, DataType) else datatype(datatype_, name)
        dims = checked_shape(shape, name)
        count = 1
        for dim in dims:
            count *= dim
        memory = _byte_memory(owner, name)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise BufferBoundsError(name, offset if isinstance(offset, int) else -1, 0,
                                    memory.nbytes)
        if dt.is_bytes:
            size = memory.nbytes - offset if nbytes is None else nbytes
            if size < 0 or offset + size > memory.nbytes:
                raise BufferBoundsError(name, offset, max(size, 0), memory.nbytes)
            if count < BYTES_CHECKED_WHEN_DECODED or size < 4 * count:  # (then it fails)
                check_bytes_tensor(memory, offset, size, count, name)
        else:
            size = count * dt.itemsize
            if nbytes is not None and nbytes != size:
                raise ShapeError(name, dims, f"{dt.name} needs {size} bytes ({count} elements "
                                             f"of {dt.itemsize}), found {nbytes}")
            if offset + size > memory.nbytes:
                raise BufferBoundsError(name, offset, size, memory.nbytes)
        self._memory = memory
        self._offset = offset
        self._datatype = dt
        self._shape = dims
        self._count = count
        self._nbytes = size
        self._name = name
        self._ledger = ledger

    # -- what it is ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def datatype(self) -> DataType:
        return self._datatype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def count(self) -> int:
        """Elements: the product of `shape`."""
        return self._count

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def owner(self) -> Any:
        """The object whose bytes this view reads."""
        return self._memory.obj

    @property
    def readonly(self) -> bool:
        return self._memory.readonly

    @property
    def address(self) -> int:
        """Address of the view's first byte."""
        return int(np.frombuffer(self._memory, np.uint8, 0, self._offset).ctypes.data)

    def __repr__(self) -> str:
        dims = ",".join(map(str, self._shape))
        return (f"TensorView({self._name!r}, {self._datatype.name}[{dims}], "
                f"{self._nbytes} bytes at offset {self._offset})")

    # -- zero-copy access ------------------------------------------------------------------

    def memoryview(self) -> memoryview:
        """The view's bytes, as a memoryview of the owner (for writelines, sockets, files)."""
        return self._memory[self._offset:self._offset + self._nbytes]

    def numpy(self) -> np.ndarray:
        """A numpy array over the view's bytes; BYTES decodes to an object array of `bytes`."""
        dt = self._datatype
        if dt.is_bytes:
            return decode_bytes_tensor(self._memory, self._offset, self._nbytes, self._shape,
                                       self._name, self._ledger)
        if dt.numpy is None:
            raise DatatypeError(self._name, dt.name,
                                "numpy has no dtype for datatype (use .torch() for it)")
        return self._array(dt.numpy)

    def torch(self) -> torch.Tensor:
        """A CPU torch tensor over the view's bytes (read-only data arrives through DLPack)."""
        dt = self._datatype
        if dt.torch is None:
            raise DatatypeError(self._name, dt.name,
                                "torch has no dtype for datatype (use .numpy() for it)")
        if self._count == 0:
            return torch.empty(self._shape, dtype=dt.torch)
        array = self._array(dt.storage)
        # from_numpy warns on read-only arrays; DLPack carries them without a warning.
        tensor = torch.from_numpy(array) if array.flags.writeable else from_dlpack(array)
        if dt.numpy is None:
            tensor = tensor.view(dt.torch)  # BF16: the bits travel as uint16
        return tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.torch().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)

    def aligned(self, alignment: int = ALIGNMENT, pool: BufferPool | None = None) -> TensorView:
        """This view if its first byte is on an `alignment` boundary, else a counted copy."""
        if self._nbytes == 0 or self.address % alignment == 0:
            return self
        return self._copied_to_pool(pool)

    # -- building views from arrays --------------------------------------------------------

    @classmethod
    def from_numpy(cls, array: np.ndarray, *, name: str = "tensor",
                   ledger: CopyLedger | None = None, pool: BufferPool | None = None,
                   datatype_: DataType | None = None) -> TensorView:
        """A view of `array` in wire layout: zero-copy when it is already C-contiguous,
        little-endian and aligned; otherwise one counted copy into a pooled buffer."""
        dt = datatype_ or datatype_of_numpy(array.dtype, name)
        target = pool or default_pool()
        if dt.is_bytes:
            buffer, nbytes = encode_bytes_tensor(array, target.acquire)
            record_copy(nbytes, "encode", ledger)
            return cls(buffer, dt, array.shape, nbytes=nbytes, name=name, ledger=ledger)
        wire = dt.storage
        if array.size == 0:
            return cls(b"", dt, array.shape, name=name, ledger=ledger)
        if array.dtype == wire and array.flags.c_contiguous and array.flags.aligned:
            return cls._over(array, dt, name, ledger)
        buffer = target.acquire(array.size * dt.itemsize)
        destination = host_array(buffer, wire, array.size).reshape(array.shape)
        copy_into(destination, array, "layout" if array.dtype.isnative else "byteswap", ledger)
        return cls(buffer, dt, array.shape, name=name, ledger=ledger)

    @classmethod
    def from_torch(cls, tensor: Tensor, *, name: str = "tensor",
                   ledger: CopyLedger | None = None, pool: BufferPool | None = None) -> TensorView:
        """A view of a CPU tensor: zero-copy when contiguous, else one counted copy."""
        if not tensor.is_cpu:
            raise ValueError(f"tensor '{name}': on {tensor.device}; copy it to the host first")
        dt = datatype_of_torch(tensor.dtype, name)
        if tensor.requires_grad:  # (numpy() refuses it; detach() costs a tensor otherwise)
            tensor = tensor.detach()
        if tensor.numel() and not tensor.is_contiguous():
            target = pool or default_pool()
            buffer = target.acquire(tensor.numel() * dt.itemsize)
            bits = torch.frombuffer(buffer, dtype=tensor.dtype, count=tensor.numel())
            copy_into(bits.view(tensor.shape), tensor, "layout", ledger)
            return cls(buffer, dt, tensor.shape, name=name, ledger=ledger)
        if dt.numpy is None:
            tensor = tensor.view(torch.uint16)
        return cls.from_numpy(tensor.numpy(), name=name, ledger=ledger, pool=pool, datatype_=dt)

    @classmethod
    def from_array(cls, value: Tensor | np.ndarray, *, name: str = "tensor",
                   ledger: CopyLedger | None = None) -> TensorView:
        """`from_torch` or `from_numpy`, whichever `value` is (a model's BYTES output, or a
        BYTES input, is a numpy object array; everything else a tensor)."""
        if isinstance(value, Tensor):
            return cls.from_torch(value, name=name, ledger=ledger)
        return cls.from_numpy(value, name=name, ledger=ledger)

    # -- internals -------------------------------------------------------------------------

    @classmethod
    def _over(cls, array: np.ndarray, dt: DataType, name: str,
              ledger: CopyLedger | None) -> TensorView:
        """A view of a non-empty, C-contiguous, aligned array in `dt`'s wire dtype, without
        `__init__`'s checks: numpy's shape and the array's own bytes already pass them. Every
        output of every request comes this way, cold in the caches: the checks cost
        from_torch ~3 µs of its ~12 there (identity, bench/RESULTS.md)."""
        view = cls.__new__(cls)
        view._memory = array.data.cast("B")
        view._offset = 0
        view._datatype = dt
        view._shape = array.shape
        view._count = array.size
        view._nbytes = array.nbytes
        view._name = name
        view._ledger = ledger
        return view

    def _array(self, dtype: np.dtype) -> np.ndarray:
        if self._count == 0:
            return np.empty(self._shape, dtype)
        array = np.frombuffer(self._memory, dtype, self._count, self._offset)
        if not array.flags.aligned:
            moved = self._copied_to_pool(None)
            self._memory, self._offset = moved._memory, moved._offset
            array = np.frombuffer(self._memory, dtype, self._count, self._offset)
        return array.reshape(self._shape)

    def _copied_to_pool(self, pool: BufferPool | None) -> TensorView:
        buffer = (pool or default_pool()).acquire(self._nbytes)
        destination = host_array(buffer, np.uint8, self._nbytes)
        source = np.frombuffer(self._memory, np.uint8, self._nbytes, self._offset)
        copy_into(destination, source, "realign", self._ledger)
        return TensorView(buffer, self._datatype, self._shape, nbytes=self._nbytes,
                          name=self._name, ledger=self._ledger)
