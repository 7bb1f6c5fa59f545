"""Says what a Triton Python model is given: REPORT is a JSON object of initialize's args
and of the request (id, parameters, outputs asked for, input types, and how many times
execute has been called since the model was loaded, this call included), with what
get_model_dir() says in initialize, in execute and on a thread of its own; UPPER is TEXT in capitals.
A request with parameter "count" gets that many responses back for the call, rightly or not;
with "wrong": "dtype" or "missing" its REPORT is of the wrong type, or left out. Each response
carries parameters (its row count, a flag, a float, a string; with "wrong": "parameter" one
that no protocol can carry)."""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.calls = 0
        self.model_dir = pb_utils.get_model_dir()
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
            json.loads(args["model_config"]))

    def execute(self, requests):
        self.calls += 1
        seen = []  # what get_model_dir says on a thread of the model's own
        thread = threading.Thread(target=lambda: seen.append(pb_utils.get_model_dir()))
        thread.start()
        thread.join()
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            report = {
                "args": self.args,
                "config": json.loads(self.args["model_config"]),
                "id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "outputs": request.requested_output_names(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "calls": self.calls,
                "model_dir": [self.model_dir, pb_utils.get_model_dir(), seen[0]],
                "decoupled": self.decoupled,
                "text": {"dtype": str(text.as_numpy().dtype), "shape": text.shape(),
                         "triton_dtype": text.triton_dtype(), "cpu": text.is_cpu()},
            }
            upper = np.array([item.upper() for item in text.as_numpy().reshape(-1)],
                             dtype=np.object_).reshape(text.as_numpy().shape)
            outputs = [pb_utils.Tensor("UPPER", upper),
                       pb_utils.Tensor("REPORT", np.array([json.dumps(report)], np.object_))]
            wrong = report["parameters"].get("wrong")
            if wrong == "dtype":  # REPORT as numbers, where the config says TYPE_STRING
                outputs[1] = pb_utils.Tensor("REPORT", np.zeros(1, np.float32))
            elif wrong == "missing":
                outputs = outputs[:1]
            parameters = {"rows": len(text.as_numpy()), "cpu": text.is_cpu(), "scale": 0.25,
                          "model": "inspect"}
            if wrong == "parameter":
                parameters["nested"] = {"not": "a scalar"}
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs,
                                                        parameters=parameters))
        wanted = json.loads(requests[0].parameters()).get("count")
        return responses * wanted if wanted is not None else responses
