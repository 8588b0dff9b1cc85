"""DiffAugment: differentiable augmentations applied to real and fake images alike.

Zhao, Liu, Lin, Zhu & Han 2020, "Differentiable Augmentation for Data-Efficient GAN Training",
Sec. 3 and their ``DiffAugment_pytorch.py``: the discriminator only ever sees augmented images,
and since every op is differentiable in the pixels, the generator is trained through them.
Three policies, each a fixed sequence of ops with per-sample random parameters:

- ``"color"``: brightness ``x + (u − 0.5)``; saturation ``(x − x̄_c) · 2u + x̄_c`` (x̄_c the mean
  over channels of each pixel); contrast ``(x − x̄) · (u + 0.5) + x̄`` (x̄ the mean over the
  whole image); u ~ U(0, 1) per sample and op. No clamping: images in [-1, 1] may leave it.
  With one channel x̄_c = x, so saturation is the identity (grayscale has no saturation).
- ``"translation"``: an integer shift in each axis drawn uniformly from ``[−r·S, r·S]``
  (``r = 1/8``, rounded to the nearest pixel), vacated pixels set to 0.
- ``"cutout"``: a square of side ``round(S/2)`` set to 0, its centre uniform over the image
  (so part of it may fall outside).

Why not kornia: kornia's colour ops take images in [0, 1] and clamp to it (zero gradient on
every clipped pixel, and GAN images are in [-1, 1]), its translation resamples bilinearly
instead of shifting whole pixels, and its random erasing draws rectangles of random aspect
inside the image; each DiffAugment op is a few tensor lines, and ``contragan`` then does not
need the optional ``image`` extra.

Randomness comes from ``generator`` (on its own device; parameters are moved to the images'
device) or, without one, from torch's global stream on the images' device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "POLICIES",
    "brightness",
    "contrast",
    "cutout",
    "diff_augment",
    "saturation",
    "translation",
]


def _uniform(x: Tensor, generator: torch.Generator | None) -> Tensor:
    """``u ~ U(0, 1)`` per sample, shaped ``(N, 1, 1, 1)``, in x's dtype and on x's device."""
    device = generator.device if generator is not None else x.device
    u = torch.rand(x.shape[0], 1, 1, 1, generator=generator, device=device)
    return u.to(device=x.device, dtype=x.dtype)


def _randint(
    low: int, high: int, count: int, x: Tensor, generator: torch.Generator | None
) -> Tensor:
    """``count`` integers uniform in ``[low, high]`` (inclusive), on x's device."""
    device = generator.device if generator is not None else x.device
    values = torch.randint(low, high + 1, (count,), generator=generator, device=device)
    return values.to(x.device)


