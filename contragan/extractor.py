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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contragan.data import ImageData, blend_digits, images_and_labels, load_data, to_signed_unit
from shared.runtime import eval_mode
from shared.updaters import check_finite

__all__ = [
    "EXTRACTOR_VERSION",
    "RANGE_TOLERANCE",
    "ExtractorRecipe",
    "FeatureExtractor",
    "check_images",
    "check_labels",
    "classifier_accuracy",
    "fit_classifier",
    "fresh_backgrounds",
    "new_classifier",
    "predict_logits",
    "recipe_for",
    "train_extractor",
]

EXTRACTOR_VERSION = 3  # 3: digits-m trains on its digits over fresh backgrounds too
RANGE_TOLERANCE = 1e-5  # float rounding of a tanh output or of x / 127.5 - 1


@dataclass(frozen=True)
class ExtractorRecipe:
    """How the extractor of one data set is built and trained (:func:`train_extractor`)."""

    epochs: int = 12
    width: int = 32  # base channels of :class:`FeatureExtractor`
    label_smoothing: float = 0.0
    # digits-m only: extra copies of the training split, each its same digits blended over new
    # background crops (the data's own recipe, :func:`fresh_backgrounds`)
    reblends: int = 0


# Test accuracy. digits, the default recipe: about 99 % at 32 px. digits-m (1347 training images
# on photographs) is harder: on the splits of seeds 0-6 at 16 px, 60 epochs at width 48 with label
# smoothing 0.1 reach 96.0-97.6 % (four of seven splits below 97 %; wider nets and longer
# training move it by a few test images). Four more copies of the training digits over fresh
# background crops, 15 epochs of the five copies (about as many steps as 75 epochs of one),
# reach 98 % and more on every one of those splits (docs/measurements.md).
RECIPES: dict[str, ExtractorRecipe] = {
    "digits-m": ExtractorRecipe(epochs=15, width=48, label_smoothing=0.1, reblends=4),
}


def recipe_for(data_name: str) -> ExtractorRecipe:
    """The recipe of ``data_name`` (:data:`RECIPES`), the default :class:`ExtractorRecipe` else."""
    return RECIPES.get(data_name, ExtractorRecipe())


class FeatureExtractor(nn.Module):
    """A four-stage CNN classifier whose pooled last stage is the feature space of the metrics.

    Stages of conv 3×3 → batch norm → ReLU, the first three followed by a 2×2 max-pool, then
    global average pooling: ``forward`` returns those ``feature_dim`` features and
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
    ) -> None:
        super().__init__()
        for name, value, low in [
            ("in_channels", in_channels, 1),
            ("num_classes", num_classes, 2),
            ("image_size", image_size, 8),
            ("width", width, 1),
            ("feature_dim", feature_dim, 1),
        ]:
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        self.width = width
        self.num_features = feature_dim
        widths = [in_channels, width, 2 * width, 4 * width, feature_dim]
        layers: list[nn.Module] = []
        for stage, (c_in, c_out) in enumerate(itertools.pairwise(widths)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out)]
            layers += [nn.ReLU(inplace=True)]
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


def _random_shift(images: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Translate each image by its own integer offset in [-max_shift, max_shift]², edge-padded.

    The light augmentation of the extractor and of CAS: digits stay digits (no flips).

    Shape:
        images: ``(N, C, H, W)``; returns the same shape
    """
    if max_shift == 0:
        return images
    N, _, H, W = images.shape
    padded = F.pad(images, (max_shift,) * 4, mode="replicate")  # (N, C, H+2s, W+2s)
    offsets = torch.randint(0, 2 * max_shift + 1, (2, N), generator=generator)
    offsets = offsets.to(images.device)
    rows = offsets[0, :, None] + torch.arange(H, device=images.device)  # (N, H)
    cols = offsets[1, :, None] + torch.arange(W, device=images.device)  # (N, W)
    batch = torch.arange(N, device=images.device)[:, None, None]  # (N, 1, 1)
    shifted = padded[batch, :, rows[:, :, None], cols[:, None, :]]  # (N, H, W, C)
    return shifted.permute(0, 3, 1, 2)  # (N, C, H, W)


