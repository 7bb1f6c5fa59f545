"""Placement "auto": light models join the loop's core; a heavy CPU model left to the
defaults gets a spare instance there that shares its weights and only runs when the first
instance is busy."""

from __future__ import annotations

import asyncio
import os
import pathlib
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.pipeline import idle_time
from tensorgate.pipeline.executor import ExecutorThread
from tensorgate.pipeline.placement import plan_placement
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run

_PLANNED = plan_placement("auto")
pytestmark = pytest.mark.skipif(_PLANNED is None or _PLANNED.shared,
                                reason="placement needs Linux and two or more usable CPUs "
                                       "(a CPU quota of one CPU or less shares one core)")


@pytest.fixture(autouse=True)
def two_cpus() -> Iterator[list[int]]:
    """Two CPUs, as on the machine these defaults were measured on (loop on the first, the
    first instance on the second); afterwards pytest's thread, which the engine pins to the
    loop's CPU, gets all of its CPUs back."""
    cpus = os.sched_getaffinity(0)
    two = sorted(cpus)[:2]
    os.sched_setaffinity(0, two)
    yield two
    os.sched_setaffinity(0, cpus)


@pytest.fixture(scope="module")
def placement_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("placement")
    second = sorted(os.sched_getaffinity(0))[1]
    pinned = f'parameters {{ key: "cpu_affinity" value {{ string_value: "{second}" }} }}'
    one = "instance_group [ { count: 1 kind: KIND_CPU } ]"
    threads = 'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "2" } }'
    for name, extra in (("heavy", ""), ("heavy_one", one), ("heavy_pinned", pinned),
                        ("heavy_threads", threads)):
        rb.add_torchscript(root, name, rb.Heavy(), [64, 256], [64, 256], max_batch=0, extra=extra)
    # about 20 ms a forward: more than the time at SCHED_IDLE a busy loop's core leaves it
    rb.add_torchscript(root, "heavy_long", rb.Heavy(rounds=160), [64, 256], [64, 256],
                       max_batch=0)
    rb.add_torchscript(root, "light", rb.Identity(), [4], [4], max_batch=0)
    return root


def _request(model: str, seed: int) -> InferenceRequest:
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(seed))
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")})


def test_heavy_model_gets_a_spare_that_runs_only_when_the_first_is_busy(
        placement_repo: pathlib.Path, two_cpus: list[int]) -> None:
    direct = torch.jit.script(rb.Heavy().eval())

    async def scenario() -> None:
        engine = Engine(placement_repo, placement="auto")
        await engine.start(["heavy"])
        version = engine._served.versions["heavy"][1]
        first, spare = version.executors  # one thread against one on 2 cores
        assert (first.cpus, spare.cpus) == (f"cpu {two_cpus[1]}", f"cpu {two_cpus[0]}")
        assert spare.runner is first.runner  # one copy of the weights
        _assert_spare_on_idle_time(first, spare)

        for seed in range(4):  # one at a time: always the first instance
            await engine.infer(_request("heavy", seed))
        assert (first.batches_run, spare.batches_run) == (4, 0)

        results = await asyncio.gather(*(engine.infer(_request("heavy", s)) for s in range(6)))
        assert spare.batches_run > 0 and first.batches_run + spare.batches_run == 10
        for seed, result in enumerate(results):  # the same answers from either instance
            x = _request("heavy", seed).inputs["INPUT__0"].torch()
            torch.testing.assert_close(result.outputs["OUTPUT__0"].torch(), direct(x))
        await engine.shutdown()
    run(scenario())


def _assert_spare_on_idle_time(first: ExecutorThread, spare: ExecutorThread) -> None:
    """The spare runs on the loop core's idle time where it may later be raised back
    (pipeline/idle_time.py), else at the default priority; the first always at the default."""
    assert os.sched_getscheduler(first.thread_id) == os.SCHED_OTHER and first.idle_time is None
    if idle_time._may_lower_and_raise():
        assert os.sched_getscheduler(spare.thread_id) == os.SCHED_IDLE
        assert spare.idle_time is not None and spare.forward_ns == first.forward_ns
    else:
        assert os.sched_getscheduler(spare.thread_id) == os.SCHED_OTHER
        assert spare.idle_time is None


