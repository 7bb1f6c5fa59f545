"""Ensembles (`platform: "ensemble"`): steps run as soon as their inputs exist (independent
ones at once), each a request to its model that batches with everyone else's; tensors pass
between steps as views; composing models load with the ensemble; bad step graphs are refused
at load with the step and tensor named; a failing step fails the request, naming the step."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InternalError, ModelConfigError
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import BATCHING, run

CHAIN = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "RAW" data_type: TYPE_FP32 dims: [4] }} ]
output [ {{ name: "FINAL" data_type: TYPE_FP32 dims: [4] }},
         {{ name: "ONCE" data_type: TYPE_FP32 dims: [4] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{first}" model_version: -1
     input_map {{ key: "INPUT__0" value: "RAW" }} output_map {{ key: "OUTPUT__0" value: "MID" }} }},
  {{ model_name: "scaled" model_version: -1
     input_map {{ key: "INPUT__0" value: "MID" }}
     output_map {{ key: "OUTPUT__0" value: "FINAL" }} }},
  {{ model_name: "copy" model_version: 1
     input_map {{ key: "INPUT__0" value: "RAW" }}
     output_map {{ key: "OUTPUT__0" value: "ONCE" }} }}
] }}
"""


def _ensemble(root: pathlib.Path, name: str, text: str) -> None:
    rb.write_config(root, name, text)  # its version directory stays empty, as in Triton


@pytest.fixture(scope="module")
def ensemble_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("ensembles")
    rb.add_python(root, "scaled", BATCHING)
    rb.add_torchscript(root, "copy", rb.Identity(), [4], [4], BATCHING)
    rb.add_torchscript(root, "failing", rb.Failing(), [4], [4], BATCHING)
    rb.add_counter(root, "counter")
    _ensemble(root, "chain", CHAIN.format(name="chain", first="scaled"))
    _ensemble(root, "broken_step", CHAIN.format(name="broken_step", first="failing"))
    _ensemble(root, "streams", CHAIN.format(name="streams", first="counter"))
    return root


def _request(model: str, value: torch.Tensor, **kw) -> InferenceRequest:
    return InferenceRequest(model, {"RAW": TensorView.from_torch(value, name="RAW")}, **kw)


