"""The outbox that carries a decoupled model's responses to the loop: calls posted from
several threads run on the loop, each thread's in the order it posted them; one that raises
goes to the loop's exception handler and the rest still run."""

from __future__ import annotations

import asyncio
import threading

from tensorgate.pipeline.response_streams import Outbox
from tests.pipeline.conftest import run


def test_calls_from_threads_run_on_the_loop_in_order_and_a_failing_one_is_reported() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        reported: list[BaseException] = []
        loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
        outbox = Outbox(loop)
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
    run(scenario())
