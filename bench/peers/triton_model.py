"""A Triton Python-backend model (copied to <repo>/<name>/1/model.py by bench/compare.py).

What a Triton user writes to serve a PyTorch model from the Python backend: requests of one
`execute` call (the dynamic batcher's batch) are stacked, run once, and split.
"""

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.environ["TG_BENCH_PEERS"])
import workloads  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.module = workloads.load(args["model_name"])

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT__0").as_numpy() for r in requests]
        outputs = workloads.run(self.module, np.concatenate(inputs) if len(inputs) > 1 else inputs[0])
        responses, start = [], 0
        for array in inputs:
            part = outputs[start:start + len(array)]
            start += len(array)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT__0", part)]))
        return responses
