"""KServe's and Kubernetes' schemas, as the models their Python SDKs generate, applied to
parsed YAML: the first key a schema does not have, a wrong type, or a missing required field,
named with where it is. For tests/deploy/test_manifests.py.

Run in a process of its own, as tests/e2e/kserve_client.py is: the `kserve` package defines
the same `inference.*` protobuf messages as tritonclient's, and one process cannot import
both. Reads [[type name, where, document], ...] as JSON on stdin; writes a JSON list with,
for each, null or the error's words.

    python tests/deploy/kube_schema.py < cases.json
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import kserve
import kubernetes.client

_PRIMITIVES = {"str": (str,), "int": (int,), "bool": (bool,), "float": (float, int)}


def _model_class(name: str) -> type:
    for module in (kserve, kubernetes.client):
        found = getattr(module, name, None)
        if isinstance(found, type):
            return found
    raise LookupError(f"no KServe or Kubernetes model named {name}")


def build(value: Any, type_name: str, where: str) -> Any:
    """`value` (parsed YAML) as the generated model `type_name` says: ValueError naming the
    first key either schema does not have, a wrong type, or a field a model requires."""
    # KServe's generator writes list[X] and dict(str, X); Kubernetes' List[X], Dict[str, X]
    list_of = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
    dict_of = re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name)
    if list_of:
        if not isinstance(value, list):
            raise ValueError(f"{where}: a list expected, not {value!r}")
        return [build(v, list_of.group(1), f"{where}[{i}]") for i, v in enumerate(value)]
    if dict_of:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: a mapping expected, not {value!r}")
        inner = dict_of.group(1) or dict_of.group(2)
        return {k: build(v, inner, f"{where}.{k}") for k, v in value.items()}
    if type_name == "object":  # IntOrString and free-form fields
        return value
    if type_name == "ResourceQuantity":  # kserve's name for a quantity: "2", 2, "4Gi"
        if not isinstance(value, (str, int)):
            raise ValueError(f"{where}: a quantity expected, not {value!r}")
        return value
    if type_name in _PRIMITIVES:
        if isinstance(value, bool) and type_name != "bool" or not isinstance(
                value, _PRIMITIVES[type_name]):
            raise ValueError(f"{where}: {type_name} expected, not {value!r}")
        return value
    model = _model_class(type_name)
    if not isinstance(value, dict):
        raise ValueError(f"{where}: a {type_name} mapping expected, not {value!r}")
    by_key = {key: attribute for attribute, key in model.attribute_map.items()}
    unknown = sorted(set(value) - set(by_key))
    if unknown:
        raise ValueError(f"{where}: {type_name} has no field {unknown[0]!r}")
    arguments = {by_key[k]: build(v, model.openapi_types[by_key[k]], f"{where}.{k}")
                 for k, v in value.items()}
    try:  # the generated models check required fields (Kubernetes' with pydantic)
        return model(**arguments)
    except ValueError as error:
        raise ValueError(f"{where}: {' '.join(str(error).split())}") from None


def main() -> int:
    found: list[str | None] = []
    for type_name, where, document in json.load(sys.stdin):
        try:
            build(document, type_name, where)
            found.append(None)
        except ValueError as error:
            found.append(str(error))
    json.dump(found, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
