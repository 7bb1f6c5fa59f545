"""CUDA graphs per batch size for static-shape models: capture once, replay per batch.

A batch of `rows` replays the smallest captured size ≥ rows; its inputs are copied into the
graph's static inputs (rows beyond the batch keep stale data, and their outputs are cut off).
Used only by the executor thread, which owns the stream; replaced by eager runs when a
model's shapes are not static (or ragged), an input or output is BYTES (strings are made on the
host, which a graph does not replay), or the config says `cuda_graphs: false`. A config's
`optimization { cuda { graph_spec ... } }` names the sizes (repository/graph_config.py).
"""

from __future__ import annotations

import bisect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from tensorgate.repository.graph_config import MAX_GRAPH_INPUT_BYTES
from tensorgate.repository.model_config import ModelSpec
from tensorgate.tensor.copies import copy_into

__all__ = ["CAPTURING", "GraphSet", "graph_batch_sizes", "map_tensors"]

_WARMUP_RUNS = 3  # runs on a side stream before capture, as torch's graph docs require
# One instance captures at a time in the process: two instances' captures at once (models
# loading together, on one GPU) failed both on an H200, cuBLAS "CUBLAS_STATUS_EXECUTION_FAILED"
# in one and "operation not permitted when stream is capturing" (bench/RESULTS.md), with
# either capture mode. The other threads' runs go on meanwhile: the mode is thread_local.
# An instance's teardown holds it too: its device-wide synchronize and empty_cache (cudaFree
# synchronizes the device) would reach into another instance's capture.
CAPTURING = threading.Lock()


def graph_batch_sizes(spec: ModelSpec) -> list[int]:
    """The sizes the config's graph_spec names (repository/graph_config.py); without, every
    size up to 8, then powers of two, the preferred sizes and the maximum. Either way those
    whose static inputs are at most MAX_GRAPH_INPUT_BYTES each: a graph holds its inputs on
    the device for as long as the model is loaded. A batch above the largest runs eagerly."""
    top = spec.max_batch_size
    if top <= 1:
        return [1]
    if spec.graph_sizes:
        sizes = set(spec.graph_sizes)
    else:
        sizes = set(range(1, min(top, 8) + 1))
        power = 16
        while power < top:
            sizes.add(power)
            power *= 2
        sizes.add(top)
        if spec.batching is not None:
            sizes.update(spec.batching.preferred_batch_sizes)
    row = max((i.row_bytes() for i in spec.model_inputs), default=0)
    return sorted(size for size in sizes if size == 1 or size * row <= MAX_GRAPH_INPUT_BYTES)


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply `fn` to every tensor in a model result (a tensor, sequence or mapping)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


class GraphSet:
    """Captured graphs of one model instance, keyed by batch rows."""

    def __init__(self, graphs: dict[int, tuple[Any, dict[str, torch.Tensor], Any]],
                 batched: bool) -> None:
        self._graphs = graphs
        self._sizes = sorted(graphs)
        self._batched = batched

    @classmethod
    def capture(cls, run: Callable[[dict[str, torch.Tensor]], Any], spec: ModelSpec,
                device: torch.device, stream: Any, sizes: list[int]) -> GraphSet | None:
        if any(i.datatype.torch is None or -1 in (i.reshape or i.dims) or i.ragged
               for i in spec.model_inputs) or any(o.datatype.is_bytes
                                                  for o in spec.model_outputs):
            return None
        with CAPTURING:
            return cls._capture(run, spec, device, stream, sizes)

    @classmethod
    def _capture(cls, run: Callable[[dict[str, torch.Tensor]], Any], spec: ModelSpec,
                 device: torch.device, stream: Any, sizes: list[int]) -> GraphSet:
        batched = spec.max_batch_size > 0
        memory_pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for rows in sorted(sizes, reverse=True):  # largest first: later ones reuse its memory
            static = {i.name: torch.zeros(([rows] if batched else []) + list(i.reshape or i.dims),
                                          dtype=i.datatype.torch, device=device)
                      for i in spec.model_inputs}
            side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_RUNS):
                    run(static)
            stream.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: other threads' calls (another model's runs) are not refused
            # while this one captures, as the default mode ("global") refuses them
            with warnings.catch_warnings(), torch.cuda.graph(
                    graph, pool=memory_pool, stream=stream, capture_error_mode="thread_local"):
                # a model that launches nothing (an identity) captures an empty graph
                warnings.filterwarnings("ignore", "The CUDA Graph is empty", UserWarning)
                out = run(static)
            graphs[rows] = (graph, static, out)
        stream.synchronize()
        return cls(graphs, batched)

    def covers(self, inputs: dict[str, Any], rows: int) -> bool:
        """Whether some captured graph takes `rows` rows of these inputs' shapes."""
        index = bisect.bisect_left(self._sizes, rows)
        if index == len(self._sizes):
            return False
        static = self._graphs[self._sizes[index]][1]
        for name, value in inputs.items():
            target = static.get(name)
            if target is None or not isinstance(value, torch.Tensor):
                return False
            if tuple(value.shape[1:] if self._batched else value.shape) != \
                    tuple(target.shape[1:] if self._batched else target.shape):
                return False
        return True

    def replay(self, inputs: dict[str, torch.Tensor], rows: int, ledger: Any = None) -> Any:
        """Copy `inputs` in (async, counted), replay, and return outputs cut to `rows`."""
        size = self._sizes[bisect.bisect_left(self._sizes, rows)]
        graph, static, out = self._graphs[size]
        for name, value in inputs.items():
            target = static[name][:rows] if self._batched else static[name]
            copy_into(target, value, "device", ledger, non_blocking=True)
        graph.replay()
        if not self._batched or size == rows:
            return out
        return map_tensors(out, lambda t: t[:rows])
