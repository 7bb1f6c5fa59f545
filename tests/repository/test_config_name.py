"""Triton's --model-config-name: a model's configs/<name>.pbtxt is its config where it has
one, its config.pbtxt where not (one repository shared by machines that need different
settings)."""

from __future__ import annotations

import pathlib
import re

import pytest

from tensorgate.cli import parse_serve
from tensorgate.config import ServerConfig
from tensorgate.repository.layout import (ModelRepositories, check_config_name, config_file,
                                          discover_models, load_source)
from tensorgate.repository.model_config import ModelConfigError
from tests.pipeline import repo_builder as rb


def test_a_named_config_stands_in_for_config_pbtxt_where_the_model_has_one(
        tmp_path: pathlib.Path) -> None:
    for name in ("a", "b", "c"):
        rb.add_python(tmp_path, name, max_batch=4)
    big = rb.add_named_config(tmp_path / "a", "big", 16)
    rb.add_named_config(tmp_path / "b", "small", 2)  # another machine's: not read with "big"
    rb.add_named_config(tmp_path / "c", "config", 8)  # Triton's example 2: configs/config.pbtxt

    a = load_source(tmp_path, "a", config_name="big")
    assert (a.spec.max_batch_size, a.config_source) == (16, str(big))
    assert load_source(tmp_path, "b", config_name="big").spec.max_batch_size == 4
    assert load_source(tmp_path, "c", config_name="config").spec.max_batch_size == 8
    for name in ("a", "b", "c"):  # no name: config.pbtxt, whatever configs/ holds
        source = load_source(tmp_path, name)
        assert (source.spec.max_batch_size, source.config_source) == (
            4, str(tmp_path / name / "config.pbtxt"))
    assert config_file(tmp_path / "b", "big") == tmp_path / "b" / "config.pbtxt"
    # a load request's config still stands in for either
    assert load_source(tmp_path, "a", '{"max_batch_size": 3, "backend": "python", "input": '
                       '[{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [4]}], '
                       '"output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", '
                       '"dims": [4]}]}', config_name="big").spec.max_batch_size == 3


def test_a_model_whose_only_config_is_a_named_one_is_found_with_that_name(
        tmp_path: pathlib.Path) -> None:
    """Found, listed and polled by the name's config alone (an ensemble has no model file
    that would show it is a model)."""
    rb.add_python(tmp_path, "only", max_batch=4)
    rb.add_named_config(tmp_path / "only", "big", 16)
    (tmp_path / "only" / "config.pbtxt").unlink()
    (tmp_path / "only" / "1" / "model.py").rename(tmp_path / "only" / "1" / "other.py")
    assert discover_models(tmp_path) == []
    assert discover_models(tmp_path, "big") == ["only"]
    named = ModelRepositories.of(tmp_path, "big")
    assert (named.names(), named.holder("only"), set(named.fingerprints())) == (
        ["only"], tmp_path, {"only"})
    assert ModelRepositories.of(tmp_path).names() == []


def test_an_error_in_a_named_config_names_its_file(tmp_path: pathlib.Path) -> None:
    rb.add_python(tmp_path, "a", max_batch=4)
    broken = rb.add_named_config(tmp_path / "a", "big", 4)
    broken.write_text('name: "a" max_batch_size: "x"')
    with pytest.raises(ModelConfigError, match=rf"^{re.escape(str(broken))}: "):
        load_source(tmp_path, "a", config_name="big")
    assert load_source(tmp_path, "a").spec.max_batch_size == 4


@pytest.mark.parametrize("name", ["a b", "h100\n", "a/b", "../x", ".", "..", "a\\b", "a\0"])
def test_a_config_name_is_a_file_name(name: str) -> None:
    message = (f"model config name '{name}' must be a file name without spaces or slashes: "
               "the server reads <model>/configs/<name>.pbtxt")
    with pytest.raises(ValueError) as refused:
        check_config_name(name)
    assert str(refused.value) == message
    with pytest.raises(ValueError) as refused:
        ServerConfig(model_config_name=name)
    assert str(refused.value) == f"model_config_name: {message}"
    with pytest.raises(ValueError) as refused:
        ModelRepositories.of("/tmp", name)
    assert str(refused.value) == message


def test_the_flag_and_the_variable_set_it() -> None:
    assert ServerConfig().model_config_name == ""
    assert parse_serve(["serve", "--model-config-name", "h100"], {}).model_config_name == "h100"
    assert parse_serve(["serve"], {"TENSORGATE_MODEL_CONFIG_NAME": "cpu"}
                       ).model_config_name == "cpu"
    assert parse_serve(["serve", "--model-config-name", "h100"],
                       {"TENSORGATE_MODEL_CONFIG_NAME": "cpu"}).model_config_name == "h100"
