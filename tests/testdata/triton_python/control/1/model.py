"""Triton's model loading API from a model: parameter "action" ("load", "unload" or none)
says what to do with the model TARGET names (with parameter "config", a JSON config to load it
with, and "files", a JSON object of its files: "file:1/model.py" → the content in base64);
READY is then `pb_utils.is_model_ready` of it. What the API refuses comes back as this
request's error."""

import base64
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            given = json.loads(request.parameters())
            try:
                if given.get("action") == "load":
                    files = {key: base64.b64decode(value)
                             for key, value in json.loads(given.get("files", "{}")).items()}
                    pb_utils.load_model(model_name=target, config=given.get("config", ""),
                                        files=files or None)
                elif given.get("action") == "unload":
                    pb_utils.unload_model(model_name=target)
                ready = pb_utils.is_model_ready(model_name=target,
                                                model_version=given.get("version", ""))
            except pb_utils.TritonModelException as error:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(error), pb_utils.TritonError.UNAVAILABLE)))
                continue
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("READY", np.array([ready]))]))
        return responses
