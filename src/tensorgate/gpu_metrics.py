"""Triton's GPU metrics, read through NVML: `nv_gpu_utilization`, `nv_gpu_memory_total_bytes`,
`nv_gpu_memory_used_bytes`, `nv_gpu_power_usage`, `nv_gpu_power_limit` and
`nv_energy_consumption`, one sample per GPU labelled by its UUID (`gpu_uuid`), as Triton's.

Triton reads them through DCGM; NVML (`libnvidia-ml.so.1`) is what DCGM reads itself, and it
comes with the NVIDIA driver wherever a GPU is usable, so ctypes loads it and tensorgate gains
no dependency. Every GPU the driver shows is reported, as nvidia-smi and dcgm-exporter do.
The server samples every `--metrics-interval-ms` off its loop (`sample` runs in the default
executor; NVML's calls take about a millisecond) and keeps the last sample for scrapes.

A reading a board does not give (power on some, energy before Volta) is left out for that
GPU rather than written as 0; energy is counted from the sampler's start, in joules, as
Triton counts it from its own. Without NVML, or without a GPU, `GpuSampler()` raises
`NvmlError` saying which, and the server says so once and reports no nv_gpu_*.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, NamedTuple

__all__ = ["NVML_LIBRARY", "GpuSample", "GpuSampler", "NvmlError"]

log = logging.getLogger("tensorgate.metrics")

NVML_LIBRARY = "libnvidia-ml.so.1"
_SUCCESS, _NOT_SUPPORTED = 0, 3  # nvmlReturn_t
_UUID_BYTES = 96                 # NVML_DEVICE_UUID_V2_BUFFER_SIZE


class NvmlError(RuntimeError):
    """NVML cannot be used here: not installed, not initialised, or no GPU."""


class GpuSample(NamedTuple):
    uuid: str                        # "GPU-…", the label Triton's metrics carry
    utilization: float | None        # 0.0-1.0: the kernel-busy share of NVML's last period
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    power_watts: float | None
    power_limit_watts: float | None  # the power management limit
    energy_joules: float | None      # since the sampler's start


class _Utilization(ctypes.Structure):  # nvmlUtilization_t: percents over NVML's period
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):  # nvmlMemory_t: bytes
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def _load(library: str) -> Any:
    try:
        lib = ctypes.CDLL(library)
    except OSError as error:
        raise NvmlError(f"NVML is not installed ({error})") from None
    device = ctypes.c_void_p  # nvmlDevice_t: an opaque pointer
    uint_p = ctypes.POINTER(ctypes.c_uint)
    for name, argtypes in (
            ("nvmlInit_v2", []),
            ("nvmlDeviceGetCount_v2", [uint_p]),
            ("nvmlDeviceGetHandleByIndex_v2", [ctypes.c_uint, ctypes.POINTER(device)]),
            ("nvmlDeviceGetUUID", [device, ctypes.c_char_p, ctypes.c_uint]),
            ("nvmlDeviceGetUtilizationRates", [device, ctypes.POINTER(_Utilization)]),
            ("nvmlDeviceGetMemoryInfo", [device, ctypes.POINTER(_Memory)]),
            ("nvmlDeviceGetPowerUsage", [device, uint_p]),
            ("nvmlDeviceGetPowerManagementLimit", [device, uint_p]),
            ("nvmlDeviceGetTotalEnergyConsumption", [device,
                                                     ctypes.POINTER(ctypes.c_ulonglong)]),
            ("nvmlErrorString", [ctypes.c_int])):
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise NvmlError(f"{library} has no {name}: not NVML, or a driver too old "
                           "for these metrics") from None
        function.argtypes = argtypes
        function.restype = ctypes.c_char_p if name == "nvmlErrorString" else ctypes.c_int
    return lib


class GpuSampler:
    """Samples every GPU NVML shows; `last` is the latest sample (empty before the first)."""

    def __init__(self, library: str = NVML_LIBRARY) -> None:
        self._nvml = _load(library)
        self._check(self._nvml.nvmlInit_v2(), "nvmlInit_v2")
        count = ctypes.c_uint()
        self._check(self._nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)),
                    "nvmlDeviceGetCount_v2")
        if count.value == 0:
            raise NvmlError("NVML shows no GPU")
        self._devices: list[tuple[ctypes.c_void_p, str]] = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            self._check(self._nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)),
                        f"nvmlDeviceGetHandleByIndex_v2({index})")
            uuid = ctypes.create_string_buffer(_UUID_BYTES)
            self._check(self._nvml.nvmlDeviceGetUUID(handle, uuid, _UUID_BYTES),
                        f"nvmlDeviceGetUUID({index})")
            self._devices.append((handle, uuid.value.decode(errors="replace")))
        self._energy_start: dict[str, int] = {}  # millijoules at each GPU's first reading
        self._failed: set[tuple[str, str]] = set()  # (GPU, call) whose failure was logged
        self.last: tuple[GpuSample, ...] = ()

    @property
    def uuids(self) -> list[str]:
        return [uuid for _, uuid in self._devices]

    def _check(self, result: int, call: str) -> None:
        if result != _SUCCESS:
            raise NvmlError(f"{call} failed: {self._reason(result)}")

    def _reason(self, result: int) -> str:
        text = self._nvml.nvmlErrorString(result)
        return text.decode(errors="replace") if text else f"error {result}"

    def _read(self, uuid: str, call: str, *args: Any) -> bool:
        """One NVML reading into `args`; False where the GPU does not give it (quietly) or
        the call failed (said once per GPU and call)."""
        result = getattr(self._nvml, call)(*args)
        if result == _SUCCESS:
            return True
        if result != _NOT_SUPPORTED and (uuid, call) not in self._failed:
            self._failed.add((uuid, call))
            log.warning("GPU metrics: %s of %s failed: %s; left out", call, uuid,
                        self._reason(result))
        return False

    def sample(self) -> tuple[GpuSample, ...]:
        """Read every GPU once (blocking driver calls: not on the event loop)."""
        samples = []
        for handle, uuid in self._devices:
            busy, memory = _Utilization(), _Memory()
            power, limit = ctypes.c_uint(), ctypes.c_uint()
            energy = ctypes.c_ulonglong()
            has_busy = self._read(uuid, "nvmlDeviceGetUtilizationRates", handle,
                                  ctypes.byref(busy))
            has_memory = self._read(uuid, "nvmlDeviceGetMemoryInfo", handle,
                                    ctypes.byref(memory))
            has_power = self._read(uuid, "nvmlDeviceGetPowerUsage", handle, ctypes.byref(power))
            has_limit = self._read(uuid, "nvmlDeviceGetPowerManagementLimit", handle,
                                   ctypes.byref(limit))
            joules = None
            if self._read(uuid, "nvmlDeviceGetTotalEnergyConsumption", handle,
                          ctypes.byref(energy)):
                start = self._energy_start.setdefault(uuid, energy.value)
                joules = (energy.value - start) / 1000
            samples.append(GpuSample(
                uuid,
                busy.gpu / 100 if has_busy else None,
                memory.total if has_memory else None,
                memory.used if has_memory else None,
                power.value / 1000 if has_power else None,
                limit.value / 1000 if has_limit else None,
                joules))
        self.last = tuple(samples)
        return self.last
