"""Sequence batching (stateful models), in-process: order, implicit state, controls, slots,
the backlog, idle expiry, instance affinity, and the errors a client gets."""

from __future__ import annotations

import asyncio
import pathlib
import re

import numpy as np
import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InvalidArgumentError, ModelConfigError
from tensorgate.pipeline import sequence_inputs
from tensorgate.pipeline.work import SequenceFlags
from tensorgate.repository.model_config import parse_model_config
from tests.e2e.conftest import memory_bytes
from tests.pipeline import sequence_models as sm
from tests.pipeline.conftest import run


@pytest.fixture(scope="module")
def seq_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("sequences")
    sm.add_accumulate(root, "accumulate", "oldest { max_candidate_sequences: 4 "
                                          "max_queue_delay_microseconds: 20000 }")
    sm.add_accumulate(root, "accumulate_one_slot", "direct { }", max_batch=1)
    sm.add_accumulate(root, "accumulate_idle", idle_us=100_000)
    sm.add_accumulate(root, "accumulate_initial", initial="initial_state { data_type: TYPE_FP32 "
                                                         "dims: [1] data_file: \"ten\" }")
    folder = root / "accumulate_initial" / "initial_state"
    folder.mkdir()
    (folder / "ten").write_bytes(np.array([10.0], dtype="<f4").tobytes())
    sm.add_accumulate(root, "accumulate_in_place", module=sm.AccumulateInPlace())
    sm.add_rows(root, "rows", delay_us=200_000, utilization=0.5)
    sm.add_rows(root, "rows_at_once", delay_us=200_000)  # no utilization: the delay is moot
    sm.add_keyed(root, "keyed")
    sm.add_accumulate(root, "accumulate_iterative", "iterative_sequence: true oldest { }")
    (root / "running_total" / "1").mkdir(parents=True)  # an ensemble with a stateful step
    (root / "running_total" / "config.pbtxt").write_text("""
        name: "running_total"
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [1] } ]
        ensemble_scheduling { step [ { model_name: "accumulate" model_version: -1
          input_map { key: "INPUT" value: "X" } output_map { key: "TOTAL" value: "SUM" } } ] }
        """)
    return root


def _request(model: str, value: float, sequence: int | str | None, start: bool = False,
             end: bool = False, rows: int = 1, **kw) -> InferenceRequest:
    tensor = torch.full((rows, 1), float(value))
    flags = SequenceFlags(sequence, start, end) if sequence is not None else None
    return InferenceRequest(model, {"INPUT": TensorView.from_torch(tensor, name="INPUT")},
                            sequence=flags, **kw)


def _value(result, name: str = "TOTAL") -> float:
    return float(result.outputs[name].torch().flatten()[0])