def test_steps_chain_and_branch_and_load_their_models(ensemble_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(ensemble_repo)
        await engine.start(["chain"])  # scaled and copy load with it
        assert engine.model_names() == ["chain", "copy", "scaled"]
        x = torch.arange(8.0).reshape(2, 4)
        result = await engine.infer(_request("chain", x))
        assert torch.equal(result.outputs["FINAL"].torch(), 2 * (2 * x + 1) + 1)
        assert torch.equal(result.outputs["ONCE"].torch(), x)
        assert result.ledger.bytes == 0  # views from step to step, and a batch of one each
        assert engine.spec("chain").platform == "ensemble"
        stats = engine.statistics("chain")[0]
        assert stats["inference_count"] == 2 and stats["inference_stats"]["success"]["count"] == 1
        await engine.shutdown()
    run(scenario())


def test_unload_dependents_unloads_the_steps_no_other_ensemble_calls(
        ensemble_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(ensemble_repo)
        await engine.start(["chain", "broken_step"])
        assert engine.model_names() == ["broken_step", "chain", "copy", "failing", "scaled"]
        await engine.unload("chain", dependents=True)  # broken_step still calls both
        assert engine.model_names() == ["broken_step", "copy", "failing", "scaled"]
        await engine.unload("broken_step", dependents=True)
        assert engine.model_names() == []
        await engine.load("chain")
        await engine.unload("chain")  # without dependents: only the ensemble
        assert engine.model_names() == ["copy", "scaled"]
        await engine.shutdown()
    run(scenario())


def test_concurrent_ensemble_requests_batch_in_their_steps(ensemble_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(ensemble_repo)
        await engine.start(["chain"])
        values = [torch.full((1, 4), float(i)) for i in range(16)]
        results = await asyncio.gather(*(engine.infer(_request("chain", v, outputs=["FINAL"]))
                                         for v in values))
        for value, result in zip(values, results):
            assert torch.equal(result.outputs["FINAL"].torch(), 4 * value + 3)
            assert list(result.outputs) == ["FINAL"]
        scaled = engine.statistics("scaled")[0]
        assert scaled["inference_count"] == 32
        assert scaled["execution_count"] < 32  # steps of different requests shared batches
        await engine.shutdown()
    run(scenario())


def test_a_failing_step_fails_the_request_naming_it(ensemble_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(ensemble_repo)
        await engine.start(["broken_step"])
        with pytest.raises(InternalError, match=r"^ensemble 'broken_step', step 'failing': "
                                                r"model 'failing' raised RuntimeError"):
            await engine.infer(_request("broken_step", -torch.ones(1, 4)))
        fine = await engine.infer(_request("broken_step", torch.ones(1, 4)))
        assert torch.equal(fine.outputs["FINAL"].torch(), torch.full((1, 4), 5.0))
        assert engine.statistics("broken_step")[0]["inference_stats"]["fail"]["count"] == 1
        await engine.shutdown()
    run(scenario())


STEP = ('{{ model_name: "{model}" model_version: -1 input_map {{ key: "INPUT__0" value: '
        '"{src}" }} output_map {{ key: "OUTPUT__0" value: "{dst}" }} }}')


def _graph(*steps: tuple[str, str, str]) -> str:
    body = ",\n".join(STEP.format(model=m, src=s, dst=d) for m, s, d in steps)
    return ('name: "bad" platform: "ensemble" max_batch_size: 8\n'
            'input [ { name: "RAW" data_type: TYPE_FP32 dims: [4] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [4] } ]\n'
            f"ensemble_scheduling {{ step [ {body} ] }}")


@pytest.mark.parametrize("text, message", [
    (_graph(("scaled", "RAW", "A"), ("scaled", "B", "OUT")),
     r"ensemble step 'scaled' reads \['B'\], which no ensemble input or step makes"),
    (_graph(("scaled", "RAW", "A")), r"ensemble outputs \['OUT'\] are made by no step"),
    (_graph(("scaled", "RAW", "OUT"), ("copy", "RAW", "OUT")),
     r"ensemble step 2 \('copy'\) makes tensor 'OUT', already made by ensemble step 1"),
    (_graph(("scaled", "B", "A"), ("copy", "A", "B"), ("copy", "RAW", "OUT")),
     r"ensemble steps 'scaled', 'copy' wait on each other's outputs \(a cycle\)"),
    (_graph(("scaled", "RAW", "OUT")).replace('key: "INPUT__0"', 'key: "IMAGE"'),
     r"ensemble step 'scaled' maps inputs \['IMAGE'\]; the model's inputs are \['INPUT__0'\]"),
    (_graph(("nowhere", "RAW", "OUT")), r"no model 'nowhere' in repository"),
    (_graph(("scaled", "RAW", "OUT")).replace('platform: "ensemble"', ""),
     r"'ensemble_scheduling' needs platform 'ensemble'"),
])
def test_bad_step_graphs_are_refused_at_load(ensemble_repo: pathlib.Path, tmp_path: pathlib.Path,
                                            text: str, message: str) -> None:
    import shutil
    for model in ("scaled", "copy"):
        shutil.copytree(ensemble_repo / model, tmp_path / model)
    _ensemble(tmp_path, "bad", text)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        with pytest.raises(Exception, match=message):
            await engine.load("bad")
        await engine.shutdown()
    run(scenario())


STREAM_CHAIN = """
name: "stream_chain"
platform: "ensemble"
max_batch_size: 4
input [ { name: "RAW" data_type: TYPE_FP32 dims: [4] } ]
output [ { name: "FINAL" data_type: TYPE_FP32 dims: [4] } ]
ensemble_scheduling { step [
  { model_name: "slow_counter" model_version: -1
    input_map { key: "INPUT__0" value: "RAW" } output_map { key: "OUTPUT__0" value: "MID" } },
  { model_name: "scaled" model_version: -1
    input_map { key: "INPUT__0" value: "MID" } output_map { key: "OUTPUT__0" value: "FINAL" } }
] }
"""


LAG = '''
import time

from tensorgate import Model


class Lag(Model):
    """Its input as it is, after (5 - its first value) × 40 ms: what comes first takes
    longest."""

    def forward(self, inputs):
        x = inputs["INPUT__0"]
        time.sleep(max(0.0, 5 - float(x.flatten()[0])) * 0.04)
        return {"OUTPUT__0": x}
'''


@pytest.fixture(scope="module")
def stream_repo(ensemble_repo: pathlib.Path) -> pathlib.Path:
    rb.add_counter(ensemble_repo, "slow_counter", delay_s=0.02)
    _ensemble(ensemble_repo, "stream_chain", STREAM_CHAIN)
    folder = rb.write_config(ensemble_repo, "lag", """
        name: "lag"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [1, 4] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [1, 4] } ]
        instance_group [ { count: 5 kind: KIND_CPU } ]
        """)
    (folder / "1" / "model.py").write_text(LAG)
    _ensemble(ensemble_repo, "lagging", STREAM_CHAIN.replace('"stream_chain"', '"lagging"')
              .replace('"slow_counter"', '"counter"').replace('"scaled"', '"lag"')
              .replace("max_batch_size: 4", "max_batch_size: 0")
              .replace("dims: [4]", "dims: [1, 4]"))
    return ensemble_repo


def test_a_streaming_ensemble_answers_in_the_order_of_the_step_s_responses(
        stream_repo: pathlib.Path) -> None:
    """counter's five responses go through `lag` (five instances) at once, the first
    finishing last: the ensemble's responses still come 0, 1, 2, 3, 4."""
    async def scenario() -> None:
        engine = Engine(stream_repo)
        await engine.start(["lagging"])
        results = await _collect(engine.infer_stream(_request("lagging",
                                                              torch.full((1, 4), 5.0))))
        assert _firsts(results) == [0.0, 1.0, 2.0, 3.0, 4.0]
        await engine.shutdown()
    run(scenario())


def _firsts(results: list) -> list[float]:
    return [result.outputs["FINAL"].torch()[0, 0].item() for result in results]


def test_a_decoupled_step_makes_the_ensemble_stream_each_response_through_the_rest(
        stream_repo: pathlib.Path) -> None:
    """slow_counter streams n responses (the k-th all k); each goes through `scaled`
    (2x + 1) and out as one ensemble response, in order; the ensemble is decoupled."""
    async def scenario() -> None:
        engine = Engine(stream_repo)
        await engine.start(["stream_chain"])
        spec = engine.spec("stream_chain")
        assert spec.decoupled and spec.config.model_transaction_policy.decoupled
        got = await asyncio.gather(*(
            _collect(engine.infer_stream(_request("stream_chain", torch.full((1, 4), n))))
            for n in (5.0, 3.0)))
        assert [_firsts(results) for results in got] == [[1.0, 3.0, 5.0, 7.0, 9.0],
                                                         [1.0, 3.0, 5.0]]
        stats = engine.statistics("stream_chain")[0]
        assert stats["inference_stats"]["success"]["count"] == 2
        await engine.shutdown()
    run(scenario())


async def _collect(stream) -> list:
    return [result async for result in stream]


def test_a_step_failing_after_some_responses_fails_the_stream_after_them(
        stream_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(stream_repo)
        await engine.start(["stream_chain"])
        got = []
        with pytest.raises(InternalError, match=r"^ensemble 'stream_chain', step "
                                                r"'slow_counter': model 'slow_counter' raised "
                                                r"ValueError: stopped after one response$"):
            async for result in engine.infer_stream(_request("stream_chain",
                                                             torch.full((1, 4), -3.0))):
                got.append(result)
        assert _firsts(got) == [1.0]
        assert len(await _collect(engine.infer_stream(
            _request("stream_chain", torch.full((1, 4), 2.0))))) == 2  # it serves on
        await engine.shutdown()
    run(scenario())


def test_a_client_leaving_a_streaming_ensemble_stops_its_decoupled_step(
        stream_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(stream_repo)
        await engine.start(["stream_chain"])
        import sys
        counter = next(m for n, m in sys.modules.items()
                       if n.startswith("tensorgate_model_slow_counter")).Counter
        stream = engine.infer_stream(_request("stream_chain", torch.full((1, 4), 1000.0)))
        async for _ in stream:  # 20 s if left to run
            break
        await stream.aclose()
        before = counter.made
        await asyncio.sleep(0.3)
        assert counter.made - before <= 3  # stopped within a response or two
        await engine.shutdown()
    run(scenario(), timeout=30)


def test_outputs_from_a_decoupled_step_and_from_the_request_are_refused(
        ensemble_repo: pathlib.Path) -> None:
    """`streams`: FINAL comes from counter's responses, ONCE from the request alone: no
    response could carry both (Triton refuses it too)."""
    async def scenario() -> None:
        engine = Engine(ensemble_repo)
        with pytest.raises(ModelConfigError, match=r"the ensemble's outputs come from the "
                                                   r"request and the responses of step "
                                                   r"'counter'; they must all come from one"):
            await engine.load("streams")
        await engine.shutdown()
    run(scenario())
