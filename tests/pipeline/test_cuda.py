"""CUDA paths: graph replay equals eager, and the engine on a GPU equals the CPU result.

Skipped without a CUDA device (CI has none); bench/gpu_check.sh runs them on the device.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.builtin.nets import resnet50
from tensorgate.pipeline.cuda_graphs import GraphSet, graph_batch_sizes
from tensorgate.repository.model_config import parse_model_config
from tensorgate.tensor.pinned import cuda_available
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")]

RESNET_CONFIG = """
name: "resnet50" max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
"""


def test_graph_replay_equals_eager() -> None:
    spec = parse_model_config(RESNET_CONFIG)
    device = torch.device("cuda", 0)
    model = resnet50().to(device)
    stream = torch.cuda.Stream(device)

    def forward(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(inputs["INPUT__0"])

    with torch.inference_mode(), torch.cuda.stream(stream):
        graphs = GraphSet.capture(forward, spec, device, stream, graph_batch_sizes(spec))
        assert graphs is not None
        for rows in (1, 3, 4):  # 3 replays the size-4 graph with a stale last row
            host = torch.randn(rows, 3, 224, 224).pin_memory()
            assert graphs.covers({"INPUT__0": host}, rows)
            replayed = graphs.replay({"INPUT__0": host}, rows).clone()
            stream.synchronize()
            eager = model(host.to(device))
            torch.testing.assert_close(replayed, eager, rtol=1e-3, atol=1e-3)


def test_engine_on_gpu_equals_cpu(tmp_path: pathlib.Path) -> None:
    for name, extra in (("graphs", ""),
                        ("eager", 'parameters { key: "cuda_graphs" value { string_value: "false" } }')):
        rb.add_torchscript(tmp_path, name, rb.linear_module(), [8], [4],
                           "dynamic_batching { max_queue_delay_microseconds: 5000 }",
                           extra=f'instance_group [ {{ kind: KIND_GPU }} ]\n{extra}')
    direct = rb.linear_module().eval()
    inputs = [torch.randn(1 + i % 3, 8) for i in range(8)]

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        for model in ("graphs", "eager"):
            results = await asyncio.gather(*(engine.infer(InferenceRequest(
                model, {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")})) for x in inputs))
            for x, result in zip(inputs, results):
                out = result.outputs["OUTPUT__0"].torch()
                assert out.device.type == "cpu"
                torch.testing.assert_close(out, direct(x), rtol=1e-4, atol=1e-4)
        await engine.shutdown()
    run(scenario())
