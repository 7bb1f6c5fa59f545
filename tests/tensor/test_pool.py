"""The buffer pool: aligned, reused after release, never reused while any view lives."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch

from tensorgate.errors import PoolExhaustedError
from tensorgate.tensor import BufferPool, TensorView
from tensorgate.tensor.pinned import cuda_available
from tensorgate.tensor.pool import size_class


def test_size_classes_are_bounded_and_tight() -> None:
    assert size_class(0) == 64 and size_class(64) == 64 and size_class(65) == 128
    assert size_class(4096) == 4096 and size_class(4097) == 5120
    assert size_class(602_112) == 655_360
    for n in (1, 100, 3000):
        assert n <= size_class(n) < max(64, 2 * n) + 1
    for n in (5000, 602_112, 10**8):
        assert n <= size_class(n) <= n * 1.25
    classes = {size_class(n) for n in range(1, 1 << 22, 997)}
    assert len(classes) <= 12 + 4 * 10  # powers of two to 4 KiB, then four per octave


def test_buffers_are_aligned_and_sized(pool: BufferPool) -> None:
    for n in (1, 63, 64, 100, 4097, 602_112):
        buffer = pool.acquire(n)
        assert buffer.address % 64 == 0
        assert len(buffer) >= n and buffer.nbytes == size_class(n)


def test_release_returns_storage_for_reuse(pool: BufferPool) -> None:
    buffer = pool.acquire(1000)
    address = buffer.address
    del buffer
    again = pool.acquire(1000)
    assert again.address == address
    stats = pool.statistics()
    assert (stats.hits, stats.misses) == (1, 1)
    assert stats.bytes_in_use == 1024 and stats.bytes_idle == 0


def _views_of(buffer, kind: str) -> object:
    view = TensorView(buffer, "FP32", [16])
    if kind == "tensorview":
        return view
    if kind == "numpy":
        return view.numpy()[3:7]
    if kind == "torch":
        return view.torch()[2:]
    if kind == "dlpack":
        return torch.from_dlpack(view)
    if kind == "memoryview-slice":
        return memoryview(buffer)[8:16]
    if kind == "numpy-frombuffer":
        return np.frombuffer(buffer, np.uint8)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["tensorview", "numpy", "torch", "dlpack", "memoryview-slice",
                                  "numpy-frombuffer"])
def test_no_reuse_while_a_view_lives(pool: BufferPool, kind: str) -> None:
    buffer = pool.acquire(64)
    address = buffer.address
    survivor = _views_of(buffer, kind)
    del buffer
    gc.collect()
    # The pool must not hand the storage out while `survivor` can still read it.
    others = [pool.acquire(64) for _ in range(4)]
    assert address not in {o.address for o in others}
    del others
    del survivor
    gc.collect()
    reused = [pool.acquire(64) for _ in range(5)]
    assert address in {r.address for r in reused}


def test_writes_after_release_cannot_reach_a_living_view(pool: BufferPool) -> None:
    buffer = pool.acquire(64)
    tensor = TensorView(buffer, "INT32", [16]).torch()
    tensor[:] = 7
    del buffer
    for _ in range(3):
        other = pool.acquire(64)
        np.frombuffer(other, np.int32)[:] = -1
    assert tensor.tolist() == [7] * 16


def test_memory_bound_refuses_and_evicts_idle() -> None:
    pool = BufferPool(limit_bytes=4096)
    first = pool.acquire(2048)
    second = pool.acquire(2048)
    with pytest.raises(PoolExhaustedError, match=r"^host buffer pool is full: 64 more bytes "
                                                 r"wanted, 4096 in use of a 4096-byte limit"):
        pool.acquire(10)
    del first, second
    # Both 2 KiB buffers are idle now; a 4 KiB one fits only after evicting them.
    big = pool.acquire(4096)
    stats = pool.statistics()
    assert stats.evictions == 2 and stats.bytes_held == 4096 <= stats.limit_bytes
    assert big.address % 64 == 0


def test_trim_frees_idle(pool: BufferPool) -> None:
    buffers = [pool.acquire(5000) for _ in range(3)]
    del buffers
    assert pool.trim() == 3 * size_class(5000)
    assert pool.statistics().bytes_held == 0


def test_release_from_other_threads(pool: BufferPool) -> None:
    stop = threading.Event()
    handoff: list[object] = []
    lock = threading.Lock()

    def consumer() -> None:
        while not stop.is_set() or handoff:
            with lock:
                item = handoff.pop() if handoff else None
            del item  # the last reference dies on this thread

    thread = threading.Thread(target=consumer, name="test-releaser")
    thread.start()
    for _ in range(2000):
        buffer = pool.acquire(256)
        view = TensorView(buffer, "UINT8", [256]).torch()
        with lock:
            handoff.append(view)
        del buffer, view
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    stats = pool.statistics()
    assert stats.bytes_in_use == 0
    assert stats.hits + stats.misses == 2000
    # every buffer ever allocated came back, whichever thread dropped it
    assert stats.bytes_idle == stats.misses * size_class(256)


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_pinned_pool_gives_page_locked_aligned_buffers() -> None:
    pool = BufferPool(limit_bytes=16 << 20, pinned=True)
    buffer = pool.acquire(602_112)
    assert buffer.pinned and buffer.address % 64 == 0
    host = TensorView(buffer, "FP32", [1, 3, 224, 224]).torch()
    assert host.is_pinned()
    device = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(device.cpu(), host)


def test_idle_bytes_stay_under_their_own_bound() -> None:
    """A burst of many sizes must not stay resident: only `idle_limit_bytes` is kept."""
    pool = BufferPool(1 << 30, idle_limit_bytes=4 << 20)
    burst = [pool.acquire(n * 602_112) for n in range(1, 9)]  # batch gathers of 1…8
    del burst
    stats = pool.statistics()
    assert stats.bytes_in_use == 0 and 0 < stats.bytes_idle <= 4 << 20
    assert stats.evictions >= 1


def test_idle_bound_keeps_small_buffers_before_large_ones() -> None:
    pool = BufferPool(1 << 30, idle_limit_bytes=2 << 20)
    large, small = pool.acquire(1_500_000), pool.acquire(602_112)
    del large  # kept: it fits on its own
    assert pool.statistics().bytes_idle == size_class(1_500_000)
    del small  # the large idle buffer makes room for the small one
    assert pool.statistics().bytes_idle == size_class(602_112)
    again = pool.acquire(602_112)
    assert pool.statistics().hits == 1
    del again


def test_large_storage_is_unmapped_when_evicted() -> None:
    """Large storage is its own mapping: evicting it shrinks the process's mappings."""
    def mapped_kib() -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmSize"))

    pool = BufferPool(1 << 30, idle_limit_bytes=0)
    before = mapped_kib()
    buffer = pool.acquire(64 << 20)
    assert mapped_kib() - before >= 60 << 10
    del buffer
    assert pool.statistics().bytes_idle == 0
    assert mapped_kib() - before < 8 << 10


