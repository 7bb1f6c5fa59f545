"""Decoupled and sequence-batched, answering a request behind: a sequence's request k gets
its one response (OUT: the sum of the sequence's IN through k) with the final flag only
when request k+1 of the sequence comes; its END request is answered at once.

On Triton a sequence's next request runs once the execute of the one before has returned,
final flag or not. A server that waited for a request's final flag before running the next
of its sequence would never answer this model."""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(total):
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("OUT", np.array([[total]], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.open = {}  # correlation id → (sum so far, the sender of its last request)

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            flags = request.flags()
            total, waiting = (0, None) if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START \
                else self.open.pop(key)
            if waiting is not None:
                waiting.send(_response(total), flags=FINAL)
            total += int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().flat[0])
            sender = request.get_response_sender()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                sender.send(_response(total), flags=FINAL)
            else:
                self.open[key] = (total, sender)
        return None
