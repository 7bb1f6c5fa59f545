"""AOTInductor packages (model.pt2 from torch._inductor.aoti_compile_and_package) served
through tritonclient, and refused at load where their compiled shapes cannot serve what the
config lets in (pipeline/aoti_check.py): unchecked, their code runs on any shape given."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import types
import warnings
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from tensorgate.model import ModelContext
from tensorgate.pipeline import aoti_child
from tensorgate.pipeline.aoti_check import (_described, _exit, _Input, _judge, _last_words,
                                            check_aoti_package)
from tensorgate.pipeline.runner import load_runner
from tensorgate.repository.model_config import ModelConfigError, parse_model_config
from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.pipeline import repo_builder as rb

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="AOTInductor compiles C++: needs g++")


def _package(folder: pathlib.Path, module: torch.nn.Module, dynamic: bool) -> pathlib.Path:
    """Compile `module` (inputs [rows, 8]) for rows in [1, 8] (inductor makes it [2, 8]), or
    for exactly 1 row."""
    shapes = {"input": {0: torch.export.Dim("batch", min=1, max=8)}} if dynamic else None
    program = torch.export.export(module, (torch.randn(2 if dynamic else 1, 8),),
                                  dynamic_shapes=shapes)
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch's own deprecations, inside the compile
        warnings.simplefilter("ignore", FutureWarning)
        return pathlib.Path(torch._inductor.aoti_compile_and_package(
            program, package_path=str(folder / "model.pt2")))


def _config_text(name: str, max_batch: int = 8, dims: str = "[8]",
                 dtype: str = "TYPE_FP32") -> str:
    return f"""
        name: "{name}"
        platform: "torch_aoti"
        max_batch_size: {max_batch}
        input [ {{ name: "x" data_type: {dtype} dims: {dims} }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [4] }} ]
        dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
        """


def _config(repo: pathlib.Path, name: str, package: pathlib.Path, max_batch: int = 8,
            dims: str = "[8]", dtype: str = "TYPE_FP32") -> None:
    folder = rb.write_config(repo, name, _config_text(name, max_batch, dims, dtype))
    shutil.copy(package, folder / "1" / "model.pt2")


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("aoti")
    module = rb.linear_module().eval()
    return {"dynamic": _package(root / "dynamic", module, dynamic=True),
            "static": _package(root / "static", module, dynamic=False)}


def test_packages_serve_batches_within_their_compiled_range_and_others_are_refused(
        tmp_path: pathlib.Path, packages: dict[str, pathlib.Path]) -> None:
    repo = tmp_path / "models"
    _config(repo, "dynamic", packages["dynamic"])
    _config(repo, "static_one", packages["static"], max_batch=1)
    _config(repo, "static_batched", packages["static"])
    _config(repo, "too_many_rows", packages["dynamic"], max_batch=16)
    _config(repo, "wrong_dims", packages["dynamic"], dims="[9]")
    _config(repo, "wrong_dtype", packages["dynamic"], dtype="TYPE_FP64")
    direct = rb.linear_module().eval()
    server = start_server(repo, tmp_path / "server.log")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            reasons = {e["name"]: e["reason"] for e in client.get_model_repository_index()
                       if e["state"] != "READY"}
            where = {name: str(repo / name / "1" / "model.pt2") for name in reasons}
            assert reasons == {
                "static_batched": f"{where['static_batched']}: the AOTInductor package was "
                                  "compiled for batches of exactly 1 row, and max_batch_size "
                                  "is 8: set max_batch_size to 1, or export it with a dynamic "
                                  "batch dim, torch.export.Dim('batch', min=1, max=8)",
                "too_many_rows": f"{where['too_many_rows']}: the AOTInductor package was "
                                 "compiled for batches of at most 8 rows, and max_batch_size "
                                 "is 16: set max_batch_size to 8 or less, or export it with a "
                                 "dynamic batch dim, torch.export.Dim('batch', min=1, max=16)",
                "wrong_dims": f"{where['wrong_dims']}: the AOTInductor package refuses zeros "
                              "shaped as the config says ('x' float32 [1, 9]): "
                              "input_handles[0]: unmatched dim value at 1, expected: 8, but "
                              "got: 9",
                "wrong_dtype": f"{where['wrong_dtype']}: the AOTInductor package refuses zeros "
                               "shaped as the config says ('x' float64 [1, 8]): "
                               "input_handles[0]: unmatched dtype, expected: 6(at::kFloat), "
                               "but got: 7"}

            def infer(model: str, x: np.ndarray) -> np.ndarray:
                with httpclient.InferenceServerClient(server.url) as own:
                    item = httpclient.InferInput("x", list(x.shape), "FP32")
                    item.set_data_from_numpy(x)
                    return own.infer(model, [item]).as_numpy("y")

            rows = [np.random.default_rng(i).standard_normal((1 + i % 3, 8)).astype(np.float32)
                    for i in range(12)]
            with ThreadPoolExecutor(6) as pool:  # a batch of 1 row and batches gathered
                answers = list(pool.map(lambda x: infer("dynamic", x), rows))
            for x, y in zip(rows, answers):
                np.testing.assert_allclose(y, direct(torch.from_numpy(x)).detach().numpy(),
                                           rtol=1e-5, atol=1e-5)
            stats = client.get_inference_statistics("dynamic")["model_stats"][0]
            sizes = {b["batch_size"] for b in stats["batch_stats"]}
            assert 1 in sizes and max(sizes) > 3, sizes  # one row alone, and gathered rows
            one = rows[0][:1]
            np.testing.assert_allclose(infer("static_one", one),
                                       direct(torch.from_numpy(one)).detach().numpy(),
                                       rtol=1e-5, atol=1e-5)
            with pytest.raises(InferenceServerException, match="max_batch_size"):
                infer("static_one", rows[1])  # 2 rows: more than its config lets in
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            item = grpcclient.InferInput("x", [1, 8], "FP32")
            item.set_data_from_numpy(one)
            np.testing.assert_allclose(client.infer("dynamic", [item]).as_numpy("y"),
                                       direct(torch.from_numpy(one)).detach().numpy(),
                                       rtol=1e-5, atol=1e-5)
    finally:
        assert stop_server(server) == 0


@pytest.fixture(scope="module")
def sequences_server(tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[tuple[RunningServer, pathlib.Path]]:
    """A server of rb.Sequences compiled with x's sequence dim 1 to 16 (exported so), z's
    exactly 4 (exported static), and mask's the size of x's (one symbol), every non-batch
    dim -1 in its config; and the package's path."""
    root = tmp_path_factory.mktemp("sequences")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        package = torch._inductor.aoti_compile_and_package(
            rb.export_sequences(1, 16), package_path=str(root / "model.pt2"))
    folder = rb.write_sequences_config(root / "models", "torch_aoti",
                                       "dynamic_batching { max_queue_delay_microseconds: 2000 }")
    shutil.copy(package, folder / "1" / "model.pt2")
    server = start_server(root / "models", root / "server.log")
    try:
        yield server, folder / "1" / "model.pt2"
    finally:
        assert stop_server(server) == 0


