"""Image encoders f: x -> h, the representation that linear evaluation reads.

SimCLR (Chen et al. 2020a, Sec. 2.1) and SupCon (Khosla et al. 2020) use a ResNet whose final
fully connected layer is removed, so h is the 512- (ResNet-18) or 2048-dimensional (ResNet-50)
output of global average pooling. On 32×32 images both replace the ImageNet stem (7×7 stride-2
convolution and 3×3 max-pool, a 4× downsampling) by a 3×3 stride-1 convolution and no max-pool
(SimCLR App. B.9; SupCon's ``resnet_big.py``): the "CIFAR stem" of ``cifar_stem=True``.

``small_cnn`` is a four-block conv net for 8–32 px images, fast enough on a CPU for the
``--quick`` presets and the tests.

Weights are always initialised at random: nothing is downloaded (docs/architecture.md,
"Offline data").
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor, nn
from torchvision import models

__all__ = [
    "BACKBONES",
    "Backbone",
    "ResNetBackbone",
    "SmallCNN",
    "build_backbone",
    "to_channels_last",
]

BACKBONES = ("resnet18", "resnet50", "small_cnn")

ModuleT = TypeVar("ModuleT", bound=nn.Module)


class Backbone(nn.Module):
    """An image encoder with a known output width ``feature_dim``.

    Shape:
        - Input: x of shape (N, C, H, W), float
        - Output: h of shape (N, feature_dim)
    """

    feature_dim: int  # subclasses set it and define forward


def _kaiming_conv(
    in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int
) -> nn.Conv2d:
    """A bias-free convolution initialised as torchvision initialises a ResNet's convolutions."""
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


class ResNetBackbone(Backbone):
    """torchvision's ResNet-18 or ResNet-50 without its classifier (``fc`` is the identity).

    ``self.resnet`` is the torchvision model itself, so its stages (``resnet.layer1`` ...
    ``resnet.layer4``) can be read or split (LoCo).

    Shape:
        - Input: x of shape (N, in_channels, H, W)
        - Output: h of shape (N, 512) for ResNet-18, (N, 2048) for ResNet-50
    """

    def __init__(self, depth: int, *, in_channels: int = 3, cifar_stem: bool = True) -> None:
        super().__init__()
        if depth == 18:
            resnet = models.resnet18(weights=None)
        elif depth == 50:
            resnet = models.resnet50(weights=None)
        else:
            raise ValueError(f"depth must be 18 or 50, got {depth}")
        stem_width = resnet.conv1.out_channels  # 64
        if cifar_stem:
            # SimCLR App. B.9 / SupCon: 3×3 stride 1, no max-pool, so 32 px keep their detail
            resnet.conv1 = _kaiming_conv(in_channels, stem_width, 3, stride=1, padding=1)
            resnet.maxpool = nn.Identity()
        elif in_channels != 3:
            resnet.conv1 = _kaiming_conv(in_channels, stem_width, 7, stride=2, padding=3)
        self.feature_dim = resnet.fc.in_features  # 512 or 2048
        resnet.fc = nn.Identity()
        self.resnet = resnet

    def forward(self, x: Tensor) -> Tensor:
        h: Tensor = self.resnet(x)  # (N, feature_dim)
        return h


class SmallCNN(Backbone):
    """Four conv-BN-ReLU blocks and global average pooling, for 8–32 px images.

    Channels ``width, 2·width, 4·width, 4·width``; the last three blocks have stride 2, so a
    32 px input ends at 4×4 and an 8 px input at 1×1 before pooling. ``feature_dim = 4·width``.

    Shape:
        - Input: x of shape (N, in_channels, H, W)
        - Output: h of shape (N, 4·width)
    """

    def __init__(self, *, in_channels: int = 3, width: int = 32) -> None:
        super().__init__()
        channels = (width, 2 * width, 4 * width, 4 * width)
        strides = (1, 2, 2, 2)
        blocks: list[nn.Module] = []
        previous = in_channels
        for out_channels, stride in zip(channels, strides, strict=True):
            blocks += [
                _kaiming_conv(previous, out_channels, 3, stride=stride, padding=1),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(inplace=True),
            ]
            previous = out_channels
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.feature_dim = channels[-1]

    def forward(self, x: Tensor) -> Tensor:
        fmap = self.features(x)  # (N, 4·width, H/8, W/8)
        h: Tensor = self.pool(fmap).flatten(1)  # (N, 4·width)
        return h


def build_backbone(
    name: str, *, in_channels: int = 3, cifar_stem: bool = True, width: int = 32
) -> Backbone:
    """Build the encoder ``name`` (one of ``BACKBONES``) with random weights.

    Args:
        name: ``"resnet18"``, ``"resnet50"`` or ``"small_cnn"``.
        in_channels: channels of the input images (1 for grayscale, more for extra channels
            such as RandBit's).
        cifar_stem: ResNets only: the 3×3 stride-1 stem without max-pool of the SimCLR/SupCon
            CIFAR recipe; ``False`` keeps the ImageNet stem (7×7 stride 2, max-pool).
        width: ``small_cnn`` only: channels of its first block.

    Shape:
        - Output model: (N, in_channels, H, W) -> (N, feature_dim)
    """
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    if name == "resnet18":
        return ResNetBackbone(18, in_channels=in_channels, cifar_stem=cifar_stem)
    if name == "resnet50":
        return ResNetBackbone(50, in_channels=in_channels, cifar_stem=cifar_stem)
    if name == "small_cnn":
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        return SmallCNN(in_channels=in_channels, width=width)
    raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(BACKBONES)}")


def to_channels_last(model: ModuleT, device: torch.device | str) -> ModuleT:
    """Store ``model``'s 4-D weights channels-last on CUDA; on any other device, do nothing.

    On a GPU, cuDNN's convolutions run faster (tensor cores, no layout transposes) when weights
    and activations are NHWC; a model converted here makes its convolutions return
    channels-last activations, and inputs should be converted too
    (``x.to(memory_format=torch.channels_last)``). On a CPU the NCHW kernels are as fast or
    faster, so the model is returned unchanged. The conversion is in place and ``model`` itself
    is returned (as ``nn.Module.to`` does); the maths is unchanged.
    """
    if torch.device(device).type == "cuda":
        model.to(memory_format=torch.channels_last)
    return model
