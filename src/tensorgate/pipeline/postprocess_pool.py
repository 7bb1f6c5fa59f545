"""The threads that post-process batches (NMS, top-k, decoding) off the executors' threads.

Its threads start with the pool, on the thread that makes it (the engine's, before the loop's
thread is pinned), and not on first use: a thread takes its maker's CPUs and scheduling
policy, and a pool that made its threads on first use (concurrent.futures' does) made them
on whichever executor post-processed first. A heavy model's spare (placement.py) runs pinned
to the loop's core at SCHED_IDLE (idle_time.py), and a pool thread it made then ran the
batches it took, the first instance's too, only while the loop's core was idle: never raised
back, a batch it took waited for as long as the loop stayed busy
(tests/pipeline/test_postprocess_pool.py).

Where the engine divides the CPUs (placement.py), the threads run on the models' CPUs, not the
loop's: post-processing is the models' work, and the loop's core is kept for the network. (A
light post-processor does not show it: resnet50's top 5 beside identity at 8 connections,
`bench/spare_bench.py --heavy-postprocess topk`, served the same with the pool on the models'
core or free, within the machine's noise; bench/RESULTS.md.)

A task wakes one idle thread through a descriptor of that thread's own, written with the GIL
let go (pipeline/handoff.py's WakeFd), not a queue.SimpleQueue: its put, made by an
executor that holds the GIL, woke a thread that found the GIL taken and slept again
(bench/RESULTS.md, "The post-processing pool woken as the executors are").
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from tensorgate.pipeline.handoff import WakeFd

__all__ = ["PostprocessPool"]

log = logging.getLogger("tensorgate.engine")

_Task = tuple[Callable[..., None], tuple[Any, ...]]


class _Tasks:
    """What is submitted, in order, and the threads waiting for it (most recent last)."""

    def __init__(self) -> None:
        self.pending: deque[_Task | None] = deque()
        self.idle: list[WakeFd] = []  # the waiting threads' descriptors

    def put(self, task: _Task | None) -> None:
        self.pending.append(task)
        try:
            waiting = self.idle.pop()
        except IndexError:  # every thread is busy: each looks at `pending` before it waits
            return
        waiting.wake()


class PostprocessPool:
    """Threads for CPU post-processing: torch and numpy drop the GIL, so they run beside the
    executors. What is submitted runs in order of submission, on whichever thread is free.
    Its threads hold its tasks, not the pool: a pool dropped without shutdown (an engine
    made and never started) ends them as it goes."""

    def __init__(self, workers: int = 2, cpus: frozenset[int] | None = None) -> None:
        """`cpus`: where its threads run (the placement's compute CPUs), else the maker's."""
        if workers < 1:
            raise ValueError(f"a post-processing pool needs a thread, not {workers}")
        self._tasks = _Tasks()
        self._threads = [threading.Thread(target=_work, args=(self._tasks,),
                                          name=f"tg-postprocess_{i}", daemon=True)
                         for i in range(workers)]
        self._ending = weakref.finalize(self, _end, self._tasks, workers)  # (once, either way)
        for thread in self._threads:
            thread.start()  # (its native_id known once this returns)
            if cpus is not None and thread.native_id is not None:
                try:
                    os.sched_setaffinity(thread.native_id, cpus)
                except OSError as error:  # (they were the maker's a moment ago)
                    log.warning("post-processing runs on any of the CPUs: %s", error)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` on a pool thread. It reports its own result: one that raises is
        logged, and the thread goes on to the next."""
        self._tasks.put((fn, args))

    def shutdown(self) -> None:
        """Let the threads end once what was submitted before has run; returns at once."""
        self._ending()


def _end(tasks: _Tasks, threads: int) -> None:
    for _ in range(threads):
        tasks.put(None)


def _work(tasks: _Tasks) -> None:
    waker = WakeFd()
    try:
        _take(tasks, waker)
    finally:
        waker.close()


def _take(tasks: _Tasks, waker: WakeFd) -> None:
    pending, idle = tasks.pending, tasks.idle
    while True:
        try:
            task = pending.popleft()
        except IndexError:
            idle.append(waker)
            if pending:  # put between the look and the append: it may have found no one
                try:
                    idle.remove(waker)
                except ValueError:  # it found this thread: its wake-up is spent on nothing
                    pass
                continue
            waker.wait()
            continue
        if task is None:
            return
        fn, args = task
        del task
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - one task's failure must not end the thread
            log.exception("post-processing by %s failed", getattr(fn, "__qualname__", fn))
        del fn, args  # not held while waiting for the next: its buffers go back