def test_variable_dims_are_held_to_the_sizes_the_package_was_compiled_for(
        sequences_server: tuple[RunningServer, pathlib.Path]) -> None:
    """A dim the config leaves variable takes only the sizes the package's code was compiled
    for (sequences_server). Unchecked, the package answered z of 1 row by reading 3 more
    past it, x of 17 as if it were 16, and a mask shorter than x by reading past the mask;
    now such requests are refused naming the range or the other input, and the load says
    what each input takes."""
    module = rb.Sequences().eval()
    server, where = sequences_server
    said = server.log.read_text()
    for line in (f"{where}: config dims [-1, 8] leave dim 1 of input 'z' variable, and the "
                 "AOTInductor package takes exactly 4 there: requests of another size are "
                 "refused (give 4 in its dims)",
                 f"{where}: dim 1 of input 'x' and dim 1 of input 'mask' take one size in "
                 "the AOTInductor package: requests where they differ are refused",
                 f"{where}: input 'x' takes 1 to 16 in dim 1 (the AOTInductor package's "
                 "range): requests outside it are refused"):
        assert line in said, said
    rng = np.random.default_rng(3)

    def inputs(protocol: Any, length: int, z_length: int = 4, mask_length: int = -1
               ) -> tuple[list[Any], np.ndarray]:
        """The request's inputs, and what the module itself answers them with."""
        x = rng.standard_normal((2, length, 8)).astype(np.float32)
        z = rng.standard_normal((2, z_length, 8)).astype(np.float32)
        mask = rng.random((2, length if mask_length < 0 else mask_length), np.float32)
        given = []
        for name, value in (("x", x), ("z", z), ("mask", mask)):
            given.append(protocol.InferInput(name, list(value.shape), "FP32"))
            given[-1].set_data_from_numpy(value)
        if z_length != 4 or mask.shape[1] != length:
            return given, np.empty(0)
        return given, module(*map(torch.from_numpy, (x, z, mask))).detach().numpy()

    for protocol, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        with protocol.InferenceServerClient(url) as client:
            for length in (1, 2, 16):
                given, expected = inputs(protocol, length)
                np.testing.assert_allclose(client.infer("sequences", given).as_numpy("y"),
                                           expected, rtol=1e-5, atol=1e-5)
            for length, z_length, mask_length, refusal in (
                    (17, 4, -1, "input 'x' of model 'sequences' has shape [2,17,8]; the "
                                "model takes 1 to 16 in dim 1"),
                    (3, 1, -1, "input 'z' of model 'sequences' has shape [2,1,8]; the "
                               "model takes exactly 4 in dim 1"),
                    (3, 5, -1, "input 'z' of model 'sequences' has shape [2,5,8]; the "
                               "model takes exactly 4 in dim 1"),
                    (5, 4, 3, "input 'mask' of model 'sequences' has 3 in dim 1, and "
                              "input 'x' 5 in dim 1; the model takes one size in both")):
                with pytest.raises(InferenceServerException) as refused:
                    client.infer("sequences",
                                 inputs(protocol, length, z_length, mask_length)[0])
                assert refusal + " (the sizes it was exported for)" in str(
                    refused.value), refused.value
                assert "400" in str(refused.value) or "INVALID_ARG" in str(refused.value)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 24), st.integers(0, 6),
                          st.one_of(st.none(), st.integers(0, 24))), min_size=1, max_size=12))
