"""Inception V3 (Szegedy et al. 2016, "Rethinking the Inception Architecture"), without the aux head.

Module names follow the paper's figures: A = Fig. 5 (35x35 grid), B = grid reduction to 17x17,
C = Fig. 6 (factorised 7x7), D = grid reduction to 8x8, E = Fig. 7 (expanded filter bank).
Every width is divided by ``width_divisor`` so the tiny variant runs the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tag.models.cnn import batch_norm

__all__ = ["InceptionConfig", "InceptionV3"]


@dataclass(frozen=True)
class InceptionConfig:
    image_size: int = 299  # 75 is the smallest that survives every stride
    num_classes: int = 1000
    width_divisor: int = 1  # every channel count is divided by this
    a_pool_channels: tuple[int, ...] = (32, 64, 64)  # one A module per entry: its pool-branch width
    c_channels_7x7: tuple[int, ...] = (128, 160, 160, 192)  # one C module per entry: its 7x7 inner width
    num_e_modules: int = 2


class ConvBN(nn.Module):
    """Bias-free convolution, batch norm (eps 1e-3 as in the paper's code), ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 *, stride: int = 1, padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False)
        self.norm = batch_norm(out_channels, eps=1e-3)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.norm(self.conv(x)))


def _row(in_channels: int, out_channels: int) -> ConvBN:
    """1x7 convolution keeping the grid."""
    return ConvBN(in_channels, out_channels, (1, 7), padding=(0, 3))


def _column(in_channels: int, out_channels: int) -> ConvBN:
    """7x1 convolution keeping the grid."""
    return ConvBN(in_channels, out_channels, (7, 1), padding=(3, 0))


def _pool_branch(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBN(in_channels, out_channels, 1))


class _Concat(nn.Module):
    """Runs parallel branches on one input and concatenates them along channels."""

    out_channels: int

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([branch(x) for branch in self.children()], dim=1)


class InceptionA(_Concat):
    def __init__(self, in_channels: int, pool_channels: int, w: int) -> None:
        super().__init__()
        self.branch1x1 = ConvBN(in_channels, 64 // w, 1)
        self.branch5x5 = nn.Sequential(
            ConvBN(in_channels, 48 // w, 1), ConvBN(48 // w, 64 // w, 5, padding=2))
        self.branch3x3dbl = nn.Sequential(
            ConvBN(in_channels, 64 // w, 1), ConvBN(64 // w, 96 // w, 3, padding=1),
            ConvBN(96 // w, 96 // w, 3, padding=1))
        self.branch_pool = _pool_branch(in_channels, pool_channels // w)
        self.out_channels = 64 // w + 64 // w + 96 // w + pool_channels // w


class InceptionB(_Concat):
    def __init__(self, in_channels: int, w: int) -> None:
        super().__init__()
        self.branch3x3 = ConvBN(in_channels, 384 // w, 3, stride=2)
        self.branch3x3dbl = nn.Sequential(
            ConvBN(in_channels, 64 // w, 1), ConvBN(64 // w, 96 // w, 3, padding=1),
            ConvBN(96 // w, 96 // w, 3, stride=2))
        self.branch_pool = nn.MaxPool2d(3, stride=2)
        self.out_channels = 384 // w + 96 // w + in_channels


class InceptionC(_Concat):
    def __init__(self, in_channels: int, channels_7x7: int, w: int) -> None:
        super().__init__()
        c7, out = channels_7x7 // w, 192 // w
        self.branch1x1 = ConvBN(in_channels, out, 1)
        self.branch7x7 = nn.Sequential(ConvBN(in_channels, c7, 1), _row(c7, c7), _column(c7, out))
        self.branch7x7dbl = nn.Sequential(
            ConvBN(in_channels, c7, 1), _column(c7, c7), _row(c7, c7), _column(c7, c7), _row(c7, out))
        self.branch_pool = _pool_branch(in_channels, out)
        self.out_channels = 4 * out


class InceptionD(_Concat):
    def __init__(self, in_channels: int, w: int) -> None:
        super().__init__()
        self.branch3x3 = nn.Sequential(
            ConvBN(in_channels, 192 // w, 1), ConvBN(192 // w, 320 // w, 3, stride=2))
        self.branch7x7x3 = nn.Sequential(
            ConvBN(in_channels, 192 // w, 1), _row(192 // w, 192 // w), _column(192 // w, 192 // w),
            ConvBN(192 // w, 192 // w, 3, stride=2))
        self.branch_pool = nn.MaxPool2d(3, stride=2)
        self.out_channels = 320 // w + 192 // w + in_channels


class _SplitPair(nn.Module):
    """A 1x3 and a 3x1 convolution of the same input, concatenated: ``[b, c, h, w] -> [b, 2 * out, h, w]``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.row = ConvBN(in_channels, out_channels, (1, 3), padding=(0, 1))
        self.column = ConvBN(in_channels, out_channels, (3, 1), padding=(1, 0))

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.row(x), self.column(x)], dim=1)


class InceptionE(_Concat):
    def __init__(self, in_channels: int, w: int) -> None:
        super().__init__()
        self.branch1x1 = ConvBN(in_channels, 320 // w, 1)
        self.branch3x3 = nn.Sequential(ConvBN(in_channels, 384 // w, 1), _SplitPair(384 // w, 384 // w))
        self.branch3x3dbl = nn.Sequential(
            ConvBN(in_channels, 448 // w, 1), ConvBN(448 // w, 384 // w, 3, padding=1),
            _SplitPair(384 // w, 384 // w))
        self.branch_pool = _pool_branch(in_channels, 192 // w)
        self.out_channels = 320 // w + 4 * (384 // w) + 192 // w


def _stem(w: int) -> tuple[nn.Sequential, int]:
    """299x299x3 -> 35x35x192 (paper Table 1, first rows)."""
    stem = nn.Sequential(
        ConvBN(3, 32 // w, 3, stride=2), ConvBN(32 // w, 32 // w, 3), ConvBN(32 // w, 64 // w, 3, padding=1),
        nn.MaxPool2d(3, stride=2),
        ConvBN(64 // w, 80 // w, 1), ConvBN(80 // w, 192 // w, 3),
        nn.MaxPool2d(3, stride=2),
    )
    return stem, 192 // w


class InceptionV3(nn.Module):
    """Shapes: images ``[b, 3, H, W]`` (H = W >= 75) -> logits ``[b, num_classes]``."""

    def __init__(self, config: InceptionConfig) -> None:
        super().__init__()
        w = config.width_divisor
        self.stem, channels = _stem(w)
        modules: list[_Concat] = []
        for pool_channels in config.a_pool_channels:
            modules.append(InceptionA(channels, pool_channels, w))
            channels = modules[-1].out_channels
        modules.append(InceptionB(channels, w))
        for channels_7x7 in config.c_channels_7x7:
            modules.append(InceptionC(modules[-1].out_channels, channels_7x7, w))
        modules.append(InceptionD(modules[-1].out_channels, w))
        for _ in range(config.num_e_modules):
            modules.append(InceptionE(modules[-1].out_channels, w))
        self.mixed = nn.Sequential(*modules)
        self.classifier = nn.Linear(modules[-1].out_channels, config.num_classes)

    def forward(self, images: Tensor) -> Tensor:
        features = self.mixed(self.stem(images))  # [b, 2048, 8, 8] at full size
        return self.classifier(features.mean(dim=(2, 3)))
