"""Priority levels and `timeout_action: DELAY` (Triton's schedule policy): the order requests
run in, each level's own queue bound, and delayed requests that still run."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InvalidArgumentError, UnavailableError
from tests.pipeline.conftest import run


def _request(model: str, value: float, **kw) -> InferenceRequest:
    tensor = torch.full((1, 4), value)
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(tensor, name="INPUT__0")},
                            **kw)


async def _queued(engine: Engine, model: str, count: int) -> None:
    """Wait (bounded) until `count` requests of `model` are queued."""
    for _ in range(400):
        if engine.pending(model) == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{engine.pending(model)} queued, expected {count}")


def _finishing_order(tasks: dict[str, asyncio.Task]) -> list[str]:
    order: list[str] = []
    for name, task in tasks.items():
        task.add_done_callback(lambda _, name=name: order.append(name))
    return order


def test_higher_priority_runs_first_and_levels_have_their_own_bound(
        repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["ranked"])
        tasks = {"running": asyncio.create_task(engine.infer(_request("ranked", 1.0)))}
        await _queued(engine, "ranked", 0)
        tasks["default"] = asyncio.create_task(engine.infer(_request("ranked", 2.0)))
        tasks["low"] = asyncio.create_task(engine.infer(_request("ranked", 3.0, priority=2)))
        await _queued(engine, "ranked", 2)
        tasks["high"] = asyncio.create_task(engine.infer(_request("ranked", 4.0, priority=1)))
        await _queued(engine, "ranked", 3)
        # level 1 holds one request at most; levels below it are not bounded by that
        with pytest.raises(UnavailableError, match=r"^Exceeds maximum queue size: model "
                                                   r"'ranked' already has 1 requests queued at "
                                                   r"priority level 1 \(max_queue_size 1\)"):
            await engine.infer(_request("ranked", 5.0, priority=1))
        tasks["past_levels"] = asyncio.create_task(  # 9: past the last level → the default
            engine.infer(_request("ranked", 6.0, priority=9)))
        await _queued(engine, "ranked", 4)
        order = _finishing_order(tasks)  # "running" runs 0.2 s: none has finished yet
        results = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        assert order[:2] == ["running", "high"]
        assert order[2:] == ["default", "low", "past_levels"]  # one level: arrival order
        for name, value in zip(tasks, (1.0, 2.0, 3.0, 4.0, 6.0)):
            assert torch.equal(results[name].outputs["OUTPUT__0"].torch(),
                               torch.full((1, 4), 2 * value + 1))
        await engine.shutdown()
    run(scenario())


def test_an_ensemble_passes_its_requests_priority_to_its_steps(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["ranked_ensemble"])
        tasks = {"running": asyncio.create_task(engine.infer(_request("ranked", 1.0)))}
        await _queued(engine, "ranked", 0)
        tasks["default"] = asyncio.create_task(engine.infer(_request("ranked", 2.0)))
        await _queued(engine, "ranked", 1)
        request = _request("ranked_ensemble", 3.0, priority=1)
        request.inputs = {"RAW": request.inputs["INPUT__0"]}
        tasks["ensemble_high"] = asyncio.create_task(engine.infer(request))
        await _queued(engine, "ranked", 2)
        order = _finishing_order(tasks)
        results = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        assert order == ["running", "ensemble_high", "default"]
        assert torch.equal(results["ensemble_high"].outputs["OUT"].torch(),
                           torch.full((1, 4), 7.0))
        await engine.shutdown()
    run(scenario())


def test_timed_out_request_under_delay_runs_after_the_rest(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["delayed"])
        tasks = {"running": asyncio.create_task(engine.infer(_request("delayed", 1.0)))}
        await _queued(engine, "delayed", 0)
        tasks["expires"] = asyncio.create_task(engine.infer(_request("delayed", 2.0)))
        await asyncio.sleep(0.1)  # past its 50 ms: it is delayed, not failed
        tasks["patient"] = asyncio.create_task(
            engine.infer(_request("delayed", 3.0, timeout_us=5_000_000)))
        await _queued(engine, "delayed", 2)
        order = _finishing_order(tasks)
        results = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        assert order == ["running", "patient", "expires"]
        assert torch.equal(results["expires"].outputs["OUTPUT__0"].torch(),
                           torch.full((1, 4), 5.0))
        stats = engine.statistics("delayed")[0]
        assert stats["inference_stats"]["fail"]["count"] == 0
        assert stats["execution_count"] == 3
        await engine.shutdown()
    run(scenario())


def test_priority_is_ignored_without_levels_and_checked_when_given(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["scaled"])
        result = await engine.infer(_request("scaled", 1.0, priority=7))
        assert torch.equal(result.outputs["OUTPUT__0"].torch(), torch.full((1, 4), 3.0))
        await engine.shutdown()
    run(scenario())
    from tensorgate.protocol.request_parameters import request_priority
    assert request_priority({}) == 0 and request_priority({"priority": 2}) == 2
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(InvalidArgumentError, match=r"^request parameter 'priority' must be "
                                                       r"a non-negative integer"):
            request_priority({"priority": bad})
