"""Feature-suppression data sets of "Intriguing Properties of Contrastive Losses" (Sec. 4).

Chen, Luo & Li (2021) add an easy feature to every image and watch it suppress the features the
task needs: contrastive learning solves instance discrimination with the easiest feature it finds.
Both wrappers take any image data set of the pipeline (items ``(uint8 (C, H, W), label)``):

* :class:`RandBits`: ``n_bits`` random bits per image, fixed once per image (seeded), appended as
  constant channels of 0 or 255. They are the same in both views because every view of an image
  carries the same channels, and augmentation leaves them constant: :class:`imagecl.augment.
  SimCLRViews` treats channels after the first three as extra channels and applies only the
  crop and flip to them (a constant plane stays constant), never colour jitter, grayscale or
  blur. Grayscale images are repeated to RGB first, so that the bits are always channels 3 and up.
* :class:`DigitOverlay`: a digit pasted by pixel-wise max into one of a ``grid × grid`` grid of
  cells, digit and cell drawn once per example (seeded), so the composition happens before the
  two views are made; the digit's label comes back as a second target.

:func:`wrap_image_data` applies a wrapper to every split of an :class:`~imagecl.data.ImageData`
and stores the result in memory, with statistics for the new channels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from torch import Tensor
from torch.utils.data import Dataset

from imagecl.data import (
    ImageData,
    ImageDataset,
    TensorImageDataset,
    channel_stats,
    images_and_labels,
)

__all__ = ["DigitOverlay", "RandBits", "WrappedData", "split_seed", "wrap_image_data"]


def split_seed(seed: int, stream: int) -> int:
    """An independent seed for ``stream`` (e.g. one per split) from one user seed."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def _image_shape(dataset: ImageDataset) -> tuple[int, int, int]:
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("cannot wrap an empty data set: its image shape is unknown")
    image = dataset[0][0]
    if not isinstance(image, Tensor) or image.dtype != torch.uint8 or image.ndim != 3:
        raise ValueError(f"items must hold uint8 (C, H, W) images, got {type(image).__name__}")
    C, H, W = image.shape
    return C, H, W


class RandBits(Dataset[tuple[Tensor, int]]):
    """``dataset`` with ``n_bits`` constant channels of random bits per image (RandBit).

    Bit ``b`` of image ``i`` is drawn once (``torch.Generator`` seeded with ``seed``) and becomes
    channel ``3 + b`` of that image, every pixel 0 or 255. A 1-channel image is repeated to 3
    channels first (whatever ``n_bits``, so that a sweep over ``n_bits`` keeps the same image
    channels); ``n_bits = 0`` adds nothing else. The bits carry no information about the label
    but, with enough of them, identify every image: the shortcut of Chen et al. 2021, Sec. 4.1.

    Shape:
        item: ``((3 + n_bits, H, W) uint8, label)``; ``bits``: ``(len(dataset), n_bits)`` uint8
    """

    def __init__(self, dataset: ImageDataset, n_bits: int, seed: int = 0) -> None:
        if isinstance(n_bits, bool) or not isinstance(n_bits, int) or n_bits < 0:
            raise ValueError(f"n_bits must be an int >= 0, got {n_bits!r}")
        C, self.height, self.width = _image_shape(dataset)
        if C not in (1, 3):
            raise ValueError(f"RandBits wraps 1- or 3-channel images, got C = {C}")
        self.dataset = dataset
        generator = torch.Generator().manual_seed(seed)
        count = len(dataset)  # type: ignore[arg-type]
        self.bits = torch.randint(0, 2, (count, n_bits), generator=generator, dtype=torch.uint8)

    @property
    def n_bits(self) -> int:
        return self.bits.shape[1]

    def __len__(self) -> int:
        return self.bits.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image, label = self.dataset[index]
        rgb = image.expand(3, -1, -1) if image.shape[0] == 1 else image  # (3, H, W)
        planes = (self.bits[index] * 255).view(-1, 1, 1)  # (n_bits, 1, 1)
        planes = planes.expand(-1, self.height, self.width)  # (n_bits, H, W)
        return torch.cat([rgb, planes]), label  # (3 + n_bits, H, W), a new tensor


