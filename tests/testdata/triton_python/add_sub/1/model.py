"""Sum and difference of two inputs, written against Triton's Python-backend API only.

OUTPUT0 = INPUT0 + INPUT1 (made in torch, through DLPack), OUTPUT1 = INPUT0 - INPUT1 (numpy),
REQUESTS = how many requests the execute call that answered this one had. A request whose
INPUT0 has a negative value gets an INVALID_ARG error of its own; a request with parameter
"explode" makes execute raise (every request of that call fails). finalize() leaves a file
named "finalized" in the model's directory. Custom metrics (Triton's API): a counter of the
rows summed and a histogram of the requests each execute call had, per instance.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack, to_dlpack


class TritonPythonModel:
    def initialize(self, args):
        self.directory = args["model_repository"]
        config = json.loads(args["model_config"])
        self.out1_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT1")["data_type"])
        pb_utils.Logger.log_info(f"add_sub: initialized as {args['model_instance_name']}")
        labels = {"model": args["model_name"], "instance": args["model_instance_name"]}
        # Triton refuses a Metric whose MetricFamily was collected ("Invalid metric
        # operation as the corresponding 'MetricFamily' has been deleted"): keep both
        self.rows_family = pb_utils.MetricFamily(
            name="add_sub_rows_total", description="Rows add_sub has summed",
            kind=pb_utils.MetricFamily.COUNTER)
        self.rows = self.rows_family.Metric(labels=labels)
        self.batched_family = pb_utils.MetricFamily(
            name="add_sub_requests_per_execute", description="Requests of each execute call",
            kind=pb_utils.MetricFamily.HISTOGRAM)
        self.batched = self.batched_family.Metric(labels=labels, buckets=[1, 2, 4, 8])

    def execute(self, requests):
        self.batched.observe(len(requests))
        responses = []
        for request in requests:
            if json.loads(request.parameters()).get("explode"):
                raise pb_utils.TritonModelException("asked to explode")
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            if (in0.as_numpy() < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "INPUT0 must not be negative", pb_utils.TritonError.INVALID_ARG)))
                continue
            total = from_dlpack(in0.to_dlpack()) + from_dlpack(in1.to_dlpack())
            difference = (in0.as_numpy() - in1.as_numpy()).astype(self.out1_dtype)
            rows = in0.as_numpy().shape[0]
            self.rows.increment(rows)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(total)),
                pb_utils.Tensor("OUTPUT1", difference),
                pb_utils.Tensor("REQUESTS", np.full((rows, 1), len(requests), np.int32)),
            ]))
        return responses

    def finalize(self):
        with open(os.path.join(self.directory, "finalized"), "w") as marker:
            marker.write("yes")
