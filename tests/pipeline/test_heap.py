"""An executor hands the C heap back once it has been idle after a batch of several rows,
and never between batches or after batches of one."""

from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.pipeline import heap
from tests.pipeline.conftest import run


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_heap_trimmer_runs_on_linux() -> None:
    trim = heap.heap_trimmer()
    assert trim is not None
    trim()  # returns; what it frees is the benchmark's business (bench/RESULTS.md)
    # found once a process, not once an executor (find_library runs ldconfig each call)
    assert heap.heap_trimmer() is trim


def _request(value: float) -> InferenceRequest:
    x = torch.full((1, 8), value)
    return InferenceRequest("linear", {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")})


@pytest.mark.skipif(heap.heap_trimmer() is None, reason="no glibc malloc_trim here")
def test_trims_once_after_idle_following_a_batch_of_several_rows(
        repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "IDLE_TRIM_S", 0.05)

    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["linear"])
        executor = engine._served.versions["linear"][1].executors[0]
        await engine.infer(_request(1.0))  # a batch of one
        await asyncio.sleep(0.3)
        assert executor.heap_trims == 0
        await asyncio.gather(*(engine.infer(_request(float(i))) for i in range(6)))
        stats = engine.statistics("linear")[0]
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
        for _ in range(100):  # bounded: 100 × 10 ms
            if executor.heap_trims:
                break
            await asyncio.sleep(0.01)
        assert executor.heap_trims == 1
        await asyncio.sleep(0.3)  # idle on: nothing new to give back
        assert executor.heap_trims == 1
        await engine.shutdown()
    run(scenario())
