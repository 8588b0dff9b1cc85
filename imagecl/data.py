"""Image data sets as uint8 tensors: one entry point, :func:`load_data`, for every source.

Every source comes back as an :class:`ImageData`: the labelled ``train`` and ``test`` splits, the
``pretrain`` set contrastive pre-training reads, and per-channel statistics for normalising on the
device. An item is ``(image, label)`` with ``image`` a uint8 ``(C, H, W)`` tensor in 0..255 and
``label`` an int (-1 when unlabeled). Loaders only decode and collate (:func:`collate_uint8`);
conversion to float, augmentation and normalisation run batched on the device (per-sample
random parameters, one kernel per batch), so workers ship a quarter of the bytes float32 would take.

Sources (docs/architecture.md, "Offline data"):

- ``digits``: scikit-learn's ``load_digits`` (1797 8×8 grayscale, 10 classes) upsampled to
  ``image_size`` (default 32) bilinearly, 1 channel; no download.
- ``digits-m``: the same digits blended into seeded crops of scikit-image's colour photographs
  (the MNIST-M recipe, :mod:`imagecl.digits_m`), 3 channels; no download.
- ``cifar10``, ``cifar100``, ``stl10``: torchvision's data sets under ``root`` (``download=True``
  fetches them). STL-10's ``pretrain`` is ``train`` + its 100 000 ``unlabeled`` images.
- ``imagefolder``: one sub-folder per class (torchvision ``ImageFolder``), with ``train/`` and
  ``test/`` inside or split here; ``unlabeled``: any folder of images, for pre-training only
  (:mod:`imagecl.image_folders`: eager decoding, unreadable files skipped and reported).

Digits and image folders are split stratified (every class with two or more images appears in
both splits) from ``seed``; mean and std come from the train split (``pretrain`` when there is
no train split) in [0, 1] units.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms.v2.functional as TF
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset, Subset

from imagecl.digits_m import blend_digits
from imagecl.image_folders import DecodedImages, class_folder_files, decode_files, image_files
from shared.runs import RunDir, report_skipped, skipped_line

DATASETS = ("digits", "digits-m", "cifar10", "cifar100", "stl10", "imagefolder", "unlabeled")

ImageDataset = Dataset[tuple[Tensor, int]]

_SPLIT_STREAM = 0x5B  # keeps the split stream apart from the digits-m background stream


class _Request(NamedTuple):
    """The arguments of :func:`load_data`, handed to the source's loader."""

    name: str
    root: str | Path | None
    seed: int
    download: bool
    image_size: int | None
    test_fraction: float


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
    return _LOADERS[name](_Request(name, root, seed, download, image_size, test_fraction))


# --------------------------------------------------------------------------- splits, statistics


