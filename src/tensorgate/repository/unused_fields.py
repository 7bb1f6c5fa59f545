"""A model config's fields for other backends' features — TensorRT's optimization profiles and
non-linear tensor formats, DALI's secondary devices, Triton's host policies (NUMA pinning
named by its --host-policy) and model namespaces — and for TensorRT's state buffers: what
they ask changes nothing a PyTorch or Python model computes, so the model is served without
them and its load names each one (ModelSpec.ignored), where they were dropped unsaid.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as pb

__all__ = ["fields_not_acted_on"]

_GROUP_FIELDS = ("host_policy", "secondary_devices", "profile")
_STATE_FIELDS = ("use_same_buffer_for_input_output", "use_growable_memory")


def fields_not_acted_on(config: pb.ModelConfig) -> tuple[str, ...]:
    """Each such field `config` gives, by where it is ("instance_group[1].host_policy")."""
    found = [f"instance_group[{index}].{name}"
             for index, group in enumerate(config.instance_group)
             for name in _GROUP_FIELDS if getattr(group, name)]
    found += [f"{kind} '{tensor.name}' is_non_linear_format_io"
              for kind, tensors in (("input", config.input), ("output", config.output))
              for tensor in tensors if tensor.is_non_linear_format_io]
    found += [f"sequence_batching.state[{index}].{name}"
              for index, state in enumerate(config.sequence_batching.state)
              for name in _STATE_FIELDS if getattr(state, name)]
    found += [f"ensemble_scheduling.step[{index}].model_namespace (model names are one "
              "namespace here)"
              for index, step in enumerate(config.ensemble_scheduling.step)
              if step.model_namespace]
    return tuple(found)
