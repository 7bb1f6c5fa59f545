"""Built-in post-processors a model's config can name, run in the post-processing pool.

    parameters { key: "postprocess" value { string_value: "topk" } }     # or "nms", "greedy"

Each takes the model's raw outputs (in order) for a whole batch and returns the config's
outputs (in order), each with the batch as its first dim and fixed per-item shapes, so the
results unbatch like any other output:

- topk:   scores [B, C] → BYTES [B, k] "score:index[:label]", Triton's classification format.
          Parameters: topk_k (default 1); labels from the output's `label_filename`.
- nms:    boxes [B, N, 4] (x1, y1, x2, y2), class scores [B, N, C] → boxes [B, K, 4],
          scores [B, K], classes [B, K] (INT64), count [B, 1] (INT32); zero-padded past count.
          Score-sorted, class-aware. Parameters: nms_iou_threshold (0.5),
          nms_score_threshold (0.25), nms_max_detections (K, default 100).
- greedy: logits [B, T, V] → token ids [B, T] (INT64), argmax over the vocabulary.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tensorgate.repository.model_config import ModelConfigError, ModelSpec

__all__ = ["Postprocessor", "batched_nms", "box_iou", "build_postprocessor", "greedy_decode",
           "nms", "topk_classify"]

Postprocessor = Callable[[Sequence[torch.Tensor]], list[Any]]

try:  # torchvision when it happens to be importable; PyPI's often fails beside a CPU torch
    from torchvision.ops import batched_nms as _torchvision_batched_nms  # type: ignore
except Exception:
    _torchvision_batched_nms = None


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of boxes [N,4] and [M,4] in (x1, y1, x2, y2) → [N, M]."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    top_left = torch.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (bottom_right - top_left).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union, torch.zeros_like(inter))


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices of the boxes kept by greedy NMS, highest score first.

    The IoU matrix is one vectorised computation; the greedy pass then loops once per *kept*
    box (each step suppresses a whole row at once), not once per candidate.
    """
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    order = torch.argsort(scores, descending=True, stable=True)
    overlaps = box_iou(boxes[order], boxes[order]) > iou_threshold
    alive = torch.ones(order.numel(), dtype=torch.bool)
    kept = []
    position = 0
    count = order.numel()
    while position < count:
        kept.append(position)
        alive &= ~overlaps[position]
        alive[: position + 1] = False
        remaining = torch.nonzero(alive)
        if remaining.numel() == 0:
            break
        position = int(remaining[0])
    return order[torch.tensor(kept, dtype=torch.int64)]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor,
                iou_threshold: float) -> torch.Tensor:
    """Class-aware NMS: boxes of different classes never suppress each other."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    if _torchvision_batched_nms is not None:  # same semantics, a compiled kernel
        kept: torch.Tensor = _torchvision_batched_nms(boxes, scores, classes, iou_threshold)
        return kept
    # Shift each class into its own region so boxes of two classes cannot overlap.
    span = (boxes.max() - boxes.min()).abs() + 1
    shifted = boxes + (classes.to(boxes.dtype) * span)[:, None]
    return nms(shifted, scores, iou_threshold)


def topk_classify(scores: torch.Tensor, k: int, labels: Sequence[str] = ()) -> np.ndarray:
    """[B, C] scores → object array [B, k] of b"score:index[:label]" (Triton's format: a
    float score as C's %f, "0.500000"; an integer one as its digits, "8", compared as the
    integers they are, not as floats that would tie 2**24 and 2**24 + 1)."""
    k = min(k, scores.shape[-1])
    integral = not scores.is_floating_point()
    compared = (scores.to(torch.uint8) if scores.dtype == torch.bool
                else scores if integral else scores.float())
    values, indices = torch.topk(compared, k, dim=-1)
    out = np.empty((scores.shape[0], k), dtype=object)
    for row, (vals, idxs) in enumerate(zip(values.tolist(), indices.tolist())):
        for col, (value, index) in enumerate(zip(vals, idxs)):
            text = f"{value}:{index}" if integral else f"{value:f}:{index}"
            if index < len(labels):
                text += f":{labels[index]}"
            out[row, col] = text.encode()
    return out


def greedy_decode(logits: torch.Tensor) -> torch.Tensor:
    """Token ids by argmax over the last dim."""
    return torch.argmax(logits, dim=-1).to(torch.int64)


def _detections(boxes: torch.Tensor, class_scores: torch.Tensor, iou: float, threshold: float,
                limit: int) -> list[torch.Tensor]:
    batch = boxes.shape[0]
    out_boxes = torch.zeros(batch, limit, 4, dtype=torch.float32)
    out_scores = torch.zeros(batch, limit, dtype=torch.float32)
    out_classes = torch.zeros(batch, limit, dtype=torch.int64)
    counts = torch.zeros(batch, 1, dtype=torch.int32)
    best, labels = class_scores.float().max(dim=-1)
    for image in range(batch):
        candidates = torch.nonzero(best[image] >= threshold).flatten()
        b, s, c = boxes[image, candidates].float(), best[image, candidates], labels[image, candidates]
        keep = batched_nms(b, s, c, iou)[:limit]
        n = keep.numel()
        out_boxes[image, :n] = b[keep]
        out_scores[image, :n] = s[keep]
        out_classes[image, :n] = c[keep]
        counts[image, 0] = n
    return [out_boxes, out_scores, out_classes, counts]


def _labels(spec: ModelSpec, directory: pathlib.Path | None) -> list[str]:
    filename = spec.outputs[0].label_filename if spec.outputs else ""
    if not filename or directory is None:
        return []
    return (directory / filename).read_text(encoding="utf-8").splitlines()


def build_postprocessor(spec: ModelSpec, model_directory: pathlib.Path | None) -> Postprocessor | None:
    """The post-processor the config's `postprocess` parameter names, or None."""
    name = spec.parameters.get("postprocess", "")
    if not name:
        return None
    p = spec.parameters

    def number(key: str, default: float) -> float:
        try:
            return float(p.get(key, default))
        except ValueError:
            raise ModelConfigError(spec.name, f"parameter '{key}' must be a number, "
                                              f"got '{p[key]}'") from None

    if name == "topk":
        k = int(number("topk_k", 1))
        labels = _labels(spec, model_directory)
        return lambda raw: [topk_classify(raw[0], k, labels)]
    if name == "nms":
        iou, threshold = number("nms_iou_threshold", 0.5), number("nms_score_threshold", 0.25)
        limit = int(number("nms_max_detections", 100))
        if len(spec.outputs) != 4:
            raise ModelConfigError(spec.name, "postprocess 'nms' needs 4 outputs in the config: "
                                              "boxes, scores, classes, count")
        return lambda raw: _detections(raw[0], raw[1], iou, threshold, limit)
    if name == "greedy":
        return lambda raw: [greedy_decode(raw[0])]
    raise ModelConfigError(spec.name, f"unknown postprocess '{name}'; choices are: greedy, nms, "
                                      "topk")
