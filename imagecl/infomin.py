"""Toy views in the spirit of InfoMin (Tian et al. 2020, "What Makes for Good Views?").

Tian et al. build views that share chosen factors of variation and find that contrastive
learning encodes the factors the two views share and discards the others ("InfoMin": the best
views share only the task-relevant factor). Our generator renders a 1-channel image from three
factors:

* ``digit``: a class 0–9, drawn as a random instance of scikit-learn's 8×8 digits of that class,
  upsampled to a ``grid``-th of the image side;
* ``position``: the cell of a ``grid × grid`` grid the digit is pasted into (pixel-wise max);
* ``background``: one of scikit-image's bundled grey textures (:data:`TEXTURES`: brick, grass,
  gravel), a random crop of it, dimmed to at most ``texture_max`` so the digit stays visible.

:func:`make_pairs` returns positive pairs whose two images share exactly the chosen factors: a
shared factor has the same value in both, every other factor a different value (and every
nuisance — the digit instance, the crop of the texture — is drawn afresh for each image).
Everything is a function of a ``torch.Generator`` (never the global generators); the textures are
read through ``importlib.resources`` from the installed scikit-image, never copied.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from imagecl.sources import digit_images

__all__ = [
    "FACTORS",
    "TEXTURES",
    "InfoMinImages",
    "InfoMinPairs",
    "ToyConfig",
    "make_images",
    "make_pairs",
    "render",
    "sample_factors",
    "texture_bank",
]

FACTORS: tuple[str, ...] = ("digit", "position", "background")
TEXTURES: tuple[str, ...] = ("brick.png", "grass.png", "gravel.png")


class ToyConfig(NamedTuple):
    """How the toy images look; the defaults give 32 px images with 16 px digits in 4 cells."""

    image_size: int = 32
    grid: int = 2  # position factor: grid × grid cells of side image_size // grid
    texture_scale: int = 2  # textures are shrunk by this factor before cropping (coarser crops)
    texture_max: int = 150  # backgrounds are dimmed to [0, texture_max]; strokes reach 255

    @property
    def sizes(self) -> tuple[int, int, int]:
        """Number of values of each factor of :data:`FACTORS`."""
        return 10, self.grid * self.grid, len(TEXTURES)

    def check(self) -> None:
        if self.grid < 1 or self.image_size < 2 * self.grid:
            raise ValueError(f"need grid >= 1 and image_size >= 2·grid, got {self}")
        if self.texture_scale < 1 or not 0 <= self.texture_max <= 255:
            raise ValueError(f"need texture_scale >= 1 and texture_max in 0..255, got {self}")


class InfoMinImages(NamedTuple):
    """Single images and their factors."""

    images: Tensor  # (N, 1, S, S) uint8
    factors: Tensor  # (N, 3) long: digit, position, background


class InfoMinPairs(NamedTuple):
    """Positive pairs: ``images[:, 0]`` and ``images[:, 1]`` share exactly ``shared``."""

    images: Tensor  # (N, 2, 1, S, S) uint8
    factors: Tensor  # (N, 2, 3) long
    shared: tuple[str, ...]


@functools.lru_cache(maxsize=4)
def texture_bank(scale: int = 2, texture_max: int = 150) -> Tensor:
    """The grey textures of :data:`TEXTURES`, shrunk by ``scale`` and dimmed to ``texture_max``.

    Shape:
        returns ``(3, H, W)`` uint8 (H = W = 512 / scale for scikit-image's textures)
    """
    folder = importlib.resources.files("skimage") / "data"
    planes = []
    for name in TEXTURES:
        with (folder / name).open("rb") as handle, Image.open(handle) as image:
            gray = image.convert("L")
            size = (gray.width // scale, gray.height // scale)
            array = np.asarray(gray.resize(size, Image.Resampling.BOX), dtype=np.float64)
        planes.append(np.round(array * (texture_max / 255.0)).astype(np.uint8))  # (H, W)
    side = min(min(plane.shape) for plane in planes)
    return torch.from_numpy(np.stack([plane[:side, :side] for plane in planes]))  # (3, H, W)


@functools.lru_cache(maxsize=4)
def _digit_bank(side: int) -> tuple[Tensor, Tensor, Tensor]:
    """scikit-learn's digits at ``side`` px sorted by class, with each class's first row and
    count.

    Shape:
        returns ``(1797, 1, side, side)`` uint8, ``(10,)`` long, ``(10,)`` long
    """
    images, labels = digit_images(side)  # (M, 1, side, side), (M,)
    order = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=10)  # (10,)
    starts = torch.cumsum(counts, 0) - counts  # (10,)
    return images[order], starts, counts


def sample_factors(count: int, config: ToyConfig, generator: torch.Generator) -> Tensor:
    """``count`` independent, uniform draws of every factor.

    Shape:
        returns ``(count, 3)`` long: digit, position, background
    """
    columns = [torch.randint(k, (count,), generator=generator) for k in config.sizes]
    return torch.stack(columns, dim=1)  # (count, 3)


def render(factors: Tensor, config: ToyConfig, generator: torch.Generator) -> Tensor:
    """Images of the given factors, a fresh digit instance and texture crop for each row.

    Shape:
        factors: ``(N, 3)`` long; returns ``(N, 1, S, S)`` uint8
    """
    config.check()
    N, S = factors.shape[0], config.image_size
    side = S // config.grid
    offset = (S - config.grid * side) // 2
    bank, starts, counts = _digit_bank(side)
    digit, position, background = factors.unbind(1)  # (N,) each
    instance = starts[digit] + (torch.rand(N, generator=generator) * counts[digit]).long()
    digits = bank[instance]  # (N, 1, side, side)
    textures = texture_bank(config.texture_scale, config.texture_max)  # (3, T, T)
    free = textures.shape[-1] - S + 1
    corners = torch.randint(free, (N, 2), generator=generator)  # (N, 2): top, left
    rows = corners[:, :1] + torch.arange(S)  # (N, S)
    cols = corners[:, 1:] + torch.arange(S)  # (N, S)
    images = textures[background[:, None, None], rows[:, :, None], cols[:, None, :]]  # (N, S, S)
    images = images.unsqueeze(1).clone()  # (N, 1, S, S)
    for cell in range(config.grid * config.grid):
        chosen = position == cell  # (N,)
        top = offset + (cell // config.grid) * side
        left = offset + (cell % config.grid) * side
        region = images[chosen, :, top : top + side, left : left + side]  # (n, 1, side, side)
        images[chosen, :, top : top + side, left : left + side] = torch.maximum(
            region, digits[chosen]
        )
    return images


def make_images(count: int, *, seed: int, config: ToyConfig | None = None) -> InfoMinImages:
    """``count`` images with uniform, independent factors (for probing what was learned).

    Shape:
        images ``(count, 1, S, S)`` uint8, factors ``(count, 3)`` long
    """
    config = config or ToyConfig()
    generator = torch.Generator().manual_seed(seed)
    factors = sample_factors(count, config, generator)
    return InfoMinImages(render(factors, config, generator), factors)


def make_pairs(
    count: int, shared: Sequence[str], *, seed: int, config: ToyConfig | None = None
) -> InfoMinPairs:
    """``count`` positive pairs sharing exactly the factors ``shared`` (names of :data:`FACTORS`).

    View 0's factors are uniform; view 1 copies the shared ones and moves every other factor to
    a different value, uniform over the other values. A factor with a single value (a 1×1 grid)
    cannot differ, so it must be shared.

    Shape:
        images ``(count, 2, 1, S, S)`` uint8, factors ``(count, 2, 3)`` long
    """
    config = config or ToyConfig()
    unknown = [name for name in shared if name not in FACTORS]
    if unknown or len(set(shared)) != len(shared):
        raise ValueError(f"shared must name distinct factors of {FACTORS}, got {tuple(shared)}")
    generator = torch.Generator().manual_seed(seed)
    first = sample_factors(count, config, generator)  # (count, 3)
    second = first.clone()
    for column, (name, size) in enumerate(zip(FACTORS, config.sizes, strict=True)):
        if name in shared:
            continue
        if size < 2:
            raise ValueError(f"factor {name!r} has one value only: it cannot differ")
        step = torch.randint(1, size, (count,), generator=generator)  # (count,) in 1..size-1
        second[:, column] = (first[:, column] + step) % size
    factors = torch.stack([first, second], dim=1)  # (count, 2, 3)
    images = render(factors.flatten(0, 1), config, generator)  # (2·count, 1, S, S)
    return InfoMinPairs(images.view(count, 2, *images.shape[1:]), factors, tuple(shared))
