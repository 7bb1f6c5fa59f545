"""Decoupled and iterative, as in Triton's decoupled rescheduling example but kept per
sequence: IN = n gets n responses, one an execute, OUT = how many are still to come after
it (n-1 down to 0). Every execute but a request's last sends its response and reschedules
the request; the last sends it with the final flag. Each response carries parameter "batch":
how many requests its execute had.

IN = -1 checks the first run's sender once rescheduled: the rerun sends through it, and
answers OUT 0 with what that raised as parameter "stale" (and the final flag)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}  # correlation id → responses still to send
        self.first_senders = {}  # correlation id → an IN = -1 request's first sender

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            if self._stale_sender_check(request, key, len(requests)):
                continue
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "IN")
                                     .as_numpy().flat[0])
            self.left[key] -= 1
            response = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", np.array([[self.left[key]]], np.int32))],
                parameters={"batch": len(requests)})
            sender = request.get_response_sender()
            if self.left[key] <= 0:
                del self.left[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None

    def _stale_sender_check(self, request, key, batch):
        first = self.first_senders.pop(key, None)
        if first is not None:  # the rerun
            try:
                first.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([[-1]], np.int32))]))
                stale = "sent"
            except pb_utils.TritonModelException as error:
                stale = str(error)
            request.get_response_sender().send(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", np.array([[0]], np.int32))],
                parameters={"batch": batch, "stale": stale}),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return True
        if int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().flat[0]) == -1:
            self.first_senders[key] = request.get_response_sender()
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return True
        return False