def brightness(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Add ``u − 0.5``, u ~ U(0, 1) per sample.

    Shape:
        x: ``(N, C, H, W)``; result: same
    """
    return x + (_uniform(x, generator) - 0.5)


def saturation(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Scale each pixel's deviation from its channel mean by ``2u``; the identity when C = 1.

    Shape:
        x: ``(N, C, H, W)``; result: same
    """
    mean = x.mean(dim=1, keepdim=True)  # (N, 1, H, W)
    return (x - mean) * (_uniform(x, generator) * 2) + mean


def contrast(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Scale the deviation from the image mean by ``u + 0.5``.

    Shape:
        x: ``(N, C, H, W)``; result: same
    """
    mean = x.mean(dim=(1, 2, 3), keepdim=True)  # (N, 1, 1, 1)
    return (x - mean) * (_uniform(x, generator) + 0.5) + mean


def translation(
    x: Tensor, ratio: float = 0.125, generator: torch.Generator | None = None
) -> Tensor:
    """Shift each image by whole pixels, up to ``round(ratio · size)`` per axis, zero fill.

    ``out[n, :, i, j] = x[n, :, i − dy_n, j − dx_n]`` where that pixel exists, else 0;
    ``ratio = 1/8`` is DiffAugment's default.

    Shape:
        x: ``(N, C, H, W)``; result: same
    """
    N, _, H, W = x.shape
    max_dy, max_dx = int(H * ratio + 0.5), int(W * ratio + 0.5)
    dy = _randint(-max_dy, max_dy, N, x, generator)  # (N,)
    dx = _randint(-max_dx, max_dx, N, x, generator)  # (N,)
    rows = torch.arange(H, device=x.device) - dy[:, None]  # (N, H) source row of each row
    cols = torch.arange(W, device=x.device) - dx[:, None]  # (N, W)
    inside = ((rows >= 0) & (rows < H))[:, :, None] & ((cols >= 0) & (cols < W))[:, None, :]
    batch = torch.arange(N, device=x.device)[:, None, None]  # (N, 1, 1)
    moved = x[batch, :, rows.clamp(0, H - 1)[:, :, None], cols.clamp(0, W - 1)[:, None, :]]
    # advanced indices around the channel slice put it last: (N, H, W, C)
    return moved.permute(0, 3, 1, 2) * inside[:, None].to(x.dtype)  # (N, C, H, W)


def cutout(x: Tensor, ratio: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    """Zero a square of side ``round(ratio · size)`` centred uniformly over each image.

    The centre lies anywhere in ``[0, size]`` (``[0, size − 1]`` for odd sides), so the square
    may be clipped by the border, as in DiffAugment; ``ratio = 1/2`` is its default.

    Shape:
        x: ``(N, C, H, W)``; result: same
    """
    N, _, H, W = x.shape
    side_h, side_w = int(H * ratio + 0.5), int(W * ratio + 0.5)
    top = _randint(0, H - side_h % 2, N, x, generator) - side_h // 2  # (N,)
    left = _randint(0, W - side_w % 2, N, x, generator) - side_w // 2  # (N,)
    rows = torch.arange(H, device=x.device) - top[:, None]  # (N, H)
    cols = torch.arange(W, device=x.device) - left[:, None]  # (N, W)
    hole = ((rows >= 0) & (rows < side_h))[:, :, None] & ((cols >= 0) & (cols < side_w))[:, None, :]
    return x * (~hole)[:, None].to(x.dtype)  # (N, C, H, W)


Augment = Callable[[Tensor, torch.Generator | None], Tensor]


def _translation(x: Tensor, generator: torch.Generator | None) -> Tensor:
    return translation(x, generator=generator)


def _cutout(x: Tensor, generator: torch.Generator | None) -> Tensor:
    return cutout(x, generator=generator)


# DiffAugment's policy names and the ops each runs, in order
POLICIES: dict[str, tuple[Augment, ...]] = {
    "color": (brightness, saturation, contrast),
    "translation": (_translation,),
    "cutout": (_cutout,),
}


def diff_augment(
    x: Tensor, policy: str = "color,translation,cutout", generator: torch.Generator | None = None
) -> Tensor:
    """Apply DiffAugment's comma-separated ``policy`` in order; ``""`` is the identity.

    Call it on real and fake batches alike before the discriminator (Zhao et al. 2020, Eq. 4–5);
    the reference recipe for CIFAR-10 with 100 % data is ``"color,translation,cutout"``.
    The input is never modified.

    Shape:
        x: ``(N, C, H, W)`` floating; result: same shape, dtype and device
    """
    names = [name.strip() for name in policy.split(",")] if policy.strip() else []
    bad = [name for name in names if name not in POLICIES]
    if bad:
        raise ValueError(f"unknown DiffAugment policy {bad[0]!r}; valid: {', '.join(POLICIES)}")
    if x.ndim != 4 or not x.is_floating_point():
        raise ValueError(
            f"diff_augment expects a floating (N, C, H, W) batch, got {x.dtype} {tuple(x.shape)}"
        )
    for name in names:
        for op in POLICIES[name]:
            x = op(x, generator)
    return x
