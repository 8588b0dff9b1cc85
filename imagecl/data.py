"""Image data sets as uint8 tensors: one entry point, :func:`load_data`, for every source.

Every source comes back as an :class:`ImageData`: the labelled ``train`` and ``test`` splits, the
``pretrain`` set contrastive pre-training reads, and per-channel statistics for normalising on the
device. An item is ``(image, label)`` with ``image`` a uint8 ``(C, H, W)`` tensor in 0..255 and
``label`` an int (-1 when unlabeled). Loaders only decode and collate (:func:`collate_uint8`);
conversion to float, augmentation and normalisation run batched on the device (per-sample
random parameters, one kernel per batch), so workers ship a quarter of the bytes float32 would take.

The sources (:data:`DATASETS`: digits, digits-m, CIFAR-10/100, STL-10, image folders) and how
each is read and split are in :mod:`imagecl.sources`. Mean and std come from the train split
(``pretrain`` when there is no train split) in [0, 1] units. Also here: the helpers other
modules use on these data sets (:func:`images_and_labels`, :func:`stratified_subset`,
:func:`channel_stats`, the report of skipped files).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset, Subset

from imagecl.digits_m import blend_digits as blend_digits  # re-exported: re-blending digits-m
from imagecl.sources import SOURCES, SourceImages, SourceRequest, load_source
from shared.runs import RunDir
from shared.skipped import report_skipped, skipped_line

# every source's name, in the order of --data's choices
DATASETS: tuple[str, ...] = tuple(SOURCES)

ImageDataset = Dataset[tuple[Tensor, int]]


class TensorImageDataset(ImageDataset):
    """Images and labels held in memory; item ``i`` is ``(images[i], int(labels[i]))``.

    The tensors are stored, not copied (``images_and_labels`` hands them back as they are).

    Shape:
        images: ``(N, C, H, W)`` uint8
        labels: ``(N,)`` integer (stored as long)
    """

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(
                f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(
                f"labels must be ({images.shape[0]},) to match images, got {tuple(labels.shape)}"
            )
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise ValueError(f"labels must be integers, got {labels.dtype}")
        self.images = images
        self.labels = labels.to(torch.long)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])


class ImageData(NamedTuple):
    """A loaded source: splits of ``(image uint8 (C, H, W), label int)`` items and statistics.

    Every split is held in memory as a :class:`TensorImageDataset` (a ``Dataset`` with ``len``).
    """

    name: str
    train: TensorImageDataset  # labelled training split
    test: TensorImageDataset  # labelled test split
    pretrain: TensorImageDataset  # train, or train + unlabeled images (label -1)
    num_classes: int  # 0 for unlabeled-only data
    channels: int
    image_size: int  # H == W
    mean: tuple[float, ...]  # per channel, [0, 1] units
    std: tuple[float, ...]
    skipped: tuple[tuple[str, str], ...]  # (file, reason) of unreadable images


def collate_uint8(batch: Sequence[tuple[Tensor, int]]) -> tuple[Tensor, Tensor]:
    """Stack ``(image, label)`` items into a uint8 image batch and a long label vector.

    Shape:
        batch: N items of ``((C, H, W) uint8, int)``
        returns ``(N, C, H, W)`` uint8, ``(N,)`` long
    """
    if len(batch) == 0:
        raise ValueError("collate_uint8 got an empty batch")
    images = torch.stack([image for image, _ in batch])  # (N, C, H, W)
    if images.dtype != torch.uint8:
        raise ValueError(f"collate_uint8 expects uint8 images, got {images.dtype}")
    labels = torch.tensor([int(label) for _, label in batch], dtype=torch.long)  # (N,)
    return images, labels


def images_and_labels(dataset: ImageDataset) -> tuple[Tensor, Tensor]:
    """Every item of ``dataset`` stacked, for probes and metrics that want whole tensors.

    A :class:`TensorImageDataset` returns its own tensors (no copy, do not modify them);
    ``Subset`` and ``ConcatDataset`` of those are indexed and concatenated without a Python loop
    over items; any other dataset is iterated.

    Shape:
        returns ``(N, C, H, W)`` uint8, ``(N,)`` long
    """
    if isinstance(dataset, TensorImageDataset):
        return dataset.images, dataset.labels
    if isinstance(dataset, Subset) and isinstance(dataset.dataset, TensorImageDataset):
        index = torch.as_tensor(list(dataset.indices), dtype=torch.long)
        return dataset.dataset.images[index], dataset.dataset.labels[index]
    if isinstance(dataset, ConcatDataset) and len(dataset.datasets) > 0:
        parts = [images_and_labels(part) for part in dataset.datasets]
        images = torch.cat([images for images, _ in parts])  # (N, C, H, W)
        return images, torch.cat([labels for _, labels in parts])
    items = [dataset[i] for i in range(len(dataset))]  # type: ignore[arg-type]
    if not items:
        raise ValueError(f"images_and_labels cannot infer the image shape of an empty {dataset!r}")
    return collate_uint8(items)


def skipped_summary(data: ImageData, listing: str | Path = "skipped.csv") -> str | None:
    """One line on the image files that could not be read, or ``None`` when every file was.

    E.g. ``"skipped 3 of 43 image files (UnidentifiedImageError: 2, OSError: 1); the list is
    in RUN/skipped.csv"``; ``listing`` is where the list lies.
    """
    if not data.skipped:
        return None
    reasons = [reason for _, reason in data.skipped]
    return skipped_line(reasons, total=_files_seen(data), noun="image files", listing=listing)


def report_skipped_images(data: ImageData, run_dir: RunDir | str | Path) -> str | None:
    """Write ``skipped.csv`` (columns ``file, reason``) of the unreadable image files into the
    run folder and print :func:`skipped_summary` when there are any; returns that line."""
    return report_skipped(run_dir, data.skipped, total=_files_seen(data), noun="image files")


def _files_seen(data: ImageData) -> int:
    """Every image the source offered: read (``pretrain`` holds ``train``) and skipped."""
    return len(data.pretrain) + len(data.test) + len(data.skipped)


def load_data(
    name: str,
    *,
    root: str | Path | None = None,
    seed: int = 0,
    download: bool = False,
    image_size: int | None = None,
    test_fraction: float = 0.25,
) -> ImageData:
    """Load the source ``name`` (one of :data:`DATASETS`) as uint8 image tensors.

    ``root`` is needed by every source but the digits; ``seed`` fixes the digits and image
    folder splits and the digits-m backgrounds; ``download`` lets torchvision fetch CIFAR and
    STL-10; ``image_size`` overrides the native size (digits 32, CIFAR 32, STL-10 96, folders 32);
    ``test_fraction`` is the share of each class held out where the source has no test split.

    Shape:
        items of every split: ``((C, image_size, image_size) uint8, int)``
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    request = SourceRequest(name, root, seed, download, image_size, test_fraction)
    return _image_data(name, load_source(request))


