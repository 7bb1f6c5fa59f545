"""A model instance's runs at load, on its executor's thread, before it takes a request.

The config's `model_warmup` samples, each `count` times, or else zeros of its inputs at batch
1 (where zeros can stand in); then a check that 2 rows answer 2 rows in every output (a model
traced from one row may have fixed an output's first dim), and on a GPU the CUDA graphs of
each batch size. A warm-up that fails fails the load, saying which run failed and, for a
batching config whose dims begin with 1, that the batch dim was likely written into them.
An exported program whose guard refuses zeros of its least sizes, though its range takes
them, is warmed one size up at a time, and the spec its requests are held to says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from tensorgate.errors import InternalError
from tensorgate.pipeline.cuda_graphs import GraphSet, graph_batch_sizes
from tensorgate.pipeline.executor_settings import ExecutorSettings
from tensorgate.pipeline.input_bounds import lows_raised, raised_least
from tensorgate.pipeline.made_inputs import sample_inputs, warmup_inputs, zeros_refused
from tensorgate.pipeline.runner import Runner
from tensorgate.repository.model_config import ModelConfigError, ModelSpec

__all__ = ["MAX_LEAST_RAISES", "WarmUp"]

log = logging.getLogger("tensorgate.executor")

# steps a program's least sizes may go up at its warm-up (`_warm_at_least`): a guard that
# refuses s = 1 needs one; each is a run of the program on zeros of a few elements
MAX_LEAST_RAISES = 8


class WarmUp:
    """One instance's warm-up. `named` post-processes and names a raw result as a batch's
    is (the executor's); `settings` is what the instance serves afterwards (an exported
    program's least sizes may have gone up), `graphs` its CUDA graphs, `graphs_s` what their
    capture took."""

    def __init__(self, settings: ExecutorSettings, runner: Runner,
                 named: Callable[[Any, ModelSpec], dict[str, Any]], stream: Any) -> None:
        self.settings = settings
        self.graphs: GraphSet | None = None
        self.graphs_s = 0.0
        self._runner = runner
        self._named = named
        self._stream = stream

    def run(self) -> None:
        s = self.settings
        runner = self._runner
        if s.spec.warmup:  # the config's model_warmup samples, each `count` times
            rows_checked = not self._checks_rows()
            first: dict[str, Any] = {}
            for sample in s.spec.warmup:
                inputs = sample_inputs(s.spec, sample, s.directory.parent / "warmup", s.device)
                first = first or inputs
                for count in range(sample.count):
                    raw = self._warm_run(inputs, f"sample '{sample.name}' (batch "
                                                 f"{sample.batch_size})")
                    if count == 0 and sample.batch_size >= 2 and not rows_checked:
                        self._check_rows(raw, sample.batch_size,
                                         f"warm-up sample '{sample.name}'")
                        rows_checked = True
            if not rows_checked:  # every sample a batch of 1: the first, twice over
                name = s.spec.warmup[0].name
                twice = {key: (torch.cat([value, value]) if isinstance(value, torch.Tensor)
                               else np.concatenate([value, value]))
                         for key, value in first.items()}
                self._check_rows(self._warm_run(twice, f"sample '{name}' twice (batch 2)"),
                                 2, f"warm-up sample '{name}' twice")
        elif runner.requests is not None:
            # Triton runs a Python model only on requests and its config's model_warmup: one
            # may not take zeros (a tokenizer, image bytes), and a failed warm-up fails the load
            return
        else:
            # Batch 1 only: on CPU a warm-up at max_batch_size (64 × ResNet-50) costs seconds
            # of start-up for little; on a GPU, graph capture below runs every batch size.
            zeros = warmup_inputs(s.spec, 1, s.device)
            if zeros is None:
                log.info("model %s: no warm-up: it has no model_warmup, and zeros cannot stand "
                         "in: %s", s.spec.name, zeros_refused(s.spec, 1))
                return
            self._warm_at_least(zeros)
            s = self.settings  # its least sizes may have gone up
            self._check_batch_rows()
        if s.device.type == "cuda" and s.cuda_graphs and runner.module is not None:
            started = time.perf_counter()
            sizes = graph_batch_sizes(s.spec)
            self.graphs = GraphSet.capture(runner.run, s.spec, s.device, self._stream, sizes)
            self.graphs_s = time.perf_counter() - started
            if self.graphs is not None:
                log.info("model %s: instance %d has CUDA graphs for batch sizes %s", s.spec.name,
                         s.instance, ", ".join(map(str, sizes)))

    def _warm_at_least(self, zeros: dict[str, Any]) -> None:
        """Warm up at batch 1 on zeros of the least sizes; where an exported program's guard
        refuses them though its range takes them, one step up (`raised_least`) at a time,
        and the requests are held to what ran."""
        before, refused = self.settings.spec, ""
        shapes = self._runner.shapes
        for step in range(MAX_LEAST_RAISES + 1):
            try:
                self._warm_run(dict(zeros), "at batch 1")
                break
            except InternalError as error:
                s = self.settings
                said = str(error.__cause__)
                spec = (raised_least(s.spec, shapes, said)
                        if shapes is not None and step < MAX_LEAST_RAISES else None)
                if spec is None:
                    raise
                refused = refused or said
                self.settings = s = replace(s, spec=spec)
                found = warmup_inputs(spec, 1, s.device)
                assert found is not None  # as it was: only sizes changed
                zeros = found
        if refused:
            log.info("model %s: the exported program refused zeros of its least sizes (%s), "
                     "which its range constraints take; the least sizes went up until it ran, "
                     "and requests are held to them: %s", before.name, refused,
                     lows_raised(before, self.settings.spec))

    def _warm_run(self, inputs: dict[str, Any], what: str) -> Any:
        """The model's raw result for `inputs` (None for a decoupled model)."""
        try:
            result = self._runner.run(inputs)
            if isinstance(result, Iterator):  # a decoupled model: make its first response
                next(result, None)
                if hasattr(result, "close"):
                    result.close()
                return None
            return result
        except Exception as error:
            raise InternalError(f"model '{self.settings.spec.name}' failed its warm-up "
                                f"{what} with {type(error).__name__}: {error}"
                                f"{_batch_dim_hint(self.settings.spec)}") from error

    def _checks_rows(self) -> bool:
        """Whether the rows of the model's answers are held to the batch's at load: for a
        TorchScript or exported model that batches (a model traced from one row may have
        made an output's shape a constant: every batch the batcher gathered then failed
        under load, in split_rows). Sequence, decoupled and batch-input models are left out:
        their rows are not the requests'."""
        s = self.settings
        spec = s.spec
        return not (spec.max_batch_size < 2 or s.kind not in ("torchscript", "pt2")
                    or spec.sequence is not None or spec.decoupled or spec.batch_inputs
                    or spec.batch_outputs)

    def _check_batch_rows(self) -> None:
        """2 rows of zeros answer 2 rows in each output tensor, or the load fails here
        (`_checks_rows`)."""
        if not self._checks_rows():
            return
        zeros = warmup_inputs(self.settings.spec, 2, self.settings.device)
        if zeros is not None:
            self._check_rows(self._warm_run(dict(zeros), "at batch 2"), 2, "zeros")

    def _check_rows(self, raw: Any, rows: int, given: str) -> None:
        """Each output tensor of the model's answer `raw` to `rows` rows (`given`: of what)
        has that many rows, or the load fails saying which."""
        s = self.settings
        for name, value in self._named(raw, s.spec).items():
            if isinstance(value, torch.Tensor) and (value.dim() == 0 or value.shape[0] != rows):
                answered = ("no batch dim" if value.dim() == 0 else
                            f"{value.shape[0]} row{'s' if value.shape[0] != 1 else ''}")
                raise ModelConfigError(str(s.artifact), f"a batch of {rows} rows ({given}) "
                                       f"answered {answered} in output '{name}' (shape "
                                       f"{list(value.shape)}); with max_batch_size "
                                       f"{s.spec.max_batch_size} the first dim of every output "
                                       "must be the batch's rows. A model traced "
                                       "(torch.jit.trace) from one row may have fixed it: "
                                       "trace it from 2 rows, or serve it with max_batch_size "
                                       "0 and the batch in its dims")


def _batch_dim_hint(spec: ModelSpec) -> str:
    """For a warm-up that failed: a batching config whose dims begin with 1 likely wrote the
    batch dim into them (a common Triton mistake), and the model got one dim too many."""
    if spec.max_batch_size < 1:
        return ""
    first = next((item for item in spec.model_inputs
                  if item.dims[:1] == (1,) and item.reshape is None and not item.ragged),
                 None)
    if first is None:
        return ""
    dims = list(first.dims)
    return (f". (With max_batch_size {spec.max_batch_size} the server adds the batch dim in "
            f"front of the config's dims: input '{first.name}' dims {dims} made a batch of "
            f"shape {[1] + dims}. If the 1 is the batch, write dims {dims[1:]}.)")
