"""Triton's GPU metrics through NVML (tensorgate/gpu_metrics.py): the Prometheus text written
from a sample, and the ctypes calls themselves, against a library built here from nvml.h's
declarations of the calls used. This machine has no GPU driver: that library checks argument
and structure layouts and how failures are taken, not the driver; the server against the real
NVML is tests/e2e/test_gpu_metrics.py, run on the GPU device by bench/gpu_check.sh.
"""

from __future__ import annotations

import ctypes
import logging
import pathlib
import re
import shutil
import subprocess

import pytest

from tensorgate.gpu_metrics import NVML_LIBRARY, GpuSample, GpuSampler, NvmlError
from tensorgate.metrics import render_metrics


def nvml_present() -> bool:
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return False
    return True


def test_a_sample_is_written_with_tritons_names_and_a_missing_reading_left_out() -> None:
    text = render_metrics([], gpus=(
        GpuSample("GPU-0a", 0.25, 80 << 30, 3 << 30, 123.5, 700.0, 42.0),
        GpuSample("GPU-1b", 0.0, 80 << 30, 0, None, None, None)))
    assert "# TYPE nv_gpu_utilization gauge" in text
    assert "# TYPE nv_energy_consumption counter" in text
    assert 'nv_gpu_utilization{gpu_uuid="GPU-0a"} 0.25\n' in text
    assert f'nv_gpu_memory_total_bytes{{gpu_uuid="GPU-0a"}} {80 << 30}\n' in text
    assert f'nv_gpu_memory_used_bytes{{gpu_uuid="GPU-0a"}} {3 << 30}\n' in text
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-0a"} 123.5\n' in text
    assert 'nv_gpu_power_limit{gpu_uuid="GPU-0a"} 700.0\n' in text
    assert 'nv_energy_consumption{gpu_uuid="GPU-0a"} 42.0\n' in text
    assert 'nv_gpu_memory_used_bytes{gpu_uuid="GPU-1b"} 0\n' in text
    assert re.search(r'^nv_(gpu_power_\w+|energy_consumption)\{gpu_uuid="GPU-1b"\}', text,
                     re.M) is None
    assert "nv_gpu" not in render_metrics([])


# The calls gpu_metrics makes, declared as nvml.h declares them; two GPUs: the first gives
# every reading (energy rising 2.5 J a call), the second has no power readings
# (NVML_ERROR_NOT_SUPPORTED) and its energy call fails (NVML_ERROR_UNKNOWN).
_NVML_ABI = r"""
#include <stdio.h>
#include <string.h>
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st { int index; } *nvmlDevice_t;
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; }
    nvmlMemory_t;
static struct nvmlDevice_st devices[2] = {{0}, {1}};
static int initialised = 0;
static unsigned long long energy = 5000000ULL;
static int known(nvmlDevice_t d) { return initialised && (d == &devices[0] || d == &devices[1]); }
nvmlReturn_t nvmlInit_v2(void) { initialised = 1; return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { *count = 2; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index > 1) return 2;
    *device = &devices[index]; return 0;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    if (!known(d)) return 2;
    if (length < 80) return 7;
    snprintf(uuid, length, "GPU-%08d-abi", d->index); return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!known(d)) return 2;
    u->gpu = 37 + d->index; u->memory = 11; return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!known(d)) return 2;
    m->total = 150754820096ULL; m->free = 150754820096ULL - 1073741824ULL - d->index;
    m->used = 1073741824ULL + d->index; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (!known(d)) return 2;
    if (d->index == 1) return 3;
    *mw = 123456; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *mw) {
    if (!known(d)) return 2;
    if (d->index == 1) return 3;
    *mw = 700000; return 0;
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    if (!known(d)) return 2;
    if (d->index == 1) return 999;
    energy += 2500; *mj = energy; return 0;
}
const char *nvmlErrorString(nvmlReturn_t result) {
    return result == 999 ? "Unknown Error" : "some error";
}
"""


@pytest.fixture(scope="module")
def nvml_abi(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler to build the NVML-ABI library")
    folder = tmp_path_factory.mktemp("nvml")
    (folder / "nvml_abi.c").write_text(_NVML_ABI)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(folder / "libnvml_abi.so"),
                    str(folder / "nvml_abi.c")], check=True, capture_output=True)
    return folder / "libnvml_abi.so"


def test_the_sampler_reads_each_gpu_through_nvmls_calls(
        nvml_abi: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    sampler = GpuSampler(str(nvml_abi))
    assert sampler.uuids == ["GPU-00000000-abi", "GPU-00000001-abi"]
    assert sampler.last == ()
    with caplog.at_level(logging.WARNING, logger="tensorgate.metrics"):
        first = sampler.sample()
        second = sampler.sample()
    assert first[0] == GpuSample("GPU-00000000-abi", 0.37, 150754820096, 1073741824,
                                 123.456, 700.0, 0.0)
    assert second[0].energy_joules == 2.5  # since the sampler's first reading
    # no power readings (not supported) and a failed energy call: left out, not zero
    assert second[1] == GpuSample("GPU-00000001-abi", 0.38, 150754820096, 1073741825,
                                  None, None, None)
    assert sampler.last is second
    failures = [r.getMessage() for r in caplog.records]
    assert failures == ["GPU metrics: nvmlDeviceGetTotalEnergyConsumption of GPU-00000001-abi "
                        "failed: Unknown Error; left out"]  # once, and only for the failure


def test_a_library_that_is_not_nvml_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    (tmp_path / "other.c").write_text("int nvmlInit_v2(void) { return 0; }\n")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(tmp_path / "libother.so"),
                    str(tmp_path / "other.c")], check=True, capture_output=True)
    with pytest.raises(NvmlError, match=r"^.*libother\.so has no nvmlDeviceGetCount_v2: not "
                                        r"NVML, or a driver too old for these metrics$"):
        GpuSampler(str(tmp_path / "libother.so"))


@pytest.mark.skipif(nvml_present(), reason="this machine has NVML")
def test_without_nvml_the_sampler_says_so() -> None:
    with pytest.raises(NvmlError, match=r"^NVML is not installed \(libnvidia-ml\.so\.1: "):
        GpuSampler()
