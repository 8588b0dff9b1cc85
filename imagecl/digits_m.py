"""digits-m: the MNIST-M recipe on scikit-learn's digits, an offline benchmark where colour matters.

Ganin & Lempitsky, "Unsupervised Domain Adaptation by Backpropagation" (ICML 2015), built MNIST-M
by blending each MNIST digit over a patch cut at random from a colour photograph (BSDS500):
``out[i, j, k] = |background[i, j, k] − digit[i, j]|`` per colour channel. Raw pixels become a
weak cue (the background dominates them) and the digit is a change of colour against the
background, so grayscale or colour-blind features lose. Here the photographs are the RGB ones
that scikit-image installs in ``skimage/data`` (read through ``importlib.resources``, never copied),
and the digits are sklearn's, upsampled (:func:`imagecl.sources.digit_images`); everything is a
pure function of the seed, built in memory.
"""

from __future__ import annotations

import functools
import importlib.resources

import numpy as np
import torch
from PIL import Image
from torch import Tensor

# RGB photographs shipped with scikit-image (no download): textures, faces, objects and the
# Hubble deep field. Grayscale textures (brick, grass, gravel) are left out: a grey background
# would make the colour cue vanish for those samples.
BACKGROUND_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "hubble_deep_field.jpg",
    "ihc.png",
)

# Keeps the background stream independent of the split stream drawn from the same seed.
_BACKGROUND_STREAM = 0x6D


@functools.lru_cache(maxsize=1)
def background_photos() -> tuple[np.ndarray, ...]:
    """The photographs of :data:`BACKGROUND_PHOTOS`, decoded once per process.

    Shape:
        each ``(H, W, 3)`` uint8, read-only (shared by every call)
    """
    folder = importlib.resources.files("skimage") / "data"
    photos = []
    for name in BACKGROUND_PHOTOS:
        with (folder / name).open("rb") as handle, Image.open(handle) as image:
            array = np.asarray(image.convert("RGB"))  # (H, W, 3)
        array.setflags(write=False)
        photos.append(array)
    return tuple(photos)


def random_background_crops(count: int, size: int, *, seed: int) -> Tensor:
    """``count`` random ``size``×``size`` crops of the background photographs.

    Each crop picks a photograph uniformly, then a crop position uniformly inside it, from
    ``numpy.random.default_rng([seed, 0x6D])`` (never the global generators).

    Shape:
        returns ``(count, 3, size, size)`` uint8
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    photos = background_photos()
    smallest = min(min(photo.shape[:2]) for photo in photos)
    if not 1 <= size <= smallest:
        raise ValueError(f"digits-m image_size must be in [1, {smallest}], got {size}")
    rng = np.random.default_rng([seed, _BACKGROUND_STREAM])
    which = rng.integers(len(photos), size=count)
    corners = rng.random((count, 2))  # (count, 2): top and left as fractions of the free range
    crops = np.empty((count, size, size, 3), dtype=np.uint8)  # (N, S, S, 3)
    for i in range(count):
        photo = photos[which[i]]
        top = int(corners[i, 0] * (photo.shape[0] - size + 1))
        left = int(corners[i, 1] * (photo.shape[1] - size + 1))
        crops[i] = photo[top : top + size, left : left + size]
    return torch.from_numpy(crops).permute(0, 3, 1, 2).contiguous()  # (N, 3, S, S)


def blend_digits(digits: Tensor, *, seed: int) -> Tensor:
    """MNIST-M blend: ``|background − digit|`` per channel over seeded photograph crops.

    The single-channel digit is broadcast to the three channels; both are uint8 in 0..255 and the
    absolute difference stays in that range. The same ``seed`` gives the same backgrounds.

    Shape:
        digits: ``(N, 1, S, S)`` uint8
        returns ``(N, 3, S, S)`` uint8
    """
    if digits.dtype != torch.uint8 or digits.dim() != 4 or digits.shape[1] != 1:
        raise ValueError(
            f"digits must be uint8 (N, 1, S, S), got {digits.dtype} {tuple(digits.shape)}"
        )
    N, _, H, W = digits.shape
    if H != W:
        raise ValueError(f"digits must be square, got {H}x{W}")
    backgrounds = random_background_crops(N, H, seed=seed)  # (N, 3, S, S)
    difference = backgrounds.to(torch.int16) - digits.to(torch.int16)  # (N, 3, S, S) broadcast
    return difference.abs_().to(torch.uint8)
