"""config.pbtxt → a frozen ModelSpec (repository/model_spec.py), with Triton's own ModelConfig
schema.

The schema is the one tritonclient ships (`tritonclient.grpc.model_config_pb2`, compiled from
triton-inference-server/common), parsed as protobuf text format: a field the schema lacks or
a value of the wrong kind is an error naming the file, the line and the field. On top of the
schema we check what the schema cannot say (names, dims, batch sizes).
"""

from __future__ import annotations

import math
import pathlib
import re
from typing import Any, Literal

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError
from tensorgate.repository.graph_config import graph_sizes, optimization_not_acted_on
from tensorgate.repository.metrics_config import histogram_bounds, metric_tags
from tensorgate.repository.model_spec import (BatchingPolicy, InstanceGroup, ModelSpec,
                                              QueuePolicy, RaggedLimits, TensorSpec, TiedDim,
                                              WarmupInput, WarmupSample, config_json)
from tensorgate.repository.ragged_config import batch_inputs, batch_outputs
from tensorgate.repository.sequence_config import SequencePolicy, sequence_policy
from tensorgate.repository.unused_fields import fields_not_acted_on
from tensorgate.tensor.dtypes import datatype_from_config

__all__ = ["BatchingPolicy", "InstanceGroup", "ModelConfigError", "ModelSpec", "QueuePolicy",
           "RaggedLimits", "SequencePolicy", "TensorSpec", "TiedDim", "WarmupInput",
           "WarmupSample", "check_file_name", "config_json", "model_config_from_json", "model_spec",
           "parse_model_config", "read_model_config", "version_policy"]

# Fields that change how Triton runs a model, not what it computes: served without them,
# and a load says so (ModelSpec.ignored); `optimization`'s, but for its CUDA graph sizes, too
# (repository/graph_config.py).
NOT_ACTED_ON = ("model_operations",)
_CAPABILITY = re.compile(r"[0-9]+\.[0-9]+")  # a CUDA compute capability, as Triton writes it
MAX_PRIORITY_LEVELS = 1000  # each level is a queue the batcher walks; more is a config mistake
# What a config may ask of the machine at load: a config may come from a client (a load's
# `config` override), and a mistyped count must fail the load, not exhaust the server.
MAX_INSTANCES = 256  # executor threads of one model, all its instance groups together
MAX_WARMUP_COUNT = 10_000  # runs of one model_warmup sample
MAX_WARMUP_BYTES = 1 << 30  # one warm-up input tensor, its rows included


