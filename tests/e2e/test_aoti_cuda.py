"""AOTInductor packages compiled for CUDA, served by a KIND_GPU instance: the load's checks
(pipeline/aoti_check.py) run the package in its child on the GPU, learn its compiled batch
range and the dims it sizes from one another as they do on the CPU, and refuse a package
compiled for the CPU. Skipped without a CUDA device (bench/gpu_check.sh runs it there)."""

from __future__ import annotations

import pathlib
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.e2e.test_aoti_packages import _export_two_groups, check_two_groups
from tests.pipeline import repo_builder as rb

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                 reason="AOTInductor compiles C++: needs g++")]


def _compile(program: torch.export.ExportedProgram, path: pathlib.Path) -> pathlib.Path:
    with warnings.catch_warnings():  # torch's own deprecations and advice, inside the compile
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", "TensorFloat32 tensor cores", UserWarning)
        return pathlib.Path(torch._inductor.aoti_compile_and_package(
            program, package_path=str(path)))


def _linear(device: str) -> torch.export.ExportedProgram:
    """rb.linear_module on `device`, for batches of 1 to 8 rows of [8]."""
    return torch.export.export(
        rb.linear_module().eval().to(device), (torch.randn(2, 8, device=device),),
        dynamic_shapes={"input": {0: torch.export.Dim("batch", min=1, max=8)}})


def _serve(models: pathlib.Path, name: str, package: pathlib.Path, max_batch: int,
           inputs: dict[str, str], output_dims: str) -> None:
    listed = ", ".join(f'{{ name: "{input_name}" data_type: TYPE_FP32 dims: {dims} }}'
                       for input_name, dims in inputs.items())
    folder = rb.write_config(models, name, f"""
        name: "{name}"
        platform: "torch_aoti"
        max_batch_size: {max_batch}
        input [ {listed} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: {output_dims} }} ]
        instance_group [ {{ kind: KIND_GPU count: 1 }} ]
        dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
        """)
    shutil.copy(package, folder / "1" / "model.pt2")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[RunningServer, pathlib.Path]]:
    """"linear" (CUDA, batches of up to 8), "too_many_rows" (the same, max_batch_size 16),
    "cpu_package" (rb.linear_module compiled for the CPU, on a GPU instance) and
    "two_groups" (CUDA)."""
    root = tmp_path_factory.mktemp("aoti_cuda")
    models = root / "models"
    linear = _compile(_linear("cuda"), root / "linear.pt2")
    on_cpu = _compile(_linear("cpu"), root / "linear_cpu.pt2")
    groups = _compile(_export_two_groups("cuda"), root / "two_groups.pt2")
    _serve(models, "linear", linear, 8, {"input": "[8]"}, "[4]")
    _serve(models, "too_many_rows", linear, 16, {"input": "[8]"}, "[4]")
    _serve(models, "cpu_package", on_cpu, 8, {"input": "[8]"}, "[4]")
    _serve(models, "two_groups", groups, 8,
           {"ids": "[-1]", "kv": "[-1, 8]", "mask": "[-1]", "edges": "[-1]", "w": "[-1]",
            "types": "[-1]"}, "[1]")
    running = start_server(models, root / "server.log")
    try:
        yield running, models
    finally:
        assert stop_server(running) == 0, running.log.read_text()


def test_a_cuda_package_serves_its_compiled_batches_and_the_rest_is_refused(
        server: tuple[RunningServer, pathlib.Path]) -> None:
    running, models = server
    with grpcclient.InferenceServerClient(running.grpc_url) as client:
        refused = {m.name: m.reason for m in client.get_model_repository_index().models
                   if m.state != "READY"}
        assert set(refused) == {"too_many_rows", "cpu_package"}, refused
        where = models / "too_many_rows" / "1" / "model.pt2"
        assert refused["too_many_rows"] == (
            f"{where}: the AOTInductor package was compiled for batches of at most 8 rows, "
            "and max_batch_size is 16: set max_batch_size to 8 or less, or export it with a "
            "dynamic batch dim, torch.export.Dim('batch', min=1, max=16)")
        assert str(models / "cpu_package" / "1" / "model.pt2") in refused["cpu_package"]

    direct = rb.linear_module().eval()

    def infer(x: np.ndarray) -> np.ndarray:
        with grpcclient.InferenceServerClient(running.grpc_url) as own:
            item = grpcclient.InferInput("input", list(x.shape), "FP32")
            item.set_data_from_numpy(x)
            return own.infer("linear", [item]).as_numpy("y")

    rows = [np.random.default_rng(i).standard_normal((1 + i % 3, 8)).astype(np.float32)
            for i in range(12)]
    with ThreadPoolExecutor(6) as pool:  # one row alone and rows gathered into batches
        answers = list(pool.map(infer, rows))
    for x, y in zip(rows, answers):
        np.testing.assert_allclose(y, direct(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-4, atol=1e-4)
    with pytest.raises(InferenceServerException, match="max_batch_size"):
        infer(np.zeros((9, 8), np.float32))


def test_a_cuda_packages_tied_dims_are_learned_and_held(
        server: tuple[RunningServer, pathlib.Path]) -> None:
    """The learning that test_aoti_packages proves on the CPU, here with the package's
    kernels on the GPU: the two groups of tied dims are logged, a request off either is a
    400 naming the inputs, and one on both is answered."""
    running, models = server
    with grpcclient.InferenceServerClient(running.grpc_url) as client:
        check_two_groups(running.log.read_text(), models / "two_groups" / "1" / "model.pt2",
                         grpcclient, client, "StatusCode.INVALID_ARGUMENT")