def _stratified_split(labels: Tensor, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded per-class split: round(test_fraction·n_c) of each class to test, at least one and
    at most n_c − 1 (a class of one stays in train). Indices come back sorted.

    Shape:
        labels: ``(N,)``; returns train and test indices, together a permutation of ``0..N-1``
    """
    rng = np.random.default_rng([seed, _SPLIT_STREAM])
    y = labels.numpy()
    train, test = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        members = members[rng.permutation(members.size)]
        n_test = min(members.size - 1, max(1, round(test_fraction * members.size)))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return torch.from_numpy(np.sort(np.concatenate(train))), torch.from_numpy(
        np.sort(np.concatenate(test))
    )


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


def _resize(images: Tensor, size: int) -> Tensor:
    """Antialiased bilinear resize of a uint8 batch, in chunks (no-op at the same size).

    Shape:
        images: ``(N, C, H, W)`` uint8; returns ``(N, C, size, size)`` uint8
    """
    if images.shape[-2:] == (size, size):
        return images
    chunks = [
        TF.resize(images[start : start + 1024], [size, size], antialias=True)
        for start in range(0, images.shape[0], 1024)
    ]
    return torch.cat(chunks) if chunks else images.new_empty((0, images.shape[1], size, size))


def _image_data(
    name: str,
    train: TensorImageDataset,
    test: TensorImageDataset,
    pretrain: TensorImageDataset,
    num_classes: int,
    skipped: tuple[tuple[str, str], ...] = (),
) -> ImageData:
    stats_from = train.images if len(train) else pretrain.images
    mean, std = channel_stats(stats_from)
    _, C, H, _ = stats_from.shape
    return ImageData(name, train, test, pretrain, num_classes, C, H, mean, std, skipped)


def _split_data(
    request: _Request,
    images: Tensor,
    labels: Tensor,
    num_classes: int,
    skipped: tuple[tuple[str, str], ...] = (),
) -> ImageData:
    train_index, test_index = _stratified_split(labels, request.test_fraction, request.seed)
    train = TensorImageDataset(images[train_index], labels[train_index])
    test = TensorImageDataset(images[test_index], labels[test_index])
    return _image_data(request.name, train, test, train, num_classes, skipped)


# --------------------------------------------------------------------------- digits


def digit_images(image_size: int = 32) -> tuple[Tensor, Tensor]:
    """scikit-learn's 1797 digits, 0..16 scaled to 0..255 and upsampled bilinearly.

    Shape:
        returns ``(1797, 1, image_size, image_size)`` uint8, ``(1797,)`` long
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = torch.from_numpy(bunch.images).to(torch.float32).unsqueeze(1)  # (N, 1, 8, 8)
    pixels = pixels * (255.0 / 16.0)
    pixels = F.interpolate(
        pixels, size=(image_size, image_size), mode="bilinear", align_corners=False
    )  # (N, 1, S, S)
    images = pixels.round().clamp(0, 255).to(torch.uint8)
    return images, torch.from_numpy(bunch.target).to(torch.long)


def _load_digits(request: _Request) -> ImageData:
    images, labels = digit_images(request.image_size or 32)  # (N, 1, S, S)
    if request.name == "digits-m":
        images = blend_digits(images, seed=request.seed)  # (N, 3, S, S)
    return _split_data(request, images, labels, 10)


# --------------------------------------------------------------------------- torchvision sets


def _need_root(name: str, root: str | Path | None, what: str, url: str) -> Path:
    if root is None:
        raise ValueError(
            f"{name} needs root=, the folder that holds {what} (download=True / --download "
            f"fetches it there, or get {url})"
        )
    return Path(root).expanduser()


def _open_torchvision(name: str, cls: Any, root: Path, download: bool, **kwargs: Any) -> Any:
    """Construct a torchvision data set, turning its missing-file and md5 errors into one line."""
    folder = root / cls.base_folder
    if not download:
        names = [file for file, _ in cls.train_list + cls.test_list]
        names += [cls.meta["filename"]] if hasattr(cls, "meta") else []  # CIFAR's class names
        missing = [file for file in names if not (folder / file).is_file()]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise FileNotFoundError(
                f"{name}: {missing[0]}{more} not found in {folder}; pass download=True "
                f"(--download) or get {cls.url} and extract it into {root}"
            )
    try:
        return cls(str(root), download=True, **kwargs) if download else cls(str(root), **kwargs)
    except RuntimeError as err:
        if "corrupted" not in str(err):
            raise
        raise ValueError(
            f"{name}: files in {folder} failed torchvision's md5 check; delete them and pass "
            f"download=True (--download), or get {cls.url} again"
        ) from err


def _load_cifar(request: _Request) -> ImageData:
    name = request.name
    cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    root = _need_root(name, request.root, cls.base_folder, cls.url)
    size = request.image_size or 32
    # only the first construction downloads; the second finds the files in place
    train_set = _open_torchvision(name, cls, root, request.download, train=True)
    test_set = _open_torchvision(name, cls, root, False, train=False)
    splits = []
    for dataset in (train_set, test_set):
        images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2)  # (N, 3, 32, 32) from NHWC
        images = _resize(images.contiguous(), size)  # (N, 3, S, S)
        splits.append(TensorImageDataset(images, torch.tensor(dataset.targets)))
    return _image_data(name, splits[0], splits[1], splits[0], len(train_set.classes))


