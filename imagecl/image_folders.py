"""Folders of image files decoded eagerly into uint8 tensors, skipping what cannot be read.

Two layouts: torchvision's ``ImageFolder`` (one sub-folder per class, class index = position of
the folder name in sorted order) and a plain folder searched recursively (no labels). Files are
chosen by extension (``torchvision.datasets.folder.IMG_EXTENSIONS``, case-insensitive); each is
decoded with PIL, converted to RGB (16-bit greyscale scaled to 8 bits; CMYK, palette, grey and
alpha modes through PIL's conversion), centre-cropped to a square and resized (bicubic). A file that
PIL cannot open or decode completely (not an image, truncated, corrupt) is skipped and reported
with the reason; one bad file never stops a run.

Decoding is eager: the whole folder lives in memory as ``(N, 3, S, S)`` uint8, which is
3·S² bytes per image (3 KiB at 32×32, 147 KiB at 224×224). That suits the small sets this
toolkit tests and studies on; for a large folder, decode it once on a machine with the memory
(or a GPU box) and keep the tensors, rather than decoding here on every start.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

# What PIL raises for a file that is not an image, is truncated or corrupt: UnidentifiedImageError
# and "image file is truncated" are OSErrors; broken PNG chunks raise SyntaxError; short GIFs
# EOFError; bad headers ValueError or struct.error; huge images DecompressionBombError.
DECODE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    SyntaxError,
    EOFError,
    ValueError,
    struct.error,
    Image.DecompressionBombError,
)


class DecodedImages(NamedTuple):
    """Images that decoded, their labels, and the files that did not."""

    images: Tensor  # (N, 3, S, S) uint8
    labels: Tensor  # (N,) long; -1 for unlabeled folders
    skipped: tuple[tuple[str, str], ...]  # (file, reason)


def decode_image(path: str | Path, size: int) -> Tensor:
    """Decode one file to RGB, centre-crop it to a square and resize it to ``size``.

    Raises one of :data:`DECODE_ERRORS` when the file cannot be read completely.

    Shape:
        returns ``(3, size, size)`` uint8
    """
    with Image.open(path) as image:
        image.load()  # decode now: a truncated file raises here, not at first use
        if image.mode == "P" and "transparency" in image.info:
            # PIL warns when palette transparency goes straight to RGB
            rgb = image.convert("RGBA").convert("RGB")
        elif image.mode.startswith("I;16") or image.mode == "I":
            # 16-bit greyscale (PNG, TIFF): PIL's convert clips every value above 255 to white;
            # scale 0..65535 to 0..255 instead
            wide = np.asarray(image).astype(np.int64)
            rgb = Image.fromarray((wide.clip(0, 65535) // 257).astype(np.uint8)).convert("RGB")
        else:
            rgb = image.convert("RGB")
    fitted = ImageOps.fit(rgb, (size, size), method=Image.Resampling.BICUBIC)
    array = np.asarray(fitted)  # (S, S, 3)
    return torch.from_numpy(array.copy()).permute(2, 0, 1)  # (3, S, S)


def decode_files(files: Sequence[tuple[str | Path, int]], size: int) -> DecodedImages:
    """Decode ``(path, label)`` pairs in order; unreadable files are skipped and reported.

    Shape:
        returns images ``(N, 3, size, size)`` uint8 and labels ``(N,)`` long, N ≤ len(files)
    """
    images = torch.empty((len(files), 3, size, size), dtype=torch.uint8)  # (N, 3, S, S)
    labels = torch.empty(len(files), dtype=torch.long)
    skipped: list[tuple[str, str]] = []
    count = 0
    for path, label in files:
        try:
            images[count] = decode_image(path, size)
        except DECODE_ERRORS as err:
            skipped.append((str(path), f"{type(err).__name__}: {err}"))
            continue
        labels[count] = label
        count += 1
    return DecodedImages(images[:count].clone(), labels[:count].clone(), tuple(skipped))


def class_folder_files(
    folder: Path, classes: Sequence[str] | None = None
) -> tuple[list[tuple[str, int]], list[str]]:
    """Image files of an ``ImageFolder`` layout with their class indices, sorted.

    ``classes`` fixes the class order (a test folder takes the train folder's classes); a class
    folder outside it is an error, a missing one is fine.
    """
    found, _ = find_classes(folder)  # FileNotFoundError when there is no class folder
    if classes is None:
        classes = found
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise ValueError(f"class folders {unknown} in {folder} are not among the classes {classes}")
    class_to_idx = {name: index for index, name in enumerate(classes)}
    present = {name: class_to_idx[name] for name in found}
    files = make_dataset(folder, present, extensions=IMG_EXTENSIONS, allow_empty=True)
    return files, list(classes)


def image_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` (recursively) with an image extension, sorted."""
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file() and path.name.lower().endswith(IMG_EXTENSIONS)
    )
