"""Queue full, deadlines, cancellation, a model that raises, bad input and shutdown: each
answers clearly and leaves the engine serving; nothing accepted goes unanswered."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import (DeadlineExceededError, InternalError, InvalidArgumentError,
                               NotFoundError, UnavailableError)
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run


def _request(model: str, value: torch.Tensor, **kw) -> InferenceRequest:
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(value, name="INPUT__0")},
                            **kw)


def _ones(model: str = "slow", **kw) -> InferenceRequest:
    return _request(model, torch.ones(1, 4), **kw)


@pytest.fixture(scope="module")
def gathering(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A repository of rb.Failing as "failing" that gathers what comes within 50 ms into one
    batch from the first (no batch cap: it starts at one row)."""
    root = tmp_path_factory.mktemp("gathering")
    rb.add_torchscript(root, "failing", rb.Failing(), [4], [4],
                       "dynamic_batching { max_queue_delay_microseconds: 50000 }",
                       extra='parameters { key: "batch_cap" value { string_value: "off" } }')
    return root


async def _started(repo: pathlib.Path, *models: str) -> Engine:
    engine = Engine(repo)
    await engine.start(models)
    return engine


async def _until_running(engine: Engine, model: str) -> None:
    """Wait (bounded) until nothing of `model` is left in its queue: the first one runs."""
    await asyncio.sleep(0.01)  # let the task that submits it start
    for _ in range(200):
        if engine.pending(model) == 0:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the first request never left the queue")


