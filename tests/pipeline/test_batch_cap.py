"""The measured batch cap: pure decisions on recorded costs, then through the engine with
real models whose cost per row grows (a CPU-bound model) or falls (a GPU-like one)."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.pipeline.batch_cap import GATHER_BYTES, MIN_COST_NS, PROBE_EVERY, BatchCap
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run

MS = 1_000_000


def _record(cap: BatchCap, rows: int, ms_per_row: float, times: int = 3) -> None:
    for _ in range(times):
        cap.record(rows, int(ms_per_row * MS * rows))


def test_batches_start_at_one_row_and_probe_the_next_size_until_it_is_measured() -> None:
    cap = BatchCap(64)
    assert cap.limit == 1
    limits = [cap.rows_for_next_batch() for _ in range(8)]
    assert limits == [1, 3] * 4  # 2–3 rows not measured yet: every second batch tries them
    _record(cap, 1, 71.0, times=10)
    _record(cap, 2, 90.0, times=2)  # one batch short of counting
    assert cap.limit == 1 and cap.rows_for_next_batch() in (1, 3)


def test_eager_probes_only_while_they_are_cheap() -> None:
    slow, quick = BatchCap(64), BatchCap(64)
    _record(slow, 1, 71.0)   # a probe of 3 rows would take 213 ms: no hurry
    _record(quick, 1, 2.0)   # 6 ms: every second batch until 2–3 rows are measured
    assert [slow.rows_for_next_batch() for _ in range(2 * PROBE_EVERY)].count(3) == 2
    assert [quick.rows_for_next_batch() for _ in range(2 * PROBE_EVERY)].count(3) == PROBE_EVERY


def test_dearer_large_batches_cap_at_the_cheapest_size_and_probe_one_bucket_up() -> None:
    cap = BatchCap(64)
    _record(cap, 1, 71.0)
    _record(cap, 2, 84.0)    # ResNet-50 on one CPU thread: a row costs more in a batch
    assert cap.limit == 1
    limits = [cap.rows_for_next_batch() for _ in range(2 * PROBE_EVERY)]
    assert limits.count(3) == 2 and set(limits) == {1, 3}  # measured: now and then only
    _record(cap, 2, 72.0, times=6)  # later 2–3 rows are as cheap (within 5 %): still one,
    assert cap.limit == 1           # the smallest batches as cheap as any
    _record(cap, 2, 63.0, times=12)  # 11 % cheaper: batches take them, no more
    assert cap.limit == 3
    _record(cap, 2, 50.0, times=12)  # 30 % cheaper, past GROW_MARGIN: the limit grows
    assert cap.limit == 7


def test_cheaper_rows_grow_the_limit_a_bucket_at_a_time_to_the_maximum() -> None:
    cap = BatchCap(64)
    _record(cap, 1, 3.0)
    _record(cap, 2, 2.0)
    assert cap.limit == 7     # 2–3 rows measured cheapest: up to the next bucket, not 64
    _record(cap, 6, 1.2)
    assert cap.limit == 15
    _record(cap, 12, 1.0)
    _record(cap, 24, 0.9)
    _record(cap, 48, 0.8)
    assert cap.limit == 64


def test_a_plateau_settles_on_its_smallest_size() -> None:
    cap = BatchCap(64)
    for rows, ms in ((1, 3.0), (2, 2.0), (6, 1.2), (12, 1.01), (24, 1.0)):
        _record(cap, rows, ms)
    assert cap.limit == 15  # 8–15 rows are within 5 % of 16–31's cost: no need to wait for 31


def test_cheap_models_are_never_capped() -> None:
    cap = BatchCap(64)
    _record(cap, 1, 0.035)   # under MIN_COST_NS a row: the loop's work dominates
    assert MIN_COST_NS > 0.035 * MS and cap.limit == 64  # uncapped once batches of one count
    _record(cap, 2, 0.050)   # dearer per row, still cheap
    assert cap.limit == 64


def test_cheap_rows_on_a_cpu_are_kept_to_what_the_gather_bytes_hold() -> None:
    row = 3 * 224 * 224 * 4  # identity's FP32 image, 602,112 bytes
    cap = BatchCap(64, gather_bytes=GATHER_BYTES)
    _record(cap, 1, 0.035)   # cheap: not capped by cost, but by what its gather copies
    assert cap.rows_for_next_batch(row) == GATHER_BYTES // row == 3 and cap.limit == 3
    assert cap.rows_for_next_batch(4096) == 64 and cap.limit == 64  # small rows: no bound
    assert cap.rows_for_next_batch(2 * GATHER_BYTES) == 1  # larger than it: one request
    gpu = BatchCap(64)       # no gather bound: on a GPU batching pays
    _record(gpu, 1, 0.035)
    assert gpu.rows_for_next_batch(row) == 64
    dear = BatchCap(64, gather_bytes=GATHER_BYTES)
    _record(dear, 1, 71.0)   # a row dearer than MIN_COST_NS: its cost decides, as before
    _record(dear, 2, 50.0, times=12)
    assert dear.rows_for_next_batch(row) in (7, 15) and dear.limit == 7


@pytest.fixture(scope="module")
def cost_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("cost_models")
    # 3 ms × rows ** 1.5: a row costs 3 ms alone, 12 ms in a batch of 16
    rb.add_python(root, "crowded", "dynamic_batching { }", delay_s=0.003, delay_power=1.5,
                  max_batch=16)
    rb.add_python(root, "crowded_uncapped", "dynamic_batching { }", delay_s=0.003,
                  delay_power=1.5, max_batch=16,
                  extra='parameters { key: "batch_cap" value { string_value: "off" } }')
    # 3 ms a batch whatever its rows: a row gets cheaper as batches grow
    rb.add_python(root, "flat", "dynamic_batching { }", delay_s=0.003, max_batch=16)
    # cheap rows (microseconds), one of 602 KB and one of 4 KB
    rb.add_torchscript(root, "wide", rb.Identity(), [3, 224, 224], [3, 224, 224],
                       "dynamic_batching { }", max_batch=16)
    rb.add_torchscript(root, "narrow", rb.Identity(), [1024], [1024], "dynamic_batching { }",
                       max_batch=16)
    return root


def _limit(engine: Engine, model: str) -> int:
    return next(s.batch_rows_limit for s, _ in engine.model_statistics() if s.name == model)


def _batches(engine: Engine, model: str) -> dict[int, int]:
    stats = engine.statistics(model)[0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


async def _waves(engine: Engine, model: str, waves: int, clients: int = 32) -> None:
    for _ in range(waves):
        requests = [InferenceRequest(model, {"INPUT__0": TensorView.from_torch(
            torch.ones(1, 4), name="INPUT__0")}) for _ in range(clients)]
        results = await asyncio.gather(*(engine.infer(r) for r in requests))
        for result in results:
            assert next(iter(result.outputs.values())).torch().tolist() == [[3.0] * 4]


def _serve(repo: pathlib.Path, model: str, waves: int,
           then: int = 0) -> tuple[int, dict[int, int], dict[int, int]]:
    """Start `model`, send four single requests (batch-1 costs), then `waves` waves of 32
    concurrent ones. Returns the limit then, the batches run so far (rows: count), and the
    batches run by `then` more waves."""
    async def scenario() -> tuple[int, dict[int, int], dict[int, int]]:
        engine = Engine(repo, placement="none")
        await engine.start([model])
        await _waves(engine, model, 4, clients=1)
        await _waves(engine, model, waves)
        limit, before = _limit(engine, model), _batches(engine, model)
        await _waves(engine, model, then)
        after = _batches(engine, model)
        await engine.shutdown()
        return limit, before, {rows: after[rows] - before.get(rows, 0) for rows in after}
    return run(scenario())


def test_engine_caps_a_model_whose_rows_cost_more_in_batches(cost_repo: pathlib.Path) -> None:
    limit, _, later = _serve(cost_repo, "crowded", 3, then=2)
    assert limit == 1
    assert sum(n for rows, n in later.items() if rows > 3) == 0, later  # probes: ≤ 3 rows
    assert later[1] >= 32


def test_engine_lets_batches_grow_when_rows_get_cheaper(cost_repo: pathlib.Path) -> None:
    limit, batches, _ = _serve(cost_repo, "flat", 12)
    assert limit == 16 and max(batches) >= 8


def test_batch_cap_off_keeps_the_configured_maximum(cost_repo: pathlib.Path) -> None:
    limit, batches, _ = _serve(cost_repo, "crowded_uncapped", 3)
    assert limit == 16 and max(batches) > 3


def test_engine_keeps_cheap_wide_rows_to_the_gather_bytes(cost_repo: pathlib.Path) -> None:
    async def waves(engine: Engine, model: str, shape: tuple[int, ...], clients: int) -> None:
        for _ in range(3):
            x = torch.arange(float(torch.Size(shape).numel())).reshape(1, *shape)
            requests = [InferenceRequest(model, {"INPUT__0": TensorView.from_torch(
                x, name="INPUT__0")}) for _ in range(clients)]
            for result in await asyncio.gather(*(engine.infer(r) for r in requests)):
                assert torch.equal(result.outputs["OUTPUT__0"].torch(), x)

    async def scenario() -> dict[str, tuple[int, dict[int, int]]]:
        engine = Engine(cost_repo, placement="none")
        await engine.start(["wide", "narrow"])
        seen = {}
        for model, shape in (("wide", (3, 224, 224)), ("narrow", (1024,))):
            await waves(engine, model, shape, 1)  # batch-1 costs: cheap rows
            await waves(engine, model, shape, 32)
            seen[model] = (_limit(engine, model), _batches(engine, model))
        await engine.shutdown()
        return seen

    seen = run(scenario())
    limit, batches = seen["wide"]
    assert limit == GATHER_BYTES // (3 * 224 * 224 * 4) == 3 and max(batches) <= 3, batches
    limit, batches = seen["narrow"]
    assert limit == 16 and max(batches) > 3, batches  # 4 KB rows batch as they come


_COUNTED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        counted = np.full((1, 1), len(requests), np.int32)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("REQUESTS", counted)])
                for _ in requests]
"""


