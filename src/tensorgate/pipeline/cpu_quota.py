"""How many CPUs this process may use: its affinity, narrowed by its cgroup's CPU quota.

A container with a CPU limit (Kubernetes' `resources.limits.cpu`, `docker run --cpus`) sees
every core of its node in `os.cpu_count()` and in its affinity; the limit is a quota of CPU
time per period in its cgroup. Threads sized to the node's cores then share the quota and
are throttled together: the kernel stops them all for the rest of each period once the
quota is spent, a tail-latency cliff. So torch's intra-op threads and the placement
(pipeline/placement.py) count the CPUs the quota allows, rounded up, as Go (1.25's
GOMAXPROCS) and the JVM do. cgroup v2's `cpu.max` and v1's `cpu.cfs_quota_us` /
`cpu.cfs_period_us` are read along the process's cgroup path up to the hierarchy's root,
the least quota winning (a parent's limit binds its children).
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable

__all__ = ["cgroup_cpu_limit", "usable_cpus"]

_CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def usable_cpus(affinity: int) -> int:
    """The CPUs a thread allowed `affinity` CPUs may keep busy at once: at most its cgroup
    quota's CPUs rounded up; at least 1. (The affinity is placement.thread_cpus()'s: the
    engine pins its loop's thread, whose own affinity would then say one.)"""
    count = affinity
    limit = cgroup_cpu_limit()
    if limit is not None:
        count = min(count, math.ceil(limit))
    return max(1, count)


def cgroup_cpu_limit(proc_cgroup: str | None = None,
                     root: pathlib.Path = _CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (quota / period), or None where none
    is set or none can be read. `proc_cgroup`: /proc/self/cgroup's text (read if None);
    `root`: where the hierarchies are mounted."""
    if proc_cgroup is None:
        try:
            proc_cgroup = pathlib.Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    limits = []
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":  # cgroup v2 (the unified hierarchy)
            for mount in (root, root / "unified"):
                if (mount / "cgroup.controllers").exists():
                    limits.append(_least(mount, path, _v2_limit))
                    break
        elif "cpu" in controllers.split(","):  # cgroup v1's cpu controller
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                mount = root / name
                if (mount / "cpu.cfs_quota_us").exists():
                    limits.append(_least(mount, path, _v1_limit))
                    break
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _least(mount: pathlib.Path, path: str,
           read: Callable[[pathlib.Path], float | None]) -> float | None:
    """The least limit `read` finds from the cgroup at `path` up to `mount`'s root. Inside
    a container the process's path may name its host's hierarchy while the mount shows the
    container's own cgroup at its root: the root is read either way."""
    folder = mount / path.strip("/") if path.strip("/") else mount
    found = []
    while True:
        limit = read(folder)
        if limit is not None:
            found.append(limit)
        if folder == mount or mount not in folder.parents:
            break
        folder = folder.parent
    return min(found) if found else None


def _v2_limit(folder: pathlib.Path) -> float | None:
    try:
        quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not period:
        return None
    return _ratio(quota, period)


def _v1_limit(folder: pathlib.Path) -> float | None:
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # v1's -1: no quota
