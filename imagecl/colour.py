"""Colour jitter of a whole float image batch, one set of factors per image: torchvision's
jitter as batched tensor ops (checked against it image by image in the tests).

:func:`color_jitter` applies brightness, contrast, saturation and hue in a given order, with the
formulas of ``torchvision.transforms.v2.functional.adjust_*``; the hue rotation works on the HSV
hexcone without building HSV images. :class:`imagecl.augment.SimCLRViews` draws the factors with
kornia and applies them here (kornia's own HSV round trip was 60% of a CIFAR batch's time).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale (ITU-R 601-2 luma)


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
    weights = x.new_tensor(GRAY_WEIGHTS)[:, None, None]  # (3, 1, 1)
    for step in order:
        if step == 0:
            x = (x * f[:, 0]).clamp_(0.0, 1.0)
        elif step in (1, 2):
            gray = (x * weights).sum(1, keepdim=True)  # (B, 1, H, W)
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
    hue = hue.div_(torch.where(chroma > 0, chroma, 1.0))  # gray pixels: chroma 0, any hue
    hue = hue.add_(turns[:, 0], alpha=6).remainder_(6.0)  # (B, H, W) in [0, 6)
    out = torch.empty_like(x)
    torch.addcmul(low, chroma, (hue - 3).abs_().sub_(1).clamp_(0, 1), out=out[:, 0])
    torch.addcmul(low, chroma, (hue - 2).abs_().neg_().add_(2).clamp_(0, 1), out=out[:, 1])
    torch.addcmul(low, chroma, hue.sub_(4).abs_().neg_().add_(2).clamp_(0, 1), out=out[:, 2])
    return out