# --------------------------------------------------------------------------- subsets, statistics


def stratified_subset(labels: Tensor, max_count: int, *, seed: int) -> Tensor:
    """Indices of at most ``max_count`` items, every class in proportion to its size.

    Within each class the items are shuffled from ``seed``; the i-th of a class of ``n_c`` gets
    the key ``i / n_c`` and the ``max_count`` smallest keys are kept (ties in class order).
    With ``M = max_count`` and ``C`` classes, class ``c`` keeps between ``(M - C)·n_c / N`` and
    ``M·n_c / N + 1`` items, and every class keeps at least one when ``M >= C``. A split
    ordered by class (image folders) thus keeps all its classes, where its first ``M`` items
    would hold the first classes only. With ``N <= M`` every index is kept.

    Shape:
        labels: ``(N,)`` integer; returns ``(min(N, max_count),)`` sorted long indices
    """
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count}")
    N = labels.shape[0]
    if N <= max_count:
        return torch.arange(N)
    generator = torch.Generator().manual_seed(seed)
    shuffled = torch.randperm(N, generator=generator)  # (N,)
    grouped = shuffled[torch.sort(labels[shuffled], stable=True).indices]  # (N,) by class
    _, counts = torch.unique_consecutive(labels[grouped], return_counts=True)  # (C,)
    sizes = counts.repeat_interleave(counts)  # (N,) size of each item's class
    starts = (counts.cumsum(0) - counts).repeat_interleave(counts)  # (N,)
    key = (torch.arange(N) - starts).double() / sizes  # (N,) in [0, 1)
    keep = torch.sort(key, stable=True).indices[:max_count]  # (max_count,)
    return grouped[keep].sort().values


def channel_stats(images: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std in [0, 1] units, exact, from pixel histograms.

    Shape:
        images: ``(N, C, H, W)`` uint8 with N ≥ 1; returns two C-tuples
    """
    N, C = images.shape[:2]
    if N == 0:
        raise ValueError("cannot compute mean/std of zero images")
    counts = torch.zeros(C, 256, dtype=torch.float64)  # (C, 256)
    step = max(1, 2**24 // images[0].numel())  # about 16 MiB of pixels per chunk
    for start in range(0, N, step):
        chunk = images[start : start + step]
        for c in range(C):
            counts[c] += torch.bincount(chunk[:, c].reshape(-1), minlength=256).to(torch.float64)
    values = torch.arange(256, dtype=torch.float64) / 255.0  # (256,)
    total = counts.sum(dim=1)  # (C,)
    mean = (counts * values).sum(dim=1) / total  # (C,)
    variance = (counts * values**2).sum(dim=1) / total - mean**2  # (C,)
    std = variance.clamp(min=0.0).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


def _image_data(name: str, source: SourceImages) -> ImageData:
    """Wrap a source's splits into data sets; mean and std come from the train split
    (``pretrain`` when there is no train split)."""
    train = TensorImageDataset(*source.train)
    test = TensorImageDataset(*source.test)
    pretrain = train if source.pretrain is None else TensorImageDataset(*source.pretrain)
    stats_from = train.images if len(train) else pretrain.images
    mean, std = channel_stats(stats_from)
    _, C, H, _ = stats_from.shape
    return ImageData(
        name, train, test, pretrain, source.num_classes, C, H, mean, std, source.skipped
    )