def test_a_model_given_its_requests_one_by_one_has_no_gather_bound(
        tmp_path: pathlib.Path) -> None:
    """A Triton Python model's execute takes a batch's requests as they are (nothing is
    gathered): cheap rows of 2.4 MB, past GATHER_BYTES, still batch."""
    folder = rb.write_config(tmp_path, "counted", """
        name: "counted"
        backend: "python"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 600000 ] } ]
        output [ { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 50000 }
        """)
    (folder / "1" / "model.py").write_text(_COUNTED)

    async def scenario() -> tuple[list[int], int]:
        engine = Engine(tmp_path, placement="none")
        await engine.start(["counted"])
        x = TensorView.from_torch(torch.zeros(1, 600_000), name="X")
        requests = []
        for clients in (1, 1, 1, 1, 8):  # batch-1 costs (cheap), then 8 at once
            answers = await asyncio.gather(*(engine.infer(InferenceRequest(
                "counted", {"X": x})) for _ in range(clients)))
            requests = [int(a.outputs["REQUESTS"].torch()[0, 0]) for a in answers]
        limit = _limit(engine, "counted")
        await engine.shutdown()
        return requests, limit

    assert 600_000 * 4 > GATHER_BYTES
    requests, limit = run(scenario())
    assert limit == 8 and max(requests) > 1, (limit, requests)  # bounded, it would be one
