"""Triton's CPU metrics from /proc text: busy and total jiffies, memory total and used, and
utilization between two samples; a host without /proc reports none."""

from __future__ import annotations

import pathlib

import pytest

from tensorgate.config import ServerConfig
from tensorgate.host_metrics import HostSampler, cpu_times, memory

STAT = """cpu  100 5 50 800 20 3 2 0 7 0
cpu0 50 2 25 400 10 1 1 0 0 0
intr 12345
"""
MEMINFO = """MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:   12288000 kB
"""


def test_proc_text_is_read_as_triton_reads_it() -> None:
    # busy: user nice system irq softirq steal; idle and iowait are not; guest is in user
    assert cpu_times(STAT) == (160, 980)
    assert memory(MEMINFO) == (16384000 * 1024, 4096000 * 1024)
    with pytest.raises(ValueError, match="no 'cpu' line"):
        cpu_times("intr 1\n")
    with pytest.raises(ValueError, match="no MemTotal or MemAvailable"):
        memory("MemFree: 1 kB\n")


def _write(folder: pathlib.Path, busy: int, idle: int) -> None:
    (folder / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n")
    (folder / "meminfo").write_text(MEMINFO)


def test_utilization_is_the_busy_share_between_two_samples(tmp_path: pathlib.Path) -> None:
    sampler = HostSampler(str(tmp_path))
    _write(tmp_path, busy=100, idle=900)
    first = sampler.sample()
    assert first is not None and first.cpu_utilization == 0.0  # nothing to compare with yet
    _write(tmp_path, busy=175, idle=925)  # 75 of the 100 jiffies since were busy
    assert sampler.sample() == sampler.last
    assert sampler.last is not None and sampler.last.cpu_utilization == 0.75
    assert sampler.last.memory_used_bytes == 4096000 * 1024


def test_a_host_without_proc_reports_none(tmp_path: pathlib.Path) -> None:
    sampler = HostSampler(str(tmp_path / "missing"))
    assert sampler.sample() is None and sampler.last is None


def test_the_metrics_flags_as_tritons() -> None:
    config = ServerConfig.from_mapping({"allow_metrics": "false", "allow_cpu_metrics": "0",
                                        "metrics_interval_ms": "500"})
    assert (config.allow_metrics, config.allow_cpu_metrics, config.allow_gpu_metrics,
            config.metrics_interval_ms) == (False, False, True, 500)
    with pytest.raises(ValueError, match="^metrics_interval_ms must be 1 or more, got 0$"):
        ServerConfig(metrics_interval_ms=0)
    with pytest.raises(ValueError, match="setting 'allow_metrics' expects bool, got 'maybe'"):
        ServerConfig.from_mapping({"allow_metrics": "maybe"})
