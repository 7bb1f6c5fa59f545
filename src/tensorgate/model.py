"""The base class of a Python model (`<repo>/<model>/<version>/model.py`).

Stages, and where each runs:

    setup(context)          once, on the model instance's executor thread (it owns the device)
    preprocess(inputs[, requests])  per batch, on the executor thread
    forward(batch)          per batch, on the executor thread, under torch.inference_mode()
    postprocess(outputs)    per batch, in the post-processing pool (off the loop and executor)

`inputs` maps each config input name to a batched torch tensor on the instance's device;
`postprocess` returns a mapping from each config output name to a tensor (or, for BYTES, a
numpy object array) whose first dim is the batch. Weights load with `weights_only=True`.

A `preprocess` that takes a second argument gets the batch's requests, one `RequestInfo`
each in row order: its id, its rows of the batch and its request parameters (Triton's
parameters extension: what a client sends beside the reserved ones, such as a sampling
temperature). What the model needs of them in `forward` or `postprocess` it passes on in
what it returns. What a model sets in a request's `response_parameters` (from any hook that
holds the `RequestInfo`) the client gets as its response's parameters. Warm-up runs come as
one request with no parameters.

A stateful model (`sequence_batching`) also finds its control inputs (START, END, READY,
CORRID: one row per request) and its implicit states' inputs in `inputs`, and returns its
states' outputs with its other outputs; its requests come one per sequence per batch, each
sequence always to the same instance, so a model may keep per-sequence data keyed by CORRID.

A decoupled model (`model_transaction_policy { decoupled: true }`, e.g. one that streams
tokens) gets one request per call, and its `forward` is a generator: each value it yields
is post-processed and sent at once as one response; clients call it on the gRPC stream
(tritonclient's `start_stream` / `stream_infer`). When the client goes away the generator
is closed at its next `yield`. What it sets in its request's `response_parameters` before a
`yield` goes with that response only (the dict is emptied after each). An instance runs one
such request at a time unless the config parameter `streams_per_instance` is N > 1: then it
steps up to N generators in turn, one `yield` each, on its executor thread (never two at
once), so a new request's first response need not wait for whole streams; a model that
keeps a request's state on `self` across a `yield` must keep the default.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from tensorgate.repository import script_archive, weights

__all__ = ["Model", "ModelContext", "Parameter", "RequestInfo"]

# A request parameter's value, as JSON and gRPC's InferParameter carry it.
Parameter = bool | int | float | str

NO_PARAMETERS: Mapping[str, Parameter] = MappingProxyType({})


@dataclass(frozen=True)
class ModelContext:
    """What `setup` may know: where the version's files are, the device, the config."""

    name: str
    version: int
    directory: pathlib.Path
    device: torch.device
    max_batch_size: int
    parameters: dict[str, str] = field(default_factory=dict)
    instance: int = 0  # which of the version's instances (each has its own model object)

    def load_weights(self, filename: str) -> Any:
        """`torch.load` of a file in the version directory onto the device, tensors only
        (weights_only=True), read with the GIL free: the server's other models go on
        answering meanwhile (repository/weights.py)."""
        return weights.load_weights(self.directory / filename, self.device)

    def load_torchscript(self, filename: str) -> Any:
        """`torch.jit.load` of a TorchScript file in the version directory onto the device;
        onto the CPU its tensors are read with the GIL free, the server's other models
        answering meanwhile (repository/script_archive.py)."""
        return script_archive.load_script_module(self.directory / filename, self.device)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One request of a batch, as `preprocess(inputs, requests)` sees it. `rows` is where its
    rows are in the batched inputs (slice(0, 1) for a model that does not batch: its inputs
    have no batch dim)."""

    id: str
    rows: slice
    parameters: Mapping[str, Parameter]
    # What the model answers besides its outputs: entries set here (bool, 64-bit int, float
    # or str values), in any hook that holds this object, reach the client as the
    # response's parameters (JSON `parameters`, gRPC InferParameters).
    response_parameters: dict[str, Parameter] = field(default_factory=dict, compare=False)


class Model:
    """Subclass this in model.py and implement `forward`; the other hooks are optional."""

    def setup(self, context: ModelContext) -> None:
        """Build the network and load weights; runs on the executor thread."""

    def preprocess(self, inputs: dict[str, torch.Tensor],
                   requests: Sequence[RequestInfo] = ()) -> Any:
        return inputs

    def forward(self, batch: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def postprocess(self, outputs: Any) -> Any:
        return outputs
