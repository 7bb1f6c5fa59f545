"""A decoupled tensorgate Model's instance interleaves up to `streams_per_instance` requests
(pipeline/generations.py): their generators step in turn on its executor thread, never more
at once than the limit; a short request is not kept behind a long one; a client that stops
reading holds back its own request only; a client that leaves, or an unload, closes its
generator; the parameter is refused where it does not apply."""

from __future__ import annotations

import asyncio
import pathlib
import sys
import time
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InternalError, ModelConfigError
from tensorgate.pipeline.response_streams import RESPONSES_AHEAD
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run

STEPPER = '''
import time

import torch

from tensorgate import Model


class Stepper(Model):
    """For a first input value n, yields n responses, the k-th all k, each after delay_s;
    a negative n raises after the first response. Counts, for the tests, the generators running
    at once (`most`), the responses made and the generators whose cleanup ran (the
    warm-up's one among them)."""

    running = 0
    most = 0
    made = 0
    closed = 0

    def setup(self, context):
        self.delay = float(context.parameters.get("delay_s", "0"))

    def forward(self, inputs):
        x = inputs["INPUT__0"]
        count = int(x.flatten()[0].item())
        Stepper.running += 1
        Stepper.most = max(Stepper.most, Stepper.running)
        try:
            for k in range(abs(count)):
                if count < 0 and k == 1:
                    raise ValueError("stopped after one response")
                if self.delay:
                    time.sleep(self.delay)
                Stepper.made += 1
                yield {"OUTPUT__0": torch.full_like(x, float(k))}
        finally:
            Stepper.running -= 1
            Stepper.closed += 1
'''


def _add_stepper(root: pathlib.Path, name: str, delay_s: float, streams: int | None,
                 decoupled: bool = True) -> None:
    limit = ("" if streams is None else
             f'parameters {{ key: "streams_per_instance" value {{ string_value: "{streams}" }} }}')
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    folder = rb.write_config(root, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        {policy}
        parameters {{ key: "delay_s" value {{ string_value: "{delay_s}" }} }}
        {limit}
        """)
    (folder / "1" / "model.py").write_text(STEPPER)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("generations")
    _add_stepper(root, "one_at_a_time", 0.01, None)
    _add_stepper(root, "two_at_a_time", 0.01, 2)
    _add_stepper(root, "fast_pair", 0.0, 2)
    _add_stepper(root, "slow_pair", 0.02, 2)
    _add_stepper(root, "any_one", 0.0, 1)
    _add_stepper(root, "any_three", 0.0, 3)
    return root


def _stepper(model: str) -> Any:
    return next(m for n, m in sys.modules.items()
                if n.startswith(f"tensorgate_model_{model}")).Stepper


def _request(model: str, count: float) -> InferenceRequest:
    value = torch.full((4,), float(count))
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(value, name="INPUT__0")})


async def _collect(engine: Engine, model: str, count: int) -> list[float]:
    return [result.outputs["OUTPUT__0"].torch()[0].item()
            async for result in engine.infer_stream(_request(model, count))]


def test_an_instance_runs_at_most_streams_per_instance_requests_at_once(
        repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["one_at_a_time", "two_at_a_time"])
        for model, most in (("one_at_a_time", 1), ("two_at_a_time", 2)):
            stepper = _stepper(model)
            closed = stepper.closed
            got = await asyncio.gather(*(_collect(engine, model, 6) for _ in range(4)))
            assert got == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]] * 4  # each in order, whole
            assert stepper.most == most, model
            assert stepper.running == 0 and stepper.closed == closed + 4
            stats = engine.statistics(model)[0]
            assert stats["execution_count"] == 4 and stats["inference_count"] == 4
            assert stats["inference_stats"]["success"]["count"] == 4
        await engine.shutdown()
    run(scenario(), timeout=30)


def test_a_short_request_is_not_kept_behind_a_long_one(repo: pathlib.Path) -> None:
    """With one request at a time the short one would end after the long one's 40 steps."""
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["slow_pair"])
        long_stream = engine.infer_stream(_request("slow_pair", 40))  # 0.8 s of steps
        long_got = [(await anext(long_stream)).outputs["OUTPUT__0"].torch()[0].item()]
        short = await _collect(engine, "slow_pair", 2)
        assert short == [0.0, 1.0]
        stepper = _stepper("slow_pair")
        assert stepper.running == 1  # the long one is still going
        long_got += [r.outputs["OUTPUT__0"].torch()[0].item() async for r in long_stream]
        assert long_got == [float(k) for k in range(40)]
        await engine.shutdown()
    run(scenario(), timeout=30)


def test_a_client_that_stops_reading_holds_back_its_own_request_only(
        repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["fast_pair"])
        stepper = _stepper("fast_pair")
        unread = engine.infer_stream(_request("fast_pair", 1_000_000))
        await anext(unread)  # then not read again: its responses wait, up to the bound
        for _ in range(250):  # the one taken and RESPONSES_AHEAD more, then it is parked
            if stepper.made >= RESPONSES_AHEAD + 1:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        held = stepper.made
        assert held == RESPONSES_AHEAD + 1
        assert await _collect(engine, "fast_pair", 3) == [0.0, 1.0, 2.0]  # the other goes on
        await asyncio.sleep(0.2)
        assert stepper.made == held + 3  # the unread one made nothing more meanwhile
        await anext(unread)  # taking one lets it make one more, and only one
        for _ in range(250):
            if stepper.made > held + 3:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        assert stepper.made == held + 3 + 1
        closed = stepper.closed
        await unread.aclose()  # its client leaves: its generator is closed
        for _ in range(100):
            if stepper.closed > closed:
                break
            await asyncio.sleep(0.02)
        assert stepper.closed == closed + 1 and stepper.running == 0
        stats = engine.statistics("fast_pair")[0]["inference_stats"]
        assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 1
        assert await _collect(engine, "fast_pair", 2) == [0.0, 1.0]
        await engine.shutdown()
    run(scenario(), timeout=30)


