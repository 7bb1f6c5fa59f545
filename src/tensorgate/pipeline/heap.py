"""Give the C heap's free memory back to the operating system when an executor goes idle,
and when it stops (its model's weights freed: without it, ~8 reloads of the built-in
resnet50 left the server at 736 MB, 473 with it; bench/reload_stall_bench.py).

torch's CPU tensors are glibc mallocs. After a large batch (ResNet-50 at batch 14–64 on CPU)
glibc keeps the freed activations in the executor thread's arena, so the process stays at
its burst size: on 2 cores, with a spare instance, RSS was 981 MB after a 16-connection
burst without the trim and 461 MB 3 s after it with the trim (bench/RESULTS.md). Trimming
takes 3–30 ms and makes the next large batch fault its pages in again, so it runs only
after the executor has been idle for a while, never between batches under load.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable

__all__ = ["IDLE_TRIM_S", "heap_trimmer"]

IDLE_TRIM_S = 1.0  # idle this long after a batch of more than one row, then trim


@functools.cache
def heap_trimmer() -> Callable[[], None] | None:
    """glibc's `malloc_trim(0)`, or None where there is no glibc (macOS, musl). Found once a
    process: ctypes.util.find_library runs `ldconfig -p` in a child process each call, and
    every executor thread asks as it starts."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)
    return release
