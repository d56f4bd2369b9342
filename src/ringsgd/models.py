"""The networks we train: Caffe's two classic small nets, and a ResNet-20 for communication-heavy runs.

`lenet` and `cifar10_quick` are the layer stacks of Caffe's examples (so numbers can be compared with
the literature), with PyTorch's default initialisation. Every builder checks the input it is given and
refuses one it cannot take with a UsageError, instead of a shape error deep inside the first forward.
Initialisation draws only from torch's global RNG, so `torch.manual_seed(s)` fixes the weights.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .errors import UsageError


class LeNet(nn.Sequential):
    """Caffe's MNIST LeNet: conv 20 5x5, pool 2, conv 50 5x5, pool 2, fc 500, ReLU, fc classes (28x28 input)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10):
        super().__init__(
            nn.Conv2d(in_channels, 20, 5), nn.MaxPool2d(2),  # 28 -> 24 -> 12
            nn.Conv2d(20, 50, 5), nn.MaxPool2d(2),  # 12 -> 8 -> 4
            nn.Flatten(), nn.Linear(50 * 4 * 4, 500), nn.ReLU(inplace=True), nn.Linear(500, num_classes),
        )


class Cifar10Quick(nn.Sequential):
    """Caffe's cifar10_quick (32x32 input). Pools use ceil_mode, as Caffe does: 32 -> 16 -> 8 -> 4.

    Caffe's layer order is kept: max pool *before* the first ReLU, average pools after the others, and
    no ReLU between the two fully connected layers.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10):
        super().__init__(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
            nn.Flatten(), nn.Linear(64 * 4 * 4, 64), nn.Linear(64, num_classes),
        )


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus the input. A downsampling block's shortcut subsamples and zero-pads the
    channels (He et al.'s option A): no parameters, which keeps ResNet-20 at its usual 0.27M."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride, self.extra_planes = stride, planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra_planes:
            half = self.extra_planes // 2
            x = F.pad(x, (0, 0, 0, 0, half, self.extra_planes - half))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet20(nn.Module):
    """CIFAR-style ResNet-20: a 3x3 conv, 3 stages of 3 basic blocks (16/32/64 channels), global pool, fc.

    BatchNorm statistics are per worker (as DDP without SyncBatchNorm): each worker normalises its own
    shard, so N workers do not compute what 1 worker with the whole batch would. That is why this model
    is excluded from the N-workers-equals-1-worker equivalence; use it for speed, not for that check.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, blocks: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, planes = [], 16
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(blocks):
                layers.append(BasicBlock(planes, width, stride if i == 0 else 1))
                planes = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _exact_size(name: str, size: int) -> Callable[[int], None]:
    def check(image_size: int) -> None:
        if image_size != size:
            raise UsageError(f"{name} takes {size}x{size} images, got {image_size}x{image_size}: "
                             f"use resnet20 for other sizes")
    return check


def _min_size(name: str, size: int) -> Callable[[int], None]:
    def check(image_size: int) -> None:
        if image_size < size:
            raise UsageError(f"{name} needs images of at least {size}x{size}, got {image_size}x{image_size}")
    return check


# name -> (class, input-size check)
MODELS: dict[str, tuple[type[nn.Module], Callable[[int], None]]] = {
    "lenet": (LeNet, _exact_size("lenet", 28)),
    "cifar10_quick": (Cifar10Quick, _exact_size("cifar10_quick", 32)),
    "resnet20": (ResNet20, _min_size("resnet20", 8)),  # global pooling: 28 and 32 px both fine
}

_DEFAULTS = {"digits": "lenet", "mnist": "lenet", "cifar10": "cifar10_quick"}


def build_model(name: str, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """A fresh `name` network for in_channels x image_size x image_size inputs and `num_classes` outputs."""
    try:
        cls, check_size = MODELS[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}: use one of {', '.join(MODELS)}") from None
    if in_channels < 1:
        raise UsageError(f"in_channels must be at least 1, got {in_channels}")
    if num_classes < 2:
        raise UsageError(f"num_classes must be at least 2, got {num_classes}")
    check_size(image_size)
    return cls(in_channels, num_classes)


def default_model(dataset_name: str) -> str:
    """The classic net for a data set: LeNet for the digit sets, cifar10_quick for CIFAR-10."""
    try:
        return _DEFAULTS[dataset_name]
    except KeyError:
        raise UsageError(f"no default model for data set {dataset_name!r}: use one of "
                         f"{', '.join(_DEFAULTS)}, or pass a model by name") from None
