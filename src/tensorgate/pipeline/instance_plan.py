"""Where a version's instances run, decided as it loads: each instance group's devices,
the file they load (cc_model_filenames), each instance's rate-limiter claim, whether the
instances run one copy of the model, and whether a heavy CPU model gets a spare instance on
the event loop's cores.

Pure decisions over the config, the server's placement and what the first instance measured;
the engine starts the threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import torch

from tensorgate.pipeline.executor import ExecutorThread
from tensorgate.pipeline.executor_settings import ExecutorSettings
from tensorgate.pipeline.placement import LIGHT_FORWARD_NS, Placement
from tensorgate.pipeline.rate_limiter import Claim, RateLimiter
from tensorgate.repository.model_config import ModelConfigError, ModelSpec
from tensorgate.tensor.pinned import cuda_available

__all__ = ["SPARE_SLOWDOWN", "capability", "group_devices", "loop_cores_help",
           "model_filename", "on_loop_cores", "passive_instances", "rate_claims",
           "release_claims", "setup_text", "shares_weights", "wants_spare"]

SPARE_SLOWDOWN = 1.5


def group_devices(spec: ModelSpec, device: str) -> list[list[torch.device]]:
    """Each instance group's instances' devices (one group of one when none is given);
    `device` is the server's --device ("auto", "cpu", "cuda", "cuda:N")."""
    groups = spec.instance_groups or ()
    if not groups:
        return [[_auto_device(device)]]
    devices = []
    for group in groups:
        if group.kind == "KIND_CPU" or device == "cpu":
            devices.append([torch.device("cpu")] * group.count)
        elif group.kind == "KIND_GPU":
            if not cuda_available():
                raise ModelConfigError(spec.name, "instance_group kind KIND_GPU, but no CUDA "
                                                  "device is available; use KIND_CPU or "
                                                  "KIND_AUTO")
            gpus = group.gpus or tuple(range(torch.cuda.device_count()))
            devices.append([torch.device("cuda", g) for g in gpus
                            for _ in range(group.count)])
        else:
            devices.append([_auto_device(device)] * group.count)
    return devices


def passive_instances(spec: ModelSpec, by_group: list[list[torch.device]]) -> set[int]:
    """The instances of passive groups (instance_group passive: true), by index: loaded as
    Triton loads them (its backend's instance initialised; no warm-up, no rate limiter
    claim, no thread that runs requests), never given a request."""
    passive: set[int] = set()
    first = 0
    for group, devices in zip(spec.instance_groups or (None,), by_group):
        if group is not None and group.passive:
            passive.update(range(first, first + len(devices)))
        first += len(devices)
    return passive


def capability(device: torch.device) -> str:
    """A GPU's CUDA compute capability as Triton writes it ("9.0"); "" for a CPU."""
    if device.type != "cuda":
        return ""
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def model_filename(spec: ModelSpec, devices: Sequence[torch.device],
                   capability_of: Callable[[torch.device], str] = capability) -> str:
    """The file cc_model_filenames names for the compute capability of these instances'
    GPUs, as Triton chooses a GPU instance's file; "" for the default (a CPU instance's,
    and a GPU's the map does not name). A version loads one file for all its instances, so
    instances that would choose different files are refused, naming them."""
    if not spec.cc_model_filenames:
        return ""
    by_capability = dict(spec.cc_model_filenames)
    chosen: dict[str, list[str]] = {}
    for device in dict.fromkeys(devices):
        found = capability_of(device)
        chosen.setdefault(by_capability.get(found, "") if found else "", []).append(
            f"{device} ({found})" if found else str(device))
    if len(chosen) > 1:
        said = "; ".join(f"{', '.join(where)}: {name or 'the default file'}"
                         for name, where in chosen.items())
        raise ModelConfigError(spec.name, "cc_model_filenames gives its instances different "
                                          f"files ({said}), and a version loads one file for "
                                          "all its instances: serve each file as its own "
                                          "model, or place the instances on GPUs alike")
    return next(iter(chosen))


def _auto_device(device: str) -> torch.device:
    if device != "auto":
        chosen = torch.device(device)  # "cuda" is the first GPU, as in "auto"
        return torch.device("cuda", 0) if chosen == torch.device("cuda") else chosen
    return torch.device("cuda", 0) if cuda_available() else torch.device("cpu")