def read_model_config(path: pathlib.Path) -> pb.ModelConfig:
    """`path` (a config.pbtxt) checked against the schema only: model_spec checks the rest."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelConfigError(str(path), f"cannot read: {error}") from None
    return _parse_text(text, str(path))


def _parse_text(text: str, source: str) -> pb.ModelConfig:
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise ModelConfigError(source, str(error)) from None
    return config


def parse_model_config(text: str, source: str = "config.pbtxt",
                       expected_name: str | None = None) -> ModelSpec:
    return model_spec(_parse_text(text, source), source, expected_name, "the model directory")


def model_config_from_json(value: str | dict[str, Any], source: str) -> pb.ModelConfig:
    """A config given as JSON text or its dict (Triton's /config form), schema-checked."""
    config = pb.ModelConfig()
    if isinstance(value, str) and not value.lstrip().startswith("{"):
        # (json_format takes "[]" as an empty config: a model of nothing would load)
        raise ModelConfigError(source, "must be a JSON object")
    try:
        if isinstance(value, str):
            json_format.Parse(value, config)
        else:
            json_format.ParseDict(value, config)
    except json_format.ParseError as error:
        raise ModelConfigError(source, str(error)) from None
    return config


def model_spec(config: pb.ModelConfig, source: str, expected_name: str | None,
               named_by: str) -> ModelSpec:
    """The checked ModelSpec of a schema-valid `config` (a missing name is `expected_name`;
    another is an error naming `named_by`)."""
    if expected_name is not None:
        if not config.name:
            config.name = expected_name
        elif config.name != expected_name:
            raise ModelConfigError(source, f"field 'name' is '{config.name}' but {named_by} "
                                           f"is '{expected_name}'; they must match")
    return _spec(config, source)


def _spec(config: pb.ModelConfig, source: str) -> ModelSpec:
    if not config.name:
        raise ModelConfigError(source, "field 'name' is missing")
    if config.max_batch_size < 0:
        raise ModelConfigError(source, f"field 'max_batch_size' is {config.max_batch_size}; "
                                       "it must be 0 (no batching) or more")
    if config.default_model_filename:
        check_file_name(config.default_model_filename, "default_model_filename",
                         "each version's directory", source)
    given = {descriptor.name for descriptor, _ in config.ListFields()}
    bounds, families_not_written = histogram_bounds(config, source)
    by_capability = _cc_model_filenames(config, source)
    ignored = (optimization_not_acted_on(config)
               + tuple(name for name in NOT_ACTED_ON if name in given)
               + fields_not_acted_on(config) + families_not_written
               + tuple(f"cc_model_filenames key {key!r} (not a compute capability such as "
                       "'9.0': never chosen)" for key, _ in by_capability
                       if not _CAPABILITY.fullmatch(key)))
    cached = config.response_cache.enable
    if cached and (config.model_transaction_policy.decoupled
                   or config.WhichOneof("scheduling_choice") == "sequence_batching"):
        raise ModelConfigError(source, "'response_cache' cannot be enabled on a decoupled or "
                                       "stateful (sequence_batching) model: its answers depend "
                                       "on more than the request")
    inputs = tuple(_tensor(t, "input", source, config.max_batch_size) for t in config.input)
    outputs = tuple(_tensor(t, "output", source, config.max_batch_size) for t in config.output)
    for kind, specs in (("input", inputs), ("output", outputs)):
        names = [spec.name for spec in specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ModelConfigError(source, f"{kind} names must be unique; repeated: "
                                           + ", ".join(duplicates))
    ragged = {spec.name: spec.ragged for spec in inputs}  # every input: is it ragged
    return ModelSpec(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        batching=_batching(config, source),
        instance_groups=_instance_groups(config, source),
        version_policy=version_policy(config, source),
        parameters={key: value.string_value for key, value in config.parameters.items()},
        default_model_filename=config.default_model_filename,
        cc_model_filenames=by_capability,
        decoupled=config.model_transaction_policy.decoupled,
        sequence=(sequence_policy(config, source)
                  if config.WhichOneof("scheduling_choice") == "sequence_batching" else None),
        warmup=tuple(_warmup(w, config, inputs, source) for w in config.model_warmup),
        ignored=ignored,
        graph_sizes=graph_sizes(config, source, max((t.row_bytes() for t in inputs), default=0)),
        response_cache=cached,
        batch_inputs=batch_inputs(config, source, ragged),
        batch_outputs=batch_outputs(config, source, ragged, [o.name for o in outputs]),
        metric_tags=metric_tags(config, source),
        histogram_bounds=bounds,
        config=config,
    )


def _warmup(message: pb.ModelWarmup, config: pb.ModelConfig, inputs: tuple[TensorSpec, ...],
            source: str) -> WarmupSample:
    where = f"model_warmup '{message.name}'" if message.name else "a model_warmup sample"
    if not message.name:
        raise ModelConfigError(source, f"{where} has no 'name'")
    batch = message.batch_size
    limit = max(config.max_batch_size, 1)
    if not 1 <= batch <= limit:
        raise ModelConfigError(source, f"{where} has batch_size {batch}; it must lie in [1, "
                                       f"{limit}]" + ("" if config.max_batch_size else
                                                      " (the model does not batch)"))
    config_inputs = {t.name: t for t in inputs}
    missing = sorted(set(config_inputs) - set(message.inputs)
                     - {t.name for t in inputs if t.optional})
    if missing:
        raise ModelConfigError(source, f"{where} gives no data for inputs {missing}")
    samples = []
    for name, given in sorted(message.inputs.items()):
        spec = config_inputs.get(name)
        if spec is None:  # control and state inputs get zeros: only config inputs here
            raise ModelConfigError(source, f"{where} names input '{name}'; the model's "
                                           f"inputs are: {', '.join(config_inputs)}")
        if given.data_type == pb.TYPE_INVALID or datatype_from_config(
                pb.DataType.Name(given.data_type), name) is not spec.datatype:
            raise ModelConfigError(source, f"{where}: input '{name}' is "
                                           f"{pb.DataType.Name(given.data_type)}; the model's "
                                           f"input is {spec.datatype.name}")
        dims = tuple(given.dims)
        if not spec.accepts(dims) or any(d < 1 for d in dims):
            raise ModelConfigError(source, f"{where}: input '{name}' has dims {list(dims)}; "
                                           f"the model's input has {list(spec.dims)} (fix "
                                           "every variable dim)")
        choice = given.WhichOneof("input_data_type")
        if choice is None:
            raise ModelConfigError(source, f"{where}: input '{name}' needs zero_data, "
                                           "random_data or input_data_file")
        file = given.input_data_file if choice == "input_data_file" else ""
        if choice == "input_data_file" and ("/" in file or file in ("", ".", "..")):
            raise ModelConfigError(source, f"{where}: input '{name}': input_data_file "
                                           f"'{file}' must be a file name in the model's "
                                           "warmup folder")
        nbytes = batch * max(spec.datatype.itemsize, 1) * math.prod(dims)
        if nbytes > MAX_WARMUP_BYTES:
            raise ModelConfigError(source, f"{where}: input '{name}' of {batch} × {list(dims)} "
                                           f"is {nbytes:,} bytes; a warm-up input may be at "
                                           f"most {MAX_WARMUP_BYTES:,}")
        data: Literal["zero", "random", "file"] = (
            "file" if file else "zero" if choice == "zero_data" else "random")
        samples.append((name, WarmupInput(spec.datatype, dims, data, file)))
    if message.count > MAX_WARMUP_COUNT:
        raise ModelConfigError(source, f"{where} has count {message.count}; at most "
                                       f"{MAX_WARMUP_COUNT} runs are allowed")
    return WarmupSample(message.name, batch, tuple(samples), max(message.count, 1))


def _tensor(message: pb.ModelInput | pb.ModelOutput, kind: str, source: str,
            max_batch_size: int) -> TensorSpec:
    where = f"{kind} '{message.name}'" if message.name else f"an {kind}"
    if not message.name:
        raise ModelConfigError(source, f"{where} has no 'name'")
    if message.data_type == pb.TYPE_INVALID:
        raise ModelConfigError(source, f"{where} has no 'data_type'")
    dt = datatype_from_config(pb.DataType.Name(message.data_type), message.name)
    dims = tuple(message.dims)
    if not dims and max_batch_size == 0:
        raise ModelConfigError(source, f"{where} has no 'dims'")
    bad = [d for d in dims if d < -1 or d == 0]
    if bad:
        raise ModelConfigError(source, f"{where} has dims {list(dims)}; each must be -1 "
                                       "(variable) or positive")
    if message.is_shape_tensor:
        raise ModelConfigError(source, f"{where} is_shape_tensor: a TensorRT shape tensor, "
                                       "which tensorgate does not serve (its requests would "
                                       "leave out the batch dim a PyTorch model's inputs "
                                       "have)")
    reshape = tuple(message.reshape.shape) if message.HasField("reshape") else None
    labels = getattr(message, "label_filename", "")
    if labels:
        check_file_name(labels, f"{where}: label_filename", "the model's directory", source)
    return TensorSpec(message.name, dt, dims, reshape,
                      optional=bool(getattr(message, "optional", False)),
                      label_filename=labels,
                      ragged=bool(getattr(message, "allow_ragged_batch", False)))


def _cc_model_filenames(config: pb.ModelConfig, source: str) -> tuple[tuple[str, str], ...]:
    """cc_model_filenames, each file checked as default_model_filename is, sorted."""
    for key, name in config.cc_model_filenames.items():
        check_file_name(name, f"cc_model_filenames[{key!r}]", "each version's directory",
                        source)
    return tuple(sorted(config.cc_model_filenames.items()))


def check_file_name(name: str, what: str, folder: str, source: str) -> None:
    """A file a config names stays in its folder: a config may come from a client (a load's
    `config` override), and a path out of the folder would read any file the server can."""
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ModelConfigError(source, f"{what} '{name}' must be a file name in {folder}, "
                                       "not a path")


def _batching(config: pb.ModelConfig, source: str) -> BatchingPolicy | None:
    choice = config.WhichOneof("scheduling_choice")
    if choice == "ensemble_scheduling":
        if config.platform != "ensemble":
            raise ModelConfigError(source, "'ensemble_scheduling' needs platform 'ensemble'")
        return None  # its steps' models batch (pipeline/ensemble.py checks the steps)
    if choice != "dynamic_batching":
        return None  # none, or sequence_batching (repository/sequence_config.py)
    batching = config.dynamic_batching
    if config.max_batch_size == 0:
        raise ModelConfigError(source, "'dynamic_batching' needs 'max_batch_size' above 0")
    too_big = [s for s in batching.preferred_batch_size if s > config.max_batch_size or s < 1]
    if too_big:
        raise ModelConfigError(source, f"'preferred_batch_size' {too_big} must lie in "
                                       f"[1, max_batch_size={config.max_batch_size}]")
    default = _queue_policy(batching.default_queue_policy)
    levels = batching.priority_levels
    if levels > MAX_PRIORITY_LEVELS:
        raise ModelConfigError(source, f"'priority_levels' is {levels}; at most "
                                       f"{MAX_PRIORITY_LEVELS} are supported")
    outside = sorted(k for k in batching.priority_queue_policy if not 1 <= k <= levels)
    if outside:
        allowed = f"with 'priority_levels: {levels}' they must lie in [1, {levels}]" if levels \
            else "it needs 'priority_levels'"
        raise ModelConfigError(source, f"'priority_queue_policy' names levels {outside}; "
                                       + allowed)
    if levels and not 1 <= batching.default_priority_level <= levels:
        raise ModelConfigError(source, f"'default_priority_level' is "
                                       f"{batching.default_priority_level}; with "
                                       f"'priority_levels: {levels}' it must lie in "
                                       f"[1, {levels}]")
    queues = tuple(_queue_policy(batching.priority_queue_policy[level])
                   if level in batching.priority_queue_policy else default
                   for level in range(1, levels + 1)) or (default,)
    return BatchingPolicy(
        max_queue_delay_us=batching.max_queue_delay_microseconds,
        preferred_batch_sizes=tuple(sorted(set(batching.preferred_batch_size))),
        preserve_ordering=batching.preserve_ordering,
        queues=queues,
        default_level=batching.default_priority_level - 1 if levels else 0,
    )


def _queue_policy(policy: pb.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=policy.max_queue_size,
        default_timeout_us=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        delay_on_timeout=policy.timeout_action == pb.ModelQueuePolicy.DELAY,
    )


def _instance_groups(config: pb.ModelConfig, source: str) -> tuple[InstanceGroup, ...]:
    groups = tuple(_instance_group(g, source) for g in config.instance_group)
    total = sum(g.count * max(len(g.gpus), 1) for g in groups)
    if total > MAX_INSTANCES:
        raise ModelConfigError(source, f"instance_group asks for {total} instances; at most "
                                       f"{MAX_INSTANCES} are served (each is a thread)")
    if groups and all(g.passive for g in groups):  # Triton would leave requests waiting
        raise ModelConfigError(source, "every instance_group is passive: no instance would "
                                       "take a request; make one group active "
                                       "(passive: false)")
    return groups


def _instance_group(group: pb.ModelInstanceGroup, source: str) -> InstanceGroup:
    if group.count < 0:
        raise ModelConfigError(source, f"instance_group count {group.count} is negative")
    resources: dict[str, tuple[str, int, bool]] = {}
    for resource in group.rate_limiter.resources:
        if not resource.name:
            raise ModelConfigError(source, "instance_group rate_limiter resource without a "
                                           "name")
        if resource.name in resources:
            raise ModelConfigError(source, f"instance_group rate_limiter names resource "
                                           f"'{resource.name}' twice")
        resources[resource.name] = (resource.name, resource.count,
                                    getattr(resource, "global"))
    return InstanceGroup(max(group.count, 1), pb.ModelInstanceGroup.Kind.Name(group.kind),
                         tuple(group.gpus), tuple(resources.values()),
                         max(group.rate_limiter.priority, 1),  # Triton's: 0 counts as 1
                         group.passive)


def version_policy(config: pb.ModelConfig, source: str) -> tuple[str, tuple[int, ...]]:
    """`config`'s version policy: ("latest", (n,)), ("all", ()) or ("specific", versions)."""
    choice = config.version_policy.WhichOneof("policy_choice")
    if choice is None:
        return ("latest", (1,))
    if choice == "latest":
        n = config.version_policy.latest.num_versions
        if n < 1:
            raise ModelConfigError(source, f"version_policy latest num_versions is {n}; "
                                           "it must be 1 or more")
        return ("latest", (n,))
    if choice == "all":
        return ("all", ())
    versions = tuple(sorted(config.version_policy.specific.versions))
    if not versions or versions[0] < 1:
        raise ModelConfigError(source, "version_policy specific needs versions of 1 or more")
    return ("specific", versions)
