"""The geometric ops of SimCLR's views, batched on the images' device: random resized crop and
horizontal flip, each drawing one set of parameters per row.

:class:`ResizedCropBoxes` is torchvision's ``RandomResizedCrop`` sampler (its ``get_params``)
for a whole batch, :func:`resized_crop` resamples one box per row to the output size with a
single ``affine_grid`` / ``grid_sample`` (bicubic, borders replicated), and
:class:`HorizontalFlip` mirrors rows with probability ``p``. Every random draw is on the
images' device and nothing is read back to the host. :class:`imagecl.augment.SimCLRViews`
runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = [
    "CROP_ATTEMPTS",
    "HorizontalFlip",
    "ResizedCropBoxes",
    "central_crop_size",
    "resized_crop",
]

CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop: 10 tries, then a central crop


@dataclass(frozen=True)
class ResizedCropBoxes:
    """Random resized crop boxes: torchvision's sampler, batched on the device.

    Per row, up to 10 tries of an area fraction ``U(scale)`` and a log-uniform aspect ratio in
    ``ratio``, the sides rounded to pixels; the first box that fits the image wins, else the
    central crop of the largest box with an allowed ratio (torchvision's ``get_params``). The
    top-left corner is uniform over the positions that keep the box inside.
    """

    scale: tuple[float, float]
    ratio: tuple[float, float]

    def __call__(self, batch: int, height: int, width: int, device: torch.device) -> Tensor:
        """Boxes in pixels: left, top, width, height.

        Shape:
            returns: float ``(B, 4)`` on ``device``
        """
        low, high = math.log(self.ratio[0]), math.log(self.ratio[1])
        u = torch.rand(batch, CROP_ATTEMPTS, 4, device=device)  # (B, T, 4): area, ratio, top, left
        area = (self.scale[0] + (self.scale[1] - self.scale[0]) * u[..., 0]) * (height * width)
        aspect = (low + (high - low) * u[..., 1]).exp_()  # (B, T)
        w = (area * aspect).sqrt_().round_()  # (B, T)
        h = (area / aspect).sqrt_().round_()
        fits = (w >= 1) & (w <= width) & (h >= 1) & (h <= height)  # (B, T)
        first = fits.to(torch.uint8).argmax(1, keepdim=True)  # (B, 1): the first box that fits
        missed = ~fits.any(1)  # (B,): none fits, the central crop
        fallback_w, fallback_h = central_crop_size(height, width, self.ratio)
        w = w.gather(1, first)[:, 0].masked_fill_(missed, fallback_w)  # (B,)
        h = h.gather(1, first)[:, 0].masked_fill_(missed, fallback_h)
        corner = u[..., 2:].gather(1, first[:, :, None].expand(-1, -1, 2))[:, 0]  # (B, 2)
        top = (corner[:, 0] * (height + 1 - h)).floor_()  # (B,)
        left = (corner[:, 1] * (width + 1 - w)).floor_()
        top = top.masked_fill_(missed, (height - fallback_h) // 2)
        left = left.masked_fill_(missed, (width - fallback_w) // 2)
        return torch.stack([left, top, w, h], dim=1)  # (B, 4)


def central_crop_size(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int]:
    """torchvision's fallback box (width, height): the whole image, its ratio clamped."""
    if width / height < ratio[0]:
        return width, round(width / ratio[0])
    if width / height > ratio[1]:
        return round(height * ratio[1]), height
    return width, height


@dataclass(frozen=True)
class HorizontalFlip:
    """Mirror each row with probability ``p``.

    Shape:
        ``(B, C, H, W) -> (B, C, H, W)``
    """

    p: float

    def __call__(self, x: Tensor) -> Tensor:
        on = torch.rand(x.shape[0], device=x.device) < self.p  # (B,)
        return torch.where(on[:, None, None, None], x.flip(-1), x)


def resized_crop(x: Tensor, boxes: ResizedCropBoxes, size: int) -> Tensor:
    """Bicubic resize of one random box per row (drawn by ``boxes``) to ``size × size``.

    Box corners map to the output's corner pixel centres (``align_corners=True``); the border is
    replicated, not zero-padded, so a crop touching the border keeps its values. Bicubic
    resampling can overshoot [0, 1]; the caller clamps.

    Shape:
        x: float ``(B, C, H, W)``; returns ``(B, C, size, size)``
    """
    b, c, h, w = x.shape
    if b == 0:  # affine_grid refuses an empty batch
        return x.new_empty(0, c, size, size)
    left, top, box_w, box_h = boxes(b, h, w, x.device).unbind(1)  # (B,) each, pixels
    # output [-1, 1] -> input [-1, 1]: x_in = sx · x_out + tx, box corners to pixel centres
    sx, sy = (box_w - 1) / max(w - 1, 1), (box_h - 1) / max(h - 1, 1)  # (B,)
    tx, ty = (
        (2 * left + box_w - 1) / max(w - 1, 1) - 1,
        (2 * top + box_h - 1) / max(h - 1, 1) - 1,
    )
    zero = torch.zeros_like(sx)
    theta = torch.stack([sx, zero, tx, zero, sy, ty], dim=1).view(b, 2, 3)  # (B, 2, 3)
    if size == 1:  # affine_grid's own value (the box centre), without its unit-size warning
        grid = theta[:, :, 2].reshape(b, 1, 1, 2)
    else:
        grid = F.affine_grid(theta, [b, 1, size, size], align_corners=True)
    return F.grid_sample(x, grid, mode="bicubic", padding_mode="border", align_corners=True)
