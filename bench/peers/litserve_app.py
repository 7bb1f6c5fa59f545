"""LitServe serving the same models: one LitAPI per workload, dynamic batching on.

LitServe takes JSON bodies, so a tensor travels as base64 of its little-endian float32 bytes:
`{"shape": [1, 3, 224, 224], "data": "<base64>"}` in, the same form out.

    python bench/peers/litserve_app.py PORT
"""

from __future__ import annotations

import base64
import sys

import litserve as ls
import numpy as np

import workloads


class TorchScriptAPI(ls.LitAPI):
    def __init__(self, name: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.name = name

    def setup(self, device: str) -> None:
        self.module = workloads.load(self.name)

    def decode_request(self, request: dict) -> np.ndarray:
        data = np.frombuffer(base64.b64decode(request["data"]), dtype=np.float32)
        return data.reshape(request["shape"])

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(inputs)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        return workloads.run(self.module, batch)

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        return [output[i:i + 1] for i in range(len(output))]

    def encode_response(self, output: np.ndarray) -> dict:
        return {"shape": list(output.shape), "data": base64.b64encode(output.tobytes()).decode()}


def main() -> None:
    apis = [TorchScriptAPI(name, api_path=f"/predict/{name}", max_batch_size=64,
                           batch_timeout=0.0) for name in workloads.WORKLOADS]
    server = ls.LitServer(apis, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), generate_client_file=False)


if __name__ == "__main__":
    main()
