"""KServe's own Python SDK as the client (tests/e2e/kserve_client.py, in a process of its
own): its REST and gRPC clients' health checks, FP32 and BYTES inference in binary and JSON,
and a bad request's error, against the shared e2e server."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.e2e.conftest import RunningServer

# (looked for, not imported: its protobuf messages clash with tritonclient's in one process)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("kserve") is None,
                                reason="KServe's SDK comes with the test extras (make test)")

SCRIPT = pathlib.Path(__file__).with_name("kserve_client.py")
VALUES = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


@pytest.fixture(scope="module")
def seen(server: RunningServer) -> dict[str, Any]:
    """What the SDK's clients got, each call once."""
    grpc_port = server.grpc_url.rsplit(":", 1)[1]
    done = subprocess.run([sys.executable, str(SCRIPT), str(server.port), grpc_port],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _identity(answer: dict[str, Any], request_id: str) -> None:
    assert answer["id"] == request_id and answer["model_name"] == "identity", answer
    output = answer["outputs"]["OUTPUT__0"]
    assert output["datatype"] == "FP32" and output["shape"] == [2, 3, 4]
    assert output["values"] == VALUES.reshape(-1).tolist()


def _shout(answer: dict[str, Any]) -> None:
    assert answer["outputs"]["text_output"]["values"] == ["HELLO", "W\u00d6RLD"], answer
    assert answer["outputs"]["text_output"]["datatype"] == "BYTES"
    assert answer["outputs"]["length"]["values"] == [5, 5]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_health_reads_as_the_sdk_expects(seen: dict[str, Any], protocol: str) -> None:
    # (KServe's REST client reads {"live": true} and {"ready": true} from the bodies)
    calls = seen[protocol]
    assert [calls["live"], calls["ready"], calls["model ready"],
            calls["missing model ready"]] == [True, True, True, False], calls


def test_rest_inference_in_binary_and_json(seen: dict[str, Any]) -> None:
    _identity(seen["rest"]["identity binary"], "rest-b")
    _identity(seen["rest"]["identity json"], "rest-j")
    _shout(seen["rest"]["shout binary"])
    _shout(seen["rest"]["shout json"])


def test_grpc_inference(seen: dict[str, Any]) -> None:
    _identity(seen["grpc"]["identity"], "grpc-1")
    _shout(seen["grpc"]["shout"])


@pytest.mark.parametrize("protocol, status", [("rest", 400), ("grpc", "INVALID_ARGUMENT")])
def test_a_bad_request_names_what_is_wrong(seen: dict[str, Any], protocol: str,
                                           status: Any) -> None:
    error = seen[protocol]["misnamed"]
    assert error["status"] == status, error
    assert "no input 'NOPE'" in error["message"], error
