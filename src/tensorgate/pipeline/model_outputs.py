"""A model's outputs checked and handed to its requests, and its failures put in words a
client can act on: the executor's pure part (pipeline/executor.py), run on its thread or in
the post-processing pool. What a model made wrong (a datatype no protocol holds, rows that
do not add up, a shape its config's dims do not take) is the model's fault, an InternalError
that names the model and output; sizes an exported program's guard refused are the
request's (a 400)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from tensorgate.errors import DatatypeError, InternalError, InvalidArgumentError, TensorgateError
from tensorgate.pipeline.batching import split_rows
from tensorgate.pipeline.input_bounds import guard_dims
from tensorgate.pipeline.ragged import scatter
from tensorgate.pipeline.runner import Runner
from tensorgate.pipeline.torch_io import strings_array
from tensorgate.pipeline.work import Batch
from tensorgate.repository.model_config import ModelSpec
from tensorgate.tensor.dtypes import datatype_of_numpy, datatype_of_torch
from tensorgate.tensor.view import TensorView

__all__ = ["check_output", "model_error", "output_datatype", "refused_sizes", "reshaped",
           "results_per_request"]

log = logging.getLogger("tensorgate.executor")  # (the executor's part: logged as it)



def results_per_request(batch: Batch, outputs: dict[str, Any], spec: ModelSpec,
                        scattered: dict[str, str]) -> None:
    """A batch's outputs (named by `spec`) cut into its requests' results, each only the
    outputs it asked for: in rows, or for a batch output (`scattered`: output → the input
    whose shapes it follows) in its requests' input shapes, then in the config's dims where
    it has a `reshape`. Views of the batch's tensors: nothing copied but what a reshape of
    an output not laid out in rows must (counted). Raises InternalError naming an output the
    model made wrong (datatype, rows, shape)."""
    items = batch.items
    rows = [item.rows for item in items]
    batching = spec.max_batch_size > 0
    for out in spec.model_outputs:
        if not any(out.name in item.wanted for item in items):
            continue
        value = outputs[out.name]
        if out.datatype.is_bytes and isinstance(value, list):  # TorchScript List[str]
            value = strings_array(value, out.reshape or out.dims,
                                  sum(rows) if batching else None, spec.name, out.name)
        check_output(spec.name, out.name, value, out.datatype)
        source = scattered.get(out.name)
        if source is not None:  # a batch output: cut in its requests' input shapes
            pieces = scatter(value, out.dims, [item.inputs[source].shape for item in items],
                             spec.name, out.name)
        elif batching:
            pieces = split_rows(value, rows, spec.name, out.name)
        else:
            pieces = [value]
        if out.reshape is not None and source is None:  # the model's shape → dims
            pieces = [reshaped(piece, ([item.rows] if batching else []) + list(out.dims),
                               spec.name, out.name, item.ledger)
                      for piece, item in zip(pieces, items)]
        for item, piece in zip(items, pieces):
            if out.name in item.wanted:
                item.results[out.name] = TensorView.from_array(piece, name=out.name,
                                                               ledger=item.ledger)


def refused_sizes(spec: ModelSpec, runner: Runner, error: BaseException
                   ) -> InvalidArgumentError | None:
    """An exported program's failed guard over a dim other than the batch dim, as the
    request's fault (a 400, not a 500): its batch holds only requests whose dims agree (no
    ragged input), in rows the program takes from 1 (runner._check_batch_range), so the
    guard refused the sizes each request brought — ones its ranges take but its code does
    not (x.view(B, -1, 4): a dim 1 of 10). None for anything else."""
    said = str(error)
    named = guard_dims(said) if isinstance(error, AssertionError) else None
    if runner.shapes is None or spec.ragged_inputs or named is None:
        return None
    batch = spec.max_batch_size > 0
    if not any(dim > 0 or not batch for _, dim in named):
        return None  # the batch dim alone: the batcher's doing, not a request's
    return InvalidArgumentError(f"model '{spec.name}' refused the request's sizes, which its "
                                f"ranges take: its exported program's {said[0].lower()}"
                                f"{said[1:]} (the sizes it was exported for)")


def model_error(model: str, error: BaseException) -> TensorgateError:
    if isinstance(error, TensorgateError):
        return error
    kind, text = type(error).__name__, str(error).strip()
    if isinstance(error, torch.jit.Error) and text:
        # TorchScript wraps the model's exception in two tracebacks; its last line is the
        # exception itself ("builtins.RuntimeError: negative input"). The rest goes to the log.
        log.warning("model %s raised in TorchScript:\n%s", model, text)
        kind, _, text = text.splitlines()[-1].partition(": ")
        kind = kind.rpartition(".")[2]
    return InternalError(f"model '{model}' raised {kind}: {text}")


def reshaped(value: Any, shape: list[int], model: str, name: str, ledger: Any) -> Any:
    """An output with a config `reshape` (the model's shape of it) in its config dims. The
    reshape itself copies nothing: an output not laid out in rows is first given the one
    counted copy its tensor view would make anyway."""
    try:
        if isinstance(value, torch.Tensor):
            if not value.is_contiguous():
                value = TensorView.from_torch(value, name=name, ledger=ledger).torch()
            return value.view(shape)
        if value.dtype != object and not value.flags.c_contiguous:  # BYTES: references only
            value = TensorView.from_numpy(value, name=name, ledger=ledger).numpy()
        return value.reshape(shape)
    except (RuntimeError, ValueError):
        raise InternalError(f"model '{model}' output '{name}' has shape "
                            f"{list(value.shape)}, which does not reshape to {shape} as its "
                            f"config's dims ask") from None


def check_output(model: str, name: str, value: Any, expected: Any) -> None:
    found = output_datatype(model, name, value, expected)
    if found is not expected:
        raise InternalError(f"model '{model}' output '{name}' is {found.name}; its config "
                            f"says {expected.name}")


def output_datatype(model: str, name: str, value: Any, expected: Any) -> Any:
    """The datatype of a model's output `value`; raises for one no protocol datatype holds
    or that is not a tensor."""
    try:
        if isinstance(value, torch.Tensor):
            found = datatype_of_torch(value.dtype, name)
        elif isinstance(value, np.ndarray):
            found = datatype_of_numpy(value.dtype, name)
        else:
            raise InternalError(f"model '{model}' output '{name}' is a "
                                f"{type(value).__name__}; expected a torch tensor or a numpy "
                                "array")
    except DatatypeError:  # the model's fault, not the request's (a 400 said it was)
        raise InternalError(f"model '{model}' output '{name}' is {value.dtype}, which no "
                            f"protocol datatype holds; its config says {expected.name}") from None
    return found

