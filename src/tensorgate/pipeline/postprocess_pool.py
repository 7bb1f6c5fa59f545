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
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["PostprocessPool"]

log = logging.getLogger("tensorgate.engine")

_Task = tuple[Callable[..., None], tuple[Any, ...]]


class PostprocessPool:
    """Threads for CPU post-processing: torch and numpy drop the GIL, so they run beside the
    executors. What is submitted runs in order of submission, on whichever thread is free.
    Its threads hold its queue, not the pool: a pool dropped without shutdown (an engine
    made and never started) ends them as it goes."""

    def __init__(self, workers: int = 2, cpus: frozenset[int] | None = None) -> None:
        """`cpus`: where its threads run (the placement's compute CPUs), else the maker's."""
        if workers < 1:
            raise ValueError(f"a post-processing pool needs a thread, not {workers}")
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
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


def _end(tasks: queue.SimpleQueue[_Task | None], threads: int) -> None:
    for _ in range(threads):
        tasks.put(None)


def _work(tasks: queue.SimpleQueue[_Task | None]) -> None:
    while True:
        task = tasks.get()
        if task is None:
            return
        fn, args = task
        del task
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - one task's failure must not end the thread
            log.exception("post-processing by %s failed", getattr(fn, "__qualname__", fn))
        del fn, args  # not held while waiting for the next: its buffers go back
