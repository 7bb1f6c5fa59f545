"""Results through the engine equal direct calls, for every artifact kind; batched equals
unbatched; a batch of one travels without a copy."""

from __future__ import annotations

import asyncio
import pathlib
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import TensorgateError
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run


def _request(model: str, value: torch.Tensor, name: str = "INPUT__0", **kw) -> InferenceRequest:
    return InferenceRequest(model, {name: TensorView.from_torch(value, name=name)}, **kw)


async def _infer_all(engine: Engine, requests: list[InferenceRequest]) -> list[torch.Tensor]:
    results = await asyncio.gather(*(engine.infer(r) for r in requests))
    return [next(iter(r.outputs.values())).torch() for r in results]


def test_torchscript_equals_direct_call_and_batches(repo: pathlib.Path) -> None:
    direct = rb.linear_module().eval()
    inputs = [torch.randn(1 + i % 2, 8) for i in range(6)]

    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["linear"])
        outputs = await _infer_all(engine, [_request("linear", x) for x in inputs])
        for x, out in zip(inputs, outputs):
            torch.testing.assert_close(out, direct(x), rtol=1e-5, atol=1e-6)
        stats = engine.statistics("linear")[0]
        assert stats["inference_count"] == sum(x.shape[0] for x in inputs)
        assert stats["execution_count"] < len(inputs)  # they were batched together
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
        await engine.shutdown()
    run(scenario())


def test_the_ready_line_says_what_the_load_took(repo: pathlib.Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Start-up time is read in the log first (on the H200 a server took 12 s to be ready,
    and nothing said where): each model's ready line gives its load and warm-up seconds
    (and its CUDA graphs' on a GPU)."""
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["linear"])
        await engine.shutdown()
    with caplog.at_level("INFO", logger="tensorgate.engine"):
        run(scenario())
    said = [r.getMessage() for r in caplog.records if "model linear v1 ready on" in r.getMessage()]
    assert len(said) == 1, said
    assert re.fullmatch(r"model linear v1 ready on cpu \(.+\); load \d+\.\d\d s, warm-up "
                        r"\d+\.\d\d s", said[0]), said


def test_torch_export_and_python_models(repo: pathlib.Path) -> None:
    direct = rb.linear_module().eval()
    xs = [torch.randn(1, 8) for _ in range(3)]
    ys = [torch.randn(2, 4) for _ in range(3)]

    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["exported", "scaled"])
        for x, out in zip(xs, await _infer_all(engine, [_request("exported", x, "x") for x in xs])):
            torch.testing.assert_close(out, direct(x), rtol=1e-5, atol=1e-6)
        for y, out in zip(ys, await _infer_all(engine, [_request("scaled", y) for y in ys])):
            torch.testing.assert_close(out, y * 2 + 1)
        await engine.shutdown()
    run(scenario())


_SCRIPT_HOLDER = '''
from tensorgate import Model


class Holder(Model):
    """Serves a TorchScript network it loads itself."""

    def setup(self, context):
        self.net = context.load_torchscript("net.pt")

    def forward(self, batch):
        return {"OUTPUT__0": self.net(batch["INPUT__0"])}
'''


def test_a_python_model_loads_a_torchscript_network_through_its_context(
        tmp_path: pathlib.Path) -> None:
    """ModelContext.load_torchscript: the module torch.jit.load gives, on the context's
    device (repository/script_archive.py's tests hold the reading to torch.jit.load's)."""
    rb.add_python(tmp_path, "holder", max_batch=4)  # its config; model.py replaced
    folder = tmp_path / "holder"
    (folder / "1" / "model.py").write_text(_SCRIPT_HOLDER)
    torch.manual_seed(0)
    net = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()))
    net.save(str(folder / "1" / "net.pt"))
    xs = [torch.randn(2, 4) for _ in range(3)]

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start(["holder"])
        try:
            for x, out in zip(xs, await _infer_all(engine, [_request("holder", x) for x in xs])):
                torch.testing.assert_close(out, net(x))
        finally:
            await engine.shutdown()
    run(scenario())


def test_batched_equals_unbatched(repo: pathlib.Path) -> None:
    inputs = [torch.randn(1, 8) for _ in range(8)]

    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["linear", "linear_unbatched"])
        batched = await _infer_all(engine, [_request("linear", x) for x in inputs])
        single = [(await _infer_all(engine, [_request("linear_unbatched", x)]))[0]
                  for x in inputs]
        assert engine.statistics("linear")[0]["execution_count"] < len(inputs)
        for b, s in zip(batched, single):
            torch.testing.assert_close(b, s, rtol=1e-5, atol=1e-6)
        unbatched_stats = engine.statistics("linear_unbatched")[0]
        assert unbatched_stats["execution_count"] == len(inputs)
        await engine.shutdown()
    run(scenario())


