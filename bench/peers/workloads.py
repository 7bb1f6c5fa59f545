"""The work every peer does, loaded the same way in every server (tensorgate's own included).

The models are the TorchScript files of tensorgate's built-in repository (`identity`, and
`resnet50` with random weights, seed 0), so every server runs the same graph with the same
kernels. `TG_BENCH_MODELS` names that repository; `TG_BENCH_THREADS` the torch intra-op thread
count, the one tensorgate gives its executor (all cores but one); `TG_BENCH_DEVICE` where the
model runs ("cpu", or "cuda": each request's batch is copied to the GPU and back, eagerly, as
a peer's user would write it). No tensorgate import: peers run in their own environments.
"""

from __future__ import annotations

import os
import pathlib
import warnings

import numpy as np
import torch

WORKLOADS = {"identity": (3, 224, 224), "resnet50": (1000,)}


def threads() -> int:
    return int(os.environ.get("TG_BENCH_THREADS", "1"))


DEVICE = torch.device(os.environ.get("TG_BENCH_DEVICE", "cpu"))


def load(name: str) -> torch.jit.ScriptModule:
    """The scripted model `name`, in eval mode on the bench device, with torch set to the
    shared thread count."""
    torch.set_num_threads(threads())
    path = pathlib.Path(os.environ["TG_BENCH_MODELS"]) / name / "1" / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path), map_location=DEVICE).eval()


def run(module: torch.jit.ScriptModule, batch: np.ndarray) -> np.ndarray:
    """One forward pass on a float32 batch; the result as a numpy array."""
    with torch.inference_mode():  # on the CPU, .to and .cpu return the tensor itself
        return module(torch.from_numpy(batch).to(DEVICE)).cpu().numpy()
