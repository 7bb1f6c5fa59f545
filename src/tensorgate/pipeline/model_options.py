"""Model config `parameters` that tune how tensorgate runs a model, read and checked once.

    INTRA_OP_THREAD_COUNT / NUM_THREADS   torch intra-op threads of each instance
    cpu_affinity                          CPUs for its executors: "1", "0,2" or "0-3"
    batch_cap, cuda_graphs                "true" / "false" switches
    streams_per_instance                  a decoupled tensorgate Model's requests one
                                          instance interleaves (pipeline/generations.py)
    INFERENCE_MODE                        Triton's PyTorch backend's: "false" runs the model
                                          under no_grad instead of inference_mode
    DISABLE_OPTIMIZED_EXECUTION           Triton's PyTorch backend's: "true" turns off the
                                          TorchScript graph executor's optimisation on the
                                          instance's thread (no re-optimising per new shape)

The PyTorch backend's other switches change torch for the whole process (the JIT executor and
fusers, cuDNN) or do not apply here; a config that sets one is served, with a warning
naming it (`unused_settings`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorgate.config import FALSE_WORDS, TRUE_WORDS
from tensorgate.repository.model_config import ModelConfigError, ModelSpec

__all__ = ["cpu_affinity", "flag", "int_parameter", "streams_per_instance", "unused_settings"]

# Triton's PyTorch-backend parameters tensorgate takes and does not act on, with why
_NOT_ACTED_ON = {
    "ENABLE_JIT_EXECUTOR": "a process-wide torch switch",
    "ENABLE_JIT_PROFILING": "a process-wide torch switch",
    "ENABLE_TENSOR_FUSER": "a process-wide torch switch",
    "ENABLE_NVFUSER": "a process-wide torch switch (nvFuser is gone from torch)",
    "DISABLE_CUDNN": "a process-wide torch switch",
    "INTER_OP_THREAD_COUNT": "torch's inter-op pool is process-wide and fixed once used",
    "ENABLE_CACHE_CLEANING": "the CUDA caching allocator is not emptied after each batch",
    "ENABLE_WEIGHT_SHARING": "instances share weights where that is safe, whatever it says",
}


def int_parameter(spec: ModelSpec, keys: Sequence[str], default: int) -> int:
    for key in keys:
        if key in spec.parameters:
            try:
                value = int(spec.parameters[key])
            except ValueError:
                raise ModelConfigError(spec.name, f"parameter '{key}' must be an integer, got "
                                                  f"'{spec.parameters[key]}'") from None
            if value < 1:
                raise ModelConfigError(spec.name, f"parameter '{key}' must be 1 or more")
            return value
    return default


def flag(spec: ModelSpec, key: str, default: bool) -> bool:
    value = spec.parameters.get(key)
    if value is None:
        return default
    if value.lower() in TRUE_WORDS:
        return True
    if value.lower() in FALSE_WORDS:
        return False
    raise ModelConfigError(spec.name, f"parameter '{key}' must be true or false, got '{value}'")


def streams_per_instance(spec: ModelSpec) -> int:
    """`streams_per_instance` (default 1), only on a decoupled model."""
    if "streams_per_instance" in spec.parameters and not spec.decoupled:
        raise ModelConfigError(spec.name, "parameter 'streams_per_instance' applies to a "
                                          "decoupled model (model_transaction_policy "
                                          "{ decoupled: true }) only")
    return int_parameter(spec, ("streams_per_instance",), 1)


def _not_acted_on(spec: ModelSpec) -> list[str]:
    """The PyTorch-backend parameters `spec` sets that tensorgate does not act on, each with
    why, for the load's warning."""
    return [f"{key} ({why})" for key, why in _NOT_ACTED_ON.items() if key in spec.parameters]


def unused_settings(spec: ModelSpec, has_cache: bool) -> list[str]:
    """What of `spec` the server takes and does not act on, each said once at load: config
    fields (ModelSpec.ignored), the PyTorch backend's process-wide parameters, a packed
    environment for Triton's stub, a response cache the server has none of (`has_cache`)."""
    said = []
    if spec.ignored:
        said.append(f"served without its config's {', '.join(spec.ignored)} (not acted on "
                    "here)")
    unused = _not_acted_on(spec)
    if unused:
        said.append(f"parameters taken and not acted on: {'; '.join(unused)}")
    if "EXECUTION_ENV_PATH" in spec.parameters:
        said.append("parameter EXECUTION_ENV_PATH (a packed Python environment for Triton's "
                    "stub) is not acted on: the model runs in the server's own environment, "
                    "which needs its packages")
    if spec.response_cache and not has_cache:
        said.append("its config enables response_cache, but the server has no cache; start "
                    "it with --response-cache-bytes")
    return said


def cpu_affinity(spec: ModelSpec) -> frozenset[int] | None:
    """`cpu_affinity` as "1", "0,2" or "0-3"."""
    text = spec.parameters.get("cpu_affinity", "").strip()
    if not text:
        return None
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ModelConfigError(spec.name, f"parameter 'cpu_affinity' must list CPUs like "
                               f"'0,2' or '0-3', got '{text}'") from None
    return frozenset(cpus)