def rate_claims(limiter: RateLimiter | None, spec: ModelSpec, version: int,
                by_group: list[list[torch.device]]) -> list[Claim | None]:
    """Each instance's rate limiter claim (None: it runs whenever it is idle, or never: a
    passive one, whose needs Triton does not register either), in the order of `by_group`'s
    devices; a load fails if one could never run."""
    if limiter is None or not spec.instance_groups:
        return [None] * sum(map(len, by_group))
    claims: list[Claim | None] = []
    try:
        for group, devices in zip(spec.instance_groups, by_group):
            for device in devices:
                if group.passive:
                    claims.append(None)
                    continue
                claims.append(limiter.claim(
                    f"model '{spec.name}' v{version} instance {len(claims)}",
                    group.resources, (device.index or 0) if device.type == "cuda" else -1,
                    group.priority))
    except ValueError as error:
        release_claims(limiter, claims)
        raise ModelConfigError(spec.name, str(error)) from None
    return claims


def release_claims(limiter: RateLimiter | None, claims: Iterable[Claim | None]) -> None:
    """Forget instances' rate limiter claims (their model is gone, or never loaded)."""
    if limiter is not None:
        for claim in claims:
            if claim is not None:
                limiter.release(claim)


def shares_weights(spec: ModelSpec, kind: str, devices: list[torch.device]) -> bool:
    """Whether a version's instances may run one copy of its model: TorchScript (whose
    forward runs on several threads at once without the GIL) on CPU instances, where N
    copies of the weights cost N times the memory for nothing a copy gives a CPU (Triton's
    PyTorch backend loads one an instance); they do once the first has loaded it, unless
    its forward assigns attributes (runner.shareable). Not a sequence model's, whose
    instances each keep their own sequences, possibly in the module's own state; not on
    GPUs (a copy a device, and CUDA graphs an instance)."""
    return (kind == "torchscript" and spec.sequence is None and not spec.decoupled
            and len(devices) > 1 and all(device.type == "cpu" for device in devices))


def wants_spare(placement: Placement | None, spec: ModelSpec,
                executors: list[ExecutorThread]) -> bool:
    """A heavy CPU model left to the defaults gets a spare instance on the loop's cores.

    With one instance the loop's core idles under a heavy model: on 2 cores ResNet-50
    served 14 requests/s with one instance and 25 with a spare on the loop's core
    (bench/RESULTS.md). A model configured with instance_group or cpu_affinity keeps
    exactly what it asked for. The spare must not be much slower than the first instance
    (1 thread against 15 would only add a tail), so it needs at least 1/SPARE_SLOWDOWN of
    the first's intra-op threads.
    """
    if spec.instance_groups:
        return False
    return loop_cores_help(placement, spec, executors[0])  # (without instance_group: one)


def on_loop_cores(placement: Placement, settings: ExecutorSettings) -> ExecutorSettings:
    """`settings` for an instance pinned to the loop's cores, a thread a core."""
    loop_cpus = placement.loop_cpus
    return replace(settings, cpu_affinity=loop_cpus, intra_op_threads=len(loop_cpus),
                   on_idle_time=True)


def loop_cores_help(placement: Placement | None, spec: ModelSpec,
                    first: ExecutorThread) -> bool:
    """Whether an instance running `first`'s copy of a model on the loop's cores, as a
    spare, would add throughput: a heavy CPU model, placed by the server (no
    cpu_affinity), and not much slower there (SPARE_SLOWDOWN)."""
    if placement is None or placement.shared or "cpu_affinity" in spec.parameters:
        return False
    return (first.settings.device.type == "cpu" and first.runner is not None
            and first.runner.shareable and first.forward_ns is not None
            and first.forward_ns >= LIGHT_FORWARD_NS
            and len(placement.loop_cpus) * SPARE_SLOWDOWN
            >= first.settings.intra_op_threads)


def setup_text(executors: list[ExecutorThread]) -> str:
    """What a load took, by step, the slowest instance's (start-up time is read here first:
    where it goes on a GPU, the CUDA graphs, or on a CPU)."""
    steps: dict[str, float] = {}
    for executor in executors:
        for step, seconds in executor.setup_s.items():
            steps[step] = max(steps.get(step, 0.0), seconds)
    return ("; " + ", ".join(f"{step} {seconds:.2f} s" for step, seconds in steps.items())
            if steps else "")
