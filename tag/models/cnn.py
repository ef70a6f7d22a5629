"""ResNet (bottleneck, He et al. 2016) and VGG (Simonyan & Zisserman 2015) image classifiers."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

__all__ = ["ResNetConfig", "ResNet", "VGGConfig", "VGG", "batch_norm"]

BOTTLENECK_EXPANSION = 4  # a bottleneck block's output has 4x its inner width


def batch_norm(channels: int, *, eps: float = 1e-5) -> nn.BatchNorm2d:
    """Batch norm over ``[b, channels, h, w]`` that keeps no running statistics.

    A train step then mutates no buffer, so ``make_fx`` of a ``functional_call`` over the parameters
    alone traces it; the train-step compute is the same (the running-average update is a few
    elementwise ops on ``[channels]``). Only eval mode differs: it normalises with batch statistics.
    """
    return nn.BatchNorm2d(channels, eps=eps, track_running_stats=False)


@dataclass(frozen=True)
class ResNetConfig:
    blocks: tuple[int, ...] = (3, 4, 23, 3)  # bottleneck blocks per stage; (3, 8, 36, 3) is ResNet-152
    width: int = 64  # inner width of the first stage, doubled at each later stage
    image_size: int = 224
    num_classes: int = 1000


def _conv_bn(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    """Bias-free convolution followed by batch norm (no activation)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False),
        batch_norm(out_channels),
    )


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, as in "ResNet v1.5"), 1x1 expand, plus a shortcut.

    Shapes: ``[b, in_channels, h, w] -> [b, 4 * width, h / stride, w / stride]``.
    """

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * BOTTLENECK_EXPANSION
        self.reduce = _conv_bn(in_channels, width, 1)
        self.spatial = _conv_bn(width, width, 3, stride)
        self.expand = _conv_bn(width, out_channels, 1)
        self.relu = nn.ReLU()
        needs_projection = stride != 1 or in_channels != out_channels
        self.shortcut = _conv_bn(in_channels, out_channels, 1, stride) if needs_projection else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        y = self.relu(self.reduce(x))
        y = self.relu(self.spatial(y))
        return self.relu(self.expand(y) + self.shortcut(x))


class ResNet(nn.Module):
    """Bottleneck ResNet. Shapes: images ``[b, 3, H, W]`` -> logits ``[b, num_classes]``."""

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _conv_bn(3, config.width, 7, stride=2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        stages, in_channels = [], config.width
        for index, num_blocks in enumerate(config.blocks):
            width = config.width * 2**index
            blocks = []
            for block in range(num_blocks):
                stride = 2 if block == 0 and index > 0 else 1
                blocks.append(Bottleneck(in_channels, width, stride))
                in_channels = width * BOTTLENECK_EXPANSION
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.classifier = nn.Linear(in_channels, config.num_classes)

    def forward(self, images: Tensor) -> Tensor:
        features = self.stages(self.stem(images))  # [b, c, h, w]
        return self.classifier(features.mean(dim=(2, 3)))


@dataclass(frozen=True)
class VGGConfig:
    # Output channels of each 3x3 convolution, one tuple per stage; a 2x2 max-pool ends every stage.
    stages: tuple[tuple[int, ...], ...] = (
        (64, 64), (128, 128), (256, 256, 256, 256), (512, 512, 512, 512), (512, 512, 512, 512))
    hidden: int = 4096  # width of the two hidden fully connected layers
    image_size: int = 224
    num_classes: int = 1000


class VGG(nn.Module):
    """Classic VGG without batch norm. Shapes: images ``[b, 3, H, W]`` -> logits ``[b, num_classes]``."""

    def __init__(self, config: VGGConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for stage in config.stages:
            for out_channels in stage:
                layers += [nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU()]
                in_channels = out_channels
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        side = config.image_size // 2 ** len(config.stages)  # 7 for 224x224 and five stages
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * side * side, config.hidden), nn.ReLU(),
            nn.Linear(config.hidden, config.hidden), nn.ReLU(),
            nn.Linear(config.hidden, config.num_classes),
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(images))