def test_any_shapes_sent_at_once_are_answered_as_the_module_does_or_refused(
        sequences_server: tuple[RunningServer, pathlib.Path],
        cases: list[tuple[int, int, int, int | None]]) -> None:
    """Requests of any sizes at once (gathered into batches where they agree), over HTTP:
    each is answered as the module itself answers it, or refused with a 400 naming the
    range or the other input it misses — never an answer read from memory past an input
    (the served copy runs unchecked), never a 500, and the server serves on."""
    server, _ = sequences_server
    rng = np.random.default_rng(len(cases))
    sent = [{"x": rng.standard_normal((rows, length, 8)).astype(np.float32),
             "z": rng.standard_normal((rows, z_length, 8)).astype(np.float32),
             "mask": rng.random((rows, length if mask_length is None else mask_length),
                                np.float32)}
            for rows, length, z_length, mask_length in cases]
    _answered_as_the_module_or_refused(
        server, "sequences", rb.Sequences().eval(), sent, 1e-5,
        lambda given: rb.sequences_refusal(given["x"].shape[1], given["z"].shape[1],
                                           given["mask"].shape[1], 1, 16))


def _answered_as_the_module_or_refused(
        server: RunningServer, model: str, module: torch.nn.Module,
        sent: list[dict[str, np.ndarray]], tolerance: float,
        refusal: Callable[[dict[str, np.ndarray]], list[str] | None]) -> None:
    """Sends each of `sent` to `model` at once over HTTP (some gathered into one batch):
    each must be answered ("y") as `module` answers it, or, where `refusal` gives the parts
    of a message, refused with a 400 holding them."""
    def send(inputs: dict[str, np.ndarray]) -> Any:
        given = []
        for name, value in inputs.items():
            given.append(httpclient.InferInput(name, list(value.shape), "FP32"))
            given[-1].set_data_from_numpy(value)
        with httpclient.InferenceServerClient(server.url) as client:
            try:
                return client.infer(model, given).as_numpy("y")
            except InferenceServerException as error:
                return error

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, sent))
    for inputs, answer in zip(sent, answers):
        parts = refusal(inputs)
        if parts is None:
            assert isinstance(answer, np.ndarray), answer
            expected = module(**{k: torch.from_numpy(v) for k, v in inputs.items()})
            np.testing.assert_allclose(answer, expected.detach().numpy(), rtol=tolerance,
                                       atol=tolerance)
            continue
        assert isinstance(answer, InferenceServerException), answer
        assert answer.status() == "400", answer
        assert all(part in str(answer) for part in parts), (parts, answer)


