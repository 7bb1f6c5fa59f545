"""Engine.upload_folders: the folders of models served from uploads, one a model, each gone
with its model (what tools/fuzz_front_ends.py compares with the temporary folder)."""

from __future__ import annotations

import io
import json
import pathlib

import torch

from tensorgate import InferenceRequest, TensorView
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run, serving


def _files(scale: float) -> dict[str, bytes]:
    weights = io.BytesIO()
    torch.save({"scale": torch.tensor(scale)}, weights)
    return {"1/model.py": rb.PYTHON_MODEL.encode(), "1/scale.pt": weights.getvalue()}


def test_upload_folders_are_those_of_models_served_from_uploads(tmp_path: pathlib.Path) -> None:
    rb.add_python(tmp_path, "a", max_batch=4)

    async def scenario() -> None:
        async with serving(tmp_path, ["a"], model_control=True, model_upload=True) as engine:
            assert engine.upload_folders() == []  # a repository's model is no upload
            config = engine.spec("a").config_dict()
            config["name"] = "up"
            await engine.load("up", json.dumps(config), _files(2.0))
            [first] = engine.upload_folders()
            assert (first / "up" / "1" / "model.py").read_text() == rb.PYTHON_MODEL
            x = torch.ones(1, 4)
            result = await engine.infer(InferenceRequest(
                "up", {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))
            assert torch.equal(result.outputs["OUTPUT__0"].torch(), x * 2 + 1)
            await engine.load("up", json.dumps(config), _files(3.0))  # loaded again
            [second] = engine.upload_folders()
            assert second != first and not first.exists()
            await engine.unload("up")
            assert engine.upload_folders() == [] and not second.exists()

    run(scenario())
