"""pipeline/cpu_quota.py: a container's CPU quota, read from cgroup v2 and v1 trees laid out
as the kernel lays them out, narrows the CPUs torch's threads and the placement count."""

from __future__ import annotations

import os
import pathlib

import pytest

from tensorgate.pipeline import cpu_quota, placement
from tensorgate.pipeline.cpu_quota import cgroup_cpu_limit
from tensorgate.pipeline.executor import default_intra_op_threads


def _v2(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_cgroup_v2_quota_of_the_process_cgroup(tmp_path: pathlib.Path) -> None:
    root = _v2(tmp_path, {"cpu.max": "max 100000\n",
                          "kubepods/pod1/c1/cpu.max": "250000 100000\n"})
    assert cgroup_cpu_limit("0::/kubepods/pod1/c1\n", root) == 2.5


def test_a_parents_quota_binds_its_children_and_max_is_no_quota(
        tmp_path: pathlib.Path) -> None:
    root = _v2(tmp_path, {"pod/cpu.max": "50000 100000\n", "pod/c1/cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit("0::/pod/c1\n", root) == 0.5
    root = _v2(tmp_path / "free", {"cpu.max": "max 100000\n", "c1/cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit("0::/c1\n", root) is None


def test_inside_a_container_its_own_cgroup_is_the_mounts_root(tmp_path: pathlib.Path) -> None:
    """/proc/self/cgroup may name the host's path while the mount shows the container's
    cgroup at its root (no cgroup namespace): the root's quota is read."""
    root = _v2(tmp_path, {"cpu.max": "200000 100000\n"})
    assert cgroup_cpu_limit("0::/kubepods/burstable/pod9/abc\n", root) == 2.0


def test_cgroup_v1_cpu_controller(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("150000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    text = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    assert cgroup_cpu_limit(text, tmp_path) == 1.5
    (folder / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "no quota"
    assert cgroup_cpu_limit(text, tmp_path) is None


def test_nothing_readable_is_no_quota(tmp_path: pathlib.Path) -> None:
    assert cgroup_cpu_limit("0::/\n", tmp_path) is None
    assert cgroup_cpu_limit("", tmp_path) is None
    root = _v2(tmp_path / "bad", {"cpu.max": "lots 100000\n"})
    assert cgroup_cpu_limit("0::/\n", root) is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux's affinity")
@pytest.mark.parametrize("quota, usable", [(None, None), (0.5, 1), (1.0, 1), (1.2, 2)])
def test_threads_and_placement_count_the_quotas_cpus(
        monkeypatch: pytest.MonkeyPatch, quota: float | None, usable: int | None) -> None:
    """Rounded up (1.2 CPUs: 2 threads may each get 0.6), never above the affinity's; a
    quota of a CPU or less puts the loop and the executors on one core, one thread."""
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(cpu_quota, "cgroup_cpu_limit", lambda: quota)
    expected = len(cpus) if usable is None else min(len(cpus), usable)
    assert cpu_quota.usable_cpus(len(cpus)) == expected
    assert default_intra_op_threads() == max(1, expected - 1)
    planned = placement.plan_placement("auto")
    if len(cpus) < 2:
        assert planned is None
    elif expected < 2:
        assert planned is not None and planned.shared and planned.compute_threads == 1
        assert planned.loop_cpus == planned.compute_cpus == {cpus[0]}
    else:
        assert planned is not None and not planned.shared
        assert planned.compute_threads == expected - 1


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux's affinity")
def test_a_thread_pinned_later_does_not_narrow_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine pins the loop's thread to its core: the threads and the placement of an
    engine made there afterwards still count the thread's CPUs as they were (the pinned
    affinity says one: the threads were 1 and the placement none, and bench/engine_bench.py's
    floor, placed so, ran on the loop's core), and unpinning gives them back. A thread
    narrowed by other means counts as narrowed."""
    monkeypatch.setattr(cpu_quota, "cgroup_cpu_limit", lambda: None)
    cpus = os.sched_getaffinity(0)
    threads = default_intra_op_threads()
    planned = placement.plan_placement("auto")
    try:
        placement.pin_current_thread(frozenset({min(cpus)}))
        assert os.sched_getaffinity(0) == {min(cpus)}
        assert placement.thread_cpus() == sorted(cpus)
        assert default_intra_op_threads() == threads
        assert placement.plan_placement("auto") == planned
        placement.unpin_current_thread()
        assert os.sched_getaffinity(0) == cpus
        os.sched_setaffinity(0, {min(cpus)})
        assert placement.thread_cpus() == [min(cpus)]
        assert default_intra_op_threads() == 1 and placement.plan_placement("auto") is None
    finally:
        placement.unpin_current_thread()
        os.sched_setaffinity(0, cpus)
