"""A bounded pool of aligned host buffers, reused only after their last view is gone.

`acquire(n)` hands out a `HostBuffer` of at least `n` bytes from a size class. The pool keeps
a weak reference to it; when the buffer and every view made of it are gone, the storage
returns to the idle list of its class. Release needs no call and cannot come early.

Size classes: powers of two up to 4 KiB, then four per octave (so at most 25 % is wasted),
which also keeps the number of exporter types bounded whatever sizes clients send.

Two bounds: `limit_bytes` on everything held (in use and idle: the memory bound that turns
into UNAVAILABLE), and `idle_limit_bytes` on what is kept for reuse. Without the second, the
idle lists of every size a burst touched (batch gathers of 2…64 requests) filled the whole
1 GiB bound and stayed resident: tensorgate's RSS went from 434 MB to 1,454 MB after 64
concurrent identity clients (bench/compare.py). When a returned buffer does not fit, larger
idle buffers go first (batch-1 sizes are the hot path), else the returned one is freed.

The idle bound must still hold what a busy server reuses: a freed buffer comes back as fresh
pages, and faulting those in costs ten times the copy that fills them (18 ms against 1.9 ms
for 40 MB). With 64 MB kept, batch staging buffers were freed and re-made for every batch,
and identity at 64 connections ran at 1,534 requests/s instead of 3,252 (bench/RESULTS.md).
So the default keeps 256 MB while busy, and `trim_if_quiet`, called on a period by the
server, gives the excess back once traffic stops.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tensorgate.errors import PoolExhaustedError
from tensorgate.tensor.buffer import HostBuffer, aligned_storage, exporter_type, wrap_storage
from tensorgate.tensor.pinned import cuda_available, pinned_storage

__all__ = ["BUSY_IDLE_BYTES", "BufferPool", "PoolStatistics", "QUIET_IDLE_BYTES", "default_pool",
           "size_class"]

_MIN_CLASS = 64
_POW2_UNTIL_BITS = 12  # 4 KiB


def size_class(nbytes: int) -> int:
    """The capacity of the class that holds `nbytes`."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    bits = (nbytes - 1).bit_length()
    if bits <= _POW2_UNTIL_BITS:
        return 1 << bits
    step = 1 << (bits - 3)  # a quarter of the octave [2**(bits-1), 2**bits)
    return -(-nbytes // step) * step


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """Counters since the pool was made, and the bytes it holds now."""

    hits: int
    misses: int
    evictions: int
    bytes_in_use: int
    bytes_idle: int
    limit_bytes: int
    pinned: bool
    idle_limit_bytes: int

    @property
    def bytes_held(self) -> int:
        return self.bytes_in_use + self.bytes_idle


class BufferPool:
    """Aligned (or pinned) host buffers in size classes, within `limit_bytes` held in all.

    Thread-safe: buffers may be acquired on one thread and die on another. A dying buffer
    only appends to a deque (no lock), so release from a GC pass inside `acquire` is safe.
    """

    def __init__(self, limit_bytes: int = 1 << 30, *, idle_limit_bytes: int = 64 << 20,
                 pinned: bool = False) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
        if idle_limit_bytes < 0:
            raise ValueError(f"idle_limit_bytes must not be negative, got {idle_limit_bytes}")
        self._limit = limit_bytes
        self._idle_wanted = idle_limit_bytes
        self._idle_limit = min(idle_limit_bytes, limit_bytes)
        self._pinned = pinned
        self._allocate: Callable[[int], np.ndarray] = pinned_storage if pinned else aligned_storage
        self._lock = threading.Lock()
        self._idle: dict[int, list[np.ndarray]] = {}
        # id(weakref) → (the weakref, kept alive so its callback fires; capacity; storage).
        # Keyed by id because a weakref hashes its referent, and ctypes arrays cannot hash.
        self._live: dict[int, tuple[weakref.ref[HostBuffer], int, np.ndarray]] = {}
        self._returned: deque[tuple[int, np.ndarray]] = deque()
        self._in_use = 0
        self._idle_bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._acquired_at_check = 0

    def acquire(self, nbytes: int) -> HostBuffer:
        """A buffer of at least `nbytes`; raises PoolExhaustedError at the memory bound."""
        if nbytes < 0:
            raise ValueError(f"cannot acquire {nbytes} bytes")
        capacity = size_class(nbytes)
        storage = None
        with self._lock:
            if self._returned:
                self._drain()
            free = self._idle.get(capacity)
            if free:
                storage = free.pop()
                if not free:
                    del self._idle[capacity]
                self._idle_bytes -= capacity
                self._hits += 1
            else:
                self._misses += 1
                self._make_room(capacity)
            self._in_use += capacity
        if storage is None:
            try:
                storage = self._allocate(capacity)
                buffer = wrap_storage(storage, pinned=self._pinned)  # checks its alignment
            except BaseException:
                with self._lock:
                    self._in_use -= capacity
                raise
        else:  # storage this pool made, checked then: a new exporter over it, nothing more
            buffer = exporter_type(capacity, self._pinned).from_buffer(storage)
        ref = weakref.ref(buffer, self._on_release)
        self._live[id(ref)] = (ref, capacity, storage)
        return buffer

    def statistics(self) -> PoolStatistics:
        with self._lock:
            self._drain()
            return PoolStatistics(self._hits, self._misses, self._evictions, self._in_use,
                                  self._idle_bytes, self._limit, self._pinned, self._idle_limit)

    def set_limit(self, limit_bytes: int) -> None:
        """A new bound on everything held (the server's --host-pool-bytes). Buffers in use
        stay theirs; idle ones beyond the new bound are freed."""
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
        with self._lock:
            self._limit = limit_bytes
            self._idle_limit = min(self._idle_wanted, limit_bytes)
            self._drain()
            while self._idle and (self._idle_bytes > self._idle_limit
                                  or self._in_use + self._idle_bytes > limit_bytes):
                self._evict(max(self._idle))

    def trim(self, keep_bytes: int = 0) -> int:
        """Free idle buffers, largest first, until at most `keep_bytes` stay idle; returns the
        bytes freed."""
        with self._lock:
            self._drain()
            before = self._idle_bytes
            while self._idle_bytes > keep_bytes:
                self._evict(max(self._idle))
            return before - self._idle_bytes

    def trim_if_quiet(self, keep_bytes: int) -> int:
        """`trim(keep_bytes)` when nothing was acquired since the previous call, else nothing.

        Called on a period, a burst keeps every buffer it reuses, and the memory goes back
        one to two periods after the last request."""
        acquired = self._hits + self._misses
        quiet = acquired == self._acquired_at_check
        self._acquired_at_check = acquired
        return self.trim(keep_bytes) if quiet else 0

    def _on_release(self, ref: weakref.ref[HostBuffer]) -> None:
        # Runs on whichever thread dropped the last reference, possibly inside `acquire`.
        _, capacity, storage = self._live.pop(id(ref))
        self._returned.append((capacity, storage))

    def _drain(self) -> None:
        while self._returned:
            capacity, storage = self._returned.popleft()
            self._in_use -= capacity
            while self._idle_bytes + capacity > self._idle_limit and self._idle \
                    and max(self._idle) > capacity:
                self._evict(max(self._idle))
            if self._idle_bytes + capacity > self._idle_limit:
                self._evictions += 1  # dropping the last reference frees (unmaps) it
                continue
            self._idle.setdefault(capacity, []).append(storage)
            self._idle_bytes += capacity

    def _evict(self, capacity: int) -> None:
        self._idle[capacity].pop()
        if not self._idle[capacity]:
            del self._idle[capacity]
        self._idle_bytes -= capacity
        self._evictions += 1

    def _make_room(self, capacity: int) -> None:
        if self._in_use + capacity > self._limit:
            raise PoolExhaustedError(capacity, self._in_use, self._limit)
        while self._in_use + self._idle_bytes + capacity > self._limit:
            self._evict(max(self._idle))  # lists in _idle are never empty


_default: BufferPool | None = None
_default_lock = threading.Lock()


BUSY_IDLE_BYTES = 256 << 20  # what the default unpinned pool keeps idle while serving
QUIET_IDLE_BYTES = 64 << 20  # and what it keeps once traffic has stopped


def default_pool() -> BufferPool:
    """The process's host pool: pinned when CUDA is available, 1 GiB bound.

    Unpinned, it keeps up to BUSY_IDLE_BYTES idle while busy and QUIET_IDLE_BYTES once quiet
    (the server calls `trim_if_quiet`). A pinned pool keeps everything it may (idle bound = the
    whole bound, never trimmed): page-locking and freeing are slow and may synchronize the
    device, so churn costs far more than memory. Not yet measured on a GPU.
    """
    global _default
    with _default_lock:
        if _default is None:
            pinned = cuda_available()
            _default = BufferPool(pinned=pinned, idle_limit_bytes=(1 << 30) if pinned else BUSY_IDLE_BYTES)
        return _default
