"""MLServer custom runtime serving the same TorchScript models (`mlserver start <folder>`).

MLServer's REST API takes V2 JSON (no binary tensor extension), so requests carry the tensor
as a JSON `data` list; adaptive batching is on (see the model-settings.json compare.py writes).
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

import workloads


class TorchScriptRuntime(MLModel):
    async def load(self) -> bool:
        self.module = workloads.load(self.settings.name)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        batch = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        result = workloads.run(self.module, batch)
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output(name="OUTPUT__0", payload=result)])
