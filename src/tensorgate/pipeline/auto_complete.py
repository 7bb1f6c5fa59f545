"""A Triton Python model's `auto_complete_config`: its config completed by its own code.

Triton calls `TritonPythonModel.auto_complete_config(pb_utils.ModelConfig)` once at load, in
an interpreter it then throws away, and serves the config it returns; a repository can so
hold a `model.py` without config.pbtxt, or a config without inputs and outputs. Here the
model file is run once more, as a module of its own that is dropped afterwards (so its
module-level code runs once for this and once per instance, as in Triton), off the event
loop, before the config is checked. `complete_config` is load_source's `complete` step.
"""

from __future__ import annotations

import itertools
import pathlib
import sys
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError
from tensorgate.pipeline.runner import import_model_file
from tensorgate.python_backend_config import ModelConfig
from tensorgate.repository.layout import artifact_file
from tensorgate.repository.model_config import config_json, model_config_from_json

__all__ = ["complete_config"]

_imports = itertools.count()  # each completion imports the file under a name of its own


def complete_config(config: pb.ModelConfig, folder: pathlib.Path) -> pb.ModelConfig:
    """`config` as the model in `folder` completes it; unchanged for a model that is not a
    Triton Python model with an `auto_complete_config`."""
    try:
        path, kind = artifact_file(folder, config)
    except ModelConfigError:
        return config  # loading the version says what is missing
    if kind != "python" or b"auto_complete_config" not in path.read_bytes():
        return config  # not worth running the file for
    module_name = f"tensorgate_auto_complete_{next(_imports)}"
    try:
        try:
            module = import_model_file(path, module_name)
        except ModelConfigError:
            raise
        except Exception as error:
            raise ModelConfigError(str(path), f"cannot be imported: {type(error).__name__}: "
                                              f"{error}") from error
        triton_class = getattr(module, "TritonPythonModel", None)
        method = getattr(triton_class, "auto_complete_config", None)
        if method is None:
            return config
        given = ModelConfig(config_json(config))
        try:
            returned = method(given)
        except Exception as error:
            raise ModelConfigError(str(path), f"auto_complete_config failed: "
                                              f"{type(error).__name__}: {error}") from None
    finally:
        sys.modules.pop(module_name, None)
    if not isinstance(returned, ModelConfig):
        raise ModelConfigError(str(path), f"auto_complete_config returned a "
                                          f"{type(returned).__name__}; it must return the "
                                          "pb_utils.ModelConfig it was given")
    completed: dict[str, Any] = returned.as_dict()
    return model_config_from_json(completed, f"{path}: the config auto_complete_config "
                                             "returned")