def test_batch_of_one_is_zero_copy_end_to_end(repo: pathlib.Path) -> None:
    body = bytearray(200 + 48)
    view = TensorView(body, "FP32", [1, 3, 4], 200, name="INPUT__0")
    view.torch()[:] = torch.arange(12, dtype=torch.float32).reshape(1, 3, 4)

    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["identity"])
        request = InferenceRequest("identity", {"INPUT__0": view})
        result = await engine.infer(request)
        out = result.outputs["OUTPUT__0"]
        assert out.address == view.address  # identity returns the request's own bytes
        assert torch.equal(out.torch(), view.torch())
        assert result.ledger.bytes == 0 and result.ledger.calls == 0
        await engine.shutdown()
    run(scenario())


def test_batching_copies_are_counted_per_request(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["identity"])
        for _ in range(3):  # batches start at one row until measured cheap (batch_cap.py)
            await engine.infer(_request("identity", torch.zeros(1, 3, 4)))
        requests = [_request("identity", torch.full((1, 3, 4), float(i))) for i in range(4)]
        results = await asyncio.gather(*(engine.infer(r) for r in requests))
        assert engine.statistics("identity")[0]["execution_count"] == 3 + 1
        for i, result in enumerate(results):
            assert torch.equal(result.outputs["OUTPUT__0"].torch(), torch.full((1, 3, 4), float(i)))
            assert result.ledger.bytes == 48  # its rows, gathered into the staging buffer
        await engine.shutdown()
    run(scenario())


