"""The networks of the embedded repository and the benchmarks, defined here (no torchvision).

- `resnet50()`: the standard ResNet-50 (bottleneck blocks 3-4-6-3, 1000 classes), random
  weights from a fixed seed: the same architecture and cost as the real one.
- `TinyDetector`: a small convolutional detector emitting boxes [B, A, 4] (x1, y1, x2, y2 in
  pixels) and class scores [B, A, C] for A anchors, meant for the batched-NMS post-processor.
- `Identity`: returns its input; measures pure serving overhead.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Identity", "TinyDetector", "resnet50"]


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        width = planes
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        out: torch.Tensor = self.relu(y + self.downsample(x))
        return out


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, int, int, int] = (3, 4, 6, 3),
                 classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        stages = []
        inplanes = 64
        for index, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stride = 1 if index == 0 else 2
            stage = []
            for block in range(blocks):
                stage.append(_Bottleneck(inplanes, planes, stride if block == 0 else 1))
                inplanes = planes * _Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))
        return logits


def resnet50(seed: int = 0) -> ResNet:
    """ResNet-50 with random weights from `seed` (BatchNorm statistics randomised too, so the
    outputs are not degenerate), in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    model = ResNet()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator)
                                    * (2.0 / fan_in) ** 0.5)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.BatchNorm2d):
                assert module.running_mean is not None and module.running_var is not None
                module.running_mean.copy_(torch.randn(module.num_features, generator=generator)
                                          * 0.1)
                module.running_var.copy_(torch.rand(module.num_features, generator=generator)
                                         + 0.5)
    return model.eval()


class TinyDetector(nn.Module):
    """Anchors on a 4×4 grid over a `size`×`size` image; offsets and scores from a small CNN."""

    def __init__(self, size: int = 64, classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(4))
        self.box_head = nn.Conv2d(32, 4, 1)
        self.class_head = nn.Conv2d(32, classes, 1)
        cell = size / 4
        centers = (torch.arange(4, dtype=torch.float32) + 0.5) * cell
        cy, cx = torch.meshgrid(centers, centers, indexing="ij")
        half = cell * 0.75
        anchors = torch.stack([cx - half, cy - half, cx + half, cy + half], dim=-1).reshape(16, 4)
        self.register_buffer("anchors", anchors)
        self.cell = cell

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.features(image)
        offsets = self.box_head(features).flatten(2).transpose(1, 2)  # [B, 16, 4]
        scores = torch.sigmoid(self.class_head(features).flatten(2).transpose(1, 2))
        # a registered buffer; typed Tensor | Module to mypy, and TorchScript refuses a
        # class-level annotation that would say which
        boxes = self.anchors.unsqueeze(0) + offsets * self.cell * 0.5  # type: ignore[operator]
        return boxes, scores
