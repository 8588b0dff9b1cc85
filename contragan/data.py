"""contragan's image data: the data sets it trains on and their pixel range.

The images are imagecl's (:mod:`imagecl.data`: digits, digits-m, CIFAR-10/100 and image
folders, held as uint8 with their skipped files); this module is the one place contragan reads
them from. The GAN works in the generator's tanh range, [-1, 1] (:func:`to_signed_unit`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from imagecl.data import (
    ImageData,
    blend_digits,
    collate_uint8,
    images_and_labels,
    load_data,
    report_skipped_images,
    skipped_summary,
)

__all__ = [
    "DIGITS_DATA",
    "GanData",
    "ImageData",
    "blend_digits",
    "collate_uint8",
    "images_and_labels",
    "load_data",
    "report_skipped_images",
    "skipped_summary",
    "to_signed_unit",
]

GanData = Literal["digits", "digits-m", "cifar10", "cifar100", "imagefolder"]
DIGITS_DATA = ("digits", "digits-m")  # --arch auto trains the small digits networks on these


def to_signed_unit(images: Tensor) -> Tensor:
    """Map uint8 images in 0..255 to float32 in [-1, 1]: ``x / 127.5 - 1``.

    Shape:
        images: ``(N, C, H, W)`` uint8; returns the same shape, float32
    """
    if images.dtype != torch.uint8:
        raise ValueError(f"to_signed_unit expects uint8 images, got {images.dtype}")
    return images.to(torch.float32) / 127.5 - 1.0
