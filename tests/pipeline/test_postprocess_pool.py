"""The post-processing pool's threads are the engine's, whichever executor submits first."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time

import pytest

from tensorgate.pipeline import idle_time
from tensorgate.pipeline.postprocess_pool import PostprocessPool


def _where_it_runs(pool: PostprocessPool) -> tuple[set[int], int]:
    """The CPUs and scheduling policy of the pool thread that runs a task."""
    seen: list[tuple[set[int], int]] = []
    ran = threading.Event()

    def task() -> None:
        seen.append((os.sched_getaffinity(0), os.sched_getscheduler(0)))
        ran.set()

    pool.submit(task)
    assert ran.wait(10.0), "the pool did not run a task"
    return seen[0]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two or more usable CPUs")
def test_a_thread_pinned_and_lowered_that_submits_first_does_not_make_the_pools_threads(
        ) -> None:
    """As a spare does (pinned to the loop's core, at SCHED_IDLE where allowed): the task
    runs on a thread with the maker's CPUs and policy, not the submitter's."""
    maker = (os.sched_getaffinity(0), os.sched_getscheduler(0))
    pool = PostprocessPool(2)
    lowered = idle_time._may_lower_and_raise()
    found: list[tuple[set[int], int]] = []

    def spare_like() -> None:
        os.sched_setaffinity(0, {min(maker[0])})
        if lowered:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        found.extend(_where_it_runs(pool) for _ in range(4))  # (either thread, in turn)

    submitter = threading.Thread(target=spare_like)
    submitter.start()
    submitter.join(30.0)
    pool.shutdown()
    assert found == [maker] * 4


def test_a_task_that_raises_is_logged_and_the_thread_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    pool = PostprocessPool(1)

    def fails() -> None:
        raise RuntimeError("a post-processor's bug")

    with caplog.at_level(logging.ERROR, logger="tensorgate.engine"):
        pool.submit(fails)
        _where_it_runs(pool)  # run after it, by the pool's one thread
    pool.shutdown()
    assert "post-processing by" in caplog.text and "a post-processor's bug" in caplog.text


def test_shutdown_runs_what_was_submitted_then_ends_the_threads() -> None:
    pool = PostprocessPool(2)
    gate = threading.Event()
    ran: list[int] = []
    pool.submit(gate.wait, 10.0)
    for number in range(5):
        pool.submit(ran.append, number)
    pool.shutdown()
    gate.set()
    for thread in pool._threads:
        thread.join(10.0)
        assert not thread.is_alive()
    assert sorted(ran) == list(range(5))


def test_a_pool_dropped_without_shutdown_ends_its_threads() -> None:
    """An engine made and never started (a test's, a failed start's) leaves no threads."""
    pool = PostprocessPool(2)
    threads = list(pool._threads)
    del pool
    gc.collect()
    for thread in threads:
        thread.join(10.0)
        assert not thread.is_alive()


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="needs a thread, not 0"):
        PostprocessPool(0)


def test_tasks_from_many_threads_each_run_once_and_the_threads_end_with_their_descriptors(
        ) -> None:
    """Four threads submit 5,000 tasks each to three pool threads, which sleep and wake
    between bursts: every task runs once (a wake-up lost would leave some waiting); once
    shut down, the pool's threads end and their descriptors are closed."""
    before = len(os.listdir("/proc/self/fd"))
    pool = PostprocessPool(3)
    ran: list[tuple[int, int]] = []
    lock = threading.Lock()

    def task(submitter: int, number: int) -> None:
        with lock:
            ran.append((submitter, number))

    def submit(submitter: int) -> None:
        for number in range(5000):
            pool.submit(task, submitter, number)
            if number % 250 == 0:
                time.sleep(0.001)  # the pool's threads go idle now and then

    submitters = [threading.Thread(target=submit, args=(n,)) for n in range(4)]
    for thread in submitters:
        thread.start()
    for thread in submitters:
        thread.join(30.0)
    for _ in range(1000):  # (bounded: 10 s)
        if len(ran) == 20_000:
            break
        time.sleep(0.01)
    assert sorted(ran) == [(s, n) for s in range(4) for n in range(5000)]
    pool.shutdown()
    for thread in pool._threads:
        thread.join(10.0)
        assert not thread.is_alive()
    assert len(os.listdir("/proc/self/fd")) <= before
