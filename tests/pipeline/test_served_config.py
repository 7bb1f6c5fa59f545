"""The config a served model shows (/config, a Python model's initialize): filled in as
Triton fills it, from what the engine decided — groups named, kinds resolved, GPUs listed."""

from __future__ import annotations

import torch

from tensorgate.pipeline.served_config import instance_name, served_ensemble, served_spec
from tensorgate.repository.model_config import parse_model_config


def test_groups_are_named_resolved_and_counted_per_device() -> None:
    spec = parse_model_config('name: "m" backend: "python" instance_group [ '
                              '{ count: 2 kind: KIND_AUTO }, '
                              '{ name: "big" count: 2 kind: KIND_GPU gpus: [ 1, 3 ] } ] '
                              'version_policy { all { } }')
    cpu, one, three = torch.device("cpu"), torch.device("cuda", 1), torch.device("cuda", 3)
    served = served_spec(spec, "model.py", [[cpu, cpu], [one, one, three, three]])
    config = served.config_dict()
    assert [(g["name"], g["kind"], g["count"], g["gpus"]) for g in config["instance_group"]] == [
        ("m_0", "KIND_CPU", 2, []), ("big", "KIND_GPU", 2, [1, 3])]
    assert config["version_policy"] == {"all": {}}  # a given policy stays
    assert config["default_model_filename"] == "model.py"
    assert spec.config_dict()["instance_group"][0]["kind"] == "KIND_AUTO"  # not changed


def test_a_model_without_groups_shows_the_one_it_got() -> None:
    spec = parse_model_config('name: "m" platform: "pytorch_libtorch" '
                              'default_model_filename: "weights.pt"')
    config = served_spec(spec, "weights.pt", [[torch.device("cuda", 0)]]).config_dict()
    assert [(g["name"], g["kind"], g["count"], g["gpus"]) for g in config["instance_group"]] == [
        ("m", "KIND_GPU", 1, [0])]  # as Triton names the group it fills in
    assert config["version_policy"] == {"latest": {"num_versions": 1}}


def test_instances_are_named_by_group_as_triton_names_them() -> None:
    """`<group>_<index in group>`: Triton 2.51 named add_sub's instance (group unnamed, so
    add_sub_0) add_sub_0_0, and inspect's (no group) inspect_0, in its errors and in
    initialize's model_instance_name."""
    spec = parse_model_config('name: "m" backend: "python" instance_group [ '
                              '{ count: 2 kind: KIND_CPU }, '
                              '{ name: "big" count: 1 kind: KIND_GPU gpus: [ 1, 3 ] } ]')
    cpu, one, three = torch.device("cpu"), torch.device("cuda", 1), torch.device("cuda", 3)
    served = served_spec(spec, "model.py", [[cpu, cpu], [one, three]])
    assert [instance_name(served, i) for i in range(4)] == ["m_0_0", "m_0_1", "big_0", "big_1"]
    alone = served_spec(parse_model_config('name: "n" backend: "python"'), "model.py", [[cpu]])
    assert instance_name(alone, 0) == "n_0"


def test_an_ensemble_shows_the_policies_triton_fills_in() -> None:
    """Triton 2.51's /config of an ensemble has a version policy and a transaction policy
    where its config.pbtxt had neither (tools/triton_diff.py "ensemble config")."""
    spec = parse_model_config('name: "e" platform: "ensemble" max_batch_size: 8 '
                              'ensemble_scheduling { step [ { model_name: "m" '
                              'model_version: -1 } ] }')
    config = served_ensemble(spec).config_dict()
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert "model_transaction_policy" not in spec.config_dict()  # not changed
    assert "optimization" not in config  # Triton shows none for an ensemble


def test_a_model_shows_triton_s_optimization_and_preferred_batch_defaults() -> None:
    """Triton 2.51's /config of a model has `optimization` with pinned inputs and outputs,
    and a dynamic batcher that names no preferred size prefers the largest batch
    (tools/triton_diff.py "GET /v2/models/add_sub/config"); what a config gives stays."""
    cpu = torch.device("cpu")
    plain = served_spec(parse_model_config(
        'name: "m" backend: "python" max_batch_size: 8 dynamic_batching { }'),
        "model.py", [[cpu]]).config_dict()
    assert plain["optimization"] == {
        "input_pinned_memory": {"enable": True}, "output_pinned_memory": {"enable": True},
        "priority": "PRIORITY_DEFAULT", "gather_kernel_buffer_threshold": 0,
        "eager_batching": False}
    assert plain["dynamic_batching"]["preferred_batch_size"] == [8]
    given = served_spec(parse_model_config(
        'name: "m" backend: "python" max_batch_size: 8 '
        'dynamic_batching { preferred_batch_size: [ 2, 4 ] } '
        'optimization { input_pinned_memory { enable: false } priority: PRIORITY_MAX }'),
        "model.py", [[cpu]])
    config = given.config_dict()
    assert config["dynamic_batching"]["preferred_batch_size"] == [2, 4]
    assert config["optimization"]["input_pinned_memory"] == {"enable": False}
    assert config["optimization"]["output_pinned_memory"] == {"enable": True}
    assert config["optimization"]["priority"] == "PRIORITY_MAX"
    assert given.batching is not None and given.batching.preferred_batch_sizes == (2, 4)
    unbatched = served_spec(parse_model_config('name: "m" backend: "python"'), "model.py",
                            [[cpu]]).config_dict()
    assert "dynamic_batching" not in unbatched
