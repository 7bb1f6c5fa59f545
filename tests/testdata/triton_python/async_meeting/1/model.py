"""Decoupled with `async def execute`: each execute awaits (at most 10 s) until WAIT_FOR
executes have been in flight at once, then answers OPEN (the most that were, since none
was) with the final flag.

On Triton an async decoupled execute runs on the instance's event loop, and the next
execute begins while one awaits. A server that ran each execute to its end before the
next would make the first wait out its 10 s and answer OPEN 1."""

import asyncio
import time

import numpy as np
import triton_python_backend_utils as pb_utils

WAIT_S = 10.0


class TritonPythonModel:
    def initialize(self, args):
        self.open = 0
        self.most = 0  # in flight at once, since the last time none was

    async def execute(self, requests):
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            wait_for = max(int(pb_utils.get_input_tensor_by_name(request, "WAIT_FOR")
                               .as_numpy()[0]) for request in requests)
            deadline = time.monotonic() + WAIT_S
            while self.most < wait_for and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            seen = self.most
        finally:
            self.open -= 1
            if not self.open:
                self.most = 0
        for request in requests:
            request.get_response_sender().send(
                pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OPEN", np.array([seen], np.int32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