def fit_classifier(
    model: FeatureExtractor,
    images: Tensor,
    labels: Tensor,
    *,
    epochs: int,
    seed: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 5e-4,
    max_shift: int | None = None,
    label_smoothing: float = 0.0,
) -> FeatureExtractor:
    """Train ``model``'s classifier with cross-entropy (AdamW, one-cycle schedule), in place.

    Used for the extractor (real train split) and for CAS (generated samples). The light
    augmentation is a random translation of up to ``max_shift`` pixels (default image size / 16,
    2 px at 32); ``label_smoothing`` is cross-entropy's. Batch order and shifts come from a
    generator seeded with ``seed``. The model trains on the device its parameters are on and is
    returned in eval mode.

    Shape:
        images: ``(N, C, H, W)`` float in [-1, 1]; labels: ``(N,)`` long in [0, num_classes)
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    N = images.shape[0]
    if N < 2:
        raise ValueError(f"need at least 2 images to train a classifier, got {N}")
    shift = model.image_size // 16 if max_shift is None else max_shift
    device = next(model.parameters()).device
    images, labels = images.to(device), labels.to(device)
    generator = torch.Generator().manual_seed(seed)
    steps_per_epoch = -(-N // batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=0.2
    )
    model.train()
    step = 0
    for _ in range(epochs):
        order = torch.randperm(N, generator=generator).to(device)
        for start in range(0, N, batch_size):
            index = order[start : start + batch_size]
            if index.numel() < 2:  # a batch of one breaks batch norm; skip the remainder
                continue
            batch = _random_shift(images[index], shift, generator)  # (B, C, H, W)
            loss = F.cross_entropy(
                model.logits(batch), labels[index], label_smoothing=label_smoothing
            )
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
    """A freshly initialised extractor (weights a function of ``seed``) for ``like``'s images.

    Given an extractor, its settings are copied; given data, the width is the data set's recipe's
    (:func:`recipe_for`).
    """
    if isinstance(like, FeatureExtractor):
        settings = like.settings()
    else:
        if like.num_classes < 2:
            raise ValueError(f"{like.name} has {like.num_classes} classes; the extractor needs 2+")
        settings = {
            "in_channels": like.channels,
            "num_classes": like.num_classes,
            "image_size": like.image_size,
            "width": recipe_for(like.name).width,
        }
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's stream
        torch.manual_seed(seed)
        return FeatureExtractor(**settings)


def fresh_backgrounds(
    data: ImageData, data_seed: int | None, *, copies: int, seed: int = 0
) -> Tensor:
    """``copies`` more versions of digits-m's training split: its digits over new backgrounds.

    digits-m blends each grayscale digit over a crop of a photograph
    (:func:`imagecl.digits_m.blend_digits`); blending the training split's digits again over
    other crops gives new training images of the same digits, labels unchanged (the test split's
    digits are never touched). ``data_seed`` is the seed ``data`` was loaded with: digits-m is
    rebuilt from it and must equal ``data``'s training split, so a wrong seed, image size or split
    is refused rather than mixing digits from another split. The background seeds of the copies
    are drawn from ``seed``.

    Shape:
        returns ``(copies · N_train, 3, S, S)`` uint8, copy after copy, each in the training
        split's order (its labels are ``labels.repeat(copies)``)
    """
    if data.name != "digits-m":
        raise ValueError(f"fresh backgrounds are digits-m's recipe, not {data.name!r}'s")
    if data_seed is None:
        raise ValueError(
            "digits-m's extractor blends its training digits over fresh backgrounds: pass "
            "data_seed, the seed the data set was loaded with"
        )
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    train_images, train_labels = images_and_labels(data.train)
    again = load_data("digits-m", seed=data_seed, image_size=data.image_size)
    rebuilt, rebuilt_labels = images_and_labels(again.train)
    if not (torch.equal(rebuilt, train_images) and torch.equal(rebuilt_labels, train_labels)):
        raise ValueError(
            f"data_seed {data_seed} does not rebuild this digits-m training split (was it loaded "
            "with another seed, image size or test fraction?)"
        )
    digits, _ = images_and_labels(
        load_data("digits", seed=data_seed, image_size=data.image_size).train
    )  # (N, 1, S, S): the same split of the same digits, before blending
    generator = torch.Generator().manual_seed(seed)
    seeds = torch.randint(2**31 - 1, (copies,), generator=generator).tolist()
    return torch.cat([blend_digits(digits, seed=s) for s in seeds])  # (copies·N, 3, S, S)


def train_extractor(
    data: ImageData,
    *,
    seed: int = 0,
    epochs: int | None = None,
    device: torch.device | str = "cpu",
    data_seed: int | None = None,
) -> tuple[FeatureExtractor, float]:
    """Train the extractor on ``data.train`` and measure its accuracy on ``data.test``.

    The recipe (width, epochs, label smoothing, re-blended copies) is the data set's
    (:func:`recipe_for`); ``epochs`` overrides its epochs. A recipe with re-blended copies
    (digits-m) needs ``data_seed``, the seed ``data`` was loaded with (:func:`fresh_backgrounds`).
    Returns the extractor (eval mode, parameters frozen, on ``device``) and its test accuracy in
    [0, 1]. Reproducible for a given ``seed`` on one machine with one thread count.
    """
    recipe = recipe_for(data.name)
    train_images, train_labels = images_and_labels(data.train)
    test_images, test_labels = images_and_labels(data.test)
    if len(train_labels) < 2 or len(test_labels) < 1:
        raise ValueError(f"{data.name} needs labelled train and test splits to train an extractor")
    if recipe.reblends:
        extra = fresh_backgrounds(data, data_seed, copies=recipe.reblends, seed=seed)
        train_images = torch.cat([train_images, extra])  # (N·(1 + copies), C, S, S)
        train_labels = train_labels.repeat(1 + recipe.reblends)
    model = new_classifier(data, seed=seed).to(device)
    fit_classifier(
        model,
        to_signed_unit(train_images),
        train_labels,
        epochs=recipe.epochs if epochs is None else epochs,
        seed=seed,
        label_smoothing=recipe.label_smoothing,
    )
    model.requires_grad_(False)
    return model, classifier_accuracy(model, to_signed_unit(test_images), test_labels)