def test_a_spare_given_a_batch_is_not_starved_by_a_loop_that_then_stays_busy(
        placement_repo: pathlib.Path) -> None:
    """At SCHED_IDLE a spare runs only on its core's idle time; a batch it took just before
    the loop got busy would wait for as long as the loop stays so, were it not raised back
    once overdue (pipeline/idle_time.py). The loop here spins for up to 10 s: the spare's
    request is answered while it spins, and the spare was raised to answer it.

    The spare's batch is a 20 ms one (heavy_long): on a busy core the kernel still gives a
    SCHED_IDLE thread a slice of a few ms now and then (2 ms batches were done in one within
    their 5 ms, unraised, in 8 of 60 runs; 20 ms ones in none of 70). The loop spins 7 ms at
    a time, longer than CPython's 5 ms switch interval: spinning 2 ms at a time, it kept the
    first instance's answer waiting as long as it spun in some runs (1 to 10 s, 5 of 40; at
    7 ms none of 40), that thread waking every 5 ms and sleeping again. That fits the GIL: a
    thread waiting for it asks the holder to let go only after a whole switch interval
    without a switch, and starts over each time the holder lets go and takes it back first,
    as this loop did in its selector's call at each yield. (Seen only with the spare at
    SCHED_IDLE, done by then, which this does not explain.)"""
    if not idle_time._may_lower_and_raise():
        pytest.skip("this process may not raise a thread back from SCHED_IDLE")

    async def scenario() -> None:
        engine = Engine(placement_repo, placement="auto")
        await engine.start(["heavy_long"])
        try:
            first, spare = engine._served.versions["heavy_long"][1].executors
            # one for the first instance, one for the spare, handed over before the loop spins
            answers = [asyncio.ensure_future(engine.infer(_request("heavy_long", s)))
                       for s in (1, 2)]
            await asyncio.sleep(0)
            deadline = time.monotonic() + 10.0
            while not all(a.done() for a in answers) and time.monotonic() < deadline:
                spun = time.monotonic() + 0.007
                while time.monotonic() < spun:
                    pass  # the loop's core busy: nothing idle for the spare
                await asyncio.sleep(0)
            assert all(a.done() for a in answers), (
                f"the spare's batch starved behind the loop: {_state(answers, first, spare)}")
            assert spare.batches_run == 1 and spare.idle_time is not None
            assert spare.idle_time.raises == 1, _state(answers, first, spare)
        finally:  # (a failure here must not leave a spare thread to the tests after it)
            await engine.shutdown()
    run(scenario())


def _state(answers: list[asyncio.Future[object]], first: ExecutorThread,
           spare: ExecutorThread) -> str:
    """What a starved spare's test says of it: enough to tell which part did not happen."""
    idle = spare.idle_time
    policy = os.sched_getscheduler(spare.thread_id) if spare.thread_id else None
    return (f"answers done {[a.done() for a in answers]}; first ran {first.batches_run}, "
            f"done {first.batches_done}; spare ran {spare.batches_run}, done "
            f"{spare.batches_done}, busy {spare.busy_since > 0}, policy {policy} (idle is "
            f"{os.SCHED_IDLE}), raised {idle and idle.raised}, raises {idle and idle.raises}")


def test_configured_and_light_models_get_no_spare(placement_repo: pathlib.Path,
                                                  two_cpus: list[int]) -> None:
    async def scenario() -> None:
        engine = Engine(placement_repo, placement="auto")
        # heavy_threads: a spare of 1 thread would be twice as slow as its 2-thread first
        names = ["heavy_one", "heavy_pinned", "heavy_threads", "light"]
        await engine.start(names)
        for name in names:
            version = engine._served.versions[name][1]
            assert len(version.executors) == 1, name
        light = engine._served.versions["light"][1].executors[0]
        assert light.cpus.startswith(f"cpu {two_cpus[0]} (the loop's")
        # on the loop's core too, but not a spare: the default priority
        assert os.sched_getscheduler(light.thread_id) == os.SCHED_OTHER
        await engine.shutdown()
    run(scenario())


