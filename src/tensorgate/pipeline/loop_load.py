"""How busy the event loop's thread is: the share of one core it used over the last window.

A spare instance runs on the loop's core (placement.py) and takes batches only while the
model's other instances are busy. Beside a light model that keeps the loop busy, that took
the core from the loop: on 2 cores, identity at 8 connections served 1,800 requests/s
beside resnet50 at 4 without resnet50's spare and 1,260 with it, its P99 6.8 → 12.1 ms
(bench/RESULTS.md). So a spare is given a batch only while the loop leaves most of its core
idle. Read on the loop's thread only (`time.thread_time` is the calling thread's).
"""

from __future__ import annotations

import time

__all__ = ["LoopLoad", "SPARE_LOOP_SHARE"]

SPARE_LOOP_SHARE = 0.25  # a spare runs only while the loop used less of its core than this
_WINDOW_S = 0.1


class LoopLoad:
    """The loop thread's CPU share over the last window of at least `window_s`."""

    def __init__(self, window_s: float = _WINDOW_S) -> None:
        self._window_s = window_s
        self._at: float | None = None
        self._cpu = 0.0
        self._share = 0.0

    def share(self) -> float:
        """The last whole window's share (0.0 until one has passed)."""
        now = time.monotonic()
        if self._at is None or now - self._at >= self._window_s:
            cpu = time.thread_time()  # (a system call: only once a window)
            if self._at is not None:
                self._share = (cpu - self._cpu) / (now - self._at)
            self._at, self._cpu = now, cpu
        return self._share

    def leaves_room(self) -> bool:
        """Whether a spare on the loop's core may take a batch now."""
        return self.share() < SPARE_LOOP_SHARE
