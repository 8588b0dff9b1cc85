"""The feature space of the offline GAN metrics: a small CNN classifier trained on the real data.

FID and KID are defined in the feature space of an ImageNet Inception-v3, whose weights are a
download away. Offline (REFERENCES.md, "GAN side") the features come instead from a classifier
trained here on the real training split; its test accuracy is reported with every figure and must
be high, else distances in its feature space say little (:func:`load_or_train_extractor` refuses).

Input convention, everywhere in :mod:`contragan.metrics` and here: images are float tensors in
[-1, 1] ``(N, C, H, W)``, the range of the generator's tanh; real uint8 images map there with
``x / 127.5 - 1`` (:func:`to_signed_unit`).

A trained extractor is cached per data set as ``safetensors`` plus a json sidecar, keyed by what
determines its weights: data name, image size, channels, classes, seed, a digest of the train and
test splits' bytes, the number of epochs and :data:`EXTRACTOR_VERSION` (bump it when the
architecture or the training recipe changes).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import Tensor, nn

from imagecl.data import ImageData, images_and_labels
from shared.checkpoint import atomic_write
from shared.runtime import eval_mode
from shared.updaters import check_finite

__all__ = [
    "EXTRACTOR_VERSION",
    "RANGE_TOLERANCE",
    "CachedExtractor",
    "FeatureExtractor",
    "check_images",
    "check_labels",
    "classifier_accuracy",
    "fit_classifier",
    "load_or_train_extractor",
    "new_classifier",
    "predict_logits",
    "to_signed_unit",
    "train_extractor",
]

EXTRACTOR_VERSION = 1
RANGE_TOLERANCE = 1e-5  # float rounding of a tanh output or of x / 127.5 - 1
DEFAULT_EPOCHS = 12  # 32 px: digits ≈ 99 %, digits-m 94–96 % test accuracy; ~10 CPU-seconds


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


def to_signed_unit(images: Tensor) -> Tensor:
    """Map uint8 images in 0..255 to float32 in [-1, 1]: ``x / 127.5 - 1``.

    Shape:
        images: ``(N, C, H, W)`` uint8; returns the same shape, float32
    """
    if images.dtype != torch.uint8:
        raise ValueError(f"to_signed_unit expects uint8 images, got {images.dtype}")
    return images.to(torch.float32) / 127.5 - 1.0


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
) -> FeatureExtractor:
    """Train ``model``'s classifier with cross-entropy (AdamW, one-cycle schedule), in place.

    Used for the extractor (real train split) and for CAS (generated samples). The light
    augmentation is a random translation of up to ``max_shift`` pixels (default image size / 16,
    2 px at 32). Batch order and shifts come from a generator seeded with ``seed``. The model
    trains on the device its parameters are on and is returned in eval mode.

    Shape:
        images: ``(N, C, H, W)`` float in [-1, 1]; labels: ``(N,)`` long in [0, num_classes)
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
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


class CachedExtractor(NamedTuple):
    """What :func:`load_or_train_extractor` hands back."""

    extractor: FeatureExtractor  # eval mode, frozen, on the requested device
    test_accuracy: float  # on the data's test split, in [0, 1]
    weights_path: Path  # the cached safetensors file
    from_cache: bool  # False when it was (re)trained by this call


def _cache_key(data: ImageData, data_name: str, seed: int, epochs: int) -> str:
    """Digest of everything that determines the extractor's weights and its test accuracy."""
    digest = hashlib.sha256()
    for split in (data.train, data.test):
        images, labels = images_and_labels(split)
        digest.update(images.contiguous().numpy().tobytes())
        digest.update(labels.to(torch.int64).contiguous().numpy().tobytes())
    identity = [data_name, data.image_size, data.channels, data.num_classes, seed, epochs]
    digest.update(json.dumps([*identity, EXTRACTOR_VERSION]).encode())
    return digest.hexdigest()


