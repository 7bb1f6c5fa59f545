"""A Triton Python model without config.pbtxt, as Triton's auto-complete example has them:
`auto_complete_config` names its inputs, outputs, batch size and batcher (tests/e2e/test_triton_python.py)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4], "optional": True}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                   {"name": "SEEN", "data_type": "TYPE_STRING", "dims": [1]}]
        # add_input / add_output fill in a tensor the config already names, and refuse one
        # whose data_type or dims it gives otherwise
        for tensor in inputs:
            auto_complete_model_config.add_input(tensor)
        config = auto_complete_model_config.as_dict()
        output_names = [o["name"] for o in config["output"]]
        for tensor in outputs:
            if tensor["name"] not in output_names:
                auto_complete_model_config.add_output(tensor)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.seen = json.dumps({"max_batch_size": config["max_batch_size"],
                                "inputs": [i["name"] for i in config["input"]],
                                "dynamic_batching": "dynamic_batching" in config})

    def execute(self, requests):
        responses = []
        for request in requests:
            first = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            second = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            total = first + second.as_numpy() if second is not None else first
            seen = np.array([[self.seen.encode()]] * len(first), dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", total.astype(np.float32)),
                pb_utils.Tensor("SEEN", seen)]))
        return responses
