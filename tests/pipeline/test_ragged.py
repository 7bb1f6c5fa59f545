"""Ragged batching (Triton's allow_ragged_batch, batch_input, batch_output): requests of
different shapes batch together, the model gets their elements end to end with batch inputs
that say where each ends, and a batch output goes back to each request in its input's shape."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator
from typing import Tuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InternalError, InvalidArgumentError, ModelConfigError
from tensorgate.pipeline.aoti_child import made_batch_input
from tensorgate.pipeline.ragged import batch_input_values, flatten, scatter
from tensorgate.repository.model_config import ModelSpec, parse_model_config
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run

KINDS = ["BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT",
         "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
         "BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"]


def _config(batch_inputs: str = "", batch_outputs: str = "", extra: str = "",
            max_batch: int = 8, dims: str = "[ -1 ]") -> str:
    return f"""
        name: "ragged"
        platform: "pytorch_libtorch"
        max_batch_size: {max_batch}
        input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: {dims} allow_ragged_batch: true }} ]
        output [ {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
                 {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        {batch_inputs}
        {batch_outputs}
        {extra}
        """


def _batch_input(kind: str, target: str, datatype: str = "TYPE_FP32",
                 source: str = "INPUT") -> str:
    return (f'batch_input {{ kind: {kind} target_name: "{target}" data_type: {datatype} '
            f'source_input: "{source}" }}')


def _spec(text: str) -> ModelSpec:
    return parse_model_config(text, "ragged/config.pbtxt")


def test_each_batch_input_kind_from_the_requests_shapes() -> None:
    spec = _spec(_config(" ".join(_batch_input(kind, kind, "TYPE_INT32") for kind in KINDS),
                         dims="[ -1, -1 ]"))
    # Triton's examples: counts for requests of 3, 4 and 5 elements; item shapes for a
    # batch-2 request of [3, 1] items with a batch-1 request of a [2, 2] item.
    counts = batch_input_values(spec, [{"INPUT": torch.zeros(1, 1, n)} for n in (3, 4, 5)])
    assert counts["BATCH_ELEMENT_COUNT"].tolist() == [3, 4, 5]
    assert counts["BATCH_ACCUMULATED_ELEMENT_COUNT"].tolist() == [3, 7, 12]
    assert counts["BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"].tolist() == [0, 3, 7, 12]
    assert counts["BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"].shape == (5,)
    assert all(v.dtype == torch.int32 for v in counts.values())
    shapes = batch_input_values(spec, [{"INPUT": torch.zeros(2, 3, 1)},
                                       {"INPUT": torch.zeros(1, 2, 2)}])
    assert shapes["BATCH_ITEM_SHAPE"].tolist() == [[3, 1], [3, 1], [2, 2]]
    assert shapes["BATCH_ITEM_SHAPE_FLATTEN"].tolist() == [3, 1, 3, 1, 2, 2]
    assert shapes["BATCH_ELEMENT_COUNT"].tolist() == [6, 4]  # the batch dim counts too


def test_scatter_cuts_the_flat_output_in_each_requests_input_shape() -> None:
    flat = torch.arange(12.0)
    parts = scatter(flat, (-1,), [(1, 3), (1, 4), (1, 5)], "m", "OUT")
    assert [p.shape for p in parts] == [(1, 3), (1, 4), (1, 5)]
    assert parts[2].tolist() == [[7.0, 8.0, 9.0, 10.0, 11.0]]
    assert parts[0].data_ptr() == flat.data_ptr()  # views, no copy
    with pytest.raises(InternalError, match=r"^model 'm' output 'OUT' has 12 elements; "
                                            r"scattered in its requests' input shapes it needs "
                                            r"13$"):
        scatter(flat, (-1,), [(1, 3), (1, 10)], "m", "OUT")


@pytest.mark.parametrize(("text", "message"), [
    (_config(_batch_input("BATCH_ELEMENT_COUNT", "N", source="NOPE")),
     r"batch_input 'N': source_input 'NOPE' is not an input; inputs are: INPUT$"),
    (_config(_batch_input("BATCH_ELEMENT_COUNT", "INPUT")),
     r"batch_input 'INPUT' is also a config input"),
    (_config(_batch_input("BATCH_ELEMENT_COUNT", "N", "TYPE_FP16")),
     r"batch_input 'N' has data_type TYPE_FP16; it must be TYPE_INT32, TYPE_INT64, TYPE_FP32$"),
    (_config(max_batch=0), r"ragged batching .* needs 'max_batch_size' of 1 or more$"),
    (_config(extra="sequence_batching { }"), r"is not supported with 'sequence_batching'"),
    (_config(batch_outputs='batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
                           'target_name: "NOPE" source_input: "INPUT" }'),
     r"batch_output 'NOPE' is not an output; outputs are: SUM, OUT$"),
    (_config('batch_input { kind: BATCH_ELEMENT_COUNT target_name: ["A", "B"] '
             'data_type: TYPE_INT32 source_input: "INPUT" }'),
     r"'target_name' must name exactly one tensor, got 2$"),
])
def test_a_ragged_config_that_cannot_work_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        _spec(text)


class RaggedSum(torch.nn.Module):
    """Each request's sum, from the flat input and where each request ends; and the input
    doubled, for the server to cut back per request."""

    def forward(self, x: torch.Tensor, ends: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        ends = ends.to(torch.int64)
        sums = []
        start = 0
        for i in range(ends.shape[0]):
            end = int(ends[i])
            sums.append(x[start:end].sum())
            start = end
        return torch.stack(sums).unsqueeze(1), x * 2


SCATTER = ('batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" '
           'source_input: "INPUT" }')


def add_ragged(repo: pathlib.Path) -> None:
    folder = rb.write_config(repo, "ragged", _config(
        _batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT", "ENDS", "TYPE_INT32"), SCATTER,
        # batch_cap off: the first batches would otherwise start at one row (batch_cap.py)
        'dynamic_batching { max_queue_delay_microseconds: 200000 } '
        'parameters { key: "batch_cap" value { string_value: "off" } }'))
    torch.jit.script(RaggedSum().eval()).save(str(folder / "1" / "model.pt"))


def test_requests_of_different_lengths_batch_and_each_gets_its_own_answer(
        tmp_path: pathlib.Path) -> None:
    add_ragged(tmp_path)
    values = [torch.arange(1.0, n + 1).reshape(1, n) for n in (3, 4, 5)]

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            results = await asyncio.gather(*(
                engine.infer(InferenceRequest("ragged", {
                    "INPUT": TensorView.from_torch(v, name="INPUT")})) for v in values))
            for value, result in zip(values, results):
                assert result.outputs["SUM"].torch().tolist() == [[float(value.sum())]]
                out = result.outputs["OUT"].torch()
                assert out.shape == value.shape
                torch.testing.assert_close(out, value * 2)
            stats = engine.statistics("ragged")[0]
            assert stats["inference_count"] == 3
            assert stats["execution_count"] == 1  # one batch of the three lengths
            # alone, a request is its own batch: flat, with its one end
            alone = await engine.infer(InferenceRequest("ragged", {
                "INPUT": TensorView.from_torch(values[1], name="INPUT")}))
            assert alone.outputs["SUM"].torch().tolist() == [[10.0]]
        finally:
            await engine.shutdown()
    run(scenario())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 7)), min_size=1, max_size=8))
def test_flat_batch_and_scatter_give_each_request_back_its_own(
        requests: list[tuple[int, int]]) -> None:
    """Any mix of batch sizes and lengths: the ends say where each request's elements are
    in the flat batch, and scattering the flat batch returns each request's tensor."""
    spec = _spec(_config(_batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "ENDS",
                                      "TYPE_INT64"), SCATTER))
    tensors = []
    counter = 0
    for rows, length in requests:
        tensors.append(torch.arange(counter, counter + rows * length,
                                    dtype=torch.float32).reshape(rows, length))
        counter += rows * length
    flat = torch.cat([flatten(t) for t in tensors])
    ends = batch_input_values(spec, [{"INPUT": t} for t in tensors])["ENDS"].tolist()
    for index, tensor in enumerate(tensors):
        torch.testing.assert_close(flat[ends[index]:ends[index + 1]], tensor.reshape(-1))
    parts = scatter(flat, (-1,), [t.shape for t in tensors], "m", "OUT")
    for part, tensor in zip(parts, tensors):
        torch.testing.assert_close(part, tensor)


def _add_ragged_program(repo: pathlib.Path, name: str, pairs: bool) -> None:
    folder = rb.write_ragged_config(repo, name, "torch_aoti", "w" if pairs else "x")
    torch.export.save(rb.export_ragged(pairs), str(folder / "1" / "model.pt2"))


def _ragged_request(model: str, x: torch.Tensor, w: torch.Tensor) -> InferenceRequest:
    return InferenceRequest(model, {"x": TensorView.from_torch(x[None], name="x"),
                                    "w": TensorView.from_torch(w[None], name="w")})


def test_an_exported_programs_ragged_ranges_and_ties_hold_each_batch_and_request(
        tmp_path: pathlib.Path) -> None:
    """A program's ragged inputs take their elements end to end up to the range it was
    exported for, x and w of one n (or x of 2*n), and its ENDS up to 3 requests. Before,
    the batcher gathered past them and the guards failed every request of the batch
    ("Guard failed: x.size()[0] <= 4096" for two requests of 3,000, each within it), one
    request of x 5 and w 4 failed the one batched beside it, and the Pairs program never
    loaded (its warm-up gave x 1 element). Now batches are formed within the ranges, and a
    request that no batch could take is refused alone, by name: n = 1 too, which the
    program's guard refuses though its range takes it ("x.size()[0] // 2 != 1": learned at
    its warm-up), so that a batch of one request of n = 1 cannot fail."""
    _add_ragged_program(tmp_path, "weighted", pairs=False)
    _add_ragged_program(tmp_path, "pairs", pairs=True)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            executions = {"weighted": 0, "pairs": 0}

            async def batch(model: str, *requests: tuple[torch.Tensor, torch.Tensor]
                            ) -> tuple[list[object], int]:
                answers = await asyncio.gather(
                    *(engine.infer(_ragged_request(model, x, w)) for x, w in requests),
                    return_exceptions=True)
                count = engine.statistics(model)[0]["execution_count"]
                ran, executions[model] = count - executions[model], count
                return [a if isinstance(a, BaseException) else a.outputs["SUM"].torch().item()
                        for a in answers], ran

            big = torch.full((3000,), 0.5)
            assert await batch("weighted", (big, big * 4), (big, big * 2)) == (
                [3000.0, 1500.0], 2)  # 6,000 elements: two batches
            answers, ran = await batch("weighted", (torch.ones(5), torch.ones(4)),
                                       (torch.ones(3), torch.full((3,), 2.0)))
            assert ran == 1 and answers[1] == 6.0
            assert isinstance(answers[0], InvalidArgumentError) and str(answers[0]) == (
                "input 'w' of model 'weighted' has 4 elements, and input 'x' 5; the model "
                "takes as many of both (the sizes it was exported for)")
            answers, ran = await batch("weighted", (torch.ones(5000), torch.ones(5000)))
            assert ran == 0 and str(answers[0]) == (
                "input 'x' of model 'weighted' has 5000 elements; the model takes at most "
                "4096 from a request (the sizes it was exported for)")
            # ENDS takes 3 requests at most: five make two batches, each request its own
            answers, ran = await batch("pairs", *((torch.ones(2 * n), torch.full((n,), 3.0))
                                                  for n in range(2, 7)))
            assert (answers, ran) == ([12.0, 18.0, 24.0, 30.0, 36.0], 2)
            for (x, w), refusal in (
                    ((6, 2), "input 'w' of model 'pairs' has 2 elements, and input 'x' 6; the "
                             "model takes 3 there: it takes n elements of 'w' where it takes "
                             "2*n of 'x', for one n (the sizes it was exported for)"),
                    ((5, 2), "input 'x' of model 'pairs' has 5 elements; the model takes 2*n "
                             "of them, for a whole n (the sizes it was exported for)"),
                    ((2002, 1001), "input 'x' of model 'pairs' has 2002 elements; the model "
                                   "takes at most 2000 from a request (the sizes it was "
                                   "exported for)"),
                    ((2, 1), "input 'x' of model 'pairs' has 2 elements; the model takes at "
                             "least 4 from a request (the sizes it was exported for: fewer "
                             "failed its guard)")):
                answers, ran = await batch("pairs", (torch.ones(x), torch.ones(w)))
                assert ran == 0 and isinstance(answers[0], InvalidArgumentError)
                assert str(answers[0]) == refusal
            assert (await batch("pairs", (torch.ones(4), torch.ones(2))))[0] == [4.0]
        finally:
            await engine.shutdown()
    run(scenario())


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(KINDS), st.integers(0, 50), st.integers(1, 4), st.booleans())
def test_the_load_makes_batch_inputs_as_the_server_makes_them(
        kind: str, total: int, requests: int, ragged: bool) -> None:
    """aoti_child's runs that learn a ragged package's ties make its batch inputs for
    sizes the server never saw: they must be what the server makes for some requests of
    those sizes (zeros there indexed past the input, and the load was refused)."""
    spec = _spec(_config(_batch_input(kind, "B", "TYPE_INT32"), max_batch=8,
                         dims="[ -1 ]" if ragged else "[ 3 ]"))
    made = made_batch_input({"kind": kind, "ragged": ragged},
                            [total] if ragged else [requests, 3], requests, torch.int32,
                            torch.device("cpu"))
    if ragged:  # the child shares the elements out in order, the first ones one more
        counts = [total // requests + (k < total % requests) for k in range(requests)]
        sources = [torch.zeros(1, count) for count in counts]
    else:
        sources = [torch.zeros(1, 3)] * requests
    expected = batch_input_values(spec, [{"INPUT": source} for source in sources])["B"]
    assert made.dtype == expected.dtype and made.shape == expected.shape
    if kind != "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":  # (only its shape says anything)
        assert made.tolist() == expected.tolist()


@pytest.fixture(scope="module")
def pairs_engine(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[Engine, asyncio.AbstractEventLoop]]:
    """The RaggedPairs program served by an Engine, and the loop it runs on."""
    root = tmp_path_factory.mktemp("pairs")
    _add_ragged_program(root, "pairs", pairs=True)
    loop = asyncio.new_event_loop()
    engine = Engine(root)
    loop.run_until_complete(engine.start())
    yield engine, loop
    loop.run_until_complete(engine.shutdown())
    loop.close()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1003), st.integers(0, 600)), min_size=1,
                max_size=7))
