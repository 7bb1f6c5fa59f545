"""A spare on the loop's core runs on the time the loop leaves idle, and is raised back to a
normal thread when a batch overruns.

A spare instance (engine.py) shares the loop's core, and takes a batch only while the loop
leaves most of that core idle (loop_load.py). Once it has one, at the default priority the
kernel splits the core between them: a light model's request that arrives while the spare
runs a 75 ms ResNet-50 forward waits for the loop's share of it. At SCHED_IDLE the spare runs
only while its core has nothing else to run, and the loop takes the core back the moment it
wakes: on 2 cores, identity paced at 100 requests/s beside resnet50 at 16 connections had a
P99 of 10.0 / 7.9 ms beside the spare (2.6 / 1.8 without one) and has 3.5 / 1.6 now, in two
runs of `bench/spare_bench.py --light-rate 100 --heavy-connections 16` (bench/RESULTS.md),
resnet50's rate unchanged. SCHED_IDLE alone starved a batch the spare had taken behind a loop
that then stayed busy (resnet50's P99 beside identity at 8 connections 474 → 1,056 ms,
bench/RESULTS.md, fortieth session), so a spare whose batch is not finished RAISE_AFTER times
its expected time after it was handed over (not even begun, it may be: a starved thread has
not taken it) is raised back to a normal thread, and its next batch starts lowered again; a
spare told to stop is raised for good.

Linux lets an unprivileged thread lower itself to SCHED_IDLE but not come back (sched(7):
only within RLIMIT_NICE, 0 by default, or with CAP_SYS_NICE); where a probe finds the way
back refused, the spare keeps the default priority, as before this module.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Callable

__all__ = ["IdleTime", "RAISE_AFTER", "lowered_to_idle_time"]

log = logging.getLogger("tensorgate.engine")

RAISE_AFTER = 1.5  # a batch not finished this many times its expected time on is raised
_LEAST_WAIT_S = 0.005  # (a spare's batch-1 forward is at least 0.5 ms: placement.py)


class IdleTime:
    """The loop's side of a spare thread at SCHED_IDLE: lowered before each batch, raised
    once a batch overruns. Called on the loop only."""

    __slots__ = ("_thread_id", "_loop", "_raised", "_for_good", "_handed", "raises")

    def __init__(self, thread_id: int, loop: asyncio.AbstractEventLoop) -> None:
        """The thread is at SCHED_IDLE already."""
        self._thread_id = thread_id
        self._loop = loop
        self._raised = False
        self._for_good = False  # told to stop: not lowered again
        self._handed = 0  # batches handed over so far (the thread runs them in order)
        self.raises = 0  # batches that overran and were raised (statistics, tests)

    def batch_handed(self, expected_ns: int, finished: Callable[[], int]) -> None:
        """A batch goes to the thread, expected to take `expected_ns` alone; `finished()`
        counts the batches the thread has finished, in the order they were handed over (one
        not even begun is not: a starved thread may not have taken it yet). Given each time,
        not kept: it is the executor's, which holds this object (a cycle otherwise)."""
        if self._raised and not self._for_good and _set_policy(self._thread_id,
                                                                os.SCHED_IDLE):
            self._raised = False
        self._handed += 1
        wait_s = max(_LEAST_WAIT_S, RAISE_AFTER * expected_ns / 1e9)
        self._loop.call_later(wait_s, self._raise_if_unfinished, self._handed, finished)

    @property
    def raised(self) -> bool:
        """Whether the thread runs as a normal thread now."""
        return self._raised

    def raise_now(self) -> None:
        """Raise the thread for good, as it is told to stop: its unload must not wait for
        a loop that stays busy."""
        self._for_good = True
        if not self._raised:
            self._raised = _set_policy(self._thread_id, os.SCHED_OTHER)

    def _raise_if_unfinished(self, number: int, finished: Callable[[], int]) -> None:
        """Raise the thread if the batch handed over `number`-th is not finished yet."""
        if finished() < number and not self._raised:
            self._raised = _set_policy(self._thread_id, os.SCHED_OTHER)
            self.raises += self._raised


def lowered_to_idle_time(loop: asyncio.AbstractEventLoop) -> IdleTime | None:
    """Put the calling thread at SCHED_IDLE, where it may be raised back later: its IdleTime,
    or None (the thread left as it was) where either is refused or the system has none."""
    if not _may_lower_and_raise():
        return None
    thread_id = threading.get_native_id()
    if not _set_policy(thread_id, os.SCHED_IDLE):
        return None
    return IdleTime(thread_id, loop)


@functools.cache
def _may_lower_and_raise() -> bool:
    """Whether a thread of this process may go to SCHED_IDLE and back: tried once, on a
    thread that does nothing else."""
    if not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_setscheduler"):
        return False
    result: list[bool] = []

    def probe() -> None:
        me = threading.get_native_id()
        result.append(_set_policy(me, os.SCHED_IDLE) and _set_policy(me, os.SCHED_OTHER))

    thread = threading.Thread(target=probe, name="tg-idle-time-probe", daemon=True)
    thread.start()
    thread.join()
    if not result[0]:
        log.info("a spare on the loop's core keeps the default priority: this process may "
                 "not raise a thread back from SCHED_IDLE (needs CAP_SYS_NICE or "
                 "RLIMIT_NICE 20)")
    return result[0]


def _set_policy(thread_id: int, policy: int) -> bool:
    try:
        os.sched_setscheduler(thread_id, policy, os.sched_param(0))
    except OSError:
        return False
    return True
