"""Instances of a TorchScript model on CPU run one copy of its weights (the first instance
loads it, the others run it at once beside it), unless its forward assigns attributes
(state two threads must not share); a Python model's instances each load their own."""

from __future__ import annotations

import asyncio
import pathlib
import re
import threading
import weakref

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run, serving


def _instances(count: int) -> str:
    return f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]"


def _request(model: str, seed: int) -> InferenceRequest:
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(seed))
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")})


def test_torchscript_instances_run_one_copy_of_the_weights(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    rb.add_torchscript(tmp_path, "heavy", rb.Heavy(), [64, 256], [64, 256], max_batch=0,
                       extra=_instances(3))
    direct = torch.jit.script(rb.Heavy().eval())

    async def scenario() -> None:
        async with serving(tmp_path, placement="none") as engine:
            executors = engine._served.versions["heavy"][1].executors
            assert len(executors) == 3
            assert all(e.runner is executors[0].runner for e in executors)
            results = await asyncio.gather(*(engine.infer(_request("heavy", seed))
                                             for seed in range(12)))
            # the shared module ran on more than one instance's thread, answering alike
            assert sum(e.batches_run > 0 for e in executors) >= 2
            assert sum(e.batches_run for e in executors) == 12
            for seed, result in enumerate(results):
                x = _request("heavy", seed).inputs["INPUT__0"].torch()
                torch.testing.assert_close(result.outputs["OUTPUT__0"].torch(), direct(x))
    with caplog.at_level("INFO", logger="tensorgate.engine"):
        run(scenario())
    said = [r.getMessage() for r in caplog.records if "model heavy v1 ready on" in r.getMessage()]
    assert len(said) == 1, said
    assert re.fullmatch(r"model heavy v1 ready on (cpu \(any\), ){2}cpu \(any\); the last 2 "
                        r"run the first's copy of the model; load \d+\.\d\d s, warm-up "
                        r"\d+\.\d\d s", said[0]), said


def test_python_model_instances_each_load_their_own(tmp_path: pathlib.Path) -> None:
    rb.add_python(tmp_path, "scaled", extra=_instances(2))

    async def scenario() -> None:
        async with serving(tmp_path, placement="none") as engine:
            first, second = engine._served.versions["scaled"][1].executors
            assert first.runner is not second.runner
    run(scenario())


def test_a_first_instance_that_fails_fails_the_load_and_starts_no_other(
        tmp_path: pathlib.Path) -> None:
    rb.add_torchscript(tmp_path, "broken", rb.Identity(), [4], [4], extra=_instances(3))
    (tmp_path / "broken" / "1" / "model.pt").write_bytes(b"not a TorchScript archive")

    async def scenario() -> None:
        engine = Engine(tmp_path, placement="none")
        with pytest.raises(Exception, match="broken"):
            await engine.load("broken")
        assert "broken" not in engine._served.versions
        await engine.shutdown()
    run(scenario())
    assert not [t for t in threading.enumerate() if t.name.startswith("tg-exec-broken")]


class _Caching(torch.nn.Module):
    """Keeps a tensor across calls by assigning an attribute (a cache grown on demand)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offsets", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.offsets.shape[0]:
            self.offsets = torch.zeros(x.shape[0])
        return x + self.offsets[: x.shape[0]].unsqueeze(1)


def test_a_module_that_assigns_attributes_is_loaded_per_instance(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    rb.add_torchscript(tmp_path, "caching", _Caching(), [4], [4], extra=_instances(2))

    async def scenario() -> None:
        async with serving(tmp_path, placement="none") as engine:
            first, second = engine._served.versions["caching"][1].executors
            assert first.runner is not second.runner
            x = torch.ones(3, 4)
            result = await engine.infer(InferenceRequest("caching", {
                "INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))
            torch.testing.assert_close(result.outputs["OUTPUT__0"].torch(), x)
    with caplog.at_level("INFO", logger="tensorgate.engine"):
        run(scenario())
    assert any(r.getMessage() == "model caching v1: each instance loads its own copy: its "
               "forward assigns attributes, state two threads must not share"
               for r in caplog.records)


class _Counter(torch.nn.Module):
    """Counts its calls in an attribute it assigns."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1
        return x


class _CountsInASubmodule(torch.nn.Module):
    """The assignment is in a submodule's forward, which only the graph with its calls
    inlined shows."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Identity(), _Counter())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 1.0


def test_an_assignment_in_a_submodule_is_found_after_the_warm_up(
        tmp_path: pathlib.Path) -> None:
    rb.add_torchscript(tmp_path, "counting", _CountsInASubmodule(), [4], [4],
                       extra=_instances(2))
    rb.add_torchscript(tmp_path, "plain", torch.nn.Sequential(torch.nn.Identity()), [4], [4],
                       extra=_instances(2))

    async def scenario() -> None:
        async with serving(tmp_path, placement="none") as engine:
            first, second = engine._served.versions["counting"][1].executors
            assert first.runner is not second.runner
            first, second = engine._served.versions["plain"][1].executors
            assert first.runner is second.runner
    run(scenario())


def test_a_model_that_cannot_be_warmed_up_is_still_judged(tmp_path: pathlib.Path,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    # zeros of 1.2 GB may not stand in for its input: no warm-up runs, and no forward
    # compiled its methods before they are read
    rb.add_torchscript(tmp_path, "caching", _Caching(), [300_000_000], [300_000_000],
                       max_batch=0, extra=_instances(2))

    async def scenario() -> None:
        async with serving(tmp_path, placement="none") as engine:
            first, second = engine._served.versions["caching"][1].executors
            assert first.runner is not second.runner
    with caplog.at_level("INFO", logger="tensorgate.executor"):
        run(scenario())
    assert any("no warm-up" in r.getMessage() for r in caplog.records)


def test_an_unloaded_models_weights_go_on_its_instances_threads_then_the_heap_is_trimmed(
        tmp_path: pathlib.Path) -> None:
    """The last instance to stop frees the shared module on its own thread (not the loop,
    when the unloaded version's objects go), and each instance trims the C heap after: what
    glibc would otherwise keep of every reloaded model's weights."""
    rb.add_torchscript(tmp_path, "heavy", rb.Heavy(), [64, 256], [64, 256], max_batch=0,
                       extra=_instances(2))
    freed_on: list[str] = []

    async def scenario() -> None:
        engine = Engine(tmp_path, placement="none")
        await engine.start(["heavy"])
        executors = engine._served.versions["heavy"][1].executors
        runner = executors[0].runner
        assert runner is not None and runner.module is not None
        assert executors[1].runner is runner
        weakref.finalize(runner.module, lambda: freed_on.append(
            threading.current_thread().name))
        del runner
        await engine.unload("heavy")
        for _ in range(200):  # bounded: 200 × 10 ms (the trim follows the instance's stop)
            if all(e.heap_trims for e in executors):
                break
            await asyncio.sleep(0.01)
        assert [e.heap_trims for e in executors] == [1, 1]
        assert len(freed_on) == 1 and freed_on[0].startswith("tg-exec-heavy-v1-"), freed_on
        await engine.shutdown()
    run(scenario())