def test_any_ragged_requests_at_once_are_answered_alone_right_or_refused_by_name(
        pairs_engine: tuple[Engine, asyncio.AbstractEventLoop],
        sizes: list[tuple[int, int]]) -> None:
    """Requests of any lengths at once, mostly near the tie (x of 2*n beside w of n,
    sometimes one off) and past the range: each gets what it would alone — its own sum,
    whatever batch it rode in (ENDS takes 3 requests, x 2,000 elements) — or its own
    refusal; none fails another."""
    engine, loop = pairs_engine
    requests = [(2 * n + (k % 3 == 2), n + (k % 5 == 4)) for k, (n, _) in enumerate(sizes)]
    requests += [(2 * w, w) for _, w in sizes[:2]]

    async def at_once() -> list[object]:
        return await asyncio.gather(
            *(engine.infer(_ragged_request("pairs", torch.ones(x), torch.full((w,), 2.0)))
              for x, w in requests), return_exceptions=True)

    answers = loop.run_until_complete(at_once())
    for (x, w), answer in zip(requests, answers):
        refusal = rb.ragged_pairs_refusal("pairs", x, w, guarded=True)
        if refusal is None:
            assert not isinstance(answer, BaseException), (x, w, answer)
            assert answer.outputs["SUM"].torch().item() == 4.0 * w
        else:
            assert isinstance(answer, InvalidArgumentError) and str(answer) == refusal
