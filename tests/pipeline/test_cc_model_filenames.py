"""Triton's cc_model_filenames: a GPU instance loads the file its compute capability names,
a CPU instance the default; a version whose instances would load different files is
refused naming them (pipeline/instance_plan.model_filename). CI has no GPU, so the choice
is shown here with capabilities given; tests/pipeline/test_cuda.py loads a model by the
device's own capability on a GPU, and the e2e test below a CPU server's default."""

from __future__ import annotations

import pathlib

import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.pipeline.instance_plan import capability, model_filename
from tensorgate.repository.model_config import ModelConfigError, parse_model_config
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run

CC = ('name: "m" platform: "pytorch_libtorch" cc_model_filenames { key: "9.0" value: '
      '"model_h100.pt" } cc_model_filenames { key: "8.0" value: "model_a100.pt" }')
GPU0, GPU1, CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")


def test_each_gpu_loads_its_capabilitys_file_and_a_cpu_the_default() -> None:
    spec = parse_model_config(CC)
    assert spec.cc_model_filenames == (("8.0", "model_a100.pt"), ("9.0", "model_h100.pt"))
    assert spec.ignored == ()
    hopper = {GPU0: "9.0", GPU1: "9.0", CPU: ""}.__getitem__
    assert model_filename(spec, [GPU0, GPU0, GPU1], hopper) == "model_h100.pt"
    assert model_filename(spec, [CPU, CPU], hopper) == ""
    assert model_filename(spec, [GPU0], {GPU0: "7.5"}.__getitem__) == ""  # not named
    assert model_filename(parse_model_config('name: "m"'), [GPU0], hopper) == ""
    assert capability(CPU) == ""


def test_instances_that_would_load_different_files_are_refused_by_name() -> None:
    spec = parse_model_config(CC)
    mixed = {GPU0: "9.0", GPU1: "8.0", CPU: ""}.__getitem__
    with pytest.raises(ModelConfigError, match=r"cc_model_filenames gives its instances "
                                               r"different files \(cuda:0 \(9.0\): "
                                               r"model_h100.pt; cuda:1 \(8.0\): model_a100.pt\)"):
        model_filename(spec, [GPU0, GPU1], mixed)
    with pytest.raises(ModelConfigError, match=r"cpu: the default file"):
        model_filename(spec, [GPU0, CPU], mixed)


def test_a_file_out_of_the_version_folder_is_refused_and_an_odd_key_said() -> None:
    with pytest.raises(ModelConfigError, match=r"cc_model_filenames\['9.0'\] '../x.pt' must "
                                               r"be a file name in each version's directory"):
        parse_model_config('name: "m" cc_model_filenames { key: "9.0" value: "../x.pt" }')
    spec = parse_model_config('name: "m" cc_model_filenames { key: "gpu" value: "x.pt" }')
    assert spec.ignored == ("cc_model_filenames key 'gpu' (not a compute capability such as "
                            "'9.0': never chosen)",)


def test_a_cpu_engine_serves_the_default_file(tmp_path: pathlib.Path) -> None:
    """The file a capability names is there, and answers otherwise: a CPU instance does not
    load it."""
    rb.add_torchscript(tmp_path, "m", rb.linear_module(), [8], [4],
                       extra='cc_model_filenames { key: "9.0" value: "model_h100.pt" }')
    torch.jit.script(torch.nn.Identity()).save(str(tmp_path / "m" / "1" / "model_h100.pt"))
    x = torch.randn(2, 8)

    async def scenario() -> torch.Tensor:
        engine = Engine(tmp_path, device="cpu")
        await engine.start()
        try:
            result = await engine.infer(InferenceRequest(
                "m", {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))
            return result.outputs["OUTPUT__0"].torch()
        finally:
            await engine.shutdown()
    torch.testing.assert_close(run(scenario()), rb.linear_module().eval()(x))
