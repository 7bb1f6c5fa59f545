"""Triton's CPU metrics: the host's CPU utilization since the last sample, and its memory
total and used, read from /proc (Linux only, as in Triton) every `--metrics-interval-ms`.

`nv_cpu_utilization` is the share of all cores' time that was busy between two samples
(/proc/stat's first line: everything but idle and iowait); `nv_cpu_memory_used_bytes` is
MemTotal less MemAvailable (/proc/meminfo), the memory the kernel could not hand out
without swapping. The server reads them off its loop (`sample` runs in the default
executor) and keeps the last sample for scrapes; a host without /proc reports none.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

__all__ = ["HostSample", "HostSampler", "cpu_times", "memory"]

log = logging.getLogger("tensorgate.metrics")


class HostSample(NamedTuple):
    cpu_utilization: float  # 0.0-1.0, all cores, since the previous sample
    memory_total_bytes: int
    memory_used_bytes: int


def cpu_times(stat: str) -> tuple[int, int]:
    """(busy, total) jiffies of all cores from /proc/stat's text."""
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(field) for field in fields[1:]]
            # user nice system idle iowait irq softirq steal [guest guest_nice]: guest
            # time is counted in user and nice already
            counted = values[:8]
            idle = sum(counted[3:5])
            return sum(counted) - idle, sum(counted)
    raise ValueError("/proc/stat has no 'cpu' line")


def memory(meminfo: str) -> tuple[int, int]:
    """(total, used) bytes from /proc/meminfo's text: used is MemTotal - MemAvailable."""
    found: dict[str, int] = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            found[name] = int(rest.split()[0]) * 1024  # kB
    if "MemTotal" not in found or "MemAvailable" not in found:
        raise ValueError("/proc/meminfo has no MemTotal or MemAvailable")
    return found["MemTotal"], found["MemTotal"] - found["MemAvailable"]


class HostSampler:
    """Samples the host's CPU and memory; `last` is the latest (None before the first, or
    when /proc cannot be read)."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._previous: tuple[int, int] | None = None
        self.last: HostSample | None = None
        self._failed = False

    def sample(self) -> HostSample | None:
        """Read /proc once (file reads: not on the event loop)."""
        try:
            with open(f"{self._proc}/stat") as stat, open(f"{self._proc}/meminfo") as info:
                busy, total = cpu_times(stat.read())
                memory_total, memory_used = memory(info.read())
        except (OSError, ValueError) as error:
            if not self._failed:
                log.warning("CPU metrics are not reported: %s", error)
                self._failed = True
            return None
        utilization = 0.0
        if self._previous is not None and total > self._previous[1]:
            utilization = (busy - self._previous[0]) / (total - self._previous[1])
        self._previous = (busy, total)
        self.last = HostSample(min(1.0, max(0.0, utilization)), memory_total, memory_used)
        return self.last