def test_unload_stops_the_spare_too(placement_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(placement_repo, placement="auto")
        await engine.start(["heavy"])
        spare = engine._served.versions["heavy"][1].executors[1]
        spares.append(spare.thread_id)
        await engine.unload("heavy")
        assert spare.stopped.done()
        # raised as it was told to stop, so that a busy loop could not hold up the unload
        assert spare.idle_time is None or spare.idle_time.raised
        await engine.shutdown()
    spares: list[int | None] = []
    run(scenario())
    assert spares[0] is not None
    # its own spare's thread only (one another test left behind is not this test's)
    for thread in [t for t in threading.enumerate() if t.native_id in spares]:
        thread.join(timeout=5.0)  # it settles `stopped`, then returns
        assert not thread.is_alive()


def test_the_loops_thread_is_pinned_until_shutdown_and_then_given_back(
        placement_repo: pathlib.Path, two_cpus: list[int]) -> None:
    """An engine embedded in an application leaves its thread as it found it; one made on
    the pinned thread meanwhile plans as the first did (it planned no placement at all)."""
    async def scenario() -> None:
        engine = Engine(placement_repo, placement="auto")
        await engine.start(["light"])
        assert os.sched_getaffinity(0) == {two_cpus[0]}
        assert Engine(placement_repo, placement="auto")._placement == engine._placement
        await engine.shutdown()
        assert os.sched_getaffinity(0) == set(two_cpus)
    run(scenario())


def test_no_placement_no_spare(placement_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(placement_repo, placement="none")
        await engine.start(["heavy"])
        assert len(engine._served.versions["heavy"][1].executors) == 1
        await engine.shutdown()
    run(scenario())


def test_instances_sharing_a_light_model_join_the_loop_as_the_first(
        tmp_path: pathlib.Path, two_cpus: list[int]) -> None:
    """The instances that run the first's copy of a TorchScript model are placed by the
    forward the first measured: a light one's all on the loop's core."""
    rb.add_torchscript(tmp_path, "light_pair", rb.Identity(), [4], [4], max_batch=0,
                       extra="instance_group [ { count: 2 kind: KIND_CPU } ]")

    async def scenario() -> None:
        engine = Engine(tmp_path, placement="auto")
        await engine.start()
        first, second = engine._served.versions["light_pair"][1].executors
        assert second.runner is first.runner
        for executor in (first, second):
            assert executor.cpus.startswith(f"cpu {two_cpus[0]} (the loop's"), executor.cpus
        await engine.shutdown()
    run(scenario())


def test_a_configured_heavy_models_last_instance_is_a_spare_on_the_loops_core(
        tmp_path: pathlib.Path, two_cpus: list[int], caplog: pytest.LogCaptureFixture) -> None:
    """instance_group count 2 of a heavy model: the first on the other core, the second on
    the loop's, taking batches only while the first is busy (with both on the other core,
    ResNet-50 served half the requests a second of the defaults' instance and spare)."""
    rb.add_torchscript(tmp_path, "heavy_pair", rb.Heavy(), [64, 256], [64, 256], max_batch=0,
                       extra="instance_group [ { count: 2 kind: KIND_CPU } ]")
    direct = torch.jit.script(rb.Heavy().eval())

    async def scenario() -> None:
        engine = Engine(tmp_path, placement="auto")
        await engine.start()
        first, second = engine._served.versions["heavy_pair"][1].executors
        assert (first.cpus, second.cpus) == (f"cpu {two_cpus[1]}", f"cpu {two_cpus[0]}")
        assert second.runner is first.runner
        _assert_spare_on_idle_time(first, second)
        for seed in range(4):  # one at a time: always the first instance
            await engine.infer(_request("heavy_pair", seed))
        assert (first.batches_run, second.batches_run) == (4, 0)
        results = await asyncio.gather(*(engine.infer(_request("heavy_pair", s))
                                         for s in range(6)))
        assert second.batches_run > 0 and first.batches_run + second.batches_run == 10
        for seed, result in enumerate(results):
            x = _request("heavy_pair", seed).inputs["INPUT__0"].torch()
            torch.testing.assert_close(result.outputs["OUTPUT__0"].torch(), direct(x))
        await engine.shutdown()
    with caplog.at_level("INFO", logger="tensorgate.engine"):
        run(scenario())
    assert any(r.getMessage().startswith(
        f"model heavy_pair v1 ready on cpu (cpu {two_cpus[1]}), cpu (cpu {two_cpus[0]}, a "
        "spare); the last 1 run the first's copy of the model") for r in caplog.records)


COUNTING_MODEL = '''
import pathlib
import time

from tensorgate import Model


class Counted(Model):
    """Identity that appends a line to `calls` in its version folder on every forward,
    after sleeping delay_s."""

    def setup(self, context):
        self.calls = pathlib.Path(context.directory) / "calls"
        self.delay = float(context.parameters.get("delay_s", "0"))

    def forward(self, inputs):
        with self.calls.open("a") as out:
            out.write("call\\n")
        time.sleep(self.delay)
        return {"OUTPUT__0": inputs["INPUT__0"]}
'''


def test_a_clearly_heavy_model_is_timed_twice_at_load_not_five_times(
        tmp_path: pathlib.Path) -> None:
    """Placement times batch-1 forwards at load; two far above the light bound decide it,
    and each more was start-up time (a Python model of 2.5 s took 12.5 s more to load)."""
    for name, delay in (("heavy", 0.005), ("light", 0.0)):
        folder = rb.write_config(tmp_path, name, f"""
            name: "{name}"
            backend: "python"
            max_batch_size: 0
            input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
            output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
            parameters {{ key: "delay_s" value {{ string_value: "{delay}" }} }}
            """)
        (folder / "1" / "model.py").write_text(COUNTING_MODEL)

    async def scenario() -> dict[str, int]:
        engine = Engine(tmp_path, placement="auto")
        await engine.start()
        await engine.shutdown()
        return {name: len((tmp_path / name / "1" / "calls").read_text().splitlines())
                for name in ("heavy", "light")}
    warm_up = 1
    assert run(scenario()) == {"heavy": warm_up + 2, "light": warm_up + 5}


def test_post_processing_runs_on_the_models_cpus(placement_repo: pathlib.Path,
                                                 two_cpus: list[int]) -> None:
    """Not on the loop's core (pipeline/postprocess_pool.py); and where nothing is placed,
    on the CPUs of the thread that made the engine."""
    placed = Engine(placement_repo, placement="auto")
    unplaced = Engine(placement_repo, placement="none")
    try:
        for engine, cpus in ((placed, {two_cpus[1]}), (unplaced, set(two_cpus))):
            for thread in engine._postprocess._threads:
                assert thread.native_id is not None
                assert os.sched_getaffinity(thread.native_id) == cpus
    finally:
        for engine in (placed, unplaced):
            engine._postprocess.shutdown()
