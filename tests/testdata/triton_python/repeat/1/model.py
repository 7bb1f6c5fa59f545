"""Decoupled: IN = n gets n responses (OUT = 0, 1, ... n-1), sent from a thread of the
model's own after execute has returned, then the final flag; -1 gets an error response;
-2 gets a response whose output is misnamed OUTPUT (its config says OUT); -3 an error
response without the final flag, then OUT = 7, then the flag. Each response carries its
place as parameter "index"."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self._answer, args=(sender, count), daemon=True).start()
        return None

    def _answer(self, sender, count):
        if count == -2:
            sender.send(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", np.array([0], np.int32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if count == -3:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "a passing error", pb_utils.TritonError.INVALID_ARG)))
            sender.send(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", np.array([7], np.int32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if count < 0:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "IN must not be negative", pb_utils.TritonError.INVALID_ARG)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for value in range(count):
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", np.array([value], np.int32))],
                parameters={"index": value}))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
