"""The loop's CPU share, and a spare on the loop's core given batches only while the loop
leaves room (a spare beside a light model that kept the loop busy took its core)."""

from __future__ import annotations

import asyncio
import time

import torch

from tensorgate import InferenceRequest, TensorView
from tensorgate.pipeline.loop_load import SPARE_LOOP_SHARE, LoopLoad
from tensorgate.pipeline.requests import work_item
from tensorgate.pipeline.scheduler import Scheduler
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.pipeline.work import Batch
from tensorgate.repository.model_config import parse_model_config
from tests.pipeline.conftest import run

SPEC = parse_model_config("""
name: "m"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
""")


def test_a_busy_thread_leaves_no_room_and_an_idle_one_does() -> None:
    load = LoopLoad(window_s=0.05)
    load.share()  # the window starts
    until = time.monotonic() + 0.08
    while time.monotonic() < until:  # this thread busy for the whole window
        pass
    assert load.share() > SPARE_LOOP_SHARE and not load.leaves_room()
    time.sleep(0.08)  # idle for the next
    assert load.share() < SPARE_LOOP_SHARE and load.leaves_room()


class _Held:
    """An executor that keeps every batch it is given (busy until the test says)."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []

    def submit(self, batch: Batch) -> None:
        self.batches.append(batch)


def test_a_spare_takes_a_batch_only_while_its_gate_allows() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        scheduler = Scheduler(SPEC, ModelStatistics("m", 1), loop, measured_cap=False)
        first, spare = _Held(), _Held()
        allowed = False
        scheduler.add_executor(first)
        scheduler.add_executor(spare, spare=True, spare_when=lambda: allowed)

        def submit() -> None:
            x = torch.ones(4)
            scheduler.submit(work_item(SPEC, InferenceRequest("m", {
                "INPUT__0": TensorView.from_torch(x, name="INPUT__0")}), loop))

        submit()  # to the first (idle, not a spare)
        submit()  # the first is busy and the gate is shut: it waits
        assert (len(first.batches), len(spare.batches), scheduler.pending) == (1, 0, 1)
        allowed = True
        submit()  # the gate open: the spare takes the oldest waiting
        assert (len(first.batches), len(spare.batches), scheduler.pending) == (1, 1, 1)
    run(scenario())
