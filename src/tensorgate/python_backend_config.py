"""`pb_utils.ModelConfig`: what a Triton Python model's `auto_complete_config` fills in.

Triton calls `TritonPythonModel.auto_complete_config(config)` once at load, before any
instance exists, so that a model can name its own inputs, outputs, batch size, batcher and
transaction policy: a repository may then hold a `model.py` with no config.pbtxt at all, or
one that gives only what the model does not say. The config is Triton's `/config` JSON as a
dict (`as_dict()`); each setter refuses, with a ValueError naming the model, what would
contradict the config the repository gave (pipeline/auto_complete.py turns that into a
failed load). Written from Triton's documentation of this API; no code of its is used.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["ModelConfig"]

_TENSOR_KEYS = {"input": ("name", "data_type", "dims", "optional"),
                "output": ("name", "data_type", "dims")}
_OTHER_SCHEDULERS = ("sequence_batching", "ensemble_scheduling")


class ModelConfig:
    """A model's config while `auto_complete_config` completes it (Triton's API)."""

    def __init__(self, model_config: str | Mapping[str, Any]) -> None:
        config = (json.loads(model_config) if isinstance(model_config, str)
                  else copy.deepcopy(dict(model_config)))
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        """The config as it stands (Triton's /config JSON: `"data_type": "TYPE_FP32"`)."""
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """The most requests' rows the model takes in one execute. A config that gives a
        nonzero value keeps it when it is not more than the model's (as Triton documents);
        more is an error."""
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) \
                or max_batch_size < 0:
            raise ValueError(f"auto-complete-config function for model '{self._name()}' "
                             f"specified max_batch_size {max_batch_size!r}; it must be an "
                             "integer, 0 or more")
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {configured}, but "
                             f"auto-complete-config function for model '{self._name()}' "
                             f"specified max_batch_size {max_batch_size}")
        if configured == 0:
            self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Batch requests with the dynamic batcher's defaults, unless the config already
        chose a batcher (its dynamic_batching settings are kept)."""
        for other in _OTHER_SCHEDULERS:
            if other in self._config:
                raise ValueError(f"configuration specified scheduling_choice as '{other}', but "
                                 f"auto-complete-config function for model '{self._name()}' "
                                 "tries to set scheduling_choice as 'dynamic_batching'")
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:  # Triton names it `input`
        """An input `{"name", "data_type", "dims"[, "optional"]}`; one the config already
        names gets the model's type and dims, unless the config gave others."""
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        """An output `{"name", "data_type", "dims"}`, as add_input."""
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        """`{"decoupled": True}` for a model that answers through response senders."""
        unknown = sorted(set(transaction_policy_dict) - {"decoupled"})
        if unknown:
            raise ValueError(f"model transaction property in auto-complete-config function "
                             f"for model '{self._name()}' contains property other than "
                             f"'decoupled': {', '.join(map(str, unknown))}")
        if "decoupled" not in transaction_policy_dict:
            return
        wanted = transaction_policy_dict["decoupled"]
        if not isinstance(wanted, bool):
            raise ValueError(f"auto-complete-config function for model '{self._name()}': "
                             f"'decoupled' is {wanted!r}; it must be True or False")
        policy = self._config.setdefault("model_transaction_policy", {})
        if policy.get("decoupled", wanted) != wanted:
            raise ValueError(f"trying to change decoupled property in auto-complete-config "
                             f"for model '{self._name()}', which is already set to "
                             f"{policy['decoupled']}")
        policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: Mapping[str, Any]) -> None:
        model = self._name()
        if not isinstance(tensor, Mapping):
            raise ValueError(f"{kind} in auto-complete-config function for model '{model}' "
                             f"is a {type(tensor).__name__}, not a dict")
        name = tensor.get("name")
        allowed = _TENSOR_KEYS[kind]
        extra = sorted(str(key) for key in tensor if key not in allowed)
        if extra:
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model "
                             f"'{model}' contains property other than "
                             f"{', '.join(repr(k) for k in allowed)}: {', '.join(extra)}")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                named = f" '{name}'" if name is not None else ""
                raise ValueError(f"{kind}{named} in auto-complete-config function for model "
                                 f"'{model}' is missing '{required}' property")
        wanted = {key: (list(value) if key == "dims" else value)
                  for key, value in tensor.items()}
        for current in self._config[kind]:
            if current.get("name") != name:
                continue
            given_type = current.get("data_type", "TYPE_INVALID")
            if given_type not in ("", "TYPE_INVALID") and given_type != wanted["data_type"]:
                raise ValueError(f"unable to load model '{model}', configuration expects "
                                 f"datatype {given_type} for {kind} '{name}', model provides "
                                 f"{wanted['data_type']}")
            given_dims = list(current.get("dims") or [])
            if given_dims and given_dims != wanted["dims"]:
                raise ValueError(f"model '{model}', tensor '{name}': the model expects dims "
                                 f"{wanted['dims']} but the model configuration specifies "
                                 f"dims {given_dims}")
            current.update(wanted)
            return
        self._config[kind].append(wanted)
