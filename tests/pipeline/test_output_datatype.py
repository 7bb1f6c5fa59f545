"""An output a model makes in another datatype than its config's is answered as made (as
Triton does), and the server says so once for the model, not once an instance."""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run

_DOUBLED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)  # both instances busy at once
        # FP64 where the config says FP32, as numpy math on float64 data makes it
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                    "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy().astype(
                        np.float64) * 2)])
                for r in requests]
"""


def test_an_output_in_another_datatype_is_said_once_for_all_instances(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = rb.write_config(tmp_path, "doubled", """
        name: "doubled"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        """)
    (folder / "1" / "model.py").write_text(_DOUBLED)

    async def scenario() -> list[np.ndarray]:
        engine = Engine(tmp_path, placement="none")
        await engine.start(["doubled"])
        x = TensorView.from_torch(torch.tensor([1.0, 2.0]), name="X")
        results = await asyncio.gather(*(engine.infer(InferenceRequest("doubled", {"X": x}))
                                         for _ in range(4)))
        instances = engine._served.versions["doubled"][1].executors
        assert [e.batches_run > 0 for e in instances] == [True, True]  # both made FP64
        await engine.shutdown()
        return [r.outputs["Y"].numpy() for r in results]

    with caplog.at_level("WARNING", logger="tensorgate.executor"):
        answers = run(scenario())
    for answer in answers:
        assert answer.dtype == np.float64 and answer.tolist() == [2.0, 4.0]
    said = [r for r in caplog.records if "output 'Y' is FP64 where its config says FP32"
            in r.getMessage()]
    assert len(said) == 1
