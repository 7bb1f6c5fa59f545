"""Decoupled and batched, answering from threads of its own: each request waits (at most
10 s) until WAIT_FOR of the model's requests have been open at once, then answers OPEN (the
most that were, since none was open) and BATCH (how many requests its execute was given)
with the final flag.

On Triton the instance takes its next batch as soon as execute returns, so two requests in
two executes meet. A server that runs a decoupled request to its end before the next would
make the first wait out its 10 s and answer OPEN 1."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils

WAIT_S = 10.0


class TritonPythonModel:
    def initialize(self, args):
        self.open = 0
        self.most = 0  # open at once, since the last time none was
        self.changed = threading.Condition()

    def execute(self, requests):
        with self.changed:
            self.open += len(requests)
            self.most = max(self.most, self.open)
            self.changed.notify_all()
        for request in requests:
            wait_for = int(pb_utils.get_input_tensor_by_name(request, "WAIT_FOR")
                           .as_numpy().flat[0])
            threading.Thread(target=self._answer, daemon=True, args=(
                request.get_response_sender(), wait_for, len(requests))).start()
        return None

    def _answer(self, sender, wait_for, batch):
        with self.changed:
            self.changed.wait_for(lambda: self.most >= wait_for, timeout=WAIT_S)
            seen = self.most
        sender.send(pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OPEN", np.array([[seen]], np.int32)),
            pb_utils.Tensor("BATCH", np.array([[batch]], np.int32))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.changed:
            self.open -= 1
            if not self.open:
                self.most = 0
