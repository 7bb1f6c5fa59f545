"""The built-in detector through the engine: batched NMS in the post-processing pool."""

from __future__ import annotations

import asyncio
import pathlib

import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.builtin.nets import TinyDetector
from tests.pipeline.conftest import run
from tests.pipeline.test_postprocess import _brute_nms


def _reference(image: torch.Tensor) -> tuple[list[list[float]], list[float], list[int]]:
    boxes, scores = TinyDetector(size=64, classes=3, seed=0).eval()(image)
    best, labels = scores[0].max(dim=-1)
    candidates = [i for i in range(16) if best[i].item() >= 0.3]
    keep = _brute_nms([boxes[0, i].tolist() for i in candidates],
                      [best[i].item() for i in candidates],
                      [labels[i].item() for i in candidates], 0.5)[:20]
    chosen = [candidates[k] for k in keep]
    return ([boxes[0, i].tolist() for i in chosen], [best[i].item() for i in chosen],
            [labels[i].item() for i in chosen])


def test_detector_matches_a_brute_force_reference(builtin_repo: pathlib.Path) -> None:
    torch.manual_seed(3)
    images = [torch.randn(1, 3, 64, 64) * 2 for _ in range(5)]

    async def scenario() -> None:
        engine = Engine(builtin_repo)
        await engine.start(["detector"])
        requests = [InferenceRequest("detector", {"IMAGE": TensorView.from_torch(i, name="IMAGE")})
                    for i in images]
        results = await asyncio.gather(*(engine.infer(r) for r in requests))
        for image, result in zip(images, results):
            out = {k: v.torch() for k, v in result.outputs.items()}
            boxes, scores, classes = _reference(image)
            n = out["COUNT"][0, 0].item()
            assert n == len(scores) and n > 0
            torch.testing.assert_close(out["BOXES"][0, :n], torch.tensor(boxes).reshape(n, 4))
            torch.testing.assert_close(out["SCORES"][0, :n], torch.tensor(scores))
            assert out["CLASSES"][0, :n].tolist() == classes
            assert not out["SCORES"][0, n:].any()  # zero padding past the count
        await engine.shutdown()
    run(scenario())