def test_trim_keeps_the_smallest_up_to_keep_bytes() -> None:
    pool = BufferPool(1 << 30, idle_limit_bytes=256 << 20)
    buffers = [pool.acquire(n) for n in (602_112, 602_112, 19_267_584, 38_535_168)]
    del buffers
    freed = pool.trim(keep_bytes=2 * size_class(602_112))
    assert freed == size_class(19_267_584) + size_class(38_535_168)
    assert pool.statistics().bytes_idle == 2 * size_class(602_112)
    again = pool.acquire(602_112)  # the batch-1 size is still pooled
    assert pool.statistics().hits == 1
    del again


def test_trim_if_quiet_waits_for_a_period_without_acquires() -> None:
    pool = BufferPool(1 << 30, idle_limit_bytes=256 << 20)
    pool.acquire(38_535_168)  # dropped at once: one staging-sized buffer, idle now
    held = pool.statistics().bytes_idle
    assert pool.trim_if_quiet(keep_bytes=0) == 0  # acquired since the (implicit) last check
    pool.acquire(1000)
    assert pool.trim_if_quiet(keep_bytes=0) == 0  # and again since the previous call
    assert pool.statistics().bytes_idle >= held
    assert pool.trim_if_quiet(keep_bytes=0) > 0   # a whole period with nothing acquired
    assert pool.statistics().bytes_idle == 0


def test_large_storage_is_a_private_mapping() -> None:
    """MAP_SHARED anonymous memory is shmem (its pages cost 1.7× private ones to fault in and
    free); the pool's large storage must be private."""
    from tensorgate.tensor.buffer import MAPPED_FROM, aligned_storage
    storage = aligned_storage(MAPPED_FROM * 4)
    address = storage.ctypes.data
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(v, 16) for v in span.split("-"))
            if start <= address < end:
                assert perms[3] == "p", line
                assert "/dev/zero" not in line and "SYSV" not in line, line
                break
        else:
            pytest.fail(f"no mapping holds {address:#x}")


def test_set_limit_bounds_what_is_held_from_then_on() -> None:
    pool = BufferPool(1 << 30, idle_limit_bytes=256 << 20)
    held = pool.acquire(3 << 20)
    idle = [pool.acquire(1 << 20) for _ in range(2)]
    del idle  # two idle MiB
    pool.set_limit(4 << 20)  # 3 MiB in use + 2 idle > 4: one idle MiB goes
    assert pool.statistics().bytes_idle == 1 << 20
    with pytest.raises(PoolExhaustedError, match=r"of a 4194304-byte limit; retry later or "
                                                 r"raise the pool limit \(--host-pool-bytes\)$"):
        pool.acquire((1 << 20) + 1)  # a 1.25 MiB class: 4.25 MiB in use would pass the bound
    del held
    again = pool.acquire(4 << 20)  # fits once the first is back
    assert again.nbytes == 4 << 20
    with pytest.raises(ValueError, match=r"^limit_bytes must be positive, got 0$"):
        pool.set_limit(0)