def test_each_sequence_keeps_its_own_state_in_order_and_batches_with_others(
        seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate"])
        # Three sequences, each sent all at once: their requests must run in order, one at a
        # time, while the sequences share batches.
        calls = []
        for sequence in (1, 2, 3):
            for step in range(5):
                calls.append(engine.infer(_request(
                    "accumulate", sequence * 10 + step, sequence, start=step == 0,
                    end=step == 4)))
        results = await asyncio.gather(*calls)
        for sequence in (1, 2, 3):
            got = [_value(r) for r in results[(sequence - 1) * 5:sequence * 5]]
            steps = [sequence * 10 + k for k in range(5)]
            assert got == [sum(steps[:k + 1]) for k in range(5)]
        rows = [_value(r, "ROWS") for r in results]
        assert max(rows) > 1  # sequences shared batches
        assert max(rows) <= 3  # at most one request of each sequence in a batch
        assert set(results[0].outputs) == {"TOTAL", "ROWS"}  # the state output stays inside
        stats = engine.statistics("accumulate")[0]
        assert stats["inference_stats"]["success"]["count"] == 15
        assert stats["execution_count"] < 15
        await engine.shutdown()
    run(scenario())


def test_a_new_start_resets_the_state_and_the_initial_state_comes_from_its_file(
        seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate", "accumulate_initial"])
        assert _value(await engine.infer(_request("accumulate", 5, 7, start=True))) == 5
        assert _value(await engine.infer(_request("accumulate", 5, 7))) == 10
        assert _value(await engine.infer(_request("accumulate", 1, 7, start=True))) == 1
        assert _value(await engine.infer(_request("accumulate_initial", 1, "a",
                                                  start=True))) == 11
        assert _value(await engine.infer(_request("accumulate_initial", 2, "a"))) == 13
        await engine.shutdown()
    run(scenario())


def test_a_model_updating_its_state_in_place_leaves_other_sequences_alone(
        seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate_in_place"])
        model = "accumulate_in_place"
        assert _value(await engine.infer(_request(model, 5, 1, start=True))) == 5
        assert _value(await engine.infer(_request(model, 5, 1))) == 10
        assert _value(await engine.infer(_request(model, 1, 2, start=True))) == 1
        await engine.shutdown()
    run(scenario())


def test_requests_outside_an_active_sequence_are_refused_with_what_to_do(
        seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate", "rows"])
        with pytest.raises(InvalidArgumentError, match=r"^model 'accumulate' is stateful "
                                                       r"\(sequence_batching\): each request "
                                                       r"needs a non-zero 'sequence_id'"):
            await engine.infer(_request("accumulate", 1, None))
        with pytest.raises(InvalidArgumentError, match=r"^sequence 99 of model 'accumulate' is "
                                                       r"not active: the first request of a "
                                                       r"sequence must set 'sequence_start'"):
            await engine.infer(_request("accumulate", 1, 99))
        with pytest.raises(InvalidArgumentError, match=r"this one has a batch of 2$"):
            await engine.infer(_request("accumulate", 1, 5, start=True, rows=2))
        with pytest.raises(InvalidArgumentError, match=r"^model 'rows' passes sequence ids to "
                                                       r"its control input 'CORRID' as UINT64: "
                                                       r"'sequence_id' must be an integer"):
            await engine.infer(_request("rows", 1, "text-id", start=True))
        # after its end, a sequence is gone: its id needs a new start, and the refusal says
        # how it ended
        await engine.infer(_request("accumulate", 1, 5, start=True, end=True))
        with pytest.raises(InvalidArgumentError, match=r"^sequence 5 of model 'accumulate' is "
                                                       r"not active: it ended \d+ ms ago, at "
                                                       r"its request with 'sequence_end'; the "
                                                       r"first request of a sequence must set "
                                                       r"'sequence_start'$"):
            await engine.infer(_request("accumulate", 1, 5))
        await engine.shutdown()
    run(scenario())


def test_only_the_latest_ended_sequences_are_remembered(seq_repo: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sequence_inputs, "ENDED_KEPT", 2)

    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate"])
        for sequence in (41, 42, 43):
            await engine.infer(_request("accumulate", 1, sequence, start=True, end=True))
        with pytest.raises(InvalidArgumentError, match=r"^sequence 41 of model 'accumulate' is "
                                                       r"not active: the first request of a "
                                                       r"sequence must set 'sequence_start' "
                                                       r"\(a sequence ends"):
            await engine.infer(_request("accumulate", 1, 41))
        for sequence in (42, 43):
            with pytest.raises(InvalidArgumentError, match=r"is not active: it ended "):
                await engine.infer(_request("accumulate", 1, sequence))
        # a string id longer than ENDED_ID_CHARS is not kept once its sequence ends
        long_id = "x" * (sequence_inputs.ENDED_ID_CHARS + 1)
        await engine.infer(_request("accumulate", 1, long_id, start=True, end=True))
        await engine.infer(_request("accumulate", 1, "short", start=True, end=True))
        with pytest.raises(InvalidArgumentError, match=r"is not active: the first request"):
            await engine.infer(_request("accumulate", 1, long_id))
        with pytest.raises(InvalidArgumentError, match=r"is not active: it ended "):
            await engine.infer(_request("accumulate", 1, "short"))
        await engine.shutdown()
    run(scenario())


def test_requests_queued_behind_an_end_fail_unless_they_start_again(
        seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate"])
        first = asyncio.ensure_future(engine.infer(_request("accumulate", 1, 8, start=True)))
        ended = asyncio.ensure_future(engine.infer(_request("accumulate", 2, 8, end=True)))
        late = asyncio.ensure_future(engine.infer(_request("accumulate", 4, 8)))
        again = asyncio.ensure_future(engine.infer(_request("accumulate", 8, 8, start=True)))
        assert _value(await first) == 1
        assert _value(await ended) == 3
        with pytest.raises(InvalidArgumentError, match=r"^sequence 8 of model 'accumulate' is "
                                                       r"not active: it ended \d+ ms ago, at "
                                                       r"its request with 'sequence_end'"):
            await late
        assert _value(await again) == 8
        await engine.shutdown()
    run(scenario())


def test_a_sequence_idle_too_long_is_ended(seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate_idle"])
        await engine.infer(_request("accumulate_idle", 1, 3, start=True))
        assert _value(await engine.infer(_request("accumulate_idle", 1, 3))) == 2
        await asyncio.sleep(0.4)  # max_sequence_idle_microseconds is 0.1 s
        with pytest.raises(InvalidArgumentError) as refused:
            await engine.infer(_request("accumulate_idle", 1, 3))
        ago = re.fullmatch(r"sequence 3 of model 'accumulate_idle' is not active: it ended "
                           r"(\d+) ms ago, after 100 ms without requests "
                           r"\(max_sequence_idle_microseconds\); the first request of a "
                           r"sequence must set 'sequence_start'", refused.value.message)
        assert ago is not None, refused.value.message
        assert int(ago.group(1)) <= 400  # it went at its timeout, not at this request
        (stats, _), = engine.model_statistics()
        assert (stats.sequences_expired, stats.sequences_active) == (1, 0)
        await engine.shutdown()
    run(scenario())


def test_a_sequence_waits_for_a_free_slot(seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate_one_slot"])  # direct, max_batch_size 1: one slot
        model = "accumulate_one_slot"
        assert _value(await engine.infer(_request(model, 1, 1, start=True))) == 1
        waiting = asyncio.ensure_future(engine.infer(_request(model, 5, 2, start=True)))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # sequence 1 holds the only slot
        assert engine.pending(model) == 1
        (stats, _), = engine.model_statistics()
        assert (stats.sequence_slots, stats.sequences_active, stats.sequences_waiting) == \
            (1, 1, 1)
        assert _value(await engine.infer(_request(model, 1, 1, end=True))) == 2
        assert _value(await asyncio.wait_for(waiting, 10)) == 5
        assert (stats.sequences_active, stats.sequences_waiting) == (1, 0)
        await engine.shutdown()
    run(scenario())


def test_direct_keeps_each_sequence_in_its_row_with_ready_false_fillers(
        seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        # direct, 4 slots: a batch waits up to 0.2 s while fewer than 2 have a request
        await engine.start(["rows"])
        for sequence in (11, 12, 13):  # slots 0, 1, 2
            await engine.infer(_request("rows", 0, sequence, start=True))
        await engine.infer(_request("rows", 0, 12, end=True))  # slot 1 is free again
        results = await asyncio.gather(engine.infer(_request("rows", 0, 13)),
                                       engine.infer(_request("rows", 0, 11)))
        seen = {int(r.outputs["CORRID_SEEN"].torch().flatten()[0]):
                (int(r.outputs["ROW"].torch()[0, 0]), int(r.outputs["ROWS"].torch()[0, 0]),
                 int(r.outputs["READY_SEEN"].torch()[0, 0])) for r in results}
        # one batch of three rows: 11 in row 0, a filler (READY 0) in row 1, 13 in row 2
        assert seen == {11: (0, 3, 1), 13: (2, 3, 1)}
        stats = engine.statistics("rows")[0]
        assert stats["inference_stats"]["success"]["count"] == 6  # fillers are not requests
        assert stats["inference_count"] == 6
        assert {b["batch_size"] for b in stats["batch_stats"]} == {1, 2, 3}  # rows run
        await engine.shutdown()
    run(scenario())


def test_a_direct_batch_waits_only_while_too_few_slots_have_a_request(
        tmp_path: pathlib.Path) -> None:
    """As Triton's direct batcher: without minimum_slot_utilization a request runs at once
    whatever max_queue_delay_microseconds says (here 30 s); with 0.5 of 4 slots, two
    sequences' requests run together without waiting for it."""
    sm.add_rows(tmp_path, "at_once", delay_us=30_000_000)
    sm.add_rows(tmp_path, "half", delay_us=30_000_000, utilization=0.5)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            alone = await asyncio.wait_for(engine.infer(_request("at_once", 0, 1, start=True,
                                                                 end=True)), 10)
            assert int(alone.outputs["ROWS"].torch()[0, 0]) == 1
            pair = await asyncio.wait_for(asyncio.gather(
                engine.infer(_request("half", 0, 2, start=True, end=True)),
                engine.infer(_request("half", 0, 3, start=True, end=True))), 10)
            assert [int(r.outputs["ROWS"].torch()[0, 0]) for r in pair] == [2, 2]
        finally:
            await engine.shutdown()
    run(scenario())


@pytest.mark.parametrize("utilization", ["-0.5", "1.5", "nan"])
def test_a_slot_utilization_outside_0_to_1_is_refused(utilization: str) -> None:
    config = sm.ROWS.format(name="m", max_batch=4, delay_us=100, utilization=utilization)
    with pytest.raises(ModelConfigError, match=f"direct minimum_slot_utilization "
                                               f"{utilization} must lie in \\[0, 1\\]"):
        parse_model_config(config)


def test_a_new_sequence_takes_the_lowest_free_slot(seq_repo: pathlib.Path) -> None:
    """Direct: slots handed back are taken again lowest first, before slots never used, so
    batches stay as short as the sequences allow."""
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["rows"])  # direct, 4 slots: a request's row is its slot

        async def row(sequence: int, **flags: bool) -> int:
            result = await engine.infer(_request("rows", 0, sequence, **flags))
            return int(result.outputs["ROW"].torch()[0, 0])
        assert [await row(s, start=True) for s in (21, 22, 23)] == [0, 1, 2]
        await row(22, end=True)
        await row(21, end=True)  # slots 1 and 0 are free again, 3 was never used
        assert [await row(s, start=True) for s in (24, 25, 26)] == [0, 1, 3]
        await engine.shutdown()
    run(scenario())


def test_slots_cost_memory_as_they_are_used_not_as_many_as_configured(
        tmp_path: pathlib.Path) -> None:
    """max_candidate_sequences is an int32 a config (a client's load `config` too) sets at
    will: 30 million slots cost 1.2 GB when each had a list entry from the start."""
    sm.add_accumulate(tmp_path, "many_slots", "oldest { max_candidate_sequences: 30000000 }")

    async def scenario() -> None:
        engine = Engine(tmp_path)
        before = memory_bytes("VmRSS")
        await engine.start(["many_slots"])
        assert memory_bytes("VmRSS") - before < 200 << 20
        (stats, _), = engine.model_statistics()
        assert stats.sequence_slots == 30_000_000
        assert _value(await engine.infer(_request("many_slots", 2, 1, start=True))) == 2
        assert _value(await engine.infer(_request("many_slots", 3, 1, end=True))) == 5
        await engine.shutdown()
    run(scenario())


def test_sequences_stay_on_their_instance(seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["keyed"])  # a Python model keeping totals itself; 2 instances
        calls = []
        for sequence in range(6):  # 4 slots in all: two sequences wait for one
            for step in range(4):
                calls.append(engine.infer(_request("keyed", step + 1, f"s{sequence}",
                                                   start=step == 0, end=step == 3)))
        results = await asyncio.gather(*calls)
        assert [_value(r) for r in results] == [1, 3, 6, 10] * 6
        await engine.shutdown()
    run(scenario())


def test_an_ensemble_passes_its_sequence_to_a_stateful_step(seq_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["running_total"])
        totals = []
        for step, value in enumerate((1.0, 2.0, 3.0)):
            result = await engine.infer(InferenceRequest(
                "running_total", {"X": TensorView.from_torch(torch.full((1, 1), value),
                                                             name="X")},
                sequence=SequenceFlags(21, step == 0, step == 2)))
            totals.append(_value(result, "SUM"))
        assert totals == [1.0, 3.0, 6.0]
        await engine.shutdown()
    run(scenario())


def test_iterative_requests_without_an_id_are_sequences_of_their_own(
        seq_repo: pathlib.Path) -> None:
    """iterative_sequence: a request with no sequence id starts a sequence under an id no
    live sequence has (here not 1, a client's sequence still open), and its answer ends it;
    a client's own sequences work as before, and a client may not join one the server
    made. (Rescheduling itself: tests/e2e/test_iterative_sequences.py.)"""
    async def scenario() -> None:
        engine = Engine(seq_repo)
        await engine.start(["accumulate_iterative"])
        name = "accumulate_iterative"
        assert _value(await engine.infer(_request(name, 100.0, 1, start=True))) == 100.0
        alone = await asyncio.gather(*(engine.infer(_request(name, v, None))
                                       for v in (5.0, 6.0, 7.0)))
        assert [_value(r) for r in alone] == [5.0, 6.0, 7.0]  # a start each: no shared state
        assert _value(await engine.infer(_request(name, 1.0, 1, end=True))) == 101.0
        # the next id the server gives is 5 (1 was taken when it gave 2, 3, 4): a client
        # starting 5 while that request runs is told to choose another
        tasks = [asyncio.ensure_future(engine.infer(_request(name, 8.0, None))),
                 asyncio.ensure_future(engine.infer(_request(name, 9.0, 5, start=True)))]
        with pytest.raises(InvalidArgumentError, match=r"sequence id 5 is taken by a request "
                                                       r"that came without one"):
            await tasks[1]
        assert _value(await tasks[0]) == 8.0
        await engine.shutdown()
    run(scenario())


@pytest.mark.parametrize(("body", "message"), [
    ('control_input [ { name: "INPUT" control [ { kind: CONTROL_SEQUENCE_START '
     'fp32_false_true: [0, 1] } ] } ]',
     r"control_input 'INPUT' has the name of an input; names must be unique"),
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
     'fp32_false_true: [1] } ] } ]',
     r"control_input 'S' needs one of int32_false_true, fp32_false_true or bool_false_true "
     r"with two values: false, then true"),
    ('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
     'data_type: TYPE_FP32 } ] } ]',
     r"control_input 'C': a CORRID control must be TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
     r"TYPE_INT32 or TYPE_STRING, not TYPE_FP32"),
    ('state [ { input_name: "A" output_name: "B" data_type: TYPE_FP32 dims: [2] '
     'initial_state { dims: [3] zero_data: true } } ]',
     r"state 'A': initial_state dims \[3\] must be fixed and fit the state's dims \[2\]"),
    ('state [ { input_name: "A" data_type: TYPE_FP32 dims: [2] } ]',
     r"state 'A' needs both 'input_name' and 'output_name'"),
])
def test_bad_sequence_configs_are_refused_naming_the_field(body: str, message: str) -> None:
    from tensorgate.repository.model_config import parse_model_config
    text = f"""
        name: "m"
        max_batch_size: 2
        input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [1] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [1] }} ]
        sequence_batching {{ {body} }}
        """
    with pytest.raises(ModelConfigError, match=message):
        parse_model_config(text, "m/config.pbtxt")


def test_model_inputs_follow_the_config_inputs_in_config_order() -> None:
    from tensorgate.repository.model_config import parse_model_config
    spec = parse_model_config(sm.ACCUMULATE.format(
        name="a", strategy="", idle_us=0, initial="", max_batch=4), "a/config.pbtxt")
    assert [i.name for i in spec.inputs] == ["INPUT"]
    assert [i.name for i in spec.model_inputs] == ["INPUT", "START", "READY", "TOTAL_IN"]
    assert [o.name for o in spec.model_outputs] == ["TOTAL", "ROWS", "TOTAL_OUT"]
    assert spec.sequence is not None and spec.sequence.strategy == "direct"  # the default
    assert spec.sequence.idle_us == 1_000_000  # 0: Triton's default of 1 s
