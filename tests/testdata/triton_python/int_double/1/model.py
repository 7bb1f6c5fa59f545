"""OUT = 2 × IN: a post-processing step after a decoupled one (the repeat_doubled
ensemble)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUT", 2 * pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())])
            for request in requests]
