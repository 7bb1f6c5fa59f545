"""A request that fails leaves nothing in a reference cycle: its inputs (views of the
request's pooled buffers) go when it is answered, not at the garbage collector's next pass
(tests/garbage.py). The error reached the client from a future, raised from frames that held
the request's work item, whose future held the error; and a decoupled model's wrong answer
was its own cause. Found by tools/fuzz_front_ends.py. Nor does a Triton Python model's
answered request (each request held its sender's maker, which held the batch's requests:
found by bench/gc_bench.py)."""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

from tensorgate import InferenceRequest, TensorView
from tensorgate.errors import TensorgateError
from tests.garbage import cyclic_garbage
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run, serving

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "testdata" / "triton_python"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("garbage")
    rb.add_torchscript(root, "failing", rb.Failing(), [4], [4], "dynamic_batching { }")
    shutil.copytree(TESTDATA / "repeat", root / "repeat")  # decoupled, a Triton Python model
    return root


@pytest.fixture(scope="module")
def python_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Triton Python models: add_sub answers in execute's list, sent_answers through its
    senders, bls calls add_sub and repeat (decoupled)."""
    root = tmp_path_factory.mktemp("python-garbage")
    for name in ("add_sub", "sent_answers", "bls", "repeat"):
        shutil.copytree(TESTDATA / name, root / name)
    return root


def _request(model: str, name: str, value: torch.Tensor, **options: int) -> InferenceRequest:
    return InferenceRequest(model, {name: TensorView.from_torch(value, name=name)}, **options)


@pytest.mark.parametrize("case", ["raises", "error response", "wrong answer", "deadline"])
def test_a_failed_request_leaves_no_cycle(repo: pathlib.Path, collector_off: None,
                                          case: str) -> None:
    """`failing` raises for a negative input (run alone and batched); `repeat` sends an error
    response for IN -1, and an output of the wrong name for -2 (the server's error)."""
    async def scenario() -> Counter[str]:
        async with serving(repo) as engine:
            for _ in range(3):
                with pytest.raises(TensorgateError):
                    if case == "raises":
                        await engine.infer(_request("failing", "INPUT__0", -torch.ones(1, 4)))
                    elif case == "deadline":  # past its deadline before it is queued
                        await engine.infer(_request("failing", "INPUT__0", torch.ones(1, 4),
                                                    timeout_us=1))
                    else:
                        value = torch.tensor([-1 if case == "error response" else -2],
                                             dtype=torch.int32)
                        async for _ in engine.infer_stream(_request("repeat", "IN", value)):
                            pass
            return cyclic_garbage()  # (before the engine itself goes)

    assert run(scenario()) == Counter()


@pytest.mark.parametrize("model", ["add_sub", "sent_answers", "bls", "repeat"])
def test_an_answered_triton_python_request_leaves_no_cycle(
        python_repo: pathlib.Path, collector_off: None, model: str) -> None:
    """Each model answers three requests, one at a time: execute's list, the senders of a
    model not decoupled, a BLS call (of add_sub, and of decoupled repeat), a stream."""
    async def scenario() -> Counter[str]:
        async with serving(python_repo) as engine:
            for _ in range(3):
                if model == "add_sub":
                    ones = torch.ones(1, 4)
                    await engine.infer(InferenceRequest(model, {
                        name: TensorView.from_torch(ones, name=name)
                        for name in ("INPUT0", "INPUT1")}))
                elif model == "sent_answers":
                    await engine.infer(_request(model, "IN", torch.ones(1, 1, dtype=torch.int32)))
                elif model == "bls":
                    await engine.infer(_request(model, "X", torch.ones(4)))
                else:
                    async for _ in engine.infer_stream(
                            _request(model, "IN", torch.tensor([2], dtype=torch.int32))):
                        pass
            return cyclic_garbage()

    assert run(scenario()) == Counter()


def test_a_failed_load_leaves_no_cycle(repo: pathlib.Path, collector_off: None) -> None:
    """A load the engine refuses (no such model, a config that is not JSON) raises its error
    out of the task that ran it (loads go on to their end whoever waits) without a cycle."""
    async def scenario() -> Counter[str]:
        async with serving(repo) as engine:
            for name, config in (("nope", None), ("failing", "{")):
                with pytest.raises(TensorgateError):
                    await engine.load(name, config)
            return cyclic_garbage()

    assert run(scenario()) == Counter()


@pytest.mark.parametrize("how", ["unload", "reload"])
@pytest.mark.parametrize("model", ["failing", "repeat"])
def test_a_model_unloaded_or_replaced_leaves_no_cycle(repo: pathlib.Path, collector_off: None,
                                                      how: str, model: str) -> None:
    """A version that stops serving is freed then, not left in cycles for a collection the
    server may not make for a long time (the weights were released already; its executors
    held the scheduler's callbacks, the scheduler its executors; found by
    tools/fuzz_front_ends.py with model control on). A TorchScript model and a decoupled
    Triton Python one, each answering once before it goes."""
    async def scenario() -> Counter[str]:
        async with serving(repo) as engine:
            for _ in range(2):
                if model == "failing":
                    await engine.infer(_request("failing", "INPUT__0", torch.ones(1, 4)))
                else:
                    async for _ in engine.infer_stream(
                            _request("repeat", "IN", torch.tensor([2], dtype=torch.int32))):
                        pass
                if how == "unload":
                    await engine.unload(model)
                await engine.load(model)
            return cyclic_garbage()

    assert run(scenario()) == Counter()


_CONFIG = """{kind}
max_batch_size: {batch}
input [ {{ name: "{tensor[0]}" data_type: TYPE_{datatype} dims: [ -1 ] }} ]
output [ {{ name: "{tensor[1]}" data_type: TYPE_{datatype} dims: [ -1 ] }} ]
"""

_SLOW_INIT = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(0.5)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
'''


def test_a_load_the_shutdown_overtakes_serves_nothing_after_it(tmp_path: pathlib.Path) -> None:
    """A load still running when the engine shuts down ends refused, its instances stopped:
    nothing is served, nor runs, once the shutdown is done (a load's end was registered after
    the shutdown had retired everything, its instances running on)."""
    rb.write_config(tmp_path, "slow", _CONFIG.format(kind='backend: "python"', batch=0,
                                                     datatype="INT32", tensor=("IN", "OUT"))
                    ).joinpath("1", "model.py").write_text(_SLOW_INIT)

    async def scenario() -> None:
        from tensorgate.errors import UnavailableError
        from tensorgate.pipeline.engine import Engine

        engine = Engine(tmp_path)
        await engine.start([])
        loading = asyncio.ensure_future(engine.load("slow"))
        await asyncio.sleep(0.2)  # in its initialize
        await engine.shutdown()
        with pytest.raises(UnavailableError, match="shut down while it loaded"):
            await loading
        assert engine.model_names() == []
        for _ in range(200):  # a stopped instance's thread ends just after it says so
            if not [t for t in threading.enumerate() if "slow" in t.name]:
                break
            await asyncio.sleep(0.01)
        assert not [t for t in threading.enumerate() if "slow" in t.name]

    run(scenario())


def test_a_model_whose_instance_fails_to_set_up_leaves_no_cycle(
        tmp_path: pathlib.Path, collector_off: None) -> None:
    """A TorchScript model whose file is not one (torch.jit.load fails in the instance's
    setup): the load is refused, and the failed instance is freed then (the error's
    traceback from the instance's thread held the instance, whose `ready` held the error;
    the load's frame, raising it, held it in its locals; found by
    tools/fuzz_front_ends.py)."""
    rb.write_config(tmp_path, "broken", _CONFIG.format(
        kind='platform: "pytorch_libtorch"', batch=8, datatype="FP32",
        tensor=("INPUT__0", "OUTPUT__0"))
                    ).joinpath("1", "model.pt").write_bytes(b"x = 1\n")

    async def scenario() -> Counter[str]:
        async with serving(tmp_path, models=[]) as engine:
            for _ in range(2):
                with pytest.raises(TensorgateError, match="not a ZIP archive"):  # at setup
                    await engine.load("broken")
            return cyclic_garbage()

    assert run(scenario()) == Counter()


LATE_WRONG_SEND = """
    sender.send(pb_utils.InferenceResponse(  # misnamed: its config says OUT
        output_tensors=[pb_utils.Tensor("OUTPUT", np.array([0], np.int32))]),
        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


LATE_WRONG_GENERATOR = '''
import threading

import numpy as np

from tensorgate import Model

GO = threading.Event()
STARTED = []


class LateWrong(Model):
    """Decoupled, a generator: for IN 1, once GO is set, a response whose output is
    misnamed; else (its warm-up's zeros) OUT 0."""

    def forward(self, inputs):
        if int(inputs["IN"].reshape(-1)[0]) != 1:
            yield {"OUT": np.array([0], np.int32)}
            return
        STARTED.append(None)
        GO.wait(10)
        yield {"OUTPUT": np.array([0], np.int32)}
'''


@pytest.mark.parametrize("kind", ["triton", "generator"])
def test_a_wrong_answer_whose_client_left_before_the_loop_heard_of_it_leaves_no_cycle(
        tmp_path: pathlib.Path, collector_off: None, kind: str) -> None:
    """The model's wrong answer fails its request on the model's thread (a Triton model's
    sending thread, or the executor stepping a generator); its client leaves before the
    loop runs that failure (tools/fuzz_front_ends.py grpc found it, a stream reset). The
    error the request keeps must not hold the frames it was raised through, which hold the
    request."""
    if kind == "triton":
        rb.add_gated_sender(tmp_path, "late_wrong", LATE_WRONG_SEND)
    else:
        rb.add_decoupled_int32(tmp_path, "late_wrong", LATE_WRONG_GENERATOR)

    async def scenario() -> Counter[str]:
        async with serving(tmp_path) as engine:
            model = next(module for name, module in sys.modules.items()
                         if name.startswith("tensorgate_model_late_wrong")
                         and hasattr(module, "GO"))
            stream = engine.infer_stream(InferenceRequest("late_wrong", {
                "IN": TensorView.from_array(np.array([1], np.int32), name="IN")}))
            waiting = asyncio.ensure_future(stream.__anext__())
            for _ in range(1000):  # (bounded: 10 s)
                if model.STARTED:
                    break
                await asyncio.sleep(0.01)
            model.GO.set()
            time.sleep(0.3)  # holds the loop: the answer fails the request meanwhile
            waiting.cancel()  # the client leaves, before the loop runs the failure
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await stream.aclose()
            for _ in range(5):
                await asyncio.sleep(0.01)  # the failure runs on the loop
            assert engine.statistics("late_wrong")[0]["inference_stats"]["fail"]["count"] == 1
            return cyclic_garbage()  # (before the engine itself goes)

    assert run(scenario()) == Counter()
