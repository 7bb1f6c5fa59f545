"""The loop's mailbox, which carries a decoupled model's responses to the loop: calls posted
from several threads run on the loop, each thread's in the order it posted them; one that
raises goes to the loop's exception handler and the rest still run. Requests streaming at
once take their queued responses in turn."""

from __future__ import annotations

import asyncio
import pathlib
import re
import sys
import threading
import time

import numpy as np
import pytest

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.pipeline.handoff import LoopMailbox
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run


def test_calls_from_threads_run_on_the_loop_in_order_and_a_failing_one_is_reported() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        reported: list[BaseException] = []
        loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
        outbox = LoopMailbox(loop)  # (what the Outbox was)
        seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
        on_loop: list[bool] = []
        done = asyncio.Event()

        def record(thread: int, value: int) -> None:
            on_loop.append(threading.current_thread() is threading.main_thread())
            seen[thread].append(value)
            if sum(map(len, seen.values())) == 3 * 500:
                done.set()

        def fail() -> None:
            raise ValueError("a posted call failed")

        def produce(thread: int) -> None:
            for value in range(500):
                outbox.post(record, thread, value)
                if thread == 0 and value == 250:
                    outbox.post(fail)

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(3)]
        for thread in threads:
            thread.start()
        await asyncio.wait_for(done.wait(), 10)
        for thread in threads:
            thread.join()
        assert all(values == list(range(500)) for values in seen.values())
        assert all(on_loop)
        assert [str(error) for error in reported] == ["a posted call failed"]
        outbox.close()
    run(scenario())


GATED_SEND = """
    for value in range(20):
        sender.send(pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("OUT", np.array([value], np.int32))]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@pytest.fixture(scope="module")
def gated_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("gated")
    rb.add_gated_sender(root, "gated", GATED_SEND)
    return root


def test_requests_streaming_at_once_take_turns_with_their_queued_responses(
        gated_repo: pathlib.Path) -> None:
    """Two requests' 20 responses each are all made while the loop is held (as when a model
    sends faster than they are sent on): their callers then take them in turn, not all of
    one request's before the other's first (which is what a new request's first response
    waited behind)."""
    async def scenario() -> None:
        engine = Engine(gated_repo)
        await engine.start(["gated"])
        model = sys.modules["tensorgate_model_gated_1"]
        order: list[str] = []

        async def take(name: str) -> None:
            request = InferenceRequest("gated", {"IN": TensorView.from_array(
                np.array([1], np.int32), name="IN")})
            async for result in engine.infer_stream(request):
                order.append(name)
                assert result.outputs["OUT"].numpy().shape == (1,)

        callers = [asyncio.ensure_future(take(name)) for name in "ab"]
        deadline = time.monotonic() + 10
        while len(model.STARTED) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        model.GO.set()
        time.sleep(0.3)  # holds the loop while both threads send everything
        await asyncio.gather(*callers)
        assert sorted(order) == ["a"] * 20 + ["b"] * 20
        longest = max(len(run) for run in re.findall(r"a+|b+", "".join(order)))
        assert longest <= 2, "".join(order)
        await engine.shutdown()
    run(scenario())
