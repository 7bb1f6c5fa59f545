"""Model config `parameters` that tune how tensorgate runs a model, read and checked once.

    INTRA_OP_THREAD_COUNT / NUM_THREADS   torch intra-op threads of each instance
    cpu_affinity                          CPUs for its executors: "1", "0,2" or "0-3"
    batch_cap, cuda_graphs                "true" / "false" switches
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorgate.repository.model_config import ModelConfigError, ModelSpec

__all__ = ["cpu_affinity", "flag", "int_parameter"]


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
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ModelConfigError(spec.name, f"parameter '{key}' must be true or false, got '{value}'")


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
