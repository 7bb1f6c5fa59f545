"""Host buffers whose data starts on a 64-byte boundary, and whose lifetime views can see.

A `HostBuffer` is a ctypes byte array laid over storage we allocated. It is the object that
exports the buffer protocol, so every memoryview, numpy array and torch tensor made from it
holds a reference to it (directly or through a memoryview's managed buffer). That is what
lets a pool learn, with a weak reference, that the last view of a buffer is gone — and makes
handing the storage out again while a view lives impossible rather than merely unlikely.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from typing import TYPE_CHECKING, Any

import numpy as np

__all__ = ["ALIGNMENT", "HostBuffer", "aligned_storage", "allocate", "exporter_type",
           "host_array", "wrap_storage"]

ALIGNMENT = 64


class HostBuffer:
    """Mixin of every buffer exporter type; `len()` is its capacity in bytes."""

    __slots__ = ()
    pinned: bool = False

    @property
    def address(self) -> int:
        """Address of the first byte (a multiple of ALIGNMENT)."""
        return ctypes.addressof(self)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        return ctypes.sizeof(self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        kind = "pinned " if self.pinned else ""
        return f"<{kind}HostBuffer {self.nbytes} bytes at {self.address:#x}>"

    if TYPE_CHECKING:  # every instance is also a ctypes array, which exports its bytes
        def __buffer__(self, flags: int, /) -> memoryview: ...


def host_array(buffer: HostBuffer, dtype: Any, count: int = -1) -> np.ndarray:
    """`count` items of `dtype` over `buffer`, no copy (numpy's stubs know no buffer
    protocol, only the types that have one built in)."""
    array: np.ndarray = np.frombuffer(buffer, dtype, count)  # type: ignore[call-overload]
    return array


@functools.lru_cache(maxsize=None)
def exporter_type(capacity: int, pinned: bool) -> type[Any]:
    """The HostBuffer type of `capacity` bytes (pinned or not), made once."""
    # ctypes caches every array type it makes, so capacities must come from a bounded set:
    # the pool's size classes, never a client-chosen length.
    base = ctypes.c_uint8 * capacity
    name = f"{'Pinned' if pinned else ''}HostBuffer{capacity}"
    return type(name, (HostBuffer, base), {"pinned": pinned})


MAPPED_FROM = 128 * 1024  # storage at least this large is its own anonymous mapping


def aligned_storage(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """A writable 1-D uint8 array of `nbytes` whose data address is a multiple of `alignment`.

    Large storage is an anonymous mmap (page-aligned), so freeing it gives the pages back to
    the kernel at once; from malloc, glibc's sliding mmap threshold would move such sizes into
    the heap after the first free, where fragmentation keeps them resident. The mapping is
    private: Python's default for `mmap(-1, n)` is MAP_SHARED, which the kernel backs with
    shmem, and faulting in and freeing shmem pages cost 1.7× private ones (30 vs 18 ms for
    40 MB filled once, fresh).
    """
    if nbytes >= MAPPED_FROM and mmap.PAGESIZE % alignment == 0:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return np.frombuffer(mapping, dtype=np.uint8)
    raw = np.empty(nbytes + alignment - 1, dtype=np.uint8)
    shift = (-raw.ctypes.data) % alignment
    return raw[shift:shift + nbytes]


def wrap_storage(storage: np.ndarray, *, pinned: bool = False) -> HostBuffer:
    """A new exporter over all of `storage` (1-D uint8, aligned, capacity from a bounded set)."""
    if storage.ctypes.data % ALIGNMENT:
        raise ValueError(f"storage at {storage.ctypes.data:#x} is not {ALIGNMENT}-byte aligned")
    exporter: HostBuffer = exporter_type(storage.nbytes, pinned).from_buffer(storage)
    return exporter


def allocate(capacity: int) -> HostBuffer:
    """An unpooled aligned buffer; prefer `BufferPool.acquire` on any request path."""
    return wrap_storage(aligned_storage(capacity))
