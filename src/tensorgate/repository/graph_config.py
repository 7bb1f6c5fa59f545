"""Triton's `optimization` block, read for the one part tensorgate acts on: which batch sizes
get a CUDA graph (`optimization { cuda { graph_spec [ { batch_size: 4 }, ... ] } }`).

A GPU model with static shapes gets a graph per batch size by default
(pipeline/cuda_graphs.graph_batch_sizes: every size up to 8, then powers of two, the
preferred sizes and the maximum). Each graph holds its static inputs and its memory pool on
the device while the model is loaded, and each capture adds to the load's time; a config
that names its sizes gets those alone, the way Triton's TensorRT backend reads the same
field. A batch replays the smallest graph that holds its rows; a batch above the largest
runs eagerly. `cuda { graphs: ... }` is a proto3 bool (false and absent are one), so it
cannot turn graphs off here: the `cuda_graphs` parameter does.

What the block says beyond that (a graph_spec's input shapes and lower bound, busy-wait
events, priorities, accelerators, pinned-memory switches, ...) is served without, and the
load names each such field (`ModelSpec.ignored`).
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError

__all__ = ["MAX_GRAPH_INPUT_BYTES", "graph_sizes", "optimization_not_acted_on"]

# The most bytes one static input of one graph may hold on the device: max_batch_size is an
# int32 a config (a client's load `config` too) sets at will
MAX_GRAPH_INPUT_BYTES = 1 << 30


def graph_sizes(config: pb.ModelConfig, source: str, row_bytes: int) -> tuple[int, ...]:
    """The batch sizes the config's graph_spec names, sorted (none: the server chooses).
    `row_bytes`: the largest input's bytes a row, for the bound on what a graph holds."""
    sizes: set[int] = set()
    batching = config.max_batch_size > 0
    for index, spec in enumerate(config.optimization.cuda.graph_spec):
        where = f"optimization.cuda.graph_spec[{index}].batch_size"
        if not batching:
            if spec.batch_size != 0:
                raise ModelConfigError(source, f"{where} is {spec.batch_size}; a model with "
                                               "max_batch_size 0 takes no batch: it must be 0")
            sizes.add(1)
            continue
        if not 1 <= spec.batch_size <= config.max_batch_size:
            raise ModelConfigError(source, f"{where} is {spec.batch_size}; it must be 1 to "
                                           f"max_batch_size ({config.max_batch_size})")
        if spec.batch_size > 1 and spec.batch_size * row_bytes > MAX_GRAPH_INPUT_BYTES:
            raise ModelConfigError(
                source, f"{where} is {spec.batch_size}: a graph at that size would hold "
                        f"{spec.batch_size * row_bytes:,} bytes of one input on the device "
                        f"while loaded, over the {MAX_GRAPH_INPUT_BYTES:,} a graph may")
        sizes.add(spec.batch_size)
    return tuple(sorted(sizes))


def optimization_not_acted_on(config: pb.ModelConfig) -> tuple[str, ...]:
    """`optimization`'s fields the config gives that tensorgate serves without, by path."""
    if not config.HasField("optimization"):
        return ()
    found = []
    for descriptor, value in config.optimization.ListFields():
        if descriptor.name != "cuda":
            found.append(f"optimization.{descriptor.name}")
            continue
        for field, _ in value.ListFields():
            if field.name == "graph_spec":
                parts = {part.name for spec in value.graph_spec for part, _ in spec.ListFields()}
                found += [f"optimization.cuda.graph_spec.{name}" for name in sorted(parts)
                          if name != "batch_size"]
            elif field.name != "graphs":
                found.append(f"optimization.cuda.{field.name}")
    return tuple(found)