def _load_stl10(request: _Request) -> ImageData:
    name, cls = request.name, torchvision.datasets.STL10
    root = _need_root(name, request.root, cls.base_folder, cls.url)
    size = request.image_size or 96
    # "train+unlabeled" holds the 5000 labelled images first, then the 100 000 unlabeled ones
    # (label -1): train is a view of its first rows, so the labelled images are held once.
    # torchvision's array is a transposed view of the file (column-major images), kept as is.
    both = _open_torchvision(name, cls, root, request.download, split="train+unlabeled")
    images = _resize(torch.from_numpy(both.data), size)  # (N, 3, S, S)
    labels = torch.from_numpy(both.labels.astype(np.int64))  # (N,)
    n_train = int((labels >= 0).sum())
    train = TensorImageDataset(images[:n_train], labels[:n_train])
    test_set = _open_torchvision(name, cls, root, False, split="test")
    test_images = _resize(torch.from_numpy(test_set.data).contiguous(), size)  # (N, 3, S, S)
    test = TensorImageDataset(test_images, torch.from_numpy(test_set.labels.astype(np.int64)))
    num_classes = len(getattr(both, "classes", range(10)))  # class_names.txt is optional
    return _image_data(name, train, test, TensorImageDataset(images, labels), num_classes)


# --------------------------------------------------------------------------- image folders


def _existing_folder(name: str, root: str | Path | None) -> Path:
    if root is None:
        raise ValueError(f"{name} needs root=, a folder of images")
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"{name}: folder {folder} does not exist")
    return folder


def _readable(decoded: DecodedImages, folder: Path, count: int) -> DecodedImages:
    if decoded.images.shape[0] == 0:
        raise ValueError(
            f"no readable image in {folder} ({count} image files, {len(decoded.skipped)} skipped)"
        )
    return decoded


def _load_imagefolder(request: _Request) -> ImageData:
    folder = _existing_folder(request.name, request.root)
    size = request.image_size or 32
    train_dir, test_dir = folder / "train", folder / "test"
    if not (train_dir.is_dir() and test_dir.is_dir()):
        files, classes = class_folder_files(folder)
        decoded = _readable(decode_files(files, size), folder, len(files))
        return _split_data(request, decoded.images, decoded.labels, len(classes), decoded.skipped)
    train_files, classes = class_folder_files(train_dir)
    test_files, _ = class_folder_files(test_dir, classes)
    train = _readable(decode_files(train_files, size), train_dir, len(train_files))
    test = _readable(decode_files(test_files, size), test_dir, len(test_files))
    train_set = TensorImageDataset(train.images, train.labels)
    test_set = TensorImageDataset(test.images, test.labels)
    skipped = train.skipped + test.skipped
    return _image_data(request.name, train_set, test_set, train_set, len(classes), skipped)


def _load_unlabeled(request: _Request) -> ImageData:
    folder = _existing_folder(request.name, request.root)
    size = request.image_size or 32
    files = image_files(folder)
    decoded = _readable(decode_files([(path, -1) for path in files], size), folder, len(files))
    empty = TensorImageDataset(
        torch.empty((0, 3, size, size), dtype=torch.uint8), torch.empty(0, dtype=torch.long)
    )
    pretrain = TensorImageDataset(decoded.images, decoded.labels)
    return _image_data(request.name, empty, empty, pretrain, 0, decoded.skipped)


_LOADERS: dict[str, Callable[[_Request], ImageData]] = {
    "digits": _load_digits,
    "digits-m": _load_digits,
    "cifar10": _load_cifar,
    "cifar100": _load_cifar,
    "stl10": _load_stl10,
    "imagefolder": _load_imagefolder,
    "unlabeled": _load_unlabeled,
}
