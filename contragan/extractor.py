"""The feature space of the offline GAN metrics: a small CNN classifier trained on the real data.

FID and KID are defined in the feature space of an ImageNet Inception-v3, whose weights are a
download away. Offline (nothing is downloaded) the features come instead from a classifier
trained here on the real training split; its test accuracy is reported with every figure and must
be high, else distances in its feature space say little
(:func:`contragan.extractor_cache.load_or_train_extractor` refuses).

Input convention, everywhere in :mod:`contragan.metrics` and here: images are float tensors in
[-1, 1] ``(N, C, H, W)``, the range of the generator's tanh; real uint8 images map there with
``x / 127.5 - 1`` (:func:`contragan.data.to_signed_unit`).

Trained extractors are cached per data set by :mod:`contragan.extractor_cache`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contragan.data import ImageData, images_and_labels, to_signed_unit
from shared.runtime import eval_mode
from shared.updaters import check_finite

__all__ = [
    "EXTRACTOR_VERSION",
    "RANGE_TOLERANCE",
    "RECIPE",
    "FeatureExtractor",
    "Recipe",
    "affine_warp",
    "check_images",
    "check_labels",
    "classifier_accuracy",
    "fit_classifier",
    "new_classifier",
    "predict_logits",
    "train_extractor",
]

EXTRACTOR_VERSION = 2  # 1: one conv per stage, shifts only; 2: two convs, affine augmentation
RANGE_TOLERANCE = 1e-5  # float rounding of a tanh output or of x / 127.5 - 1
DEFAULT_EPOCHS = 12  # 32 px: digits ≈ 99 %, digits-m ≈ 97 % test accuracy


@dataclass(frozen=True)
class Recipe:
    """How :func:`fit_classifier` trains (everything but the epochs and the seed).

    The augmentation is a random affine warp per image that keeps the class of a digit: a
    rotation of up to ``max_rotation`` degrees, a scaling by up to ``1 ± max_scale`` and a
    translation of up to ``max_shift`` × the image size in each direction (no flips); the warp
    samples bilinearly and repeats the border. :mod:`contragan.extractor_cache` hashes the
    recipe into its key, so cached extractors trained with another recipe are not reused.
    """

    batch_size: int = 64
    lr: float = 3e-3  # AdamW's peak learning rate of the one-cycle schedule
    weight_decay: float = 5e-4
    warmup: float = 0.2  # share of the steps over which the learning rate rises
    max_rotation: float = 10.0  # degrees
    max_scale: float = 0.1
    max_shift: float = 1 / 16  # of the image size: 2 px at 32

    def __post_init__(self) -> None:
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2, got {self.batch_size}")
        for name in ("lr", "weight_decay", "max_rotation", "max_scale", "max_shift"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.warmup < 1.0:
            raise ValueError(f"warmup must be in (0, 1), got {self.warmup}")
        if self.max_scale >= 1.0:
            raise ValueError(f"max_scale must be < 1, got {self.max_scale}")


RECIPE = Recipe()  # the extractor's and CAS's


class FeatureExtractor(nn.Module):
    """A four-stage CNN classifier whose pooled last stage is the feature space of the metrics.

    Four stages of width ``width``, 2×, 4× and ``feature_dim`` channels: the first one conv
    3×3 → batch norm → ReLU, the other three ``depth`` of them (two by default: on digits-m one
    conv per stage stops near 95 % test accuracy, two reach about 97 %), the first three stages
    followed by a 2×2 max-pool, then global average pooling: ``forward`` returns those
    ``feature_dim`` features and
    :meth:`logits` a linear classifier on top. Works for any channel count and image sizes ≥ 8
    (16, 32, 64, ...). ``num_features`` is the attribute torchmetrics reads instead of probing
    the network with a dummy image, so the module plugs into
    ``FrechetInceptionDistance(feature=extractor)``; call ``.eval()`` first (batch norm) and feed
    it images in [-1, 1] (torchmetrics passes images to a custom feature module unchanged).

    Shape:
        x: ``(N, in_channels, image_size, image_size)`` float in [-1, 1]
        returns ``(N, feature_dim)``; :meth:`logits` returns ``(N, num_classes)``
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        *,
        width: int = 32,
        feature_dim: int = 128,
        depth: int = 2,
    ) -> None:
        super().__init__()
        for name, value, low in [
            ("in_channels", in_channels, 1),
            ("num_classes", num_classes, 2),
            ("image_size", image_size, 8),
            ("width", width, 1),
            ("feature_dim", feature_dim, 1),
            ("depth", depth, 1),
        ]:
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        self.width = width
        self.num_features = feature_dim
        self.depth = depth
        widths = [in_channels, width, 2 * width, 4 * width, feature_dim]
        layers: list[nn.Module] = []
        for stage, (c_in, c_out) in enumerate(itertools.pairwise(widths)):
            for conv in range(1 if stage == 0 else depth):
                layers += [nn.Conv2d(c_out if conv else c_in, c_out, 3, padding=1, bias=False)]
                layers += [nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            if stage < 3:
                layers.append(nn.MaxPool2d(2))
        self.trunk = nn.Sequential(*layers)
        self.classifier = nn.Linear(feature_dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        maps: Tensor = self.trunk(x)  # (N, F, h, w)
        return maps.mean(dim=(2, 3))  # (N, F) global average pool

    def logits(self, x: Tensor) -> Tensor:
        logits: Tensor = self.classifier(self(x))  # (N, C)
        return logits

    def settings(self) -> dict[str, int]:
        """The constructor arguments, enough to rebuild the module before loading weights."""
        return {
            "in_channels": self.in_channels,
            "num_classes": self.num_classes,
            "image_size": self.image_size,
            "width": self.width,
            "feature_dim": self.num_features,
            "depth": self.depth,
        }


def check_images(images: Tensor, like: FeatureExtractor, name: str = "images") -> Tensor:
    """``images`` as float32 in [-1, 1] with ``like``'s channels and size, or a ValueError.

    uint8 images are mapped with :func:`to_signed_unit`; floats must already lie in [-1, 1]
    (up to rounding). Floats in [0, 1] pass unnoticed: they are the caller's responsibility.

    Shape:
        images: ``(N, C, S, S)``; returns the same shape, float32
    """
    C, S = like.in_channels, like.image_size
    if images.dim() != 4 or images.shape[1:] != (C, S, S):
        raise ValueError(f"{name} must be (N, {C}, {S}, {S}), got shape {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        return to_signed_unit(images)
    if not images.is_floating_point():
        raise ValueError(f"{name} must be float in [-1, 1] or uint8, got {images.dtype}")
    if images.numel() and not bool(torch.isfinite(images).all()):
        raise ValueError(f"{name} has NaN or infinite values")
    if images.numel() and float(images.abs().max()) > 1.0 + RANGE_TOLERANCE:
        raise ValueError(
            f"{name} must lie in [-1, 1] (the generator's tanh range), got values in "
            f"[{float(images.min()):.4g}, {float(images.max()):.4g}]; map uint8 images with "
            "x / 127.5 - 1 (or pass them as uint8)"
        )
    return images.to(torch.float32)


def check_labels(labels: Tensor, count: int, num_classes: int, name: str = "labels") -> Tensor:
    """``labels`` as long on the CPU after checking shape ``(count,)``, dtype and range."""
    if labels.dim() != 1 or labels.shape[0] != count:
        raise ValueError(f"{name} must be ({count},), got shape {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"{name} must be integers, got {labels.dtype}")
    labels = labels.to("cpu", torch.long)
    if count and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"{name} must be in [0, {num_classes}), got values in "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    return labels


def affine_warp(images: Tensor, angle: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    """Rotate, scale and translate each image about its centre (bilinear, border repeated).

    Image ``n`` is rotated by ``angle[n]`` radians (counter-clockwise as displayed, rows
    downwards), magnified by ``scale[n]`` and moved by ``shift[n] = (dx, dy)`` pixels (right,
    down). Pixel centres map onto pixel centres for quarter turns and integer shifts, so those
    are exact (``torch.rot90``, a replicate-padded translation).

    Shape:
        images: ``(N, C, H, W)`` float; angle, scale: ``(N,)``; shift: ``(N, 2)``;
        returns ``(N, C, H, W)``
    """
    N, _, H, W = images.shape
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale  # (N,), (N,)
    # output → input sampling positions in [-1, 1] coordinates (x right, y down); one pixel
    # is 2 / W wide
    to_x, to_y = -2.0 * shift[:, 0] / W, -2.0 * shift[:, 1] / H  # (N,), (N,)
    theta = torch.stack(
        [torch.stack([cos, -sin, to_x], dim=1), torch.stack([sin, cos, to_y], dim=1)], dim=1
    )  # (N, 2, 3)
    grid = F.affine_grid(theta.to(images.dtype), [N, 1, H, W], align_corners=False)
    return F.grid_sample(
        images, grid, mode="bilinear", padding_mode="border", align_corners=False
    )  # (N, C, H, W)


def _random_affine(images: Tensor, recipe: Recipe, generator: torch.Generator) -> Tensor:
    """:func:`affine_warp` with each image's rotation, scale and shift drawn uniformly within
    ``recipe``'s bounds from ``generator``; the images themselves when every bound is 0.

    Shape:
        images: ``(N, C, H, W)``; returns the same shape
    """
    if recipe.max_rotation == 0 and recipe.max_scale == 0 and recipe.max_shift == 0:
        return images
    N, _, H, W = images.shape
    draws = torch.rand(4, N, generator=generator, dtype=torch.float64) * 2 - 1  # (4, N)
    angle = draws[0] * math.radians(recipe.max_rotation)  # (N,)
    scale = 1 + draws[1] * recipe.max_scale  # (N,)
    shift = draws[2:].T * (recipe.max_shift * torch.tensor([W, H], dtype=torch.float64))
    device = images.device
    return affine_warp(images, angle.to(device), scale.to(device), shift.to(device))


def fit_classifier(
    model: FeatureExtractor,
    images: Tensor,
    labels: Tensor,
    *,
    epochs: int,
    seed: int,
    recipe: Recipe = RECIPE,
) -> FeatureExtractor:
    """Train ``model``'s classifier with cross-entropy (AdamW, one-cycle schedule), in place.

    Used for the extractor (real train split) and for CAS (generated samples), with the
    augmentation of :class:`Recipe`. Batch order and warps come from a generator seeded with
    ``seed``. The model trains on the device its parameters are on and is returned in eval mode.

    Shape:
        images: ``(N, C, H, W)`` float in [-1, 1]; labels: ``(N,)`` long in [0, num_classes)
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    N = images.shape[0]
    if N < 2:
        raise ValueError(f"need at least 2 images to train a classifier, got {N}")
    device = next(model.parameters()).device
    images, labels = images.to(device), labels.to(device)
    generator = torch.Generator().manual_seed(seed)
    batch_size = recipe.batch_size
    steps_per_epoch = -(-N // batch_size)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay
    )
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=recipe.lr,
        total_steps=epochs * steps_per_epoch,
        pct_start=recipe.warmup,
    )
    model.train()
    step = 0
    for _ in range(epochs):
        order = torch.randperm(N, generator=generator).to(device)
        for start in range(0, N, batch_size):
            index = order[start : start + batch_size]
            if index.numel() < 2:  # a batch of one breaks batch norm; skip the remainder
                continue
            batch = _random_affine(images[index], recipe, generator)  # (B, C, H, W)
            loss = F.cross_entropy(model.logits(batch), labels[index])
            step += 1
            check_finite(loss, "classifier loss", step)
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            optimizer.step()
            schedule.step()
    return model.eval()


@torch.no_grad()
def predict_logits(model: FeatureExtractor, images: Tensor, *, batch_size: int = 512) -> Tensor:
    """Class logits of ``images`` in eval mode, batched, on the model's device.

    Shape:
        images: ``(N, C, H, W)`` float in [-1, 1]; returns ``(N, num_classes)``
    """
    device = next(model.parameters()).device
    with eval_mode(model):
        chunks = [
            model.logits(images[start : start + batch_size].to(device))
            for start in range(0, images.shape[0], batch_size)
        ]
    return torch.cat(chunks)  # (N, C)


def classifier_accuracy(model: FeatureExtractor, images: Tensor, labels: Tensor) -> float:
    """Share of ``images`` whose arg-max class is their label, in [0, 1].

    Shape:
        images: ``(N, C, H, W)`` float in [-1, 1], N ≥ 1; labels: ``(N,)``
    """
    predictions = predict_logits(model, images).argmax(dim=1).cpu()  # (N,)
    return float((predictions == labels.cpu()).to(torch.float64).mean())


def new_classifier(like: ImageData | FeatureExtractor, *, seed: int) -> FeatureExtractor:
    """A freshly initialised extractor (weights a function of ``seed``) for ``like``'s images."""
    if isinstance(like, FeatureExtractor):
        settings = like.settings()
    else:
        if like.num_classes < 2:
            raise ValueError(f"{like.name} has {like.num_classes} classes; the extractor needs 2+")
        settings = {
            "in_channels": like.channels,
            "num_classes": like.num_classes,
            "image_size": like.image_size,
        }
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's stream
        torch.manual_seed(seed)
        return FeatureExtractor(**settings)


def train_extractor(
    data: ImageData,
    *,
    seed: int = 0,
    epochs: int = DEFAULT_EPOCHS,
    device: torch.device | str = "cpu",
) -> tuple[FeatureExtractor, float]:
    """Train the extractor on ``data.train`` and measure its accuracy on ``data.test``.

    Returns the extractor (eval mode, parameters frozen, on ``device``) and its test accuracy
    in [0, 1]. Reproducible for a given ``seed`` on one machine with one thread count.
    """
    train_images, train_labels = images_and_labels(data.train)
    test_images, test_labels = images_and_labels(data.test)
    if len(train_labels) < 2 or len(test_labels) < 1:
        raise ValueError(f"{data.name} needs labelled train and test splits to train an extractor")
    model = new_classifier(data, seed=seed).to(device)
    fit_classifier(model, to_signed_unit(train_images), train_labels, epochs=epochs, seed=seed)
    model.requires_grad_(False)
    return model, classifier_accuracy(model, to_signed_unit(test_images), test_labels)