SPEC = parse_model_config('name: "m" platform: "torch_aoti" max_batch_size: 8 '
                          'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] } ] '
                          'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                          "m/config.pbtxt")
GIVEN = [_Input("x", "float32", [1, 1, 3], [True, True, False])]


def test_both_ways_of_loading_a_package_answer_and_refuse_alike(
        packages: dict[str, pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The checking child calls torch's C++ package loader itself only on torch 2.13, and
    `aoti_load_package` elsewhere (torch 2.11's loader crashed when called so): both give
    the same answer for real rows, and the same refusal, in the checks' words, for a batch
    beyond the compiled range passed as meta tensors (what the probes pass)."""
    monkeypatch.setenv("AOTI_RUNTIME_CHECK_INPUTS", "1")
    rows = torch.randn(3, 8)
    answers, refusals = [], []
    for direct in (aoti_child.DIRECT_LOADER_TORCH, (0, 0)):
        monkeypatch.setattr(aoti_child, "DIRECT_LOADER_TORCH", direct)
        run = aoti_child._loaded(str(packages["dynamic"]))
        with torch.inference_mode():
            answers.append(run([rows]))
        refusals.append(aoti_child._refusal(run, [torch.empty(9, 8, device="meta")]))
    flat = [answer[0] if isinstance(answer, (list, tuple)) else answer for answer in answers]
    torch.testing.assert_close(flat[0], flat[1])
    torch.testing.assert_close(flat[0], rb.linear_module().eval()(rows), rtol=1e-5, atol=1e-5)
    assert refusals[0] is not None and "dim value is too large" in refusals[0], refusals
    assert refusals[0] == refusals[1], refusals


def _runner(path: pathlib.Path) -> Any:
    """`path` loaded as the executor loads a model.pt2 (the package path's own test)."""
    context = ModelContext("lin", 1, path.parent, torch.device("cpu"), 8)
    return load_runner(path, "pt2", parse_model_config(_config_text("lin")), context)


def test_a_package_is_loaded_as_one_not_tried_as_a_program_first(
        packages: dict[str, pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.export.load, given a package, probes the CPU with the C++ compiler first: in an
    image without one (deploy/Dockerfile's) each package's load logged torch's 50-line
    traceback before serving. A package is told by its listing and never given to it."""
    tried: list[str] = []

    def export_load(path: str, *args: Any, **kwargs: Any) -> Any:
        tried.append(path)
        raise RuntimeError("not a torch.export program")

    monkeypatch.setattr(torch.export, "load", export_load)
    runner = _runner(packages["dynamic"])
    rows = torch.randn(3, 8)
    with torch.inference_mode():
        answer = runner.run({"x": rows})
    assert tried == []
    flat = answer[0] if isinstance(answer, (list, tuple)) else answer
    torch.testing.assert_close(flat, rb.linear_module().eval()(rows), rtol=1e-5, atol=1e-5)


def test_a_package_that_does_not_load_is_refused_as_a_package(tmp_path: pathlib.Path) -> None:
    broken = tmp_path / "model.pt2"
    with zipfile.ZipFile(broken, "w") as archive:  # a package's listing, no package inside
        archive.writestr("model/data/aotinductor/model/model.wrapper.so", b"not a library")
    with pytest.raises(ModelConfigError, match="an AOTInductor package that does not load"):
        _runner(broken)


def test_a_temporary_directory_mounted_noexec_is_refused_by_name(
        packages: dict[str, pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """torch unpacks a package's code into TMPDIR and maps it to run it: on a /tmp mounted
    noexec (Docker's `--tmpfs /tmp` unless `:exec`) every package failed its load deep in the
    checking child ("failed to map segment from shared object"). Said by name now."""
    real = os.statvfs
    temporary = os.path.realpath(tempfile.gettempdir())

    def statvfs(path: Any) -> Any:
        found = real(path)
        if os.path.realpath(path) != temporary:
            return found
        return types.SimpleNamespace(f_flag=found.f_flag | os.ST_NOEXEC)

    monkeypatch.setattr(os, "statvfs", statvfs)
    with pytest.raises(ModelConfigError, match=f"temporary directory {temporary} .*noexec"):
        check_aoti_package(packages["dynamic"], parse_model_config(_config_text("lin")),
                           torch.device("cpu"))


def test_a_child_that_crashes_is_reported_with_where_it_crashed() -> None:
    """A package that crashes the checking child (on the GPU machine's torch 2.11 each one
    did, 'exit -11: (nothing on stderr)') is refused with the signal and the child's frame
    from faulthandler's dump, which the child's environment turns on: here a real crash,
    a read of address 0 in a child started as _ask_child starts it."""
    crash = subprocess.run([sys.executable, "-c", "import ctypes\nctypes.string_at(0)"],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    assert crash.returncode < 0
    assert _exit(crash.returncode) == "killed by SIGSEGV"
    assert _last_words(crash.stderr).startswith('crashed at File "/'), crash.stderr
    assert "ctypes" in _last_words(crash.stderr), crash.stderr
    assert _exit(3) == "exit 3" and _last_words("") == "(nothing on stderr)"
    assert _last_words("one\nRuntimeError: two\n") == "RuntimeError: two"


def _judged(error: str, rows: int = 1, view: bool = False) -> None:
    _judge("p", SPEC, GIVEN, error, rows, view, set())


def test_each_refusal_of_the_generated_checks_is_judged_by_what_it_names() -> None:
    """The generated checks' words (torch 2.13's cpp wrapper) for cases the test above does
    not compile: a batch dim from 2 rows is inductor's 0/1 specialization (served); from 4,
    or fixed at 2, a batch of 1 is outside it; a dim the config leaves variable is only
    warned of (where its range was not learned first); a stride (a channels-last export)
    fails the load; a view's device refusal does not."""
    _judged("input_handles[0]: dim value is too small at 0, expected it to be >= 2, but got: 1")
    with pytest.raises(ModelConfigError, match=r"^p: the AOTInductor package was compiled for "
                                               r"batches of at least 4 rows, and the batcher"):
        _judged("input_handles[0]: dim value is too small at 0, expected it to be >= 4, "
                "but got: 1")
    with pytest.raises(ModelConfigError, match=r"compiled for batches of exactly 2 rows, and "
                                               r"the batcher makes batches of any size from 1 "
                                               r"to max_batch_size 8"):
        _judged("input_handles[0]: unmatched dim value at 0, expected: 2, but got: 1")
    _judged("input_handles[0]: dim value is too small at 1, expected it to be >= 2, but "
            "got: 1")  # a variable dim: warned of
    stride = "input_handles[0]: unmatched stride value at 1, expected: 1, but got: 3\n"
    with pytest.raises(ModelConfigError, match=r"refuses zeros shaped as the config says "
                                               r"\('x' float32 \[1, 1, 3\]\): input_handles"
                                               r"\[0\]: unmatched stride value at 1"):
        _judged(stride, rows=2)
    _judged("input_handles[0]: unmatched device type, expected: 00(cpu), but got: 14\n",
            rows=8, view=True)  # a view is a meta tensor: refused for its device by design
    with pytest.raises(ModelConfigError, match=r"refuses zeros .*unmatched dim value at 2"):
        _judged("input_handles[0]: unmatched dim value at 2, expected: 4, but got: 3", rows=2)
    _judged("input_handles[0]: unmatched dim value at 2, expected: 4, but got: 3", rows=8,
            view=True)  # only a view's batch dim counts
    with pytest.raises(ModelConfigError, match=r"compiled for batches of at most 6 rows, and "
                                               r"max_batch_size is 8: set max_batch_size to 6 "
                                               r"or less"):
        _judged("input_handles[0]: dim value is too large at 0, expected to be <= 6, but "
                "got: 8", rows=8, view=True)


def test_the_dims_probed_are_the_variable_ones_of_an_input_as_the_model_takes_it() -> None:
    """The batch dim is the batcher's and a fixed dim the config's; a reshaped input's
    dims are its reshape's; a ragged one is taken flat, its dim 0 probed; a server-made
    one's count is bounded (its range alone), and made by the child as the server makes
    it."""
    spec = parse_model_config(
        'name: "m" platform: "torch_aoti" max_batch_size: 8 input [ '
        '{ name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] }, '
        '{ name: "flat" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ 2, -1 ] } }, '
        '{ name: "r" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ] '
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 '
        'source_input: "r" } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]', "m/config.pbtxt")
    zeros = torch.zeros
    order = ("x", "flat", "r", "n")
    assert _described("x", zeros(1, 1, 3), spec, True, order).probe == (1,)
    assert _described("flat", zeros(1, 2, 1), spec, True, order).probe == (2,)
    ragged = _described("r", zeros(1), spec, True, order)
    assert (ragged.probe, ragged.bound, ragged.ragged, ragged.made) == ((0,), (), True, None)
    count = _described("n", zeros(1), spec, True, order)
    assert (count.probe, count.bound, count.ragged, count.made) == (
        (), (0,), False, {"kind": "BATCH_ELEMENT_COUNT", "source": 2, "ragged": True})
    # a ragged source of two dims a request: the child cannot share its elements out into
    # requests for any size, so the flat dim's range alone is learned
    rows = parse_model_config(
        'name: "m" platform: "torch_aoti" max_batch_size: 8 input [ '
        '{ name: "r" data_type: TYPE_FP32 dims: [ -1, 3 ] allow_ragged_batch: true } ] '
        'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "s" data_type: TYPE_INT32 '
        'source_input: "r" } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]', "m/config.pbtxt")
    assert _described("r", zeros(3), rows, True, ("r", "s")).bound == (0,)


class _TwoGroups(torch.nn.Module):
    """ids, mask, types [rows, s], edges [rows, s + 1]; kv [rows, t, 8], w [rows, t]: two
    groups, their inputs interleaved, whose least sizes collide (edges and w both 3)."""

    def forward(self, ids: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor,
                edges: torch.Tensor, w: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return sum((part.sum(1, keepdim=True) for part in (ids, mask, types, edges, w)),
                   kv.sum((1, 2)).unsqueeze(1))


def _export_two_groups(device: str = "cpu") -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1, max=8)
    s, t = torch.export.Dim("s", min=1, max=64), torch.export.Dim("t", min=1, max=32)
    shapes = ((2, 5), (2, 7, 8), (2, 5), (2, 6), (2, 7), (2, 5))
    return torch.export.export(
        _TwoGroups(), tuple(torch.randn(shape, device=device) for shape in shapes),
        dynamic_shapes={"ids": {0: batch, 1: s}, "kv": {0: batch, 1: t},
                        "mask": {0: batch, 1: s}, "edges": {0: batch, 1: s + 1},
                        "w": {0: batch, 1: t}, "types": {0: batch, 1: s}})


def _serve_package(models: pathlib.Path, name: str, package: pathlib.Path,
                   inputs: dict[str, str], output: str = "y") -> None:
    """`package` as model `name` in `models`: FP32 inputs of these dims, batches of up to
    8, one FP32 output of [1]."""
    listed = ", ".join(f'{{ name: "{input_name}" data_type: TYPE_FP32 dims: {dims} }}'
                       for input_name, dims in inputs.items())
    folder = rb.write_config(models, name, f"""
        name: "{name}"
        platform: "torch_aoti"
        max_batch_size: 8
        input [ {listed} ]
        output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [1] }} ]
        """)
    shutil.copy(package, folder / "1" / "model.pt2")


class _RaggedSum(torch.nn.Module):
    """Each request's sum from the flat input and where each request ends (ENDS), with
    tensor ops only (an AOTInductor package runs no Python loop); and the input doubled."""

    def forward(self, x: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        owner = torch.searchsorted(ends.to(torch.int64), torch.arange(x.shape[0]), right=True)
        sums = torch.zeros(ends.shape[0], dtype=x.dtype).index_add(0, owner, x)
        return sums.unsqueeze(1), x * 2


def _export_ragged_sum() -> torch.export.ExportedProgram:
    return torch.export.export(
        _RaggedSum(), (torch.randn(12), torch.tensor([3, 7, 12], dtype=torch.int32)),
        dynamic_shapes={"x": {0: torch.export.Dim("elements", min=1, max=4096)},
                        "ends": {0: torch.export.Dim("requests", min=1, max=8)}})


@pytest.fixture(scope="module")
def sized_server(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[RunningServer, pathlib.Path]]:
    """A server of rb.Sized compiled with s from 1 to 16, edges s + 1 and pairs 2*s: as
    "sized" with every non-batch dim -1, and as "sized_fixed" with edges' dims [6] (s is
    then 5: a relation to a dim the config fixes); of rb.Product as "product"; of
    rb.PairsFirst as "pairs_first"; of _TwoGroups as "two_groups"; of _RaggedSum as
    "ragged" (ragged batching); of rb.RaggedPairs as "ragged_pairs"; and the root of its
    repository."""
    root = tmp_path_factory.mktemp("sized")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        package = torch._inductor.aoti_compile_and_package(
            rb.export_sized(), package_path=str(root / "model.pt2"))
        product = torch._inductor.aoti_compile_and_package(
            rb.export_product(), package_path=str(root / "product.pt2"))
        pairs_first = torch._inductor.aoti_compile_and_package(
            rb.export_pairs_first(batched=True), package_path=str(root / "pairs_first.pt2"))
        two_groups = torch._inductor.aoti_compile_and_package(
            _export_two_groups(), package_path=str(root / "two_groups.pt2"))
        ragged = torch._inductor.aoti_compile_and_package(
            _export_ragged_sum(), package_path=str(root / "ragged.pt2"))
        ragged_pairs = torch._inductor.aoti_compile_and_package(
            rb.export_ragged(pairs=True), package_path=str(root / "ragged_pairs.pt2"))
    for name, edges in (("sized", "[-1]"), ("sized_fixed", "[6]")):
        folder = rb.write_sized_config(root / "models", name, "torch_aoti", edges)
        shutil.copy(package, folder / "1" / "model.pt2")
    _serve_package(root / "models", "product", product,
                   {"x": "[-1]", "w": "[-1]", "y": "[-1]"}, output="out")
    _serve_package(root / "models", "pairs_first", pairs_first, {"pairs": "[-1]", "x": "[-1]"})
    _serve_package(root / "models", "two_groups", two_groups,
                   {"ids": "[-1]", "kv": "[-1, 8]", "mask": "[-1]", "edges": "[-1]",
                    "w": "[-1]", "types": "[-1]"})
    folder = rb.write_config(root / "models", "ragged", """
        name: "ragged"
        platform: "torch_aoti"
        max_batch_size: 8
        input [ { name: "INPUT" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [1] },
                 { name: "OUT" data_type: TYPE_FP32 dims: [-1] } ]
        batch_input { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ENDS"
                      data_type: TYPE_INT32 source_input: "INPUT" }
        batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT"
                       source_input: "INPUT" }
        dynamic_batching { max_queue_delay_microseconds: 100000 }
        parameters { key: "batch_cap" value { string_value: "off" } }
        """)
    shutil.copy(ragged, folder / "1" / "model.pt2")
    folder = rb.write_ragged_config(root / "models", "ragged_pairs", "torch_aoti", "w")
    shutil.copy(ragged_pairs, folder / "1" / "model.pt2")
    server = start_server(root / "models", root / "server.log")
    try:
        yield server, root / "models"
    finally:
        assert stop_server(server) == 0


def _sized_inputs(protocol: Any, rng: np.random.Generator, length: int, edges: int,
                  pairs: int, rows: int = 1) -> tuple[list[Any], dict[str, np.ndarray]]:
    """A request to "sized" of these lengths: its `protocol` inputs, and the arrays sent."""
    sent = {"x": rng.standard_normal((rows, length, 8)).astype(np.float32),
            "edges": rng.random((rows, edges), np.float32),
            "pairs": rng.random((rows, pairs), np.float32)}
    given = []
    for name, value in sent.items():
        given.append(protocol.InferInput(name, list(value.shape), "FP32"))
        given[-1].set_data_from_numpy(value)
    return given, sent


def test_dims_sized_from_one_another_are_held_to_how_the_package_sizes_them(
        sized_server: tuple[RunningServer, pathlib.Path]) -> None:
    """edges must be one longer than x and pairs twice as long: the package reads x's length
    and sizes the others from it. Before, only equal sizes were learned: edges of x's length
    was answered from a sum read one element past edges, and pairs of 11 where 10 were
    taken answered as if it were 10. Now such requests are refused naming the size the
    model takes and why. A package that sizes a dim from two others (y of x's length times
    w's) is refused at load, where before it served with y unchecked (a y of 4 for x of 3
    and w of 5 was answered, 11 elements read past it); one that sizes a variable dim from
    a dim the config fixes was and is refused at load (its try at the config's sizes
    fails)."""
    module = rb.Sized().eval()
    server, repo = sized_server
    said = server.log.read_text()
    where = repo / "sized" / "1" / "model.pt2"
    for line in (f"{where}: the AOTInductor package sizes dim 1 of input 'x' as s, dim 1 of "
                 "input 'edges' as s + 1 and dim 1 of input 'pairs' as 2*s from one s: "
                 "requests where they disagree are refused",
                 f"{where}: input 'edges' takes 2 to 17 in dim 1 (the AOTInductor package's "
                 "range): requests outside it are refused"):
        assert line in said, said
    rng = np.random.default_rng(5)
    for protocol, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        with protocol.InferenceServerClient(url) as client:
            for length in (1, 2, 16):
                given, sent = _sized_inputs(protocol, rng, length, length + 1, 2 * length, 2)
                expected = module(**{k: torch.from_numpy(v) for k, v in sent.items()})
                np.testing.assert_allclose(client.infer("sized", given).as_numpy("y"),
                                           expected.detach().numpy(), rtol=1e-4, atol=1e-4)
            for lengths in ((5, 5, 10), (5, 7, 10), (5, 6, 11), (5, 6, 2), (3, 18, 6)):
                with pytest.raises(InferenceServerException) as refused:
                    client.infer("sized", _sized_inputs(protocol, rng, *lengths)[0])
                assert rb.sized_refusal(*lengths) in str(refused.value), refused.value
                assert "400" in str(refused.value) or "INVALID_ARG" in str(refused.value)
        with httpclient.InferenceServerClient(server.url) as client:
            state = {m["name"]: m for m in client.get_model_repository_index()}
    assert state["sized"]["state"] == "READY"
    assert state["sized_fixed"]["state"] == "UNAVAILABLE"
    assert state["sized_fixed"]["reason"] == (
        f"{repo / 'sized_fixed' / '1' / 'model.pt2'}: the AOTInductor package refuses zeros "
        "shaped as the config says ('x' float32 [1, 1, 8], 'edges' float32 [1, 6], 'pairs' "
        "float32 [1, 1]): expected size 2==2, stride 6==3 at dim=0; expected size 6==3, "
        "stride 1==1 at dim=1")
    assert state["product"]["state"] == "UNAVAILABLE"
    assert state["product"]["reason"] == (
        f"{repo / 'product' / '1' / 'model.pt2'}: the AOTInductor package sizes the "
        "variable dims of its inputs (dim 1 of 'x', dim 1 of 'w', dim 1 of 'y') from one "
        "another in a way not learned here (dim 1 of 'y' is sized from dim 1 of 'x' and from "
        "dim 1 of 'w'), so a request's sizes could not be checked, and unchecked sizes are "
        "read past: give those dims fixed sizes in the config")


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 18), st.integers(0, 3),
                          st.integers(-2, 2)), min_size=1, max_size=12))
def test_any_sized_lengths_sent_at_once_are_answered_as_the_module_does_or_refused(
        sized_server: tuple[RunningServer, pathlib.Path],
        cases: list[tuple[int, int, int, int]]) -> None:
    """Requests of any lengths at once (edges near s + 1, pairs near 2*s), over HTTP: each
    is answered as the module answers it, or refused with the 400 sized_refusal says."""
    server, _ = sized_server
    rng = np.random.default_rng(len(cases))
    sent = [_sized_inputs(httpclient, rng, length, max(length + 1 - edges_off, 0),
                          max(2 * length + pairs_off, 0), rows)[1]
            for rows, length, edges_off, pairs_off in cases]

    def refusal(given: dict[str, np.ndarray]) -> list[str] | None:
        said = rb.sized_refusal(given["x"].shape[1], given["edges"].shape[1],
                                given["pairs"].shape[1], given["x"].shape[0])
        return None if said is None else [said]
    _answered_as_the_module_or_refused(server, "sized", rb.Sized().eval(), sent, 1e-4, refusal)


def test_a_first_dim_the_package_reads_as_2s_takes_even_sizes_and_sizes_the_next(
        sized_server: tuple[RunningServer, pathlib.Path]) -> None:
    """pairs [rows, 2*s] comes first, x [rows, s] after: the package reads s from pairs and
    puts pairs back from an odd size, so the check learns pairs as 2*s and x as s. Before,
    its least sizes (pairs 4, x 2) agreed, no tie was learned, and x of 4 beside pairs of 10
    was answered, one element read past x."""
    server, repo = sized_server
    where = repo / "pairs_first" / "1" / "model.pt2"
    assert (f"{where}: the AOTInductor package sizes dim 1 of input 'pairs' as 2*s and dim 1 "
            "of input 'x' as s from one s: requests where they disagree are refused"
            ) in server.log.read_text()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        def infer(pairs: int, x: int) -> Any:
            given = []
            for name, length in (("pairs", pairs), ("x", x)):
                given.append(grpcclient.InferInput(name, [2, length], "FP32"))
                given[-1].set_data_from_numpy(np.ones((2, length), np.float32))
            return client.infer("pairs_first", given).as_numpy("y")

        assert infer(10, 5).tolist() == [[15.0], [15.0]]
        assert infer(32, 16).tolist() == [[48.0], [48.0]]
        for pairs, x, refusal in (
                (9, 4, "input 'pairs' of model 'pairs_first' has 9 in dim 1; the model sizes "
                       "that dim as 2*s, for a whole s"),
                (10, 4, "input 'x' of model 'pairs_first' has 4 in dim 1, and input 'pairs' 10 "
                        "in dim 1; the model takes 5 there: it sizes dim 1 of 'pairs' as 2*s "
                        "and dim 1 of 'x' as s, for one s")):
            with pytest.raises(InferenceServerException) as refused:
                infer(pairs, x)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert refusal + " (the sizes it was exported for)" in str(refused.value)


def test_two_groups_whose_sizes_collide_are_each_learned(
        sized_server: tuple[RunningServer, pathlib.Path]) -> None:
    """ids, mask, types and edges (s + 1) are one group, kv and w another, their inputs
    interleaved: at the least sizes edges and w are both [2, 3], and a refusal of one names
    no input. Each group is learned, and a request off either is refused by it. (A first
    version of this change, which took the refused input to be the first of that shape,
    refused the load.)"""
    server, repo = sized_server
    with httpclient.InferenceServerClient(server.url) as client:
        check_two_groups(server.log.read_text(), repo / "two_groups" / "1" / "model.pt2",
                         httpclient, client, "400")


def check_two_groups(said: str, where: pathlib.Path, protocol: Any, client: Any,
                     status: str) -> None:
    """A server serving _TwoGroups' package as "two_groups" (`said`: its log) logged both
    groups; a request on both is answered, at the least sizes too, and one off either is
    refused (`status`) naming the inputs; through `client` of tritonclient's `protocol`."""
    for line in (f"{where}: the AOTInductor package sizes dim 1 of input 'ids' as s, dim 1 of "
                 "input 'mask' as s, dim 1 of input 'edges' as s + 1 and dim 1 of input "
                 "'types' as s from one s: requests where they disagree are refused",
                 f"{where}: dim 1 of input 'kv' and dim 1 of input 'w' take one size in the "
                 "AOTInductor package: requests where they differ are refused"):
        assert line in said, said

    def infer(s: int, t: int, edges: int = -1, w: int = -1) -> Any:
        shapes = {"ids": [1, s], "kv": [1, t, 8], "mask": [1, s],
                  "edges": [1, s + 1 if edges < 0 else edges], "w": [1, t if w < 0 else w],
                  "types": [1, s]}
        given = []
        for name, shape in shapes.items():
            given.append(protocol.InferInput(name, shape, "FP32"))
            given[-1].set_data_from_numpy(np.ones(shape, np.float32))
        return client.infer("two_groups", given).as_numpy("y")

    assert infer(5, 3).tolist() == [[5 * 3 + 6 + 3 * 8 + 3]]
    assert infer(1, 1).tolist() == [[1 * 3 + 2 + 1 * 8 + 1]]  # the least sizes
    for args, refusal in (
            ((5, 3, 5), "input 'edges' of model 'two_groups' has 5 in dim 1, and input "
                        "'ids' 5 in dim 1; the model takes 6 there"),
            ((5, 3, 6, 4), "input 'w' of model 'two_groups' has 4 in dim 1, and input "
                           "'kv' 3 in dim 1; the model takes one size in both")):
        with pytest.raises(InferenceServerException) as refused:
            infer(*args)
        assert refused.value.status() == status and refusal in str(refused.value)


def test_a_ragged_package_loads_and_each_request_gets_its_own_answer(
        sized_server: tuple[RunningServer, pathlib.Path]) -> None:
    """A package that takes requests' elements end to end and where each ends (ENDS, a
    batch input the server makes): its load's tries now pass the ends the server would
    make, where zeros made it index past its input ("index out of bounds", the load
    refused); and the ends count requests, not rows, so its 0/1 specialization there is
    not a batch size it refuses. Requests of 3, 4 and 5 elements at once, and an empty
    one, each get their own sum and their own elements doubled."""
    server, _ = sized_server

    def infer(length: int) -> tuple[list[list[float]], np.ndarray]:
        item = httpclient.InferInput("INPUT", [1, length], "FP32")
        item.set_data_from_numpy(np.arange(1, length + 1, dtype=np.float32)[None])
        with httpclient.InferenceServerClient(server.url) as client:  # one a thread
            result = client.infer("ragged", [item])
        return result.as_numpy("SUM").tolist(), result.as_numpy("OUT")

    with ThreadPoolExecutor(3) as pool:
        answers = dict(zip((3, 4, 5), pool.map(infer, (3, 4, 5))))
    answers[0] = infer(0)
    for length, (total, doubled) in answers.items():
        assert total == [[length * (length + 1) / 2]]
        np.testing.assert_array_equal(doubled, 2 * np.arange(1, length + 1,
                                                             dtype=np.float32)[None])


def test_a_ragged_packages_ranges_and_ties_hold_each_batch_and_request(
        sized_server: tuple[RunningServer, pathlib.Path]) -> None:
    """rb.RaggedPairs as a package: ragged x of 2*n and w of n (n to 1,000), ENDS of 1 to 3
    requests. The load learns the tie by running the package with the ENDS the server
    would make for each size it tries. Before, nothing of it was checked: x of 5 beside w
    of 2 was answered as if x were 4, x of 6 beside w of 2 failed its batch ("index out of
    bounds"), and five requests ran as one batch, past the 3 requests ENDS was compiled
    for. Now each is refused by name, and five requests make two batches."""
    server, _ = sized_server
    said = server.log.read_text()
    assert ("the AOTInductor package takes the elements of ragged inputs 'x' and 'w' from "
            "one n (2*n, n): requests where they disagree are refused") in said
    assert ("the AOTInductor package takes at most 3 requests in a batch (the range it was "
            "exported for), fewer than max_batch_size 8: batches are formed within it") in said

    def infer(x: int, w: int) -> float:
        inputs = []
        for name, length, value in (("x", x, 1.0), ("w", w, 3.0)):
            item = httpclient.InferInput(name, [1, length], "FP32")
            item.set_data_from_numpy(np.full((1, length), value, np.float32))
            inputs.append(item)
        with httpclient.InferenceServerClient(server.url) as client:  # one a thread
            return float(client.infer("ragged_pairs", inputs).as_numpy("SUM")[0, 0])

    with httpclient.InferenceServerClient(server.url) as client:
        before = client.get_inference_statistics("ragged_pairs")["model_stats"][0]
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(infer, *zip(*((2 * n, n) for n in range(1, 6)))))
        after = client.get_inference_statistics("ragged_pairs")["model_stats"][0]
    assert answers == [6.0 * n for n in range(1, 6)]
    assert int(after["inference_count"]) - int(before["inference_count"]) == 5
    assert int(after["execution_count"]) - int(before["execution_count"]) >= 2
    for x, w in ((6, 2), (5, 2), (2002, 1001)):  # the words: tests/pipeline/test_ragged.py
        refusal = rb.ragged_pairs_refusal("ragged_pairs", x, w, guarded=False)
        assert refusal is not None
        with pytest.raises(InferenceServerException) as refused:
            infer(x, w)
        assert refused.value.status() == "400" and refusal in str(refused.value)
    assert infer(2000, 1000) == 6000.0



@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 1003), min_size=1, max_size=6))
def test_any_ragged_requests_at_once_to_a_package_are_answered_right_or_refused(
        sized_server: tuple[RunningServer, pathlib.Path], lengths: list[int]) -> None:
    """rb.RaggedPairs as a package, requests at once over HTTP of w of n and x of 2*n, one
    off in some (x odd, w one more), past the range in others: each is answered as the
    module answers it alone, whatever batch it rode in, or refused by name."""
    server, _ = sized_server
    requests = [(2 * n + (k % 3 == 2), n + (k % 4 == 3)) for k, n in enumerate(lengths)]

    def infer(sizes: tuple[int, int]) -> float | InferenceServerException:
        inputs = []
        for name, length, value in zip(("x", "w"), sizes, (1.0, 2.0)):
            item = httpclient.InferInput(name, [1, length], "FP32")
            item.set_data_from_numpy(np.full((1, length), value, np.float32))
            inputs.append(item)
        try:
            with httpclient.InferenceServerClient(server.url) as client:  # one a thread
                return float(client.infer("ragged_pairs", inputs).as_numpy("SUM")[0, 0])
        except InferenceServerException as refused:
            return refused

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(infer, requests))
    for (x, w), answer in zip(requests, answers):
        refusal = rb.ragged_pairs_refusal("ragged_pairs", x, w, guarded=False)
        if refusal is None:
            assert answer == 4.0 * w, (x, w, answer)
        else:
            assert isinstance(answer, InferenceServerException), (x, w, answer)
            assert answer.status() == "400" and refusal in str(answer)
