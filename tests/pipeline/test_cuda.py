"""CUDA paths: graph replay equals eager, and the engine on a GPU equals the CPU result.

Skipped without a CUDA device (CI has none); bench/gpu_check.sh runs them on the device.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
from collections.abc import Iterator

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InternalError
from tensorgate.builtin.nets import resnet50
from tensorgate.pipeline.cuda_graphs import GraphSet, graph_batch_sizes
from tensorgate.pipeline.instance_plan import capability
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


@contextlib.contextmanager
def _logged(name: str) -> Iterator[list[str]]:
    """The messages logger `name` logs at INFO or above meanwhile."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger, handler = logging.getLogger(name), Keep(logging.INFO)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_engine_on_gpu_equals_cpu(tmp_path: pathlib.Path) -> None:
    """KIND_GPU instances with and without CUDA graphs, one with the graphs its config's
    graph_spec names (batches of 1-2 rows replay size 2, 3-4 size 4, 5-8 run eagerly), and
    one of no instance group on an Engine told device="cuda" (the first GPU: a device without
    an index once failed its load, "Expected a torch.device with a specified index")."""
    gpu = "instance_group [ { kind: KIND_GPU } ]"
    models = ("graphs", "eager", "sized", "unplaced")
    for name, extra in (("graphs", gpu),
                        ("eager", gpu + '\nparameters { key: "cuda_graphs" value { '
                                        'string_value: "false" } }'),
                        ("sized", gpu + "\noptimization { cuda { graph_spec [ "
                                        "{ batch_size: 4 }, { batch_size: 2 } ] } }"),
                        ("unplaced", "")):
        rb.add_torchscript(tmp_path, name, rb.linear_module(), [8], [4],
                           "dynamic_batching { max_queue_delay_microseconds: 5000 }",
                           extra=extra)
    direct = rb.linear_module().eval()
    inputs = [torch.randn(1 + i % 3, 8) for i in range(8)]

    async def scenario() -> None:
        engine = Engine(tmp_path, device="cuda")
        await engine.start()
        for model in models:
            results = await asyncio.gather(*(engine.infer(InferenceRequest(
                model, {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")})) for x in inputs))
            for x, result in zip(inputs, results):
                out = result.outputs["OUTPUT__0"].torch()
                assert out.device.type == "cpu"
                torch.testing.assert_close(out, direct(x), rtol=1e-4, atol=1e-4)
        await engine.shutdown()
    with _logged("tensorgate.executor") as logged:  # (gpu_check.sh runs without caplog)
        run(scenario())
    said = [m for m in logged if "has CUDA graphs" in m]
    assert "model sized: instance 0 has CUDA graphs for batch sizes 2, 4" in said, said
    assert any(m.startswith("model graphs: ") and m.endswith("1, 2, 3, 4, 5, 6, 7, 8")
               for m in said), said
    assert not any(m.startswith("model eager: ") for m in said), said


GPU_STEPS = '''
from tensorgate import Model


class GpuSteps(Model):
    """For an input whose first value is n (on the GPU), yields n responses, the k-th the
    input times k, made on the device."""

    def forward(self, inputs):
        x = inputs["INPUT__0"]
        assert x.is_cuda, x.device
        for k in range(int(x.flatten()[0].item())):
            yield {"OUTPUT__0": x * k}
'''


def test_interleaved_generators_on_gpu(tmp_path: pathlib.Path) -> None:
    """A decoupled Model on the GPU, two requests stepped in turn (streams_per_instance 2):
    each response comes to the host whole and in order."""
    folder = rb.write_config(tmp_path, "gpu_steps", """
        name: "gpu_steps"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        model_transaction_policy { decoupled: true }
        instance_group [ { kind: KIND_GPU } ]
        parameters { key: "streams_per_instance" value { string_value: "2" } }
        """)
    (folder / "1" / "model.py").write_text(GPU_STEPS)

    async def collect(engine: Engine, n: int) -> list[list[float]]:
        x = torch.full((4,), float(n))
        request = InferenceRequest("gpu_steps", {"INPUT__0": TensorView.from_torch(
            x, name="INPUT__0")})
        got = []
        async for result in engine.infer_stream(request):
            out = result.outputs["OUTPUT__0"].torch()
            assert out.device.type == "cpu"
            got.append(out.tolist())
        return got

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        results = await asyncio.gather(*(collect(engine, n) for n in (5, 3, 7)))
        for n, got in zip((5, 3, 7), results):
            assert got == [[float(n * k)] * 4 for k in range(n)]
        await engine.shutdown()
    run(scenario())


class _ComplexSecond(torch.nn.Module):
    """A 1 MB row home first, then an output torch has no protocol type for."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.repeat(1, 256), torch.complex(x, x)


def test_a_model_failing_in_its_outputs_on_gpu_fails_alone(tmp_path: pathlib.Path) -> None:
    """Each batch of `failing` comes home (a 1 MB row, then a complex output) and fails: its
    requests get the model's error naming the output and dtype, as on a CPU (a 500, not the
    400 of a client's fault), while `echo`'s answers, whose pooled buffers are the size of
    that first output, come back intact."""
    gpu = "instance_group [ { kind: KIND_GPU } ]\ndynamic_batching { }"
    folder = rb.write_config(tmp_path, "failing", f"""
        name: "failing"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [1024] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [262144] }},
                 {{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [1024] }} ]
        {gpu}
        """)
    torch.jit.script(_ComplexSecond().eval()).save(str(folder / "1" / "model.pt"))
    rb.add_torchscript(tmp_path, "echo", rb.Identity(), [262144], [262144], gpu)

    async def echo(engine: Engine, seed: int) -> None:
        x = torch.full((1, 262144), float(seed))
        result = await engine.infer(InferenceRequest("echo", {
            "INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))
        torch.testing.assert_close(result.outputs["OUTPUT__0"].torch(), x, rtol=0, atol=0)

    async def failing(engine: Engine) -> None:
        x = torch.randn(1, 1024)
        with pytest.raises(InternalError, match=r"^model 'failing' output 'OUTPUT__1' is "
                                                r"torch\.complex64, which no protocol "
                                                r"datatype holds; its config says FP32$"):
            await engine.infer(InferenceRequest("failing", {
                "INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            for _ in range(4):
                await asyncio.gather(*(echo(engine, seed) for seed in range(32)),
                                     *(failing(engine) for _ in range(32)))
        finally:
            await engine.shutdown()
    run(scenario())


def test_unloading_while_another_model_captures(tmp_path: pathlib.Path) -> None:
    """An instance's teardown (a device-wide synchronize, empty_cache) waits for another's
    capture to end: `late` loads (a ResNet-50's graphs, a few seconds of capture) while
    `early` unloads, and both are whole: `late` answers as the network does."""
    gpu = "instance_group [ { kind: KIND_GPU } ]\ndynamic_batching { }"
    rb.add_torchscript(tmp_path, "early", rb.linear_module(), [8], [4], gpu)
    folder = rb.write_config(tmp_path, "late", RESNET_CONFIG.replace(
        'name: "resnet50"', 'name: "late" platform: "pytorch_libtorch"') + gpu)
    network = resnet50().eval()
    torch.jit.script(network).save(str(folder / "1" / "model.pt"))
    x = torch.randn(1, 3, 224, 224)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start(["early"])
        try:
            await asyncio.gather(engine.load("late"), engine.unload("early"))
            result = await engine.infer(InferenceRequest("late", {
                "INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))
            with torch.inference_mode():  # (on the GPU too: TF32 convolutions there)
                expected = network.to("cuda")(x.to("cuda")).cpu()
            torch.testing.assert_close(result.outputs["OUTPUT__0"].torch(), expected,
                                       rtol=1e-3, atol=1e-3)
        finally:
            await engine.shutdown()
    run(scenario())


def test_a_gpu_instance_loads_the_file_its_compute_capability_names(
        tmp_path: pathlib.Path) -> None:
    """cc_model_filenames: `named` names a file for this GPU's capability (a module that
    doubles the default's answer) and one for another capability; its GPU instance loads
    the first. `other` names only the other capability: the default file."""
    here = capability(torch.device("cuda", 0))
    elsewhere = "1.0" if here != "1.0" else "2.0"
    doubled = torch.nn.Sequential(rb.linear_module(), _Times(2.0)).eval()
    for name, files in (("named", {here: "model_here.pt", elsewhere: "model_else.pt"}),
                        ("other", {elsewhere: "model_else.pt"})):
        extra = "instance_group [ { kind: KIND_GPU } ]\n" + "\n".join(
            f'cc_model_filenames {{ key: "{key}" value: "{file}" }}'
            for key, file in files.items())
        rb.add_torchscript(tmp_path, name, rb.linear_module(), [8], [4], extra=extra)
        torch.jit.script(doubled).save(str(tmp_path / name / "1" / "model_here.pt"))
        torch.jit.script(torch.nn.Identity()).save(str(tmp_path / name / "1" / "model_else.pt"))
    x = torch.randn(2, 8)
    default = rb.linear_module().eval()(x)

    async def scenario() -> dict[str, torch.Tensor]:
        engine = Engine(tmp_path, device="cuda")
        await engine.start()
        try:
            answers = {}
            for model in ("named", "other"):
                result = await engine.infer(InferenceRequest(
                    model, {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))
                answers[model] = result.outputs["OUTPUT__0"].torch()
            return answers
        finally:
            await engine.shutdown()
    answers = run(scenario())
    torch.testing.assert_close(answers["named"], default * 2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(answers["other"], default, rtol=1e-4, atol=1e-4)


class _Times(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor
