"""Triton's system and CUDA shared-memory extensions: client regions registered once by name
(one namespace for both kinds, as Triton's), then named by requests' inputs and outputs.
A system region is mapped and read and written in place; a CUDA region (tensor/cuda_ipc.py)
is opened from its IPC handle and copied from and into host memory (counted copies).

Security (each from a Triton CVE fix, see PROTOCOL.md §2.7): off unless the server is started
with --allow-shared-memory; keys are confined to one plain name under /dev/shm (at most one
leading "/", no other "/", no reserved prefix, an optional required prefix), opened with
O_NOFOLLOW and checked to be regular files; offset and size are bounds-checked at
registration and on every request; keys never appear in error messages (only region names).

Lifetime is structural: a registered region is one `mmap`; inputs are views of it, which hold
buffer exports on it, and CPython cannot unmap an exported mmap. Unregistering only drops the
registry's reference, so a region in use by an in-flight request is unmapped when the last
view of it is gone — never under a request. A CUDA region hands out copies, never views, and
is closed under its own lock, so never during a copy.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from tensorgate.errors import (AlreadyExistsError, InvalidArgumentError, NotFoundError,
                               UnavailableError)
from tensorgate.tensor.copies import CopyLedger, copy_into
from tensorgate.tensor.cuda_ipc import HANDLE_BYTES, CudaRegion
from tensorgate.tensor.dtypes import DataType
from tensorgate.tensor.pinned import cuda_available
from tensorgate.tensor.view import TensorView

RegionKind = Literal["system", "cuda"]

__all__ = ["SharedMemoryRegistry"]

_SHM_DIR = "/dev/shm"
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,200}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
# Internal prefixes that a client must never be able to name (ours, and Triton's Python
# backend's, whose leak-then-register chain was CVE-2025-23319/23320/23334).
_RESERVED = ("tensorgate", "triton_python_backend", "tritonpy")


@dataclass(frozen=True)
class _Region:
    """A system region: read in place, written with the model's own output write. A CUDA
    region (tensor/cuda_ipc.CudaRegion) answers the same four calls."""

    name: str
    key: str
    offset: int
    byte_size: int
    memory: memoryview  # [offset, offset + byte_size) of the mapping
    kind: ClassVar[Literal["system"]] = "system"

    def read(self, offset: int, nbytes: int, ledger: CopyLedger) -> memoryview:
        return self.memory[offset:offset + nbytes]  # in place: no copy

    def write(self, offset: int, source: np.ndarray, ledger: CopyLedger) -> None:
        destination = np.frombuffer(self.memory[offset:offset + source.nbytes], np.uint8)
        copy_into(destination, source, "encode", ledger)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def close(self) -> None:
        """Nothing to do: the mapping goes with the last view of it."""


def _non_negative(region: str, what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"region '{region}': {what} must be a non-negative integer")
    return value


class SharedMemoryRegistry:
    """Registered regions by name. Thread-safe; mapping happens at registration only. At most
    `max_regions` at once: each is a mapping of the server's, and a client that registered
    without end would exhaust the process's mappings (vm.max_map_count, 65,530 by
    default), which torch's and malloc's large allocations need too."""

    max_regions: ClassVar[int] = 4096

    def __init__(self, enabled: bool, required_prefix: str = "") -> None:
        self.enabled = enabled
        self._prefix = required_prefix
        self._regions: dict[str, _Region | CudaRegion] = {}
        self._lock = threading.Lock()

    def _check_enabled(self, kind: RegionKind = "system") -> None:
        if not self.enabled:
            raise UnavailableError(f"{kind} shared memory is disabled on this server; start it "
                                   "with --allow-shared-memory")

    @staticmethod
    def _check_name(name: object) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidArgumentError("a shared-memory region name must be 1-200 letters, "
                                       "digits, '_', '.' or '-'")

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        """Map the client's region `key` (a JSON body's values, unchecked until here)."""
        self._check_enabled()
        self._check_name(name)
        plain = key.lstrip("/") if isinstance(key, str) else ""
        if not isinstance(key, str) or not _KEY.match(key) or plain in (".", ".."):
            raise InvalidArgumentError(f"region '{name}': the key must be one plain name under "
                                       f"{_SHM_DIR} (letters, digits, '_', '.', '-'; one leading "
                                       "'/' at most)")
        if plain.lower().startswith(_RESERVED):  # what the key is stays unsaid
            raise InvalidArgumentError(
                f"region '{name}': the key is not allowed on this server: keys beginning "
                f"{', '.join(repr(r) for r in _RESERVED)} name servers' own regions; name "
                "yours otherwise")
        if self._prefix and not plain.startswith(self._prefix):
            raise InvalidArgumentError(f"region '{name}': the key is not allowed on this "
                                       f"server, which takes keys beginning '{self._prefix}'")
        start = _non_negative(name, "offset", offset)
        size = _non_negative(name, "byte_size", byte_size)
        if size == 0:
            raise InvalidArgumentError(f"region '{name}': byte_size must be above 0")
        with self._lock:
            self._check_free(name)
            memory = self._map(name, plain, start, size)
            self._regions[name] = _Region(name, key, start, size, memory)

    def register_cuda(self, name: str, raw_handle: object, device_id: object,
                      byte_size: object) -> None:
        """Open the client's CUDA memory from its IPC handle (`raw_handle`: the 64 bytes of a
        cudaIpcMemHandle_t) on GPU `device_id`; `byte_size` is checked against the
        allocation the handle names."""
        self._check_enabled("cuda")
        self._check_name(name)
        if not isinstance(raw_handle, bytes) or len(raw_handle) != HANDLE_BYTES:
            raise InvalidArgumentError(f"region '{name}': raw_handle must be the "
                                       f"{HANDLE_BYTES} bytes of a CUDA IPC memory handle")
        device = _non_negative(name, "device_id", device_id)
        size = _non_negative(name, "byte_size", byte_size)
        if size == 0:
            raise InvalidArgumentError(f"region '{name}': byte_size must be above 0")
        if not cuda_available():
            raise UnavailableError(f"cannot register CUDA shared-memory region '{name}': this "
                                   "server has no CUDA device; register a system "
                                   "shared-memory region, or send the tensors in the request")
        if device >= torch.cuda.device_count():
            raise InvalidArgumentError(f"region '{name}': device_id {device} is not a GPU of "
                                       f"this server (it has {torch.cuda.device_count()})")
        with self._lock:
            self._check_free(name)
            self._regions[name] = CudaRegion(name, raw_handle, device, size)

    def _check_free(self, name: str) -> None:
        if name in self._regions:
            raise AlreadyExistsError(f"shared-memory region '{name}' is already registered; "
                                     "unregister it first")
        if len(self._regions) >= self.max_regions:
            raise UnavailableError(f"cannot register shared-memory region '{name}': "
                                   f"{len(self._regions)} regions are registered, this server's "
                                   "limit; unregister regions no longer used")

    @staticmethod
    def _map(name: str, plain: str, offset: int, byte_size: int) -> memoryview:
        try:
            fd = os.open(os.path.join(_SHM_DIR, plain), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            # Say nothing about the key: an error must not confirm what exists under /dev/shm.
            raise InvalidArgumentError(f"region '{name}': the key cannot be opened") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidArgumentError(f"region '{name}': the key is not a shared-memory "
                                           "object")
            if offset + byte_size > info.st_size:
                raise InvalidArgumentError(f"region '{name}': offset {offset} + byte_size "
                                           f"{byte_size} exceeds the object's {info.st_size} "
                                           "bytes")
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            mapping = mmap.mmap(fd, offset + byte_size - start, offset=start)
        finally:
            os.close(fd)
        return memoryview(mapping)[offset - start:offset - start + byte_size]

    def unregister(self, name: str | None = None, kind: RegionKind = "system") -> None:
        """Forget `name` (every region of `kind` when None); a name not registered as `kind`
        is no error, as on Triton (clients clear regions they may not have made). In-flight
        views keep a system region's mapping alive; a CUDA region closes between copies."""
        self._check_enabled(kind)
        with self._lock:
            names = [name] if name is not None else [
                n for n, r in self._regions.items() if r.kind == kind]
            gone = [self._regions.pop(n) for n in names
                    if n in self._regions and self._regions[n].kind == kind]
        for region in gone:
            region.close()

    def status(self, name: str | None = None,
               kind: RegionKind = "system") -> list[dict[str, Any]]:
        """Triton's status entries of `kind`: a system region's key and offset, a CUDA
        region's device."""
        self._check_enabled(kind)
        with self._lock:
            regions = [r for r in self._regions.values()
                       if r.kind == kind and name in (None, r.name)]
        if name is not None and not regions:
            raise NotFoundError(f"{kind} shared-memory region '{name}' is not registered")
        return [r.status() for r in regions]

    def _find(self, region: str, offset: int, byte_size: int,
              tensor: str) -> _Region | CudaRegion:
        self._check_enabled()
        for what, value in (("shared_memory_offset", offset),
                            ("shared_memory_byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"tensor '{tensor}': {what} must be a non-negative "
                                           "integer")
        with self._lock:
            found = self._regions.get(region)
        if found is None:
            raise NotFoundError(f"tensor '{tensor}': shared-memory region '{region}' is not "
                                "registered")
        if offset + byte_size > found.byte_size:
            raise InvalidArgumentError(f"tensor '{tensor}': {byte_size} bytes at offset {offset} "
                                       f"run past the {found.byte_size}-byte region '{region}'")
        return found

    def input_view(self, region: str, offset: int, byte_size: int, dt: DataType,
                   shape: tuple[int, ...], tensor: str, ledger: CopyLedger) -> TensorView:
        """A view of the client's bytes in place (no copy); from a CUDA region, a view of
        their copy in host memory."""
        memory = self._find(region, offset, byte_size, tensor).read(offset, byte_size, ledger)
        return TensorView(memory, dt, shape, nbytes=byte_size, name=tensor, ledger=ledger)

    def write_output(self, region: str, offset: int, byte_size: int, view: TensorView,
                     ledger: CopyLedger) -> None:
        """Copy an output into the client's region (the model's own output write: counted)."""
        found = self._find(region, offset, byte_size, view.name)
        if view.nbytes > byte_size:
            raise InvalidArgumentError(f"output '{view.name}' needs {view.nbytes} bytes; its "
                                       f"shared-memory region '{region}' gives {byte_size}")
        found.write(offset, np.frombuffer(view.memoryview(), np.uint8, view.nbytes), ledger)
