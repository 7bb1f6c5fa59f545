"""Answers OUT = 2 × IN through each request's response sender, not execute's list (Triton
allows it since 23.10 for a model not decoupled), as the request's parameter "how" says:
"now" (the default: sent in execute with the final flag), "later" (from a thread after
execute returned), "flag apart" (the response, then the final flag alone), "twice" (a second
response, which the sender refuses), "also listed" (sent, and a response in execute's list
too), "flag only" (the final flag with no response), "nothing" (execute returns None and
sends nothing). NOTE is what the last refused send raised."""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.note = ""

    def execute(self, requests):
        hows = [json.loads(r.parameters()).get("how", "now") for r in requests]
        if "nothing" in hows:
            return None
        later = []
        listed = []
        for request, how in zip(requests, hows):
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", (value * 2).astype(np.int32)),
                pb_utils.Tensor("NOTE", np.array([[self.note.encode()]], np.object_))])
            sender = request.get_response_sender()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if how == "later":
                later.append((sender, response))
            elif how == "flag apart":
                sender.send(response)
                sender.send(flags=final)
            elif how == "twice":
                sender.send(response)
                try:
                    sender.send(response, flags=final)
                except pb_utils.TritonModelException as error:
                    self.note = str(error)
            elif how == "flag only":
                sender.send(flags=final)
            else:
                sender.send(response, flags=final)
            listed.append(response)
        if later:
            threading.Thread(target=self._send_later, args=(later,)).start()
        return listed if "also listed" in hows else None

    @staticmethod
    def _send_later(later):
        time.sleep(0.05)
        for sender, response in later:
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