def test_a_failing_request_leaves_the_one_beside_it_alone(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["two_at_a_time"])

        async def failing() -> list[float]:
            got = []
            with pytest.raises(InternalError, match=r"^model 'two_at_a_time' raised "
                                                    r"ValueError: stopped after one response$"):
                async for result in engine.infer_stream(_request("two_at_a_time", -3)):
                    got.append(result.outputs["OUTPUT__0"].torch()[0].item())
            return got
        bad, good = await asyncio.gather(failing(), _collect(engine, "two_at_a_time", 8))
        assert bad == [0.0] and good == [float(k) for k in range(8)]
        await engine.shutdown()
    run(scenario(), timeout=30)


def test_unload_past_its_drain_deadline_closes_running_generators(
        tmp_path: pathlib.Path) -> None:
    _add_stepper(tmp_path, "endless", 0.01, 3)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start(["endless"])
        streams = [engine.infer_stream(_request("endless", 1_000_000)) for _ in range(3)]
        for stream in streams:
            await anext(stream)
        stepper = _stepper("endless")
        closed = stepper.closed
        assert stepper.running == 3
        started = time.monotonic()
        await engine.unload("endless", drain_timeout_s=0.2)
        assert time.monotonic() - started < 5
        assert stepper.running == 0 and stepper.closed == closed + 3  # each one's cleanup ran
        for stream in streams:
            with pytest.raises(Exception, match="was unloaded while this request ran"):
                async for _ in stream:
                    pass
        await engine.shutdown()
    run(scenario(), timeout=30)


def test_streams_per_instance_is_refused_where_it_does_not_apply(
        tmp_path: pathlib.Path) -> None:
    _add_stepper(tmp_path, "not_decoupled", 0.0, 2, decoupled=False)
    _add_stepper(tmp_path, "zero", 0.0, 0)
    folder = rb.write_config(tmp_path, "triton_streams", """
        name: "triton_streams"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        model_transaction_policy { decoupled: true }
        parameters { key: "streams_per_instance" value { string_value: "4" } }
        """)
    (folder / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return None\n")

    async def scenario() -> None:
        engine = Engine(tmp_path)
        with pytest.raises(ModelConfigError, match=r"parameter 'streams_per_instance' applies "
                                                   r"to a decoupled model"):
            await engine.load("not_decoupled")
        with pytest.raises(ModelConfigError, match=r"parameter 'streams_per_instance' must be "
                                                   r"1 or more"):
            await engine.load("zero")
        with pytest.raises(ModelConfigError, match=r"parameter 'streams_per_instance' is for a "
                                                   r"tensorgate Model"):
            await engine.load("triton_streams")
        await engine.shutdown()
    run(scenario(), timeout=30)


# (responses asked for, what the client does, after how many responses it leaves or stalls)
_CLIENT = st.tuples(st.integers(0, 90), st.sampled_from(["read", "leave", "stall"]),
                    st.integers(0, 90))


@settings(max_examples=20, deadline=None)
@given(model=st.sampled_from(["any_one", "any_three"]),
       clients=st.lists(_CLIENT, min_size=1, max_size=6))
def test_any_mix_of_clients_gets_whole_ordered_streams(
        repo: pathlib.Path, model: str, clients: list[tuple[int, str, int]]) -> None:
    """Clients that read everything, leave part-way or stop reading for a while (past the
    RESPONSES_AHEAD bound when they ask for more), at once: each gets its responses whole and
    in order, or in order up to where it left; no more run at once than the limit; every
    generator is closed; each request is counted once; the model serves on."""
    limit = {"any_one": 1, "any_three": 3}[model]

    async def client(engine: Engine, count: int, kind: str, at: int) -> None:
        at = max(at, 1)  # (a stream left before it is read never sends its request)
        stream = engine.infer_stream(_request(model, count))
        got: list[float] = []
        try:
            async for result in stream:
                got.append(result.outputs["OUTPUT__0"].torch()[0].item())
                if kind == "leave" and len(got) == at:
                    break
                if kind == "stall" and len(got) == at:
                    await asyncio.sleep(0.05)
        finally:
            await stream.aclose()
        whole = count if kind != "leave" else min(at, count)
        assert got == [float(k) for k in range(whole)], (count, kind, at)

    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start([model])
        stepper = _stepper(model)
        stepper.most = 0
        await asyncio.gather(*(client(engine, *spec) for spec in clients))
        for _ in range(200):  # generators of clients that left close at their next step
            if stepper.running == 0:
                break
            await asyncio.sleep(0.01)
        assert stepper.running == 0
        assert 1 <= stepper.most <= limit or all(count == 0 for count, _, _ in clients)
        await asyncio.sleep(0.05)  # the last ends reach the loop
        stats = engine.statistics(model)[0]["inference_stats"]
        assert stats["success"]["count"] + stats["fail"]["count"] == len(clients)
        assert stats["success"]["count"] >= sum(kind != "leave" for _, kind, _ in clients)
        assert await _collect(engine, model, 3) == [0.0, 1.0, 2.0]
        await engine.shutdown()
    run(scenario(), timeout=60)
