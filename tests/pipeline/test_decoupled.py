"""Decoupled models (`model_transaction_policy { decoupled: true }`): a Python model whose
forward yields any number of responses per request; each reaches the caller as soon as it
is made, in order; an error after some responses fails the request after them; a caller that
leaves early stops the model; unary inference is refused with a message saying how to call
it."""

from __future__ import annotations

import asyncio
import gc
import pathlib
import threading

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InternalError, InvalidArgumentError, ModelConfigError
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run


@pytest.fixture(scope="module")
def decoupled_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("decoupled")
    rb.add_counter(root, "counter")
    rb.add_counter(root, "slow_counter", delay_s=0.05)
    rb.add_torchscript(root, "scripted", rb.Identity(), [4], [4],
                       extra="model_transaction_policy { decoupled: true }")
    return root


def _lingering(prefix: str) -> list[str]:
    """Executor threads named `prefix`... still alive after each was given 5 s to exit (a
    failed load's thread reports itself stopped just before it returns)."""
    threads = [t for t in threading.enumerate() if t.name.startswith(prefix)]
    for thread in threads:
        thread.join(timeout=5)
    return [t.name for t in threads if t.is_alive()]


def _request(model: str, first: float) -> InferenceRequest:
    value = torch.full((1, 4), float(first))
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(value, name="INPUT__0")})


def test_responses_arrive_in_order_one_request_at_a_time(decoupled_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(decoupled_repo)
        await engine.start(["counter"])

        async def collect(n: float) -> list[float]:
            return [result.outputs["OUTPUT__0"].torch()[0, 0].item()
                    async for result in engine.infer_stream(_request("counter", n))]
        got = await asyncio.gather(collect(5), collect(3), collect(0))
        assert got == [[0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 2.0], []]
        stats = engine.statistics("counter")[0]
        assert stats["execution_count"] == 3 and stats["inference_count"] == 3
        with pytest.raises(InvalidArgumentError, match=r"^model 'counter' is decoupled .* "
                                                       r"gRPC ModelStreamInfer"):
            await engine.infer(_request("counter", 2))
        await engine.shutdown()
    run(scenario())


def test_an_error_after_some_responses_fails_the_request_after_them(
        decoupled_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(decoupled_repo)
        await engine.start(["counter"])
        got = []
        with pytest.raises(InternalError, match=r"^model 'counter' raised ValueError: stopped "
                                                r"after one response$"):
            async for result in engine.infer_stream(_request("counter", -3)):
                got.append(result.outputs["OUTPUT__0"].torch()[0, 0].item())
        assert got == [0.0]
        after = [r async for r in engine.infer_stream(_request("counter", 2))]
        assert len(after) == 2  # the model serves on
        await engine.shutdown()
    run(scenario())


def test_a_caller_that_leaves_after_its_request_failed_leaves_no_error_unread(
        decoupled_repo: pathlib.Path) -> None:
    """The request failed while its caller held its first response; the caller then leaves
    without reading on. Nobody is told of the failure, and nothing is logged as an error
    nobody retrieved (tools/fuzz_front_ends.py grpc-tls found it: "Future exception was
    never retrieved", a client that reset its stream)."""
    async def scenario() -> None:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: reported.append(context["message"]))
        engine = Engine(decoupled_repo)
        await engine.start(["counter"])
        stream = engine.infer_stream(_request("counter", -3))  # fails after one response
        async for _ in stream:
            break
        for _ in range(200):  # (bounded) until the failure is counted: the request is over
            if engine.statistics("counter")[0]["inference_stats"]["fail"]["count"]:
                break
            await asyncio.sleep(0.01)
        await stream.aclose()
        del stream
        gc.collect()
        await asyncio.sleep(0)
        assert reported == []
        await engine.shutdown()
    run(scenario())


def test_a_caller_that_leaves_early_stops_the_model(decoupled_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(decoupled_repo)
        await engine.start(["slow_counter"])
        import sys
        counter = next(m for n, m in sys.modules.items()
                       if n.startswith("tensorgate_model_slow_counter")).Counter
        before = counter.made
        stream = engine.infer_stream(_request("slow_counter", 1000))  # 50 s if left to run
        async for _ in stream:
            break
        await stream.aclose()
        await asyncio.sleep(0.3)
        made = counter.made - before
        assert 1 <= made <= 4  # stopped within a response or two of leaving
        rest = [r async for r in engine.infer_stream(_request("slow_counter", 2))]
        assert len(rest) == 2  # and the executor is free for the next request
        await engine.shutdown()
    run(scenario(), timeout=30)


def test_decoupled_needs_a_python_model(decoupled_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(decoupled_repo)
        with pytest.raises(ModelConfigError, match=r"decoupled: true \}' needs a Python model"):
            await engine.load("scripted")
        await engine.shutdown()
    run(scenario())
    assert _lingering("tg-exec-scripted") == []


def test_a_sequence_batched_decoupled_model_must_be_a_triton_python_model(
        tmp_path: pathlib.Path) -> None:
    """A tensorgate Model's forward yields one request's responses on the executor thread:
    it cannot stream a sequence's requests as a sequence batcher hands them on."""
    folder = rb.write_config(tmp_path, "sequence_counter", """
        name: "sequence_counter"
        backend: "python"
        max_batch_size: 4
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        sequence_batching { }
        model_transaction_policy { decoupled: true }
        """)
    (folder / "1" / "model.py").write_text(rb.COUNTER)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        with pytest.raises(ModelConfigError, match=r"'sequence_batching' with a decoupled model "
                                                   r"needs a Triton Python model \(class "
                                                   r"TritonPythonModel\)"):
            await engine.load("sequence_counter")
        await engine.shutdown()
    run(scenario())
    assert _lingering("tg-exec-sequence_counter") == []
