"""Latency summaries: quantiles over a sliding window, Triton's `--metrics-config
summary_latencies=true` (nv_inference_*_summary_us).

Triton estimates them with CKMS streams (rank error per quantile). Here each duration goes
to a log-linear bucket of a small dict: a dict update on the loop per stage, the same for
P50 and P99.9, and the quantile read at scrape time is the true rank's value to within
half a bucket, under 0.4 % of it (exact below 256 µs). The window is prometheus-cpp's
default: the last 60 s, as five 12 s slices dropped whole as they age."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

__all__ = ["DEFAULT_QUANTILES", "LatencySummaries", "parse_quantiles"]

# Triton's default quantiles and their CKMS errors (the errors are checked, not needed here)
DEFAULT_QUANTILES = "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001"
WINDOW_S = 60.0
SLICES = 5
_MANTISSA_BITS = 8  # a bucket spans 1/128..1/256 of its values: half of it is under 0.4 %


def parse_quantiles(text: str) -> tuple[float, ...]:
    """`q:error,...` (Triton's summary_quantiles) → the quantiles, sorted; each q and
    error must lie in (0, 1)."""
    quantiles = []
    for item in text.split(","):
        quantile, colon, error = item.strip().partition(":")
        try:
            q, e = float(quantile), float(error)
        except ValueError:
            raise ValueError(f"summary_quantiles '{text}': '{item.strip()}' is not "
                             "QUANTILE:ERROR (0.99:0.001)") from None
        if not (colon and 0 < q < 1 and 0 < e < 1):
            raise ValueError(f"summary_quantiles '{text}': '{item.strip()}' needs a quantile "
                             "and an error each between 0 and 1")
        quantiles.append(q)
    return tuple(sorted(set(quantiles)))


def _bucket(us: int) -> int:
    """A key that orders as the durations do; durations below 2**_MANTISSA_BITS µs are
    their own key, above it the top _MANTISSA_BITS bits and the shift make it."""
    shift = us.bit_length() - _MANTISSA_BITS
    if shift <= 0:
        return us
    return (shift << _MANTISSA_BITS) + (us >> shift)


def _value(key: int) -> float:
    """The middle of a key's bucket, in µs."""
    shift = key >> _MANTISSA_BITS
    if shift == 0:
        return float(key)
    mantissa = key & ((1 << _MANTISSA_BITS) - 1)
    return (mantissa << shift) + ((1 << shift) - 1) / 2


class LatencySummaries:
    """One model version's summaries of `stages` (in the order `observe` takes them):
    counts per bucket in each time slice, and an all-time count and sum (µs) per stage, as
    Prometheus summaries have. Updated and read on the event loop only."""

    __slots__ = ("stages", "_clock", "_slice_s", "_slices", "_turn_at", "_count", "_sum_us")

    def __init__(self, stages: Sequence[str], window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stages = tuple(stages)
        self._clock = clock
        self._slice_s = window_s / SLICES
        # oldest first; each slice holds, per stage, bucket key → count
        self._slices = [self._empty() for _ in range(SLICES)]
        self._turn_at = clock() + self._slice_s
        self._count = [0] * len(self.stages)
        self._sum_us = [0] * len(self.stages)

    def _empty(self) -> list[dict[int, int]]:
        return [{} for _ in self.stages]

    def observe(self, *durations_ns: int) -> None:
        """One request's durations (ns) of the first stages, in order: a failed request
        or a cached answer gives fewer than a computed one."""
        now = self._clock()
        if now >= self._turn_at:
            self._turn(now)
        current = self._slices[-1]
        for at, ns in enumerate(durations_ns):
            us = ns // 1000
            counts = current[at]
            key = _bucket(us)
            counts[key] = counts.get(key, 0) + 1
            self._count[at] += 1
            self._sum_us[at] += us

    def _turn(self, now: float) -> None:
        """Drop the slices that aged out of the window, empty ones after the newest."""
        aged = min(SLICES, int((now - self._turn_at) // self._slice_s) + 1)
        del self._slices[:aged]
        self._slices += [self._empty() for _ in range(aged)]
        self._turn_at += aged * self._slice_s
        if self._turn_at <= now:  # idle for longer than the window: start from now
            self._turn_at = now + self._slice_s

    def read(self, stage: str, quantiles: Sequence[float]
             ) -> tuple[list[float], int, int]:
        """The stage's value (µs) at each quantile over the window (NaN when the window
        saw none), and its all-time count and sum (µs)."""
        now = self._clock()
        if now >= self._turn_at:
            self._turn(now)
        at = self.stages.index(stage)
        merged: dict[int, int] = {}
        for window_slice in self._slices:
            for key, count in window_slice[at].items():
                merged[key] = merged.get(key, 0) + count
        total = sum(merged.values())
        values = [math.nan] * len(quantiles)
        if total:
            ranks = sorted((max(1, math.ceil(q * total - 1e-9)), index)  # nearest rank
                           for index, q in enumerate(quantiles))
            seen = 0
            next_rank = 0
            for key in sorted(merged):
                seen += merged[key]
                while next_rank < len(ranks) and ranks[next_rank][0] <= seen:
                    values[ranks[next_rank][1]] = _value(key)
                    next_rank += 1
        return values, self._count[at], self._sum_us[at]
