"""Common corruptions of test images, the CIFAR-10-C protocol, as batched torch ops on uint8.

Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
Perturbations" (ICLR 2019): a classifier trained on clean images is tested on copies corrupted
at five severities. The formulas and severity parameters follow the authors' ``make_cifar_c.py``
(hendrycks/robustness, ``ImageNet-C/create_c``); every corruption works on x in [0, 1]:

==================  ====================================================  ====================
corruption          x -> x'                                               c, severity 1..5
==================  ====================================================  ====================
gaussian_noise      clip(x + c·ε), ε ~ N(0, 1) per pixel                  .04 .06 .08 .09 .10
shot_noise          clip(Poisson(c·x) / c)  (c photons at full intensity)  500 250 100 75 50
gaussian_blur       Gaussian filter of std c px, edges replicated          .4 .6 .7 .8 1
contrast            (x − m)·c + m, m the image's mean of each channel      .75 .5 .4 .3 .15
brightness          HSV value v -> clip(v + c), hue and saturation kept    .05 .1 .15 .2 .3
jpeg                JPEG encode/decode at quality c (Pillow, as the code)  80 65 58 50 40
pixelate            box-downscale by c, upscale back (nearest)             .95 .9 .85 .75 .65
==================  ====================================================  ====================

Differences from the reference, all below one grey level or a pixel's weight:

- the result is rounded to the nearest level; the reference's ``np.uint8`` truncates, which
  darkens every corrupted image by half a level on average;
- pixelate's box filter weighs the pixels on a cell's border by their overlap with the cell
  (exact area averaging); Pillow's BOX counts a pixel fully when its centre lies in the cell;
- the Gaussian kernel is cut at 4 std, as scikit-image's (through scipy) is, but rebuilt here.

Images are uint8 (N, C, H, W) with C = 1 or 3 (brightness and jpeg need exactly that; the other
corruptions take any C). Random numbers come only from ``generator``, drawn on the CPU and moved
to the images' device, so a seed gives the same corrupted images on every device.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image
from torch import Tensor

__all__ = ["CORRUPTIONS", "SEVERITY_PARAMS", "corrupt"]

CORRUPTIONS = (
    "gaussian_noise",
    "shot_noise",
    "gaussian_blur",
    "contrast",
    "brightness",
    "jpeg",
    "pixelate",
)

# c of severities 1..5, as in make_cifar_c.py (CIFAR-10-C; ImageNet-C uses stronger values)
SEVERITY_PARAMS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),  # std, in [0, 1] units
    "shot_noise": (500, 250, 100, 75, 50),  # photons at full intensity
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),  # std, in pixels
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # factor on the deviation from the mean
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),  # added to the HSV value
    "jpeg": (80, 65, 58, 50, 40),  # quality
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),  # downscale factor
}

GAUSSIAN_TRUNCATE = 4.0  # kernel radius in stds, scipy.ndimage.gaussian_filter's default


def _gaussian_noise(x: Tensor, std: float, generator: torch.Generator | None) -> Tensor:
    noise = torch.randn(x.shape, generator=generator)  # (N, C, H, W), on the CPU
    return (x + std * noise.to(x.device)).clamp(0, 1)


def _shot_noise(x: Tensor, photons: float, generator: torch.Generator | None) -> Tensor:
    # Poisson draws need the rates where the generator is: the CPU
    counts = torch.poisson(x.cpu() * photons, generator=generator)  # (N, C, H, W)
    return (counts.to(x.device) / photons).clamp(0, 1)


def _blur_matrix(size: int, sigma: float, device: torch.device) -> Tensor:
    """B (size, size) with (B v)_i = Σ_t w_t v_clamp(i+t): a 1-D Gaussian filter whose edge
    pixels are repeated outwards (scipy's mode="nearest"), folded into one matrix."""
    radius = int(GAUSSIAN_TRUNCATE * sigma + 0.5)
    offsets = torch.arange(-radius, radius + 1, device=device)  # (K,)
    weights = torch.exp(-0.5 * (offsets / sigma) ** 2)
    weights = weights / weights.sum()  # (K,)
    rows = torch.arange(size, device=device)[:, None].expand(size, offsets.numel())  # (S, K)
    cols = (rows + offsets).clamp(0, size - 1)  # (S, K)
    matrix = torch.zeros(size, size, device=device)
    return matrix.index_put_((rows, cols), weights.expand_as(rows), accumulate=True)  # (S, S)


def _gaussian_blur(x: Tensor, sigma: float) -> Tensor:
    H, W = x.shape[-2:]
    rows = _blur_matrix(H, sigma, x.device)  # (H, H)
    cols = _blur_matrix(W, sigma, x.device)  # (W, W)
    return torch.einsum("ih,nchw,jw->ncij", rows, x, cols)  # (N, C, H, W), separable


def _contrast(x: Tensor, factor: float) -> Tensor:
    mean = x.mean(dim=(-2, -1), keepdim=True)  # (N, C, 1, 1), per image and channel
    return ((x - mean) * factor + mean).clamp(0, 1)


def _brightness(x: Tensor, delta: float) -> Tensor:
    # HSV -> RGB is (r, g, b) = v·(1 − s + s·f_k(h)) per channel k: linear in v with h and s
    # fixed, so raising v to v' scales the pixel by v'/v. A black pixel (v = 0) has s = 0 and
    # becomes grey v'. With one channel v is the pixel itself and this is clip(x + delta).
    value = x.amax(dim=1, keepdim=True)  # (N, 1, H, W)
    new_value = (value + delta).clamp(0, 1)  # (N, 1, H, W)
    scale = new_value / value.clamp_min(torch.finfo(x.dtype).tiny)  # (N, 1, H, W)
    return torch.where(value > 0, x * scale, new_value).clamp(0, 1)  # (N, C, H, W)


def _box_matrix(out_size: int, in_size: int, device: torch.device) -> Tensor:
    """A (out_size, in_size): output cell i averages input [i·s, (i+1)·s), s = in/out, each input
    pixel weighted by its overlap with the cell."""
    step = in_size / out_size
    starts = torch.arange(out_size, device=device, dtype=torch.float64)[:, None] * step
    left = torch.arange(in_size, device=device, dtype=torch.float64)[None, :]  # pixel [j, j+1)
    overlap = (torch.minimum(starts + step, left + 1) - torch.maximum(starts, left)).clamp_min(0)
    return (overlap / step).float()  # (out, in), rows sum to 1


def _pixelate(x: Tensor, factor: float) -> Tensor:
    H, W = x.shape[-2:]
    small_h, small_w = max(1, int(H * factor)), max(1, int(W * factor))  # int(), as the code
    down = torch.einsum(
        "ih,nchw,jw->ncij",
        _box_matrix(small_h, H, x.device),
        x,
        _box_matrix(small_w, W, x.device),
    )  # (N, C, h, w)
    # nearest neighbour by pixel centres: output pixel i reads cell floor((i + 1/2)·h/H)
    row_index = ((torch.arange(H, device=x.device) + 0.5) * small_h / H).long()  # (H,)
    col_index = ((torch.arange(W, device=x.device) + 0.5) * small_w / W).long()  # (W,)
    return down.index_select(2, row_index).index_select(3, col_index)  # (N, C, H, W)


def _jpeg(images: Tensor, quality: int) -> Tensor:
    """Encode and decode every image with Pillow (the library CIFAR-10-C was made with)."""
    if images.shape[0] == 0:
        return images.clone()
    mode = "L" if images.shape[1] == 1 else "RGB"
    decoded = []
    for image in images.cpu().permute(0, 2, 3, 1).numpy():  # (H, W, C) each
        buffer = io.BytesIO()
        Image.fromarray(image.squeeze(-1) if mode == "L" else image, mode=mode).save(
            buffer, format="JPEG", quality=quality
        )
        buffer.seek(0)
        with Image.open(buffer) as reopened:
            array = np.asarray(reopened.convert(mode)).reshape(image.shape)  # (H, W, C)
        decoded.append(torch.from_numpy(array.copy()))
    return torch.stack(decoded).permute(0, 3, 1, 2).contiguous().to(images.device)


# the deterministic corruptions ignore the generator
_FLOAT_CORRUPTIONS: dict[str, Callable[[Tensor, float, torch.Generator | None], Tensor]] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "gaussian_blur": lambda x, sigma, _: _gaussian_blur(x, sigma),
    "contrast": lambda x, factor, _: _contrast(x, factor),
    "brightness": lambda x, delta, _: _brightness(x, delta),
    "pixelate": lambda x, factor, _: _pixelate(x, factor),
}