class DigitOverlay(Dataset[tuple[Tensor, int, int]]):
    """``dataset`` with a digit pasted into one cell of a ``grid × grid`` grid (DigitOnImage).

    For example ``i`` a digit of ``digits`` (index ``digit_index[i]``) and a cell
    (``positions[i]``, row-major: row ``positions // grid``, column ``positions % grid``) are
    drawn once from ``torch.Generator`` seeded with ``seed``. The digit is resized (antialiased
    bilinear) to the cell side ``H // grid`` and combined with the image by pixel-wise max in
    every channel; cells start at ``offset = (H − grid · side) // 2`` so the grid is centred.
    ``digits`` holds 1-channel digits (or as many channels as the images); its label is the
    second target.

    Shape:
        item: ``((C, H, W) uint8, label, digit_label)``
    """

    def __init__(
        self, dataset: ImageDataset, digits: ImageDataset, grid: int = 3, seed: int = 0
    ) -> None:
        if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
            raise ValueError(f"grid must be an int >= 1, got {grid!r}")
        C, H, W = _image_shape(dataset)
        if H != W or H < grid:
            raise ValueError(f"images must be square with a side >= grid = {grid}, got {H}x{W}")
        digit_images, digit_labels = images_and_labels(digits)  # (M, Cd, h, w), (M,)
        if digit_images.shape[1] not in (1, C):
            raise ValueError(
                f"digits must have 1 channel or {C} like the images, got {digit_images.shape[1]}"
            )
        self.dataset, self.grid = dataset, grid
        self.side = H // grid
        self.offset = (H - grid * self.side) // 2
        self.digit_images = TF.resize(digit_images, [self.side, self.side], antialias=True)
        self.digit_labels = digit_labels
        generator = torch.Generator().manual_seed(seed)
        count = len(dataset)  # type: ignore[arg-type]
        self.digit_index = torch.randint(len(digit_labels), (count,), generator=generator)
        self.positions = torch.randint(grid * grid, (count,), generator=generator)

    def __len__(self) -> int:
        return self.positions.shape[0]

    def cell(self, index: int) -> tuple[int, int]:
        """Top-left pixel ``(row, column)`` of the cell example ``index`` carries its digit in."""
        row, column = divmod(int(self.positions[index]), self.grid)
        return self.offset + row * self.side, self.offset + column * self.side

    def digit_label(self, index: int) -> int:
        return int(self.digit_labels[self.digit_index[index]])

    def __getitem__(self, index: int) -> tuple[Tensor, int, int]:
        image, label = self.dataset[index]
        out = image.clone()  # (C, H, W), never the wrapped data set's own tensor
        top, left = self.cell(index)
        patch = self.digit_images[self.digit_index[index]]  # (1 or C, side, side)
        region = out[:, top : top + self.side, left : left + self.side]  # a view into out
        region.copy_(torch.maximum(region, patch.expand_as(region)))
        return out, label, self.digit_label(index)


class WrappedData(NamedTuple):
    """:func:`wrap_image_data`'s result: the data and a second target per split, if any."""

    data: ImageData
    train_extra: Tensor | None  # (N_train,) the second target (DigitOverlay's digit label)
    test_extra: Tensor | None  # (N_test,)


def _stack(dataset: Dataset[Any]) -> tuple[Tensor, Tensor, Tensor | None]:
    """Every item stacked: images, labels and the optional second target.

    Shape:
        returns ``(N, C, H, W)`` uint8, ``(N,)`` long, ``(N,)`` long or None
    """
    items = [dataset[i] for i in range(len(dataset))]  # type: ignore[arg-type]
    images = torch.stack([item[0] for item in items])  # (N, C, H, W)
    labels = torch.tensor([int(item[1]) for item in items], dtype=torch.long)  # (N,)
    extra = None
    if items and len(items[0]) > 2:
        extra = torch.tensor([int(item[2]) for item in items], dtype=torch.long)  # (N,)
    return images, labels, extra


def _normalising_stats(images: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """:func:`imagecl.data.channel_stats`, with std 1 for a constant channel (std 0, e.g. a bit
    that every image shares) so that normalising it stays finite.

    Shape:
        images: ``(N, C, H, W)`` uint8; returns two C-tuples
    """
    mean, std = channel_stats(images)
    return mean, tuple(s if s > 1e-6 else 1.0 for s in std)


def wrap_image_data(
    data: ImageData, wrap: Callable[[ImageDataset, int], Dataset[Any]]
) -> WrappedData:
    """``wrap(split, stream)`` applied to every split of ``data``, held in memory.

    ``stream`` is 0 for train, 1 for test, 2 for a separate pretrain split (when ``pretrain`` is
    ``train`` itself, as for the digits, it stays the same wrapped object); derive a seed per
    stream with :func:`split_seed` so the splits get independent draws. Channel statistics are
    recomputed on the wrapped train split (pretrain when there is no train split).
    """
    train_images, train_y, train_extra = _stack(wrap(data.train, 0))
    test_images, test_y, test_extra = _stack(wrap(data.test, 1))
    train = TensorImageDataset(train_images, train_y)
    test = TensorImageDataset(test_images, test_y)
    if data.pretrain is data.train:
        pretrain = train
    else:
        pretrain_images, pretrain_y, _ = _stack(wrap(data.pretrain, 2))
        pretrain = TensorImageDataset(pretrain_images, pretrain_y)
    mean, std = _normalising_stats(train_images if len(train) else pretrain.images)
    wrapped = data._replace(
        train=train,
        test=test,
        pretrain=pretrain,
        channels=train_images.shape[1],
        mean=mean,
        std=std,
    )
    return WrappedData(wrapped, train_extra, test_extra)