def _load_cached(
    weights: Path, sidecar: Path, key: str, device: torch.device | str
) -> tuple[FeatureExtractor, float]:
    """(extractor, accuracy) from the cache files; raises on anything missing or inconsistent."""
    meta = json.loads(sidecar.read_text())
    if meta["key"] != key or meta["version"] != EXTRACTOR_VERSION:
        raise ValueError("cache key mismatch")
    blob = weights.read_bytes()
    if hashlib.sha256(blob).hexdigest() != meta["weights_sha256"]:
        raise ValueError(f"{weights.name} does not match the checksum in {sidecar.name}")
    model = FeatureExtractor(**meta["settings"])
    model.load_state_dict(load_file(str(weights)))
    accuracy = float(meta["test_accuracy"])
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"test_accuracy {accuracy} out of [0, 1]")
    return model.to(device).eval().requires_grad_(False), accuracy


def load_or_train_extractor(
    data: ImageData,
    data_name: str | None = None,
    *,
    cache_dir: str | Path,
    seed: int = 0,
    device: torch.device | str = "cpu",
    min_accuracy: float = 0.95,
    epochs: int = DEFAULT_EPOCHS,
) -> CachedExtractor:
    """The extractor of ``data`` from ``cache_dir``, trained and cached there when absent.

    ``data_name`` (default ``data.name``) names the cache files; an unreadable or inconsistent
    cache file is retrained with a warning, never fatal. The extractor is refused with a
    ``ValueError`` when its test accuracy is below ``min_accuracy`` (its weights stay cached, so
    a rerun with a lower threshold does not retrain).
    """
    if not 0.0 <= min_accuracy <= 1.0:
        raise ValueError(f"min_accuracy must be in [0, 1], got {min_accuracy}")
    data_name = data.name if data_name is None else data_name
    key = _cache_key(data, data_name, seed, epochs)
    stem = f"extractor-{re.sub(r'[^A-Za-z0-9_.-]', '_', data_name)}-{key[:16]}"
    folder = Path(cache_dir).expanduser()
    weights, sidecar = folder / f"{stem}.safetensors", folder / f"{stem}.json"
    from_cache = weights.is_file() and sidecar.is_file()
    if from_cache:
        try:
            model, accuracy = _load_cached(weights, sidecar, key, device)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as err:
            warnings.warn(
                f"extractor cache {weights} is unreadable ({type(err).__name__}: {err}); "
                "retraining it",
                RuntimeWarning,
                stacklevel=2,
            )
            from_cache = False
    if not from_cache:
        model, accuracy = train_extractor(data, seed=seed, epochs=epochs, device=device)
        _save_cached(model, accuracy, weights, sidecar, key, data_name, seed, epochs)
    if accuracy < min_accuracy:
        accepting = math.floor(accuracy * 100) / 100  # a threshold this extractor passes
        raise ValueError(
            f"the feature extractor for {data_name!r} reaches test accuracy {accuracy:.4f}, "
            f"below the required {min_accuracy:.4f}: distances in its feature space (FD, KID, "
            f"precision/recall, GAN-test) would not be trustworthy. Train it longer "
            f"(epochs={epochs} now, e.g. epochs={2 * epochs}), or accept a weaker extractor "
            f"by lowering the threshold (--min-extractor-accuracy / min_accuracy={accepting:.2f}). "
            f"Its weights are cached at {weights}."
        )
    return CachedExtractor(model, accuracy, weights, from_cache)


def _save_cached(
    model: FeatureExtractor,
    accuracy: float,
    weights: Path,
    sidecar: Path,
    key: str,
    data_name: str,
    seed: int,
    epochs: int,
) -> None:
    """Weights first, then the sidecar that vouches for them (both written atomically)."""
    weights.parent.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()
    }
    blob = save(state)
    with atomic_write(weights) as handle:
        handle.write(blob)
    meta = {
        "key": key,
        "version": EXTRACTOR_VERSION,
        "data_name": data_name,
        "seed": seed,
        "epochs": epochs,
        "settings": model.settings(),
        "test_accuracy": accuracy,
        "weights_sha256": hashlib.sha256(blob).hexdigest(),
    }
    with atomic_write(sidecar) as handle:
        handle.write(json.dumps(meta, indent=2).encode())
