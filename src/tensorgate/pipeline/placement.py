"""Which CPUs the event loop and each executor thread run on.

Measured on the 2-core machine (bench/RESULTS.md, "thread hand-off"): a loop → thread → loop
round trip costs 21 µs when both threads share a core and 67 µs when they sit on different
cores and the worker does 10 µs of Python work — cross-core wake-ups are expensive on these
VMs. So with placement "auto" the loop keeps the first core; an executor whose batch-1
forward is light (under LIGHT_FORWARD_NS, i.e. overhead-bound) moves onto the loop's core
after warm-up, and heavier ones run on the remaining cores, where torch's intra-op threads
are sized to fit. A heavy model left to the defaults (no instance_group, no cpu_affinity)
also gets a spare instance on the loop's core that shares its weights and runs only when the
first instance is busy and the loop leaves most of its core idle (loop_load.py): under load
the loop's core otherwise idles (ResNet-50 on 2 cores, 14 → 25 requests/s, bench/RESULTS.md;
sequential latency unchanged, since one request at a time always finds the first instance
free). The spare runs on the time the loop leaves idle (SCHED_IDLE: idle_time.py). A heavy
model whose instance_group asks for two instances or more has its last one placed so too
(engine.py). A model's `cpu_affinity` parameter overrides all of this.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from tensorgate.pipeline.cpu_quota import usable_cpus

__all__ = ["LIGHT_FORWARD_NS", "Placement", "pin_current_thread", "plan_placement", "thread_cpus",
           "unpin_current_thread"]

LIGHT_FORWARD_NS = 500_000
_before_pin = threading.local()  # .cpus: a pinned thread's affinity before its first pin


@dataclass(frozen=True)
class Placement:
    loop_cpus: frozenset[int]
    compute_cpus: frozenset[int]
    # torch's intra-op threads for an executor on compute_cpus: one a CPU, fewer where a
    # container's CPU quota allows fewer CPUs than the affinity names (cpu_quota.py)
    compute_threads: int

    @property
    def shared(self) -> bool:
        """Everything on the loop's cores (a quota of one CPU): no spare instances."""
        return self.compute_cpus == self.loop_cpus


def plan_placement(mode: str) -> Placement | None:
    """A placement for `mode` "auto" on a Linux machine with two or more CPUs. Where a
    container's CPU quota allows one CPU or less, the loop and every executor share the
    first core (`shared`): threads spread over the others would spend the quota in
    parallel and be throttled together (bench/quota_bench.py)."""
    if mode == "none" or not hasattr(os, "sched_getaffinity"):
        return None
    if mode != "auto":
        raise ValueError(f"placement must be 'auto' or 'none', got {mode!r}")
    cpus = thread_cpus()
    if len(cpus) < 2:
        return None
    usable = usable_cpus(len(cpus))
    if usable < 2:
        return Placement(frozenset(cpus[:1]), frozenset(cpus[:1]), 1)
    return Placement(frozenset(cpus[:1]), frozenset(cpus[1:]), usable - 1)


def thread_cpus() -> list[int]:
    """The calling thread's CPUs, in order, as they were before pin_current_thread pinned
    it: what a placement divides and torch's threads count. The engine pins the thread that
    starts it (the loop's) to one CPU; an engine made there later, or one made after the
    first has shut down and unpinned it, still sees every CPU. A thread narrowed by other
    means (os.sched_setaffinity, taskset) is taken as narrowed."""
    if not hasattr(os, "sched_getaffinity"):
        return list(range(os.cpu_count() or 1))
    return sorted(getattr(_before_pin, "cpus", None) or os.sched_getaffinity(0))


def pin_current_thread(cpus: frozenset[int]) -> None:
    """Restrict the calling thread (not the process) to `cpus`; threads it starts inherit it.
    Its affinity before the first pin is kept for thread_cpus and unpin_current_thread."""
    if getattr(_before_pin, "cpus", None) is None:
        _before_pin.cpus = frozenset(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus)


def unpin_current_thread() -> None:
    """Give the calling thread back the affinity it had before pin_current_thread."""
    cpus = getattr(_before_pin, "cpus", None)
    if cpus is not None:
        _before_pin.cpus = None
        os.sched_setaffinity(0, cpus)
