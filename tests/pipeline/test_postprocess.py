"""Post-processors against brute-force references on random inputs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tensorgate.pipeline.postprocess import (batched_nms, box_iou, greedy_decode, nms,
                                             topk_classify)


def _iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _brute_nms(boxes: list[list[float]], scores: list[float], classes: list[int],
               threshold: float) -> list[int]:
    order = sorted(range(len(boxes)), key=lambda i: -scores[i])
    keep: list[int] = []
    for i in order:
        if all(classes[k] != classes[i] or _iou(boxes[i], boxes[k]) <= threshold for k in keep):
            keep.append(i)
    return keep


def _random_boxes(rng: random.Random, n: int) -> torch.Tensor:
    rows = []
    for _ in range(n):
        x, y = rng.uniform(0, 50), rng.uniform(0, 50)
        rows.append([x, y, x + rng.uniform(1, 30), y + rng.uniform(1, 30)])
    return torch.tensor(rows, dtype=torch.float64).reshape(n, 4)


@pytest.mark.parametrize("seed", range(40))
def test_nms_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(0, 60)
    boxes = _random_boxes(rng, n)
    scores = torch.tensor([rng.random() for _ in range(n)], dtype=torch.float64)
    threshold = rng.choice([0.3, 0.5, 0.7])
    expected = _brute_nms(boxes.tolist(), scores.tolist(), [0] * n, threshold)
    assert nms(boxes, scores, threshold).tolist() == expected
    classes = torch.tensor([rng.randrange(3) for _ in range(n)], dtype=torch.int64)
    expected = _brute_nms(boxes.tolist(), scores.tolist(), classes.tolist(), threshold)
    got = batched_nms(boxes, scores, classes, threshold).tolist()
    assert got == expected  # score-sorted, and classes never suppress each other


def test_iou_matrix_matches_pairwise() -> None:
    rng = random.Random(1)
    a, b = _random_boxes(rng, 7), _random_boxes(rng, 5)
    matrix = box_iou(a, b)
    for i in range(7):
        for j in range(5):
            assert matrix[i, j].item() == pytest.approx(_iou(a[i].tolist(), b[j].tolist()))


@pytest.mark.parametrize("seed", range(10))
def test_topk_matches_sorting(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = torch.from_numpy(rng.permutation(40).reshape(2, 20).astype(np.float32))
    labels = [f"class{i}" for i in range(15)]  # fewer labels than classes: some go unlabeled
    out = topk_classify(scores, 4, labels)
    assert out.shape == (2, 4)
    for row in range(2):
        ranked = sorted(range(20), key=lambda i: -scores[row, i].item())[:4]
        expected = [f"{scores[row, i].item():f}:{i}" + (f":class{i}" if i < 15 else "")
                    for i in ranked]
        assert [v.decode() for v in out[row]] == expected


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool,
                                   torch.float16])
def test_scores_of_any_type_are_ranked_and_written_as_triton_writes_them(
        dtype: torch.dtype) -> None:
    """Integers as their digits ("8:0"; Triton 2.51 gave "8:0" where this said
    "8.000000:0"), compared as integers: 2**24 + 1 outranks 2**24, which as floats tie.
    Floats as %f."""
    if dtype == torch.int64:
        scores = torch.tensor([[2**24, 2**24 + 1, -3]], dtype=dtype)
        expected = [f"{2**24 + 1}:1", f"{2**24}:0"]
    elif dtype == torch.bool:
        scores = torch.tensor([[False, True, False]])
        expected = ["1:1", "0:0"]
    elif dtype == torch.float16:
        scores = torch.tensor([[0.5, 2.0, -1.0]], dtype=dtype)
        expected = ["2.000000:1", "0.500000:0"]
    else:
        scores = torch.tensor([[8, 3, 9]], dtype=dtype)
        expected = ["9:2", "8:0"]
    assert [v.decode() for v in topk_classify(scores, 2)[0]] == expected


def test_greedy_decode_is_argmax() -> None:
    logits = torch.randn(2, 5, 11)
    tokens = greedy_decode(logits)
    assert tokens.dtype == torch.int64
    for b in range(2):
        for t in range(5):
            assert tokens[b, t].item() == max(range(11), key=lambda v: logits[b, t, v].item())
