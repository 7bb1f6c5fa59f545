"""BLS: Y = 10 × (X + X), the sum made by calling add_sub; STREAMED = the values the
decoupled model `repeat` sends for IN = 3, read from exec(decoupled=True), each plus 10 × the
"index" parameter its response carries, then -1 for the empty response that ends them (repeat
sends its final flag alone). Parameter
"target" names another model to call instead of add_sub: its error comes back as this
request's error."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            target = json.loads(request.parameters()).get("target", "add_sub")
            call = pb_utils.InferenceRequest(
                model_name=target, requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x[None]), pb_utils.Tensor("INPUT1", x[None])])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"BLS call failed: {answer.error().message()}",
                    answer.error().code())))
                continue
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()[0]
            count = pb_utils.Tensor("IN", np.array([3], np.int32))
            streamed = [int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0])
                        + 10 * json.loads(r.parameters())["index"]
                        if r.output_tensors() else -1  # the empty last one
                        for r in pb_utils.InferenceRequest(
                            model_name="repeat", requested_output_names=["OUT"],
                            inputs=[count]).exec(decoupled=True)]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", (total * 10).astype(np.float32)),
                pb_utils.Tensor("STREAMED", np.array(streamed, np.int32))]))
        return responses
