"""ResNet-50 in plain torch (torchvision's architecture, written out) with seeded random weights,
exported to ONNX with a dynamic batch dimension: the compute-bound benchmark model.

    .venv/bin/python benchmarks/resnet50.py OUTPUT.onnx      (needs the `example` extra: torch)
"""

from __future__ import annotations

import sys
from pathlib import Path

IMAGE_SHAPE = (3, 224, 224)


def export(path: Path, seed: int = 0) -> None:
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            width = planes
            self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * self.expansion)
            self.relu = nn.ReLU(inplace=True)
            self.downsample: nn.Module | None = None
            if stride != 1 or inplanes != planes * self.expansion:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, planes * self.expansion, 1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes * self.expansion),
                )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    class ResNet50(nn.Module):
        def __init__(self, classes: int = 1000) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
            layers, inplanes = [], 64
            for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for index in range(blocks):
                    layers.append(Bottleneck(inplanes, planes, stride if index == 0 else 1))
                    inplanes = planes * Bottleneck.expansion
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2048, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    torch.manual_seed(seed)
    model = ResNet50().eval()
    example = torch.zeros(1, *IMAGE_SHAPE)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )


if __name__ == "__main__":
    export(Path(sys.argv[1]))
