"""What one model instance's executor is built from (pipeline/executor.py): settled by the
engine (pipeline/version_instances.py, instance_plan.py) before the thread starts. Frozen:
what the instance learns at load (an exported program's bounds, the least sizes its
warm-up raised) is a copy made with `replace` that its thread keeps as its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tensorgate.pipeline.placement import Placement
from tensorgate.pipeline.postprocess import Postprocessor
from tensorgate.pipeline.runner import Runner
from tensorgate.repository.model_config import ModelSpec

__all__ = ["ExecutorSettings"]


@dataclass(frozen=True)
class ExecutorSettings:
    """Everything an executor needs to build its model instance."""

    spec: ModelSpec
    version: int
    artifact: Any  # pathlib.Path
    kind: str
    directory: Any  # pathlib.Path of the version
    device: torch.device
    intra_op_threads: int
    cpu_affinity: frozenset[int] | None
    placement: Placement | None
    cuda_graphs: bool
    postprocessor: Postprocessor | None
    # A runner another instance of this version loaded, run here too instead of a second copy
    # of the weights (only runners whose forward is safe on two threads at once).
    shared_runner: Runner | None = None
    instance: int = 0  # its index among the version's instances
    # A decoupled tensorgate Model's requests one instance interleaves (generations.py)
    streams_per_instance: int = 1
    inference_mode: bool = True  # else no_grad (config parameter INFERENCE_MODE false)
    jit_optimize: bool = True  # the TorchScript executor optimises (DISABLE_OPTIMIZED_EXECUTION)
    # A spare on the loop's core: runs on the time the loop leaves idle (idle_time.py)
    on_idle_time: bool = False
    # Of a passive group, run by no one (not even as another's shared runner): loaded and
    # not warmed up, as Triton leaves a passive instance (instance_plan.passive_instances)
    passive: bool = False
    # Outputs a model made in another datatype than its config's, already logged: one set
    # for a version's instances, so that the warning is said once, not once an instance
    said_datatype: set[str] = field(default_factory=set)
