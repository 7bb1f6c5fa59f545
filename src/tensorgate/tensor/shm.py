"""Triton's system shared-memory extension: client regions mapped once, read and written in
place.

Security (each from a Triton CVE fix, see PROTOCOL.md §2.7): off unless the server is started
with --allow-shared-memory; keys are confined to one plain name under /dev/shm (at most one
leading "/", no other "/", no reserved prefix, an optional required prefix), opened with
O_NOFOLLOW and checked to be regular files; offset and size are bounds-checked at
registration and on every request; keys never appear in error messages (only region names).

Lifetime is structural: a registered region is one `mmap`; inputs are views of it, which hold
buffer exports on it, and CPython cannot unmap an exported mmap. Unregistering only drops the
registry's reference, so a region in use by an in-flight request is unmapped when the last
view of it is gone — never under a request.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgate.errors import (AlreadyExistsError, InvalidArgumentError, NotFoundError,
                               UnavailableError)
from tensorgate.tensor.copies import CopyLedger, copy_into
from tensorgate.tensor.dtypes import DataType
from tensorgate.tensor.view import TensorView

__all__ = ["SharedMemoryRegistry"]

_SHM_DIR = "/dev/shm"
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,200}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
# Internal prefixes that a client must never be able to name (ours, and Triton's Python
# backend's, whose leak-then-register chain was CVE-2025-23319/23320/23334).
_RESERVED = ("tensorgate", "triton_python_backend", "tritonpy")


@dataclass(frozen=True)
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: memoryview  # [offset, offset + byte_size) of the mapping


def _non_negative(region: str, what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"region '{region}': {what} must be a non-negative integer")
    return value


class SharedMemoryRegistry:
    """Registered regions by name. Thread-safe; mapping happens at registration only."""

    def __init__(self, enabled: bool, required_prefix: str = "") -> None:
        self.enabled = enabled
        self._prefix = required_prefix
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise UnavailableError("system shared memory is disabled on this server; start it "
                                   "with --allow-shared-memory")

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        """Map the client's region `key` (a JSON body's values, unchecked until here)."""
        self._check_enabled()
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidArgumentError("a shared-memory region name must be 1-200 letters, "
                                       "digits, '_', '.' or '-'")
        plain = key.lstrip("/") if isinstance(key, str) else ""
        if not isinstance(key, str) or not _KEY.match(key) or plain in (".", ".."):
            raise InvalidArgumentError(f"region '{name}': the key must be one plain name under "
                                       f"{_SHM_DIR} (letters, digits, '_', '.', '-'; one leading "
                                       "'/' at most)")
        if plain.lower().startswith(_RESERVED) or (self._prefix and
                                                   not plain.startswith(self._prefix)):
            raise InvalidArgumentError(f"region '{name}': the key is not allowed on this server")
        start = _non_negative(name, "offset", offset)
        size = _non_negative(name, "byte_size", byte_size)
        if size == 0:
            raise InvalidArgumentError(f"region '{name}': byte_size must be above 0")
        with self._lock:
            if name in self._regions:
                raise AlreadyExistsError(f"shared-memory region '{name}' is already registered; "
                                         "unregister it first")
            memory = self._map(name, plain, start, size)
            self._regions[name] = _Region(name, key, start, size, memory)

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

    def unregister(self, name: str | None = None) -> None:
        """Forget `name` (all regions when None). In-flight views keep their mapping alive."""
        self._check_enabled()
        with self._lock:
            if name is None:
                self._regions.clear()
            elif self._regions.pop(name, None) is None:
                raise NotFoundError(f"shared-memory region '{name}' is not registered")

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        self._check_enabled()
        with self._lock:
            if name is not None and name not in self._regions:
                raise NotFoundError(f"shared-memory region '{name}' is not registered")
            regions = [self._regions[name]] if name is not None else list(self._regions.values())
        return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for r in regions]

    def _slice(self, region: str, offset: int, byte_size: int, tensor: str) -> memoryview:
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
        return found.memory[offset:offset + byte_size]

    def input_view(self, region: str, offset: int, byte_size: int, dt: DataType,
                   shape: tuple[int, ...], tensor: str, ledger: CopyLedger) -> TensorView:
        """A view of the client's bytes in place (no copy)."""
        memory = self._slice(region, offset, byte_size, tensor)
        return TensorView(memory, dt, shape, nbytes=byte_size, name=tensor, ledger=ledger)

    def write_output(self, region: str, offset: int, byte_size: int, view: TensorView,
                     ledger: CopyLedger) -> None:
        """Copy an output into the client's region (the model's own output write: counted)."""
        memory = self._slice(region, offset, byte_size, view.name)
        if view.nbytes > byte_size:
            raise InvalidArgumentError(f"output '{view.name}' needs {view.nbytes} bytes; its "
                                       f"shared-memory region '{region}' gives {byte_size}")
        destination = np.frombuffer(memory, np.uint8, view.nbytes)
        source = np.frombuffer(view.memoryview(), np.uint8, view.nbytes)
        copy_into(destination, source, "encode", ledger)
