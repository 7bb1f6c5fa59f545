"""KServe's own Python SDK (`kserve`) against a running server: what its REST and gRPC
clients get back, printed as one JSON object for tests/e2e/test_kserve_client.py.

Run in a process of its own: the SDK's generated protobuf module defines the same
`inference.*` messages as tritonclient's, and one process cannot import both.

    python tests/e2e/kserve_client.py HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable
from typing import Any

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

VALUES = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


async def _outcome(call: Awaitable[Any]) -> Any:
    """What a call returned, or the error it raised: its type, status and message."""
    try:
        return await call
    except Exception as error:  # noqa: BLE001 - reported to the test, which asserts on it
        response = getattr(error, "response", None)
        code = getattr(error, "code", None)
        return {"error": type(error).__name__,
                "status": (response.status_code if response is not None
                           else code().name if callable(code) else None),
                "message": (response.text if response is not None
                            else error.details() if hasattr(error, "details") else str(error))}


def _identity(binary: bool, request_id: str) -> InferRequest:
    tensor = InferInput("INPUT__0", list(VALUES.shape), "FP32")
    tensor.set_data_from_numpy(VALUES, binary_data=binary)
    return InferRequest(model_name="identity", infer_inputs=[tensor], request_id=request_id,
                        request_outputs=[RequestedOutput("OUTPUT__0",
                                                         {"binary_data": binary})])


def _shout(binary: bool) -> InferRequest:
    tensor = InferInput("text_input", [2, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"hello"], ["w\u00f6rld".encode()]], dtype=np.object_),
                               binary_data=binary)
    return InferRequest(model_name="shout", infer_inputs=[tensor])


def _misnamed() -> InferRequest:
    tensor = InferInput("NOPE", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.float32), binary_data=False)
    return InferRequest(model_name="identity", infer_inputs=[tensor])


def _answer(result: Any) -> Any:
    """An InferResponse as JSON: its id and each output's datatype, shape and values."""
    if isinstance(result, dict):
        return result
    outputs = {}
    for output in result.outputs:
        array = output.as_numpy()
        values = [item.decode() if isinstance(item, bytes) else item
                  for item in array.reshape(-1).tolist()]
        outputs[output.name] = {"datatype": output.datatype, "shape": list(array.shape),
                                "values": values}
    return {"id": result.id, "model_name": result.model_name, "outputs": outputs}


async def _rest(port: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    try:
        return {
            "live": await _outcome(client.is_server_live(base)),
            "ready": await _outcome(client.is_server_ready(base)),
            "model ready": await _outcome(client.is_model_ready(base, "identity")),
            "missing model ready": await _outcome(client.is_model_ready(base, "missing")),
            "identity binary": _answer(await _outcome(
                client.infer(base, _identity(True, "rest-b"), model_name="identity"))),
            "identity json": _answer(await _outcome(
                client.infer(base, _identity(False, "rest-j"), model_name="identity"))),
            "shout binary": _answer(await _outcome(
                client.infer(base, _shout(True), model_name="shout"))),
            "shout json": _answer(await _outcome(
                client.infer(base, _shout(False), model_name="shout"))),
            "misnamed": await _outcome(client.infer(base, _misnamed(), model_name="identity")),
        }
    finally:
        await client.close()


async def _grpc(port: int) -> dict[str, Any]:
    client = InferenceGRPCClient(f"127.0.0.1:{port}", timeout=30)
    try:
        return {
            "live": await _outcome(client.is_server_live()),
            "ready": await _outcome(client.is_server_ready()),
            "model ready": await _outcome(client.is_model_ready("identity")),
            "missing model ready": await _outcome(client.is_model_ready("missing")),
            "identity": _answer(await _outcome(client.infer(_identity(True, "grpc-1")))),
            "shout": _answer(await _outcome(client.infer(_shout(True)))),
            "misnamed": await _outcome(client.infer(_misnamed())),
        }
    finally:
        await client.close()


async def _main(http_port: int, grpc_port: int) -> None:
    found = {"rest": await _rest(http_port), "grpc": await _grpc(grpc_port)}
    print(json.dumps(found, default=repr))


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]), int(sys.argv[2])))
