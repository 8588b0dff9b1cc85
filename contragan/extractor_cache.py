"""The feature extractor's cache: trained once per data set, reused across evaluations.

A trained :class:`~contragan.extractor.FeatureExtractor` is cached per data set as
``safetensors`` plus a json sidecar, keyed by what determines its weights: data name, image
size, channels, classes, seed, a digest of the train and test splits' bytes, the number of
epochs, the data set's recipe (:func:`~contragan.extractor.recipe_for`) and
:data:`~contragan.extractor.EXTRACTOR_VERSION` (bump it when the architecture or the training
recipe changes). Both files are written atomically, weights first; an unreadable or
inconsistent cache is retrained with a warning.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from contragan.data import ImageData, images_and_labels
from contragan.extractor import (
    EXTRACTOR_VERSION,
    FeatureExtractor,
    recipe_for,
    train_extractor,
)
from shared.checkpoint import atomic_write

__all__ = ["CachedExtractor", "load_or_train_extractor"]


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
    recipe = recipe_for(data.name)
    identity = [data_name, data.image_size, data.channels, data.num_classes, seed, epochs]
    identity += [recipe.width, recipe.label_smoothing, recipe.reblends]
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
    epochs: int | None = None,
    data_seed: int | None = None,
) -> CachedExtractor:
    """The extractor of ``data`` from ``cache_dir``, trained and cached there when absent.

    ``epochs`` (default: the data set's recipe) overrides the recipe's epochs; ``data_seed``, the
    seed ``data`` was loaded with, is needed by digits-m's recipe (:func:`train_extractor`).
    ``data_name`` (default ``data.name``) names the cache files; an unreadable or inconsistent
    cache file is retrained with a warning, never fatal. The extractor is refused with a
    ``ValueError`` when its test accuracy is below ``min_accuracy`` (its weights stay cached, so
    a rerun with a lower threshold does not retrain).
    """
    if not 0.0 <= min_accuracy <= 1.0:
        raise ValueError(f"min_accuracy must be in [0, 1], got {min_accuracy}")
    data_name = data.name if data_name is None else data_name
    epochs = recipe_for(data.name).epochs if epochs is None else epochs
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
        model, accuracy = train_extractor(
            data, seed=seed, epochs=epochs, device=device, data_seed=data_seed
        )
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
