"""A client's CUDA memory, opened from the IPC handle it registers (Triton's CUDA shared-memory
extension), through the CUDA driver API (`libcuda.so.1`, present wherever a GPU is usable).

`CudaRegion` opens the handle in the device's primary context — the one torch uses, so the
pointer is valid in torch's copies — and refuses a `byte_size` beyond the allocation the
handle names (`cuMemGetAddressRange`): a region that overstated its size would let a request
read or write past the client's memory, and an illegal address on the GPU poisons the
server's CUDA context for every model. Copies run on a stream of the region's own, created
non-blocking, so that they never queue behind a model's work on the legacy default stream;
each is synchronous, so nothing is in flight when the region is closed.

Nothing here runs without a GPU; the registry (tensor/shm.py) says so before calling in.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch

from tensorgate.errors import InvalidArgumentError, NotFoundError, UnavailableError
from tensorgate.tensor.copies import CopyLedger, copy_into
from tensorgate.tensor.pinned import pinned_storage

__all__ = ["HANDLE_BYTES", "CudaRegion"]

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle)
_LAZY_ENABLE_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, as Triton opens them


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]


@functools.lru_cache(maxsize=1)
def _driver() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise UnavailableError(f"CUDA shared memory needs the CUDA driver: {error}") from None
    # cuda.h maps these names to their _v2 ABI; a driver exports both, an old one only the first
    for name in ("cuCtxPushCurrent", "cuCtxPopCurrent", "cuIpcOpenMemHandle",
                 "cuMemGetAddressRange", "cuDevicePrimaryCtxRelease"):
        setattr(lib, name, getattr(lib, name + "_v2", None) or getattr(lib, name))
    u64 = ctypes.c_uint64
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.cuDevicePrimaryCtxRelease.argtypes = [ctypes.c_int]
    lib.cuCtxPushCurrent.argtypes = [ctypes.c_void_p]
    lib.cuCtxPopCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cuIpcOpenMemHandle.argtypes = [ctypes.POINTER(u64), _Handle, ctypes.c_uint]
    lib.cuIpcCloseMemHandle.argtypes = [u64]
    lib.cuMemGetAddressRange.argtypes = [ctypes.POINTER(u64), ctypes.POINTER(ctypes.c_size_t),
                                         u64]
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuInit.argtypes = [ctypes.c_uint]
    result = lib.cuInit(0)  # idempotent; torch's runtime has usually done it already
    if result != 0:
        raise UnavailableError(f"CUDA shared memory: the CUDA driver did not initialise "
                               f"(error {result})")
    return lib


def _check(result: int, call: str, region: str) -> None:
    if result == 0:
        return
    text = ctypes.c_char_p()
    _driver().cuGetErrorString(result, ctypes.byref(text))
    reason = text.value.decode(errors="replace") if text.value else f"error {result}"
    raise InvalidArgumentError(f"CUDA shared-memory region '{region}': {call} failed: {reason}")


class _DeviceBytes:
    """`byte_size` bytes at a device pointer, as torch reads them (`__cuda_array_interface__`)."""

    def __init__(self, pointer: int, byte_size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (byte_size,), "typestr": "|u1",
                                         "data": (pointer, False), "version": 3}


class CudaRegion:
    """A registered CUDA region: read into host memory, written from it, closed once."""

    kind: Literal["cuda"] = "cuda"

    def __init__(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self._lock = threading.Lock()  # a copy and close never overlap
        driver = _driver()
        device = ctypes.c_int()
        _check(driver.cuDeviceGet(ctypes.byref(device), device_id), "cuDeviceGet", name)
        self._device = device.value
        context = ctypes.c_void_p()
        _check(driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), self._device),
               "cuDevicePrimaryCtxRetain", name)
        self._context: ctypes.c_void_p | None = context
        self._pointer = 0
        self._memory: torch.Tensor | None = None
        try:
            with self._current():
                pointer = ctypes.c_uint64()
                _check(driver.cuIpcOpenMemHandle(ctypes.byref(pointer),
                                                 _Handle.from_buffer_copy(handle),
                                                 _LAZY_ENABLE_PEER_ACCESS),
                       "cuIpcOpenMemHandle", name)
                self._pointer = pointer.value
                base, size = ctypes.c_uint64(), ctypes.c_size_t()
                _check(driver.cuMemGetAddressRange(ctypes.byref(base), ctypes.byref(size),
                                                   pointer), "cuMemGetAddressRange", name)
            available = base.value + size.value - self._pointer
            if byte_size > available:
                raise InvalidArgumentError(f"CUDA shared-memory region '{name}': byte_size "
                                           f"{byte_size} exceeds the {available} bytes of the "
                                           "allocation its handle names")
            torch_device = torch.device("cuda", device_id)
            self._memory = torch.as_tensor(_DeviceBytes(self._pointer, byte_size),
                                           device=torch_device)
            self._stream = torch.cuda.Stream(torch_device)  # type: ignore[no-untyped-call]
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        """The region's context current on this thread for driver calls."""
        driver = _driver()
        _check(driver.cuCtxPushCurrent(self._context), "cuCtxPushCurrent", self.name)
        try:
            yield
        finally:
            driver.cuCtxPopCurrent(ctypes.byref(ctypes.c_void_p()))

    def read(self, offset: int, nbytes: int, ledger: CopyLedger) -> np.ndarray:
        """`nbytes` at `offset`, copied into fresh page-locked host memory, 64-byte aligned
        like every buffer a tensor view reads (counted)."""
        host = pinned_storage(nbytes)
        with self._lock:
            memory = self._open_memory()
            with torch.cuda.stream(self._stream):
                copy_into(torch.from_numpy(host), memory[offset:offset + nbytes], "device",
                          ledger)
            self._stream.synchronize()
        return host

    def write(self, offset: int, source: np.ndarray, ledger: CopyLedger) -> None:
        """`source` (host bytes) into the region at `offset` (counted); done on return."""
        with self._lock:
            memory = self._open_memory()
            with torch.cuda.stream(self._stream):
                copy_into(memory[offset:offset + source.nbytes], torch.from_numpy(source),
                          "device", ledger)
            self._stream.synchronize()

    def status(self) -> dict[str, Any]:
        """Triton's status entry of a CUDA region."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def _open_memory(self) -> torch.Tensor:
        if self._memory is None:
            raise NotFoundError(f"CUDA shared-memory region '{self.name}' was unregistered")
        return self._memory

    def close(self) -> None:
        """Unmap the client's memory and let go of the context (once; later calls do nothing)."""
        with self._lock:
            self._memory = None
            if self._context is None:
                return
            driver = _driver()
            if self._pointer:
                with self._current():
                    driver.cuIpcCloseMemHandle(ctypes.c_uint64(self._pointer))
                self._pointer = 0
            driver.cuDevicePrimaryCtxRelease(self._device)
            self._context = None
