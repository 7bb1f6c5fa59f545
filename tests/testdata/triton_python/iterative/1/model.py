"""Iterative: a request with STEPS = n is executed n times before it is answered, by
rescheduling it (Triton's request rescheduling, `iterative_sequence`), as a model that
generates a step at a time would. The answer says how often it ran (RUNS) and the most
requests an execute had while it was running (WIDEST: other requests joined its batches);
its parameter "sequence" is the correlation id it ran under, and KEPT how many other
requests the model keeps progress for. A cancelled request (its client left) is let go of
and answered CANCELLED. Each execute sleeps 10 ms, the time a step of real work would take,
so that requests sent together overlap."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.progress = {}  # correlation id -> [runs so far, widest execute]

    def execute(self, requests):
        time.sleep(0.01)
        responses = []
        for request in requests:
            key = request.correlation_id()
            if request.is_cancelled():
                self.progress.pop(key, None)
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "cancelled", pb_utils.TritonError.CANCELLED)))
                continue
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.progress[key] = [0, 0]
            runs = self.progress.setdefault(key, [0, 0])
            count, widest = runs[0] + 1, max(runs[1], len(requests))
            steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy().ravel()[0])
            if count < steps:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                runs[:] = count, widest  # only once it is rescheduled: that may raise
                responses.append(None)
                continue
            self.progress.pop(key)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("RUNS", np.array([[count]], np.int32)),
                                pb_utils.Tensor("WIDEST", np.array([[widest]], np.int32)),
                                pb_utils.Tensor("KEPT",
                                                np.array([[len(self.progress)]], np.int32))],
                parameters={"sequence": key}))
        return responses
