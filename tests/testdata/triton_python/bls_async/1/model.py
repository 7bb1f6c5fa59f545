"""Async BLS: Y = (X + X) + (X - 1), from two add_sub calls awaited together."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[None]
            calls = [pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=[output],
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", second)])
                for output, second in (("OUTPUT0", x), ("OUTPUT1", np.ones_like(x)))]
            first, other = await asyncio.gather(*(call.async_exec() for call in calls))
            y = (pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()
                 + pb_utils.get_output_tensor_by_name(other, "OUTPUT1").as_numpy())[0]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", y.astype(np.float32))]))
        return responses
