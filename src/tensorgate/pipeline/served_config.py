"""The config a served model shows (/config, a Python model's `initialize` args): its
config filled in as Triton fills a served model's, from what the engine decided."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tensorgate.repository.model_config import ModelSpec

__all__ = ["instance_name", "served_ensemble", "served_spec"]


def served_spec(spec: ModelSpec, filename: str,
                by_group: list[list[torch.device]]) -> ModelSpec:
    """`spec` with its config filled in as Triton fills a served model's (what /config and a
    Python model's initialize see): the version policy, the model file, `optimization`'s
    defaults, a dynamic batcher's largest batch as its preferred size where it names none,
    and each instance group's name, kind as resolved, count and GPUs. Unnamed groups are
    named as Triton names them: `<model>_<index>`, or `<model>` for the group a config
    without any gets."""
    config = _filled(spec)
    if not config.default_model_filename:
        config.default_model_filename = filename
    optimization = config.optimization  # Triton's defaults: pinned inputs and outputs
    for pinned in ("input_pinned_memory", "output_pinned_memory"):
        if not optimization.HasField(pinned):  # given (enable: false too): as given
            getattr(optimization, pinned).enable = True
    batching = config.dynamic_batching
    if config.HasField("dynamic_batching") and not batching.preferred_batch_size and \
            config.max_batch_size > 0:  # batches as no preferred size does (scheduler.py)
        batching.preferred_batch_size.append(config.max_batch_size)
    given = list(spec.config.instance_group) or [None]
    del config.instance_group[:]
    for index, (group, devices) in enumerate(zip(given, by_group)):
        filled = config.instance_group.add()
        if group is not None:
            filled.CopyFrom(group)
        filled.name = filled.name or (spec.name if group is None else f"{spec.name}_{index}")
        gpus = sorted({d.index or 0 for d in devices if d.type == "cuda"})
        filled.kind = filled.KIND_GPU if gpus else filled.KIND_CPU
        filled.count = len(devices) // max(len(gpus), 1)
        del filled.gpus[:]
        filled.gpus.extend(gpus)
    return replace(spec, config=config)


def served_ensemble(spec: ModelSpec) -> ModelSpec:
    """An ensemble's `spec` with its config filled in as Triton fills one: the version
    policy and the transaction policy (an ensemble has no model file or instances)."""
    config = _filled(spec)
    config.model_transaction_policy.SetInParent()  # {"decoupled": false}, as Triton shows it
    return replace(spec, config=config)


def _filled(spec: ModelSpec) -> Any:
    """A copy of `spec`'s config with the version policy Triton gives a model without one."""
    config = type(spec.config)()
    config.CopyFrom(spec.config)
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    return config


def instance_name(spec: ModelSpec, instance: int) -> str:
    """Triton's name for instance `instance` of a served model (served_spec's): its group's
    name and its index within the group (`add_sub_0_0`, `inspect_0`); a Python model's
    `initialize` sees it, and Triton's logs and errors name the instance by it. A spare
    instance, beyond the groups' counts, is named after the model."""
    index = instance
    for group in spec.config.instance_group:
        size = group.count * max(len(group.gpus), 1)
        if index < size:
            return f"{group.name}_{index}"
        index -= size
    return f"{spec.name}_{instance}"