def test_requested_outputs_and_stage_times(repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(repo)
        await engine.start(["linear"])
        result = await engine.infer(_request("linear", torch.randn(1, 8), outputs=["OUTPUT__0"]))
        assert list(result.outputs) == ["OUTPUT__0"]
        times = result.times.as_us()
        assert times["total"] >= times["compute_infer"] > 0
        assert times["queue"] >= 0 and times["compute_output"] >= 0
        stats = engine.statistics("linear")[0]["inference_stats"]
        assert stats["success"]["count"] == 1 and stats["compute_infer"]["ns"] > 0
        await engine.shutdown()
    run(scenario())


def test_buffers_return_by_reference_counting_alone(repo: pathlib.Path) -> None:
    """No request leaves a reference cycle behind: with the GC off, every pooled buffer (the
    input and the batch gathers) is back in the pool as soon as the results are dropped. A
    cycle (a WorkItem's future holding the WorkItem did) keeps each request's tensors alive
    until a collection of the generation it reached: RSS grew by hundreds of MB under load."""
    import gc

    from tensorgate.tensor import BufferPool

    pool = BufferPool(1 << 26)

    async def scenario() -> None:
        engine = Engine(repo, pool=pool)
        await engine.start(["identity", "failing"])
        views = []
        for _ in range(6):
            buffer = pool.acquire(48)
            np.frombuffer(buffer, np.float32, 12)[:] = np.random.rand(12)
            views.append(TensorView(buffer, "FP32", [1, 3, 4]))
        del buffer
        gc.disable()
        try:
            results = await asyncio.gather(*(engine.infer(InferenceRequest(
                "identity", {"INPUT__0": v})) for v in views))
            assert pool.statistics().bytes_in_use > 0
            del results, views
            with pytest.raises(TensorgateError, match="negative input"):  # the failure path too
                await engine.infer(_request("failing", torch.full((1, 4), -1.0)))
            # An executor thread may not have run since it reported its last batch (it waits
            # for the GIL); a cycle, with the GC off, never lets go however long one waits.
            for _ in range(100):
                if not pool.statistics().bytes_in_use:
                    break
                await asyncio.sleep(0.01)
            assert pool.statistics().bytes_in_use == 0
        finally:
            gc.enable()
        await engine.shutdown()
    run(scenario())


def _export(repo: pathlib.Path, name: str, rows: int, batch: object, max_batch: int = 8) -> None:
    """rb.linear_module exported from `rows` example rows with `batch` as its dim 0's
    dynamic shape (None: static), served with max_batch_size `max_batch`."""
    folder = rb.write_config(repo, name, f"""
        name: "{name}"
        platform: "torch_aoti"
        max_batch_size: {max_batch}
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [8] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [4] }} ]
        """)
    shapes = None if batch is None else {"input": {0: batch}}
    program = torch.export.export(rb.linear_module().eval(), (torch.randn(rows, 8),),
                                  dynamic_shapes=shapes)
    torch.export.save(program, str(folder / "1" / "model.pt2"))


def test_exported_programs_load_side_by_side_and_must_take_every_batch(
        tmp_path: pathlib.Path) -> None:
    """Exported programs load at once (torch.export.load keeps a global while it reads:
    two at a time failed one, at every start); one whose batch dim cannot take 1 to
    max_batch_size rows is refused at load, not batch by batch under load."""
    _export(tmp_path, "dynamic", 4, torch.export.Dim.DYNAMIC)  # [2, oo]: takes 1 row too
    _export(tmp_path, "bounded", 2, torch.export.Dim("batch", min=1, max=8))
    _export(tmp_path, "twin", 2, torch.export.Dim("batch", min=1, max=8))
    _export(tmp_path, "too_few_rows", 2, torch.export.Dim("batch", min=1, max=4))
    _export(tmp_path, "fixed", 2, None)
    _export(tmp_path, "fixed_one", 1, None, max_batch=1)
    direct = rb.linear_module().eval()

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        reasons = {e["name"]: e["reason"] for e in engine.index() if e["state"] != "READY"}
        where = {name: tmp_path / name / "1" / "model.pt2" for name in reasons}
        fix = "export it with torch.export.Dim('batch', min=1, max=8) for its batch dim"
        assert reasons == {
            "too_few_rows": f"{where['too_few_rows']}: the exported program takes batches of "
                            f"at most 4 rows, and max_batch_size is 8: set max_batch_size to "
                            f"4 or less, or {fix}",
            "fixed": f"{where['fixed']}: the exported program takes batches of exactly 2 rows, "
                     f"and the batcher makes batches of any size from 1 to max_batch_size 8: "
                     f"{fix}"}
        xs = [torch.randn(1 + i % 3, 8) for i in range(6)]
        for model in ("dynamic", "bounded", "twin"):
            outputs = await _infer_all(engine, [_request(model, x, "x") for x in xs])
            for x, out in zip(xs, outputs):
                torch.testing.assert_close(out, direct(x), rtol=1e-5, atol=1e-6)
        one = torch.randn(1, 8)
        out = (await _infer_all(engine, [_request("fixed_one", one, "x")]))[0]
        torch.testing.assert_close(out, direct(one), rtol=1e-5, atol=1e-6)
        await engine.shutdown()
    run(scenario())


class _OneRow(torch.nn.Module):
    """Traced from one row, its output's shape is a constant: [1, 4] for any batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones(1, 4) * x.mean()


def test_a_model_whose_outputs_do_not_follow_the_batch_fails_its_load(
        tmp_path: pathlib.Path) -> None:
    """Caught at load by a batch of 2 rows, not batch by batch under load (where every
    request of a gathered batch got a 500): of zeros, or with model_warmup samples, a
    sample of 2 rows or more, else the first sample twice; unbatched, the same model
    serves."""
    traced = torch.jit.trace(_OneRow().eval(), (torch.randn(1, 8),))
    sample = ('model_warmup [ {{ name: "w" batch_size: {} inputs {{ key: "INPUT__0" value: '
              '{{ data_type: TYPE_FP32 dims: [8] random_data: true }} }} }} ]')
    for name, max_batch, dims, warmup in (("batched", 8, "[8]", ""),
                                          ("unbatched", 0, "[1, 8]", ""),
                                          ("sample_of_one", 8, "[8]", sample.format(1)),
                                          ("sample_of_three", 8, "[8]", sample.format(3))):
        folder = rb.write_config(tmp_path, name, f"""
            name: "{name}"
            platform: "pytorch_libtorch"
            max_batch_size: {max_batch}
            input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: {dims} }} ]
            output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: {dims.replace("8", "4")} }} ]
            {warmup}
            """)
        traced.save(str(folder / "1" / "model.pt"))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        states = {e["name"]: (e["state"], e["reason"]) for e in engine.index()}
        rest = ("answered 1 row in output 'OUTPUT__0' (shape [1, 4]); with max_batch_size 8 "
                "the first dim of every output must be the batch's rows. A model traced "
                "(torch.jit.trace) from one row may have fixed it: trace it from 2 rows, or "
                "serve it with max_batch_size 0 and the batch in its dims")
        assert states == {
            "batched": ("UNAVAILABLE", f"{tmp_path / 'batched' / '1' / 'model.pt'}: a batch of "
                                       f"2 rows (zeros) {rest}"),
            "sample_of_one": ("UNAVAILABLE", f"{tmp_path / 'sample_of_one' / '1' / 'model.pt'}"
                                             ": a batch of 2 rows (warm-up sample 'w' twice) "
                                             f"{rest}"),
            "sample_of_three": ("UNAVAILABLE", f"{tmp_path / 'sample_of_three' / '1'}"
                                               "/model.pt: a batch of 3 rows (warm-up sample "
                                               f"'w') {rest}"),
            "unbatched": ("READY", "")}
        x = torch.ones(1, 8)
        out = (await _infer_all(engine, [_request("unbatched", x)]))[0]
        torch.testing.assert_close(out, torch.ones(1, 4))
        await engine.shutdown()
    run(scenario())


def test_a_model_file_of_the_wrong_kind_fails_its_load_saying_what_it_is(
        tmp_path: pathlib.Path) -> None:
    """torch.save's files (a pickled module, a state_dict) where TorchScript belongs read to
    torch.jit.load as "corrupted"; the load's reason says what the file is and what to save
    instead, without unpickling it. A program or a TorchScript module under the other
    name is told to change name. The good one beside them serves."""
    module = rb.linear_module().eval()
    files = {
        "pickled": ("model.pt", lambda path: torch.save(module, path)),
        "weights": ("model.pt", lambda path: torch.save(module.state_dict(), path)),
        "program_as_pt": ("model.pt", lambda path: torch.export.save(
            torch.export.export(module, (torch.zeros(2, 8),)), path)),
        "script_as_pt2": ("model.pt2", lambda path: torch.jit.script(module).save(str(path))),
        "pickled_as_pt2": ("model.pt2", lambda path: torch.save(module, path)),
        "good": ("model.pt", lambda path: torch.jit.script(module).save(str(path)))}
    for name, (file_name, save) in files.items():
        platform = "pytorch_libtorch" if file_name == "model.pt" else "torch_aoti"
        folder = rb.write_config(tmp_path, name, f"""
            name: "{name}"
            platform: "{platform}"
            max_batch_size: 0
            input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [2, 8] }} ]
            output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [2, 4] }} ]
            """)
        save(folder / "1" / file_name)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        states = {e["name"]: (e["state"], e["reason"]) for e in engine.index()}
        await engine.shutdown()
        instead = ("not a model tensorgate loads (it does not unpickle models: that runs "
                   "whatever code the file names). Save TorchScript as model.pt "
                   "(torch.jit.script(module).save(path), or torch.jit.trace), a torch.export "
                   "program as model.pt2 (torch.export.save), or load the weights in a "
                   "model.py (ModelContext.load_weights)")

        def where(name: str) -> str:
            return str(tmp_path / name / "1" / files[name][0])
        assert states == {
            "pickled": ("UNAVAILABLE", f"{where('pickled')}: model.pt is a pickled "
                                       "torch.nn.modules.container.Sequential written by "
                                       f"torch.save, {instead}"),
            "weights": ("UNAVAILABLE", f"{where('weights')}: model.pt is a dict (a state_dict "
                                       "or a training checkpoint: weights without the code "
                                       f"that runs them) written by torch.save, {instead}"),
            "program_as_pt": ("UNAVAILABLE", f"{where('program_as_pt')}: model.pt is a "
                                             "torch.export program (torch.export.save): name "
                                             "it model.pt2 (a model.pt is TorchScript)"),
            "script_as_pt2": ("UNAVAILABLE", f"{where('script_as_pt2')}: model.pt2 is "
                                             "TorchScript (torch.jit.save): name it model.pt "
                                             "(a model.pt2 is a torch.export program or an "
                                             "AOTInductor package)"),
            "pickled_as_pt2": ("UNAVAILABLE", f"{where('pickled_as_pt2')}: model.pt2 is a "
                                              "pickled torch.nn.modules.container.Sequential "
                                              f"written by torch.save, {instead}"),
            "good": ("READY", "")}
    run(scenario())


def test_a_warm_up_failing_on_a_batch_dim_written_into_the_dims_says_so(
        tmp_path: pathlib.Path) -> None:
    """dims [1, 3, 8, 8] with max_batch_size 8 (the batch written into the dims, a common
    Triton mistake) gave the convolution 5 dims and the load torch's error alone; the
    reason now says how the server shapes the batch. A model failing for another reason
    (an INT64 input to a float convolution) gets no such hint."""
    conv = torch.jit.script(torch.nn.Conv2d(3, 2, 3).eval())
    for name, dims, datatype in (("batch_in_dims", "[1, 3, 8, 8]", "TYPE_FP32"),
                                 ("wrong_type", "[3, 8, 8]", "TYPE_INT64")):
        folder = rb.write_config(tmp_path, name, f"""
            name: "{name}"
            platform: "pytorch_libtorch"
            max_batch_size: 8
            input [ {{ name: "INPUT__0" data_type: {datatype} dims: {dims} }} ]
            output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [2, 6, 6] }} ]
            """)
        conv.save(str(folder / "1" / "model.pt"))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        reasons = {e["name"]: e["reason"] for e in engine.index()}
        await engine.shutdown()
        assert reasons["batch_in_dims"].startswith(
            "model 'batch_in_dims' failed its warm-up at batch 1 with RuntimeError: ")
        assert reasons["batch_in_dims"].endswith(
            "(With max_batch_size 8 the server adds the batch dim in front of the config's "
            "dims: input 'INPUT__0' dims [1, 3, 8, 8] made a batch of shape [1, 1, 3, 8, 8]. "
            "If the 1 is the batch, write dims [3, 8, 8].)")
        assert reasons["wrong_type"].startswith(
            "model 'wrong_type' failed its warm-up at batch 1 with RuntimeError: ")
        assert "max_batch_size" not in reasons["wrong_type"]
    run(scenario())


def test_an_exported_program_s_variable_dims_take_its_ranges_and_others_are_refused(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """A dim the config leaves -1 takes what the program was exported for: x's sequence 4
    to 32, z's exactly 4, mask's x's. Before, the program never loaded (its warm-up's zeros
    had 1 in the sequence dim: "Guard failed: x.size()[1] >= 4"), and a request outside its
    range was a 500 naming a guard; now the warm-up takes the least size, and such a
    request is refused (400) with the range or the other input."""
    module = rb.Sequences().eval()
    folder = rb.write_sequences_config(tmp_path, "pytorch_export",
                                       "instance_group [ { count: 2 } ]")
    torch.export.save(rb.export_sequences(4, 32), str(folder / "1" / "model.pt2"))

    def request(length: int, z_length: int = 4, mask_length: int = -1
                ) -> tuple[InferenceRequest, torch.Tensor]:
        given = {"x": torch.randn(2, length, 8), "z": torch.randn(2, z_length, 8),
                 "mask": torch.rand(2, length if mask_length < 0 else mask_length)}
        expected = (module(**given) if z_length == 4 and mask_length < 0 else torch.empty(0))
        return (InferenceRequest("sequences", {name: TensorView.from_torch(value, name=name)
                                               for name, value in given.items()}), expected)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        assert [(e["name"], e["state"]) for e in engine.index()] == [("sequences", "READY")]
        for length in (4, 5, 32):
            given, expected = request(length)
            result = await engine.infer(given)
            torch.testing.assert_close(result.outputs["y"].torch(), expected,
                                       rtol=1e-5, atol=1e-5)
        for length, z_length, mask_length, refusal in (
                (3, 4, -1, "input 'x' of model 'sequences' has shape [2,3,8]; the model takes "
                           "4 to 32 in dim 1"),
                (33, 4, -1, "input 'x' of model 'sequences' has shape [2,33,8]; the model "
                            "takes 4 to 32 in dim 1"),
                (4, 5, -1, "input 'z' of model 'sequences' has shape [2,5,8]; the model "
                           "takes exactly 4 in dim 1"),
                (6, 4, 5, "input 'mask' of model 'sequences' has 5 in dim 1, and input 'x' 6 "
                          "in dim 1; the model takes one size in both")):
            with pytest.raises(TensorgateError) as refused:
                await engine.infer(request(length, z_length, mask_length)[0])
            assert (refused.value.status.name, str(refused.value)) == (
                "INVALID_ARGUMENT", refusal + " (the sizes it was exported for)")
        await engine.shutdown()
    with caplog.at_level("INFO", logger="tensorgate.engine"):
        run(scenario())
    where = folder / "1" / "model.pt2"
    said = [r.getMessage() for r in caplog.records if str(where) in r.getMessage()]
    assert said == [f"{where}: dim 1 of input 'x' and dim 1 of input 'mask' take one size in "
                    "the exported program: requests where they differ are refused",
                    f"{where}: input 'x' takes 4 to 32 in dim 1 (the exported program's "
                    "range): requests outside it are refused",
                    f"{where}: config dims [-1, 8] leave dim 1 of input 'z' variable, and the "
                    "exported program takes exactly 4 there: requests of another size are "
                    "refused (give 4 in its dims)",
                    f"{where}: input 'mask' takes 4 to 32 in dim 1 (the exported program's "
                    "range): requests outside it are refused"]  # once, whatever the instances


@pytest.fixture(scope="module")
def sequences_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """rb.export_sequences(4, 32), served with every non-batch dim -1."""
    repo = tmp_path_factory.mktemp("sequences")
    folder = rb.write_sequences_config(repo, "pytorch_export",
                                       "dynamic_batching { max_queue_delay_microseconds: 2000 }")
    torch.export.save(rb.export_sequences(4, 32), str(folder / "1" / "model.pt2"))
    return repo


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 40), st.integers(0, 6),
                          st.one_of(st.none(), st.integers(0, 40))), min_size=1, max_size=24))
def test_any_shapes_are_answered_as_the_module_answers_or_refused_by_the_range_they_miss(
        sequences_repo: pathlib.Path, cases: list[tuple[int, int, int, int | None]]) -> None:
    """Whatever sizes requests bring at once (some gathered into one batch), each is either
    answered as the module itself answers it, or refused (INVALID_ARGUMENT) naming the
    range or the other input it misses; never a 500."""
    module = rb.Sequences().eval()

    async def scenario() -> None:
        engine = Engine(sequences_repo)
        await engine.start()
        sent = [{"x": torch.randn(rows, length, 8), "z": torch.randn(rows, z_length, 8),
                 "mask": torch.rand(rows, length if mask_length is None else mask_length)}
                for rows, length, z_length, mask_length in cases]
        results = await asyncio.gather(*(engine.infer(InferenceRequest("sequences", {
            name: TensorView.from_torch(value, name=name) for name, value in inputs.items()}))
            for inputs in sent), return_exceptions=True)
        await engine.shutdown()
        for inputs, result in zip(sent, results):
            refusal = rb.sequences_refusal(inputs["x"].shape[1], inputs["z"].shape[1],
                                           inputs["mask"].shape[1], 4, 32)
            if refusal is None:
                assert not isinstance(result, BaseException), result
                torch.testing.assert_close(result.outputs["y"].torch(), module(**inputs),
                                           rtol=1e-5, atol=1e-5)
                continue
            assert isinstance(result, TensorgateError), result
            assert result.status.name == "INVALID_ARGUMENT", result
            assert all(part in str(result) for part in refusal), (refusal, result)
    run(scenario())


def test_a_reshaped_input_is_held_to_the_model_s_shape_of_it(tmp_path: pathlib.Path) -> None:
    """x sent flat ([rows, sequence * 8]) and reshaped to the program's [rows, sequence, 8]:
    its range and its tie to mask hold in the model's shape of it; elements that make no
    such shape are refused by name (before, a RuntimeError of torch's: a 500)."""
    folder = rb.write_config(tmp_path, "flat", """
        name: "flat"
        platform: "pytorch_export"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [-1] reshape: { shape: [-1, 8] } },
                { name: "z" data_type: TYPE_FP32 dims: [-1, 8] },
                { name: "mask" data_type: TYPE_FP32 dims: [-1] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [4] } ]
        """)
    torch.export.save(rb.export_sequences(4, 32), str(folder / "1" / "model.pt2"))
    module = rb.Sequences().eval()

    def request(x: torch.Tensor, mask_length: int) -> InferenceRequest:
        inputs = {"x": x, "z": torch.randn(1, 4, 8), "mask": torch.ones(1, mask_length)}
        return InferenceRequest("flat", {name: TensorView.from_torch(value, name=name)
                                         for name, value in inputs.items()})

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        x = torch.randn(1, 5, 8)
        given = request(x.reshape(1, 40), 5)
        result = await engine.infer(given)
        torch.testing.assert_close(result.outputs["y"].torch(), module(
            x, given.inputs["z"].torch(), torch.ones(1, 5)), rtol=1e-5, atol=1e-5)
        for sent, mask_length, refusal in (
                (264, 33, "input 'x' of model 'flat' has shape [1,264], which the model takes "
                          "as [1,33,8]; the model takes 4 to 32 in dim 1 of that (the sizes it "
                          "was exported for)"),
                (48, 5, "input 'mask' of model 'flat' has 5 in dim 1, and input 'x' 6 in dim 1 "
                        "(as the model takes it, reshaped); the model takes one size in both "
                        "(the sizes it was exported for)"),
                (41, 5, "input 'x' of model 'flat' has shape [1,41], whose elements do not make "
                        "the shape [1,-1,8] the model takes it in (its config's reshape)")):
            with pytest.raises(TensorgateError) as refused:
                await engine.infer(request(torch.randn(1, sent), mask_length))
            assert (refused.value.status.name, str(refused.value)) == ("INVALID_ARGUMENT",
                                                                       refusal)
        await engine.shutdown()
    run(scenario())


def test_dims_an_exported_program_sizes_from_one_symbol_are_held_to_how(
        tmp_path: pathlib.Path) -> None:
    """Dims exported as s + 1 and 2*s (rb.Sized): the program loads, and a request whose
    sizes disagree is refused naming the size the model takes there and how it sizes both.
    Before, only dims of s itself were tied and ranges were read as the symbol's: the
    warm-up's zeros took 1 in each dim, the guard "edges.size()[1] == 1 + x.size()[1]"
    failed it, and the program never loaded."""
    rb.write_sized_config(tmp_path, "sized", "pytorch_export")
    torch.export.save(rb.export_sized(), str(tmp_path / "sized" / "1" / "model.pt2"))
    module = rb.Sized().eval()

    def request(length: int, edges: int, pairs: int) -> tuple[InferenceRequest, dict]:
        sent = {"x": torch.randn(1, length, 8), "edges": torch.rand(1, edges),
                "pairs": torch.rand(1, pairs)}
        return InferenceRequest("sized", {name: TensorView.from_torch(value, name=name)
                                          for name, value in sent.items()}), sent

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        assert [(e["name"], e["state"]) for e in engine.index()] == [("sized", "READY")]
        for length in (1, 2, 16):
            given, sent = request(length, length + 1, 2 * length)
            result = await engine.infer(given)
            torch.testing.assert_close(result.outputs["y"].torch(), module(**sent),
                                       rtol=1e-5, atol=1e-5)
        for lengths in ((5, 5, 10), (5, 6, 11), (5, 6, 9), (1, 1, 2), (17, 18, 34)):
            with pytest.raises(TensorgateError) as refused:
                await engine.infer(request(*lengths)[0])
            assert (refused.value.status.name, str(refused.value)) == (
                "INVALID_ARGUMENT", rb.sized_refusal(*lengths))
        await engine.shutdown()
    run(scenario())


def test_a_size_no_whole_s_gives_is_refused_where_the_first_tied_dim_is_sized_from_s(
        tmp_path: pathlib.Path) -> None:
    """pairs (2*s) comes first: an odd length stands for no s, and is refused so; an x that
    is not half of pairs is refused with the size pairs makes it."""
    program = rb.export_pairs_first(batched=False)
    rb.write_config(tmp_path, "pf", """
        name: "pf"
        platform: "pytorch_export"
        max_batch_size: 0
        input [ { name: "pairs" data_type: TYPE_FP32 dims: [1, -1] },
                { name: "x" data_type: TYPE_FP32 dims: [1, -1] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [1, 1] } ]
        """)
    torch.export.save(program, str(tmp_path / "pf" / "1" / "model.pt2"))

    def request(pairs: int, x: int) -> InferenceRequest:
        return InferenceRequest("pf", {"pairs": TensorView.from_torch(torch.ones(1, pairs)),
                                       "x": TensorView.from_torch(torch.ones(1, x))})

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        result = await engine.infer(request(8, 4))
        assert result.outputs["y"].torch().tolist() == [[12.0]]
        for pairs, x, refusal in (
                (7, 4, "input 'pairs' of model 'pf' has 7 in dim 1; the model sizes that dim "
                       "as 2*s, for a whole s"),
                (8, 3, "input 'x' of model 'pf' has 3 in dim 1, and input 'pairs' 8 in dim 1; "
                       "the model takes 4 there: it sizes dim 1 of 'pairs' as 2*s and dim 1 of "
                       "'x' as s, for one s")):
            with pytest.raises(TensorgateError) as refused:
                await engine.infer(request(pairs, x))
            assert (refused.value.status.name, str(refused.value)) == (
                "INVALID_ARGUMENT", refusal + " (the sizes it was exported for)")
        await engine.shutdown()
    run(scenario())


def _save_program(repo: pathlib.Path, name: str, program: torch.export.ExportedProgram,
                  inputs: tuple[str, ...], output: str = "y") -> None:
    """`program` as model `name`: FP32 inputs of dims [-1], batches of up to 8, one FP32
    output of [1]."""
    listed = ", ".join(f'{{ name: "{item}" data_type: TYPE_FP32 dims: [-1] }}'
                       for item in inputs)
    rb.write_config(repo, name, f"""
        name: "{name}"
        platform: "pytorch_export"
        max_batch_size: 8
        input [ {listed} ]
        output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [1] }} ]
        """)
    torch.export.save(program, str(repo / name / "1" / "model.pt2"))


def _random_request(model: str, **lengths: int) -> tuple[InferenceRequest, dict]:
    """A request to `model` of one row of random numbers an input, of these lengths; and
    the tensors sent, by name."""
    sent = {name: torch.randn(1, length) for name, length in lengths.items()}
    return InferenceRequest(model, {name: TensorView.from_torch(value, name=name)
                                    for name, value in sent.items()}), sent


class _Sliced(torch.nn.Module):
    """edges [rows, s + 1] sliced to s, times x [rows, s]: export keeps s from 1 in its range
    constraints, and its guard refuses s = 1 ("-1 + edges.size()[1] != 1")."""

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        return (edges[:, 1:] * x).sum(1, keepdim=True)


def test_a_program_whose_guard_refuses_its_least_sizes_loads_from_the_next(
        tmp_path: pathlib.Path) -> None:
    """Before, the warm-up's zeros at the least sizes the range constraints give failed the
    guard, and the program never loaded. Now the least sizes go up a step of s until it
    runs (x from 2, edges from 3), requests are held to them, and the rest are answered as
    the module answers."""
    s, rows = torch.export.Dim("s", min=1, max=16), torch.export.Dim("rows", min=1, max=8)
    program = torch.export.export(_Sliced(), (torch.randn(2, 5), torch.randn(2, 6)),
                                  dynamic_shapes={"x": {0: rows, 1: s},
                                                  "edges": {0: rows, 1: s + 1}})
    _save_program(tmp_path, "sliced", program, ("x", "edges"))

    def request(length: int, edges: int) -> tuple[InferenceRequest, dict]:
        return _random_request("sliced", x=length, edges=edges)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            assert [(e["name"], e["state"]) for e in engine.index()] == [("sliced", "READY")]
            for length in (2, 7, 16):
                given, sent = request(length, length + 1)
                result = await engine.infer(given)
                torch.testing.assert_close(result.outputs["y"].torch(), _Sliced()(**sent))
            for lengths, refusal in (
                    ((1, 2), "input 'x' of model 'sliced' has shape [1,1]; the model takes 2 "
                             "to 16 in dim 1"),
                    ((2, 2), "input 'edges' of model 'sliced' has shape [1,2]; the model takes "
                             "3 to 17 in dim 1")):
                with pytest.raises(TensorgateError) as refused:
                    await engine.infer(request(*lengths)[0])
                assert (refused.value.status.name, str(refused.value)) == (
                    "INVALID_ARGUMENT", refusal + " (the sizes it was exported for)")
        finally:
            await engine.shutdown()
    run(scenario())


class _Quads(torch.nn.Module):
    """x [rows, 4*k] read as k quads: exported with Dim.AUTO, its guards refuse a dim 1 that
    is no multiple of 4 and k = 1, in words that name the batch dim too ("x.size()[1] *
    x.size()[0] % (4 * x.size()[0]) == 0")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], -1, 4).sum((1, 2)).unsqueeze(1)


def test_a_guard_that_names_the_batch_dim_raises_the_others(tmp_path: pathlib.Path) -> None:
    """The batch dim a guard names is left to the batcher; dim 1 goes up until the warm-up
    runs (8: a multiple of 4, and k = 1 refused), where before the program never loaded. A
    size its range takes and its guard does not is the request's fault: a 400."""
    auto = torch.export.Dim.AUTO
    program = torch.export.export(_Quads(), (torch.randn(2, 8),),
                                  dynamic_shapes={"x": {0: auto, 1: auto}})
    _save_program(tmp_path, "quads", program, ("x",))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            assert [(e["name"], e["state"]) for e in engine.index()] == [("quads", "READY")]
            for length in (8, 12, 64):
                result = await engine.infer(InferenceRequest("quads", {
                    "x": TensorView.from_torch(torch.ones(2, length))}))
                assert result.outputs["y"].torch().tolist() == [[float(length)]] * 2
            with pytest.raises(TensorgateError) as refused:
                await engine.infer(InferenceRequest("quads", {
                    "x": TensorView.from_torch(torch.ones(1, 4))}))
            assert str(refused.value) == ("input 'x' of model 'quads' has shape [1,4]; the "
                                          "model takes 8 or more in dim 1 (the sizes it was "
                                          "exported for)")
            # 10 is in its range, and no multiple of 4: the guard refuses it, each request
            # of such a batch (they batch only with requests of their own dims) with a 400
            refusals = await asyncio.gather(*(engine.infer(InferenceRequest("quads", {
                "x": TensorView.from_torch(torch.ones(1, 10))})) for _ in range(2)),
                                            return_exceptions=True)
            for refusal in refusals:
                assert isinstance(refusal, TensorgateError)
                assert (refusal.status.name, str(refusal)) == ("INVALID_ARGUMENT", (
                    "model 'quads' refused the request's sizes, which its ranges take: its "
                    "exported program's guard failed: x.size()[1] * x.size()[0] % (4 * "
                    "x.size()[0]) == 0 (the sizes it was exported for)"))
            result = await engine.infer(InferenceRequest("quads", {
                "x": TensorView.from_torch(torch.ones(1, 16))}))
            assert result.outputs["y"].torch().tolist() == [[16.0]]
        finally:
            await engine.shutdown()
    run(scenario())


def test_a_program_with_a_dim_sized_from_two_others_loads_and_holds_them(
        tmp_path: pathlib.Path) -> None:
    """rb.Product (y of s*t beside x of s and w of t, Dim.AUTO): s and t start at 2 (its
    guard "y >= 4" keeps them there, so the 0/1 reading is not made), the warm-up's zeros
    agree (x 2, w 2, y 4), and a y that is not x times w is refused quoting the guard.
    Before, the warm-up gave x 1, w 1, y 4, and the program never loaded."""
    _save_program(tmp_path, "product", rb.export_product(), ("x", "w", "y"), output="out")

    def request(x: int, w: int, y: int) -> tuple[InferenceRequest, dict]:
        return _random_request("product", x=x, w=w, y=y)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            assert [(e["name"], e["state"]) for e in engine.index()] == [("product", "READY")]
            for sizes in ((2, 2, 4), (3, 5, 15)):
                given, sent = request(*sizes)
                result = await engine.infer(given)
                torch.testing.assert_close(result.outputs["out"].torch(),
                                           rb.Product()(**sent), rtol=1e-5, atol=1e-5)
            for sizes, refusal in (
                    ((1, 3, 3), "input 'x' of model 'product' has shape [1,1]; the model takes "
                                "2 or more in dim 1 (the sizes it was exported for)"),
                    ((3, 5, 14), "model 'product' refused the request's sizes, which its "
                                 "ranges take: its exported program's guard failed: "
                                 "y.size()[0] * y.size()[1] == y.size()[0] * w.size()[1] * "
                                 "x.size()[1] (the sizes it was exported for)")):
                with pytest.raises(TensorgateError) as refused:
                    await engine.infer(request(*sizes)[0])
                assert (refused.value.status.name, str(refused.value)) == (
                    "INVALID_ARGUMENT", refusal)
        finally:
            await engine.shutdown()
    run(scenario())