def _check_arguments(
    images: Tensor, name: str, severity: int, generator: torch.Generator | None
) -> None:
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; choose one of {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
    if not isinstance(images, Tensor) or images.dim() != 4 or images.dtype != torch.uint8:
        description = (
            f"{images.dtype} {tuple(images.shape)}" if isinstance(images, Tensor) else images
        )
        raise ValueError(f"images must be a uint8 tensor (N, C, H, W), got {description}")
    if name in ("brightness", "jpeg") and images.shape[1] not in (1, 3):
        raise ValueError(f"{name} needs 1 or 3 channels, got C={images.shape[1]}")
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU generator, got one on {generator.device}")


def corrupt(
    images: Tensor, name: str, severity: int, *, generator: torch.Generator | None = None
) -> Tensor:
    """Corrupt a batch of images with ``name`` at ``severity`` (1..5), the CIFAR-10-C protocol.

    See the module docstring for the formulas and ``SEVERITY_PARAMS`` for the constants. The
    input is not modified; the result is a new tensor on the same device. ``gaussian_noise`` and
    ``shot_noise`` draw from ``generator`` (a CPU generator; the global one when ``None``),
    independently for every pixel of every image; the others are deterministic.

    Shape:
        - images: (N, C, H, W), uint8
        - Output: (N, C, H, W), uint8
    """
    _check_arguments(images, name, severity, generator)
    param = SEVERITY_PARAMS[name][severity - 1]
    if name == "jpeg":
        return _jpeg(images, int(param))
    x = images.float() / 255  # (N, C, H, W), in [0, 1]
    corrupted = _FLOAT_CORRUPTIONS[name](x, param, generator)
    return (corrupted * 255).round().clamp(0, 255).to(torch.uint8)
