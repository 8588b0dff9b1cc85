"""Where every image source's pixels come from: uint8 tensors of each split, per source.

Each loader turns one source into :class:`SourceImages`: the ``train`` and ``test`` splits as
uint8 ``(N, C, S, S)`` images and ``(N,)`` long labels (-1 when unlabeled), the ``pretrain``
split where it differs from ``train``, the number of classes and the files that could not be
read. :func:`imagecl.data.load_data` checks its arguments, calls :func:`load_source` and wraps
the splits into data sets; nothing here knows about data sets.

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
both splits) from ``seed`` (:func:`stratified_split`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms.v2.functional as TF
from torch import Tensor

from imagecl.digits_m import blend_digits
from imagecl.image_folders import DecodedImages, class_folder_files, decode_files, image_files

__all__ = [
    "SOURCES",
    "SourceImages",
    "SourceRequest",
    "Split",
    "digit_images",
    "load_source",
    "resize_images",
    "stratified_split",
]

SPLIT_STREAM = 0x5B  # keeps the split stream apart from the digits-m background stream


class SourceRequest(NamedTuple):
    """The arguments of :func:`imagecl.data.load_data`, handed to the source's loader."""

    name: str
    root: str | Path | None
    seed: int
    download: bool
    image_size: int | None
    test_fraction: float


class Split(NamedTuple):
    """One split of a source, held in memory."""

    images: Tensor  # (N, C, S, S) uint8
    labels: Tensor  # (N,) integer, -1 for unlabeled images


class SourceImages(NamedTuple):
    """What a source's loader returns: its splits, its classes and its unreadable files."""

    train: Split  # labelled training split
    test: Split  # labelled test split
    pretrain: Split | None  # what contrastive pre-training reads; None: the train split itself
    num_classes: int  # 0 for unlabeled-only data
    skipped: tuple[tuple[str, str], ...] = ()  # (file, reason) of unreadable images


def load_source(request: SourceRequest) -> SourceImages:
    """The splits of ``request.name`` (a key of :data:`SOURCES`), arguments already checked."""
    return SOURCES[request.name](request)


# --------------------------------------------------------------------------- splits, resizing


def stratified_split(labels: Tensor, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded per-class split: round(test_fraction·n_c) of each class to test, at least one and
    at most n_c − 1 (a class of one stays in train). Indices come back sorted.

    Shape:
        labels: ``(N,)``; returns train and test indices, together a permutation of ``0..N-1``
    """
    rng = np.random.default_rng([seed, SPLIT_STREAM])
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


def resize_images(images: Tensor, size: int) -> Tensor:
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


def _split(request: SourceRequest, images: Tensor, labels: Tensor) -> tuple[Split, Split]:
    train_index, test_index = stratified_split(labels, request.test_fraction, request.seed)
    return (
        Split(images[train_index], labels[train_index]),
        Split(images[test_index], labels[test_index]),
    )


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


def _load_digits(request: SourceRequest) -> SourceImages:
    images, labels = digit_images(request.image_size or 32)  # (N, 1, S, S)
    if request.name == "digits-m":
        images = blend_digits(images, seed=request.seed)  # (N, 3, S, S)
    return SourceImages(*_split(request, images, labels), pretrain=None, num_classes=10)


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


def _load_cifar(request: SourceRequest) -> SourceImages:
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
        images = resize_images(images.contiguous(), size)  # (N, 3, S, S)
        splits.append(Split(images, torch.tensor(dataset.targets)))
    return SourceImages(splits[0], splits[1], pretrain=None, num_classes=len(train_set.classes))


def _load_stl10(request: SourceRequest) -> SourceImages:
    name, cls = request.name, torchvision.datasets.STL10
    root = _need_root(name, request.root, cls.base_folder, cls.url)
    size = request.image_size or 96
    # "train+unlabeled" holds the 5000 labelled images first, then the 100 000 unlabeled ones
    # (label -1): train is a view of its first rows, so the labelled images are held once.
    # torchvision's array is a transposed view of the file (column-major images), kept as is.
    both = _open_torchvision(name, cls, root, request.download, split="train+unlabeled")
    images = resize_images(torch.from_numpy(both.data), size)  # (N, 3, S, S)
    labels = torch.from_numpy(both.labels.astype(np.int64))  # (N,)
    n_train = int((labels >= 0).sum())
    train = Split(images[:n_train], labels[:n_train])
    test_set = _open_torchvision(name, cls, root, False, split="test")
    test_images = resize_images(torch.from_numpy(test_set.data).contiguous(), size)
    test = Split(test_images, torch.from_numpy(test_set.labels.astype(np.int64)))
    num_classes = len(getattr(both, "classes", range(10)))  # class_names.txt is optional
    return SourceImages(train, test, Split(images, labels), num_classes)


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


def _load_imagefolder(request: SourceRequest) -> SourceImages:
    folder = _existing_folder(request.name, request.root)
    size = request.image_size or 32
    train_dir, test_dir = folder / "train", folder / "test"
    if not (train_dir.is_dir() and test_dir.is_dir()):
        files, classes = class_folder_files(folder)
        decoded = _readable(decode_files(files, size), folder, len(files))
        train, test = _split(request, decoded.images, decoded.labels)
        return SourceImages(train, test, None, len(classes), decoded.skipped)
    train_files, classes = class_folder_files(train_dir)
    test_files, _ = class_folder_files(test_dir, classes)
    train_decoded = _readable(decode_files(train_files, size), train_dir, len(train_files))
    test_decoded = _readable(decode_files(test_files, size), test_dir, len(test_files))
    return SourceImages(
        Split(train_decoded.images, train_decoded.labels),
        Split(test_decoded.images, test_decoded.labels),
        pretrain=None,
        num_classes=len(classes),
        skipped=train_decoded.skipped + test_decoded.skipped,
    )


def _load_unlabeled(request: SourceRequest) -> SourceImages:
    folder = _existing_folder(request.name, request.root)
    size = request.image_size or 32
    files = image_files(folder)
    decoded = _readable(decode_files([(path, -1) for path in files], size), folder, len(files))
    empty = Split(
        torch.empty((0, 3, size, size), dtype=torch.uint8), torch.empty(0, dtype=torch.long)
    )
    pretrain = Split(decoded.images, decoded.labels)
    return SourceImages(empty, empty, pretrain, 0, decoded.skipped)


SOURCES: dict[str, Callable[[SourceRequest], SourceImages]] = {
    "digits": _load_digits,
    "digits-m": _load_digits,
    "cifar10": _load_cifar,
    "cifar100": _load_cifar,
    "stl10": _load_stl10,
    "imagefolder": _load_imagefolder,
    "unlabeled": _load_unlabeled,
}