def test_queue_full_answers_unavailable_at_once(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = await _started(repo, "slow")
        running = asyncio.create_task(engine.infer(_ones()))
        await _until_running(engine, "slow")
        queued = [asyncio.create_task(engine.infer(_ones())) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(UnavailableError, match=r"^Exceeds maximum queue size: model 'slow' "
                                                   r"already has 2 requests queued"):
            await engine.infer(_ones())
        for result in await asyncio.gather(running, *queued):
            assert torch.equal(result.outputs["OUTPUT__0"].torch(), torch.full((1, 4), 3.0))
        stats = engine.statistics("slow")[0]
        assert stats["inference_count"] == 3
        await engine.shutdown()
    run(scenario())


def test_expired_request_never_reaches_the_model(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = await _started(repo, "slow_timeout")
        loop = asyncio.get_running_loop()
        running = asyncio.create_task(engine.infer(_ones("slow_timeout")))
        await _until_running(engine, "slow_timeout")
        started = loop.time()
        patient = asyncio.create_task(engine.infer(_ones("slow_timeout", timeout_us=2_000_000)))
        with pytest.raises(DeadlineExceededError, match=r"^request for model 'slow_timeout' timed "
                                                        r"out after \d+\.\d ms in the queue"):
            await engine.infer(_ones("slow_timeout"))  # the config's 50 ms default applies
        assert loop.time() - started < 0.2  # answered when due, not when the model was free
        await running
        await patient  # its own timeout (2 s) overrides the default: it runs
        stats = engine.statistics("slow_timeout")[0]
        assert stats["execution_count"] == 2 and stats["inference_stats"]["fail"]["count"] == 1
        await engine.shutdown()
    run(scenario())


def test_cancelled_request_is_dropped(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = await _started(repo, "slow")
        running = asyncio.create_task(engine.infer(_ones()))
        await _until_running(engine, "slow")
        gone = asyncio.create_task(engine.infer(_ones()))
        await asyncio.sleep(0.01)
        assert engine.pending("slow") == 1
        gone.cancel()
        await running
        after = await engine.infer(_ones())
        assert after.outputs["OUTPUT__0"].torch().sum().item() == 12.0
        assert gone.cancelled()
        assert engine.statistics("slow")[0]["execution_count"] == 2  # never ran the cancelled
        await engine.shutdown()
    run(scenario())


def test_a_failed_batch_run_alone_is_said_once_as_a_warning(
        gathering: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """A model that fails batches is still served request by request, at a batch's cost
    each: the first time says so as a warning, naming the model and its error."""
    async def scenario() -> None:
        engine = await _started(gathering, "failing")
        for _ in range(2):  # two batches, each of a bad request and a good one
            await asyncio.gather(engine.infer(_request("failing", -torch.ones(1, 4))),
                                 engine.infer(_request("failing", torch.ones(1, 4))),
                                 return_exceptions=True)
        await engine.shutdown()
    with caplog.at_level("DEBUG", logger="tensorgate.executor"):
        run(scenario())
    said = [r for r in caplog.records if "each runs alone" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "DEBUG"], [r.getMessage() for r in caplog.records]
    first = said[0].getMessage()
    assert first.startswith("model failing: a batch of 2 requests failed (model 'failing' "
                            "raised RuntimeError: negative input); each runs alone"), first


def test_model_that_raises_fails_only_its_batch(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = await _started(repo, "failing")
        with pytest.raises(InternalError, match=r"^model 'failing' raised .*negative input"):
            await engine.infer(_request("failing", -torch.ones(1, 4)))
        ok = await engine.infer(_request("failing", torch.ones(1, 4)))
        assert torch.equal(ok.outputs["OUTPUT__0"].torch(), torch.full((1, 4), 2.0))
        stats = engine.statistics("failing")[0]["inference_stats"]
        assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 1
        await engine.shutdown()
    run(scenario())


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 2)), min_size=2, max_size=6))
def test_a_request_that_fails_the_model_fails_alone(gathering: pathlib.Path,
                                                    sent: list[tuple[bool, int]]) -> None:
    """Requests sent at once are batched; those with a negative input make the model raise.
    Each of those fails with the model's error and every other one is answered as if it had
    come alone: the failed batch's requests were run again one by one (before, the whole
    batch failed with the bad request's error)."""
    async def scenario() -> None:
        engine = await _started(gathering, "failing")
        values = [torch.full((rows, 4), -1.0 if bad else float(i + 1))
                  for i, (bad, rows) in enumerate(sent)]
        answers = await asyncio.gather(*(engine.infer(_request("failing", value))
                                         for value in values), return_exceptions=True)
        for (bad, _), value, answer in zip(sent, values, answers):
            if bad:
                assert isinstance(answer, InternalError), answer
                assert "negative input" in str(answer)
            else:
                assert not isinstance(answer, BaseException), answer
                assert torch.equal(answer.outputs["OUTPUT__0"].torch(), value + 1)
        stats = engine.statistics("failing")[0]
        counts = stats["inference_stats"]
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1, stats  # were batched
        assert counts["fail"]["count"] == sum(bad for bad, _ in sent)
        assert counts["success"]["count"] == sum(not bad for bad, _ in sent)
        await engine.shutdown()
    run(scenario())


@pytest.mark.parametrize("request_args, error, message", [
    (("nope", {}), NotFoundError, r"^unknown model 'nope'; loaded models are: linear$"),
    (("linear", {"X": (1, 8)}), InvalidArgumentError,
     r"^model 'linear' has no input 'X'; inputs are: INPUT__0$"),
    (("linear", {}), InvalidArgumentError,
     r"^model 'linear' needs input 'INPUT__0'; the request has: no inputs$"),
    (("linear", {"INPUT__0": (1, 9)}), InvalidArgumentError,
     r"^input 'INPUT__0' of model 'linear' has shape \[1,9\]; expected \[-1,8\]$"),
    (("linear", {"INPUT__0": (9, 8)}), InvalidArgumentError,
     r"^input 'INPUT__0' of model 'linear' has a batch of 9; max_batch_size is 8$"),
    (("linear", {"INPUT__0": (8,)}), InvalidArgumentError,
     r"^input 'INPUT__0' of model 'linear' has shape \[8\]; expected \[-1,8\]$"),
])
def test_bad_requests_are_named_and_the_engine_keeps_serving(repo, request_args, error,
                                                              message) -> None:
    model, shapes = request_args

    async def scenario() -> None:
        engine = await _started(repo, "linear")
        inputs = {n: TensorView.from_torch(torch.zeros(s), name=n) for n, s in shapes.items()}
        with pytest.raises(error, match=message):
            await engine.infer(InferenceRequest(model, inputs))
        await engine.infer(_request("linear", torch.zeros(1, 8)))
        await engine.shutdown()
    run(scenario())


def test_wrong_datatype_and_unknown_output(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = await _started(repo, "linear")
        with pytest.raises(InvalidArgumentError, match=r"^input 'INPUT__0' of model 'linear' is "
                                                       r"FP64; expected FP32$"):
            await engine.infer(_request("linear", torch.zeros(1, 8, dtype=torch.float64)))
        with pytest.raises(InvalidArgumentError, match=r"^model 'linear' has no output 'Y'; "
                                                       r"outputs are: OUTPUT__0$"):
            await engine.infer(_request("linear", torch.zeros(1, 8), outputs=["Y"]))
        with pytest.raises(NotFoundError, match=r"^model 'linear' has no version 7; loaded "
                                                r"versions are: 1$"):
            await engine.infer(_request("linear", torch.zeros(1, 8), version=7))
        await engine.shutdown()
    run(scenario())


async def _one_running_two_queued(engine: Engine) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(engine.infer(_ones()))]
    await _until_running(engine, "slow")
    tasks += [asyncio.create_task(engine.infer(_ones())) for _ in range(2)]
    await asyncio.sleep(0.01)
    return tasks


def test_shutdown_drains_accepted_work(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = await _started(repo, "slow")
        tasks = await _one_running_two_queued(engine)
        await engine.shutdown(drain_timeout_s=5.0)
        results = await asyncio.gather(*tasks)
        assert all(r.outputs["OUTPUT__0"].torch().sum().item() == 12.0 for r in results)
        with pytest.raises(UnavailableError, match=r"^the server is shutting down"):
            await engine.infer(_ones())
    run(scenario())


def test_shutdown_deadline_answers_everything(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = await _started(repo, "slow")
        tasks = await _one_running_two_queued(engine)
        await engine.shutdown(drain_timeout_s=0.05)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, UnavailableError) for o in outcomes), outcomes
        assert "unloaded while this request ran" in str(outcomes[0])
        assert all("was not run" in str(o) for o in outcomes[1:])
    run(scenario())


def test_a_load_that_fails_part_way_stops_what_it_started(tmp_path: pathlib.Path) -> None:
    """Version 1 loads, version 2's setup raises: the model is not served, and version 1's
    executor thread is stopped rather than left running unreferenced."""
    import threading

    from tests.pipeline import repo_builder as rb
    rb.add_python(tmp_path, "halfway", extra="version_policy { all { } }")
    (tmp_path / "halfway" / "2").mkdir()
    (tmp_path / "halfway" / "2" / "model.py").write_text(
        "from tensorgate import Model\n\nclass Broken(Model):\n"
        "    def setup(self, context):\n        raise RuntimeError('no weights here')\n")

    def executors() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("tg-exec-halfway")]

    async def scenario() -> None:
        engine = Engine(tmp_path)
        with pytest.raises(Exception, match="no weights here"):
            await engine.load("halfway")
        assert not engine.is_ready("halfway", None)
        index = engine.index()
        assert index[0]["state"] == "UNAVAILABLE" and "no weights here" in index[0]["reason"]
        for _ in range(200):  # the stopped thread exits (bounded wait)
            if not executors():
                break
            await asyncio.sleep(0.01)
        assert executors() == []
        await engine.shutdown()
    run(scenario())


class _ComplexOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.complex(x, x)


def test_an_output_no_datatype_holds_is_the_models_fault(tmp_path: pathlib.Path) -> None:
    """A model answering with a dtype the protocol has no datatype for (complex64) fails its
    requests as an internal error naming the model and output (it was a 400, "tensor
    'OUTPUT__0': no protocol datatype", as if the client had sent it); the engine serves on."""
    rb.add_torchscript(tmp_path, "complex", _ComplexOutput(), [4], [4])
    rb.add_torchscript(tmp_path, "identity", rb.Identity(), [4], [4])

    async def scenario() -> None:
        engine = await _started(tmp_path, "complex", "identity")
        try:
            with pytest.raises(InternalError, match=r"^model 'complex' output 'OUTPUT__0' is "
                                                    r"torch\.complex64, which no protocol "
                                                    r"datatype holds; its config says FP32$"):
                await engine.infer(_ones("complex"))
            result = await engine.infer(_ones("identity"))
            assert result.outputs["OUTPUT__0"].torch().tolist() == [[1.0] * 4]
        finally:
            await engine.shutdown()
    run(scenario())


_FAILS_WHILE_MARKED = '''
import pathlib

from tensorgate import Model


class FailsOnce(Model):
    """Fails its setup once for each mark beside it (a file "fails-N" in its version's
    folder), taking one away each time: a file system or a device failing for a moment."""

    def setup(self, context):
        folder = pathlib.Path(__file__).parent
        marks = sorted(folder.glob("fails-*"))
        if marks:
            marks[0].unlink()
            raise RuntimeError(f"failed for a moment ({len(marks) - 1} more to come)")

    def forward(self, batch):
        return {"OUTPUT__0": batch["INPUT__0"]}
'''


@pytest.mark.parametrize(("failures", "retries", "loads"), [(1, 1, True), (2, 1, False),
                                                            (1, 0, False)])
def test_a_load_that_fails_for_a_moment_is_tried_again(
        tmp_path: pathlib.Path, failures: int, retries: int, loads: bool) -> None:
    """Triton's --model-load-retry-count: tried again that many times; the load fails only
    when every try did (then listed failed, with the last try's reason)."""
    rb.add_python(tmp_path, "flaky", max_batch=4)
    folder = tmp_path / "flaky"
    (folder / "1" / "model.py").write_text(_FAILS_WHILE_MARKED)
    for n in range(failures):
        (folder / "1" / f"fails-{n}").touch()

    async def scenario() -> None:
        engine = Engine(tmp_path, load_retries=retries)
        await engine.start(["flaky"])
        try:
            if loads:
                answer = await engine.infer(_request("flaky", torch.ones(1, 4)))
                assert answer.outputs["OUTPUT__0"].torch().tolist() == [[1.0] * 4]
            else:
                (entry,) = [e for e in engine.index() if e["name"] == "flaky"]
                assert entry["state"] == "UNAVAILABLE" and "failed for a moment" in \
                    entry["reason"], entry
        finally:
            await engine.shutdown()
    run(scenario())
    assert len(list((folder / "1").glob("fails-*"))) == max(failures - retries - 1, 0)
