"""Photometric ops of a whole float image batch, one set of random parameters per image:
torchvision's colour jitter as batched tensor ops (checked against it image by image in the
tests), random grayscale and random Gaussian blur, each drawing its parameters on the images'
device.

:func:`color_jitter` applies brightness, contrast, saturation and hue in a given order, with the
formulas of ``torchvision.transforms.v2.functional.adjust_*``; the hue rotation works on the HSV
hexcone without building HSV images (no RGB → HSV → RGB round trip of the batch, as kornia's
jitter makes). :class:`ColorJitterParams` draws its factors as torchvision's ColorJitter does
and :func:`random_color_jitter` applies its draws in a random order.
:class:`imagecl.augment.SimCLRViews` runs them all.

Nothing here builds a tensor from host data on a call (no ``torch.tensor`` of constants, no
Python scalar turned into a tensor by ``torch.where``) or reads a device value back, so on a GPU
a call only queues kernels; the one host-side draw is :func:`jitter_order`'s permutation, on the
CPU stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale (ITU-R 601-2 luma)


def luma(images: Tensor) -> Tensor:
    """The gray level of RGB pixels with torchvision's weights (ITU-R 601-2 luma).

    Shape:
        images: float ``(B, 3, H, W)``; returns ``(B, 1, H, W)``
    """
    r, g, b = images[:, 0:1], images[:, 1:2], images[:, 2:3]  # (B, 1, H, W) each
    return (r * GRAY_WEIGHTS[0]).add_(g, alpha=GRAY_WEIGHTS[1]).add_(b, alpha=GRAY_WEIGHTS[2])


def color_jitter(images: Tensor, factors: Tensor, order: Sequence[int] = (0, 1, 2, 3)) -> Tensor:
    """torchvision's colour jitter with one set of factors per image, the steps in ``order``.

    Step 0, brightness: ``x·b``; 1, contrast: blend with the image's mean gray level, ``c·x +
    (1 - c)·mean``; 2, saturation: blend with the image's grayscale; each clamped to [0, 1] (the
    formulas of ``torchvision.transforms.v2.functional.adjust_*``). Step 3, hue: rotate the HSV
    hue by ``h`` turns (torchvision's ``adjust_hue``), on the hexcone without building HSV
    images: value (max) and chroma (max - min) stay. Neutral factors are (1, 1, 1, 0).

    Shape:
        images: float ``(B, 3, H, W)`` in [0, 1]
        factors: ``(B, 4)``: brightness, contrast, saturation (multipliers), hue (turns)
        returns: ``(B, 3, H, W)``
    """
    x = images
    f = factors.to(x.device, x.dtype)[:, :, None, None, None]  # (B, 4, 1, 1, 1)
    for step in order:
        if step == 0:
            x = (x * f[:, 0]).clamp_(0.0, 1.0)
        elif step in (1, 2):
            gray = luma(x)  # (B, 1, H, W)
            if step == 1:
                gray = gray.mean((2, 3), keepdim=True)  # (B, 1, 1, 1)
            x = torch.lerp(gray, x, f[:, step]).clamp_(0.0, 1.0)  # f·x + (1 - f)·gray
        elif step == 3:
            x = _rotate_hue(x, f[:, 3])
        else:
            raise ValueError(f"colour jitter steps are 0..3, got {step}")
    return x


def _rotate_hue(x: Tensor, turns: Tensor) -> Tensor:
    """Add ``turns`` to the HSV hue of ``x (B, 3, H, W)``; ``turns (B, 1, 1, 1)``.

    Works on (B, H, W) planes with few temporaries (on the CPU, fresh buffers cost more than the
    arithmetic). Hue in sextants, h ∈ [0, 6), as torchvision's ``_rgb_to_hsv`` with its channel
    priority: r max: (g - b)/chroma, else g max: 2 + (b - r)/chroma, else 4 + (r - g)/chroma.
    Back: the fully saturated colour of hue h is r = clamp(|h - 3| - 1), g = clamp(2 - |h - 2|),
    b = clamp(2 - |h - 4|) in [0, 1]; a pixel is min + chroma · that colour.
    """
    r, g, b = x.unbind(1)  # (B, H, W) each
    value = torch.maximum(torch.maximum(r, g), b)
    low = torch.minimum(torch.minimum(r, g), b)
    chroma = value - low
    hue = torch.where(
        value == r,
        g - b,
        torch.where(value == g, (b - r).add_(chroma, alpha=2), (r - g).add_(chroma, alpha=4)),
    )
    hue = hue.div_(chroma + (chroma == 0))  # gray pixels: chroma 0 (and hue 0), divide by 1
    hue = hue.add_(turns[:, 0], alpha=6).remainder_(6.0)  # (B, H, W) in [0, 6)
    out = torch.empty_like(x)
    torch.addcmul(low, chroma, (hue - 3).abs_().sub_(1).clamp_(0, 1), out=out[:, 0])
    torch.addcmul(low, chroma, (hue - 2).abs_().neg_().add_(2).clamp_(0, 1), out=out[:, 1])
    torch.addcmul(low, chroma, hue.sub_(4).abs_().neg_().add_(2).clamp_(0, 1), out=out[:, 2])
    return out


def _gate(batch: int, p: float, device: torch.device) -> Tensor:
    """``(B, 1, 1, 1)`` bool: the rows an op of probability ``p`` applies to."""
    return (torch.rand(batch, device=device) < p)[:, None, None, None]


@dataclass(frozen=True)
class RandomGrayscale:
    """Replace each RGB row by its luma (torchvision's weights) with probability ``p``.

    Shape:
        ``(B, 3, H, W) -> (B, 3, H, W)``
    """

    p: float

    def __call__(self, x: Tensor) -> Tensor:
        return torch.where(_gate(x.shape[0], self.p, x.device), luma(x).expand_as(x), x)


@dataclass(frozen=True)
class RandomGaussianBlur:
    """Gaussian blur with probability ``p``, σ ~ U(``sigma``) per row, the same σ on both axes.

    Shape:
        ``(B, C, H, W) -> (B, C, H, W)``
    """

    kernel_size: int
    sigma: tuple[float, float]
    p: float

    def __call__(self, x: Tensor) -> Tensor:
        u = torch.rand(x.shape[0], 2, device=x.device)  # (B, 2): gate, σ
        sigma = self.sigma[0] + (self.sigma[1] - self.sigma[0]) * u[:, 1]  # (B,)
        on = (u[:, 0] < self.p)[:, None, None, None]  # (B, 1, 1, 1)
        return torch.where(on, gaussian_blur(x, self.kernel_size, sigma), x)


def gaussian_blur(x: Tensor, kernel_size: int, sigma: Tensor) -> Tensor:
    """Separable Gaussian blur with one σ per row, borders reflected (torchvision's padding).

    Not kornia's ``gaussian_blur2d``: it checks ``σ > 0`` by reading σ on the host, a device
    synchronisation on every call.

    Shape:
        x: ``(B, C, H, W)``, sigma: ``(B,)``; returns ``(B, C, H, W)``
    """
    B, C, H, W = x.shape
    if B * C == 0:  # grouped convolutions refuse zero groups
        return x.clone()
    pad = kernel_size // 2
    taps = torch.arange(kernel_size, device=x.device, dtype=x.dtype) - pad  # (k,)
    kernel = torch.exp(-(taps**2) / (2 * sigma[:, None] ** 2))  # (B, k)
    kernel = kernel / kernel.sum(1, keepdim=True)
    kernel = kernel[:, None].expand(B, C, kernel_size).reshape(B * C, 1, 1, kernel_size)
    mode = "reflect" if min(H, W) > pad else "replicate"  # reflect needs a pad < the side
    y = F.pad(x.reshape(1, B * C, H, W), (pad, pad, pad, pad), mode=mode)  # (1, BC, H+2p, W+2p)
    y = F.conv2d(y, kernel, groups=B * C)  # (1, BC, H + 2p, W): along the rows
    y = F.conv2d(y, kernel.transpose(2, 3), groups=B * C)  # (1, BC, H, W): along the columns
    return y.view(B, C, H, W)


@dataclass(frozen=True)
class ColorJitterParams:
    """torchvision's ColorJitter draws for a batch: one set of factors per row, and a gate.

    Brightness, contrast and saturation factors are uniform in ``[max(0, 1 - m), 1 + m]`` for
    their magnitude ``m``, the hue shift in ``[-hue, hue]`` turns; the gate is on with
    probability ``p``.
    """

    brightness: float
    contrast: float
    saturation: float
    hue: float
    p: float

    def __call__(self, batch: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Factors ``(B, 4)`` (brightness, contrast, saturation, hue) and the gate ``(B,)``."""
        u = torch.rand(batch, 5, device=device)  # (B, 5)
        columns = []
        for k, m in enumerate((self.brightness, self.contrast, self.saturation)):
            low = max(0.0, 1.0 - m)
            columns.append(low + (1.0 + m - low) * u[:, k])  # (B,)
        columns.append(self.hue * (2 * u[:, 3] - 1))
        return torch.stack(columns, dim=1), u[:, 4] < self.p  # (B, 4), (B,)


def jitter_order() -> list[int]:
    """A random order of the four jitter steps (0..3, :func:`color_jitter`), from the CPU stream.

    The order decides which kernels run, so it is drawn on the host, where reading it waits for
    no device.
    """
    return torch.randperm(4).tolist()


def random_color_jitter(x: Tensor, jitter: ColorJitterParams) -> Tensor:
    """``jitter``'s draws (factors and gate per row) applied by :func:`color_jitter`.

    The order of the steps is drawn once per call (:func:`jitter_order`), the factors per row;
    rows the gate skips are returned unchanged.

    Shape:
        x: float ``(B, 3, H, W)`` in [0, 1]; returns ``(B, 3, H, W)``
    """
    factors, on = jitter(x.shape[0], x.device)  # (B, 4), (B,)
    jittered = color_jitter(x, factors, jitter_order())
    return torch.where(on[:, None, None, None], jittered, x)
