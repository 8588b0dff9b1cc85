"""Offline GAN metrics: distances, coverage and class consistency in a locally trained space.

Without Inception weights (nothing is downloaded) the figures are computed in the feature
space of :class:`~contragan.extractor.FeatureExtractor`, a classifier trained on the real train
split; every figure is reported next to its real-vs-real value (:func:`real_vs_real`).
ContraGAN's known failure is class confusion (intra-class FID 119.6 vs 14.3 for BigGAN in
StudioGAN's CIFAR-10 benchmark; StudioGAN issues #20 and #81), which
FD alone does not see; GAN-test, CAS and per-class FD do.

Conventions:

- Images are float ``(N, C, H, W)`` in [-1, 1] (the generator's tanh range); uint8 images are
  accepted and mapped with ``x / 127.5 - 1``. Floats in [0, 1] cannot be told apart from
  [-1, 1] data and are the caller's responsibility.
- Sample counts: distances between sets depend on their sizes (FD is biased upward at small N;
  the k-NN radii of precision/recall shrink as N grows), so :func:`evaluate_samples` compares a
  real and a generated set of equal size. The protocol of ``contragan evaluate``: the real set
  is the test split, and one sample is generated per test image with that image's label, so
  per-class counts match too. :func:`real_vs_real` does the same with a class-matched subset
  of the train split as the "generated" set.
- CAS trains on the generated set itself, or (``cas_samples="train"``, :data:`CasSamples`) on
  one the size of the train split, as Ravuri & Vinyals (2019) do; real-vs-real's classifier then
  trains on the whole train split.
- The extractor runs once per set; FD and KID are then torchmetrics'
  ``FrechetInceptionDistance`` / ``KernelInceptionDistance`` fed those features through an
  identity feature module (:class:`FeatureExtractor` itself also plugs into torchmetrics as
  ``feature=``; the tests check both routes agree). The set-to-set figures live in
  :mod:`contragan.distances` and are re-exported here.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import Tensor
from torchmetrics.image.fid import FrechetInceptionDistance

from contragan.data import ImageData, images_and_labels
from contragan.distances import (
    NEAREST_K,
    DensityCoverage,
    PrecisionRecall,
    density_coverage,
    frechet_distance,
    intra_class_fd,
    kernel_distance,
    precision_recall,
)
from contragan.extractor import (
    RANGE_TOLERANCE,
    FeatureExtractor,
    check_images,
    check_labels,
    classifier_accuracy,
    fit_classifier,
    new_classifier,
)
from shared.runtime import eval_mode

__all__ = [
    "CasSamples",
    "DensityCoverage",
    "PrecisionRecall",
    "check_cas_samples",
    "classification_accuracy_score",
    "density_coverage",
    "evaluate_samples",
    "extract_features",
    "frechet_distance",
    "gan_test_accuracy",
    "inception_fid",
    "intra_class_fd",
    "kernel_distance",
    "precision_recall",
    "real_vs_real",
]

# what the CAS classifier trains on: "test", the scored generated set (one sample per test
# image); "train", a generated set of the train split's size and class counts
CasSamples = Literal["test", "train"]


def check_cas_samples(cas_samples: str) -> None:
    """Refuse a ``cas_samples`` other than those of :data:`CasSamples`, naming the value."""
    if cas_samples not in get_args(CasSamples):
        raise ValueError(f"cas_samples must be 'test' or 'train', got {cas_samples!r}")


# --------------------------------------------------------------------------- features


@torch.no_grad()
def extract_features(
    extractor: FeatureExtractor, images: Tensor, *, batch_size: int = 512
) -> Tensor:
    """The extractor's features of ``images`` (eval mode, batched), as float64 on the CPU.

    Shape:
        images: ``(N, C, H, W)`` float in [-1, 1] or uint8; returns ``(N, F)``
    """
    images = check_images(images, extractor, "images")
    device = next(extractor.parameters()).device
    with eval_mode(extractor):
        chunks = [
            extractor(images[start : start + batch_size].to(device)).to("cpu", torch.float64)
            for start in range(0, images.shape[0], batch_size)
        ]
    if not chunks:
        return torch.zeros((0, extractor.num_features), dtype=torch.float64)
    return torch.cat(chunks)  # (N, F)


# --------------------------------------------------------------------------- class consistency


def gan_test_accuracy(
    extractor: FeatureExtractor, fake_images: Tensor, fake_labels: Tensor
) -> float:
    """GAN-test (Shmelkov et al. 2018): the extractor's accuracy on generated samples against
    their conditioning labels. Near the extractor's own test accuracy for a class-consistent
    generator; near chance (1/C) when samples ignore their class.

    Shape:
        fake_images: ``(M, C, H, W)`` in [-1, 1]; fake_labels: ``(M,)``
    """
    images = check_images(fake_images, extractor, "fake_images")
    labels = check_labels(fake_labels, images.shape[0], extractor.num_classes, "fake_labels")
    if images.shape[0] == 0:
        raise ValueError("gan_test_accuracy needs at least one generated image")
    return classifier_accuracy(extractor, images, labels)


def classification_accuracy_score(
    like: FeatureExtractor,
    fake_images: Tensor,
    fake_labels: Tensor,
    test_images: Tensor,
    test_labels: Tensor,
    *,
    epochs: int,
    seed: int = 0,
) -> float:
    """CAS (Ravuri & Vinyals 2019): train a fresh classifier on generated samples and their
    conditioning labels, report its accuracy on real test images.

    The classifier has ``like``'s architecture, is initialised from ``seed`` and trained with
    the extractor's recipe (:func:`~contragan.extractor.fit_classifier`) on ``like``'s device.

    Shape:
        fake_images: ``(M, C, H, W)``, fake_labels: ``(M,)``, test_images: ``(T, C, H, W)``,
        test_labels: ``(T,)``
    """
    fake = check_images(fake_images, like, "fake_images")
    fake_y = check_labels(fake_labels, fake.shape[0], like.num_classes, "fake_labels")
    test = check_images(test_images, like, "test_images")
    test_y = check_labels(test_labels, test.shape[0], like.num_classes, "test_labels")
    if test.shape[0] == 0:
        raise ValueError("classification_accuracy_score needs at least one test image")
    device = next(like.parameters()).device
    model = new_classifier(like, seed=seed).to(device)
    fit_classifier(model, fake, fake_y, epochs=epochs, seed=seed)
    return classifier_accuracy(model, test, test_y)


# --------------------------------------------------------------------------- entry points


def evaluate_samples(
    extractor: FeatureExtractor,
    real_images: Tensor,
    real_labels: Tensor,
    fake_images: Tensor,
    fake_labels: Tensor,
    *,
    test_images: Tensor,
    test_labels: Tensor,
    seed: int = 0,
    cas_epochs: int = 12,
    cas_images: Tensor | None = None,
    cas_labels: Tensor | None = None,
    kid_subset_size: int | None = None,
    kid_subsets: int = 100,
    k: int = NEAREST_K,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Every offline figure of a generated set against a real one of the same size.

    Keys: ``fd``, ``kid_mean``, ``kid_std``, ``precision``, ``recall``, ``density``,
    ``coverage`` (real vs generated features), ``gan_test_acc`` (extractor on generated images
    vs their labels), ``cas_acc`` (classifier trained ``cas_epochs`` on generated, tested on
    ``test_images``), ``intra_fd/<c>`` per class and their mean ``intra_fd_mean`` (NaN classes
    left out), ``num_samples`` and ``cas_num_samples``. The CAS classifier trains on
    ``cas_images``/``cas_labels`` when given (a larger generated set of the same generator, any
    size), else on the generated set itself. ``kid_subset_size`` defaults to half the set, at
    most 1000.
    ``seed`` fixes the KID subsets and the CAS classifier. ``device`` (default: the extractor's)
    is where the networks run; the extractor itself is never moved (a copy is).

    Shape:
        real_images: ``(N, C, H, W)``, real_labels: ``(N,)``, fake_images: ``(N, C, H, W)``,
        fake_labels: ``(N,)``, test_images: ``(T, C, H, W)``, test_labels: ``(T,)``,
        cas_images: ``(M, C, H, W)``, cas_labels: ``(M,)``; images float in [-1, 1] or uint8
    """
    if (cas_images is None) != (cas_labels is None):
        raise ValueError("pass cas_images and cas_labels together, or neither")
    if device is not None and torch.device(device) != next(extractor.parameters()).device:
        extractor = copy.deepcopy(extractor).to(device)
    C = extractor.num_classes
    real = check_images(real_images, extractor, "real_images")
    fake = check_images(fake_images, extractor, "fake_images")
    if real.shape[0] != fake.shape[0]:
        raise ValueError(
            f"compare sets of equal size: {real.shape[0]} real vs {fake.shape[0]} generated "
            "images (FD, KID and precision/recall depend on N); generate one sample per real "
            "image with its label"
        )
    real_y = check_labels(real_labels, real.shape[0], C, "real_labels")
    fake_y = check_labels(fake_labels, fake.shape[0], C, "fake_labels")
    test = check_images(test_images, extractor, "test_images")  # checked before any work
    test_y = check_labels(test_labels, test.shape[0], C, "test_labels")
    if cas_images is None or cas_labels is None:
        cas_x, cas_y = fake, fake_y
    else:
        cas_x = check_images(cas_images, extractor, "cas_images")
        cas_y = check_labels(cas_labels, cas_x.shape[0], C, "cas_labels")
    N = real.shape[0]
    subset = min(1000, N // 2) if kid_subset_size is None else kid_subset_size
    real_f, fake_f = extract_features(extractor, real), extract_features(extractor, fake)  # (N, F)
    kid_mean, kid_std = kernel_distance(
        real_f, fake_f, subset_size=subset, subsets=kid_subsets, seed=seed
    )
    pr = precision_recall(real_f, fake_f, k=k)
    dc = density_coverage(real_f, fake_f, k=k)
    per_class = intra_class_fd(real_f, real_y, fake_f, fake_y, C)
    finite = [value for value in per_class.values() if math.isfinite(value)]
    cas = classification_accuracy_score(
        extractor, cas_x, cas_y, test, test_y, epochs=cas_epochs, seed=seed
    )
    return {
        "fd": frechet_distance(real_f, fake_f),
        "kid_mean": kid_mean,
        "kid_std": kid_std,
        "precision": pr.precision,
        "recall": pr.recall,
        "density": dc.density,
        "coverage": dc.coverage,
        "gan_test_acc": gan_test_accuracy(extractor, fake, fake_y),
        "cas_acc": cas,
        "intra_fd_mean": statistics.fmean(finite) if finite else math.nan,
        **{f"intra_fd/{c}": value for c, value in per_class.items()},
        "num_samples": float(N),
        "cas_num_samples": float(cas_x.shape[0]),
    }


def _class_matched_subset(pool_labels: Tensor, target_labels: Tensor, seed: int) -> Tensor:
    """Random indices into the pool with exactly the target's count of every class.

    Shape:
        pool_labels: ``(P,)``, target_labels: ``(N,)``; returns ``(N,)`` sorted by class
    """
    generator = torch.Generator().manual_seed(seed)
    picked = []
    for c in torch.unique(target_labels).tolist():
        members = torch.nonzero(pool_labels == c).flatten()
        need = int((target_labels == c).sum())
        if members.numel() < need:
            raise ValueError(
                f"class {c}: the train split has {members.numel()} images, the test split "
                f"{need}; real-vs-real needs at least as many train images per class"
            )
        picked.append(members[torch.randperm(members.numel(), generator=generator)[:need]])
    return torch.cat(picked)


def real_vs_real(
    extractor: FeatureExtractor,
    data: ImageData,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    cas_epochs: int = 12,
    cas_samples: CasSamples = "test",
    kid_subset_size: int | None = None,
    kid_subsets: int = 100,
    k: int = NEAREST_K,
    device: torch.device | str | None = None,
) -> dict[str, tuple[float, float]]:
    """The baseline of every figure: :func:`evaluate_samples` with real train images as the
    "generated" set, over ``seeds``; returns ``(mean, std)`` per key (sample std, 0 for one seed).

    Per seed, the "generated" set is a random subset of the train split with the test split's
    count of every class (so N and per-class counts equal those of the protocol), with their
    true labels; the real set and the CAS test set are the test split; the seed also drives KID
    subsets and the CAS classifier. The extractor was trained on these train images, so the
    baseline is what a generator reproducing its training data would score: GAN-test is the
    extractor's train accuracy (≈ 1, above its test accuracy), and train and test features may
    sit a little apart because the extractor fit one of them. KID's subsets are drawn from the
    same fixed test split in every seed, so its spread over seeds understates its noise.
    ``cas_samples="train"`` trains the CAS classifier on the whole train split instead of the
    subset (the baseline of a CAS trained on as many generated images as the train split has).
    """
    check_cas_samples(cas_samples)
    if not seeds:
        raise ValueError("real_vs_real needs at least one seed")
    train_images, train_labels = images_and_labels(data.train)
    test_images, test_labels = images_and_labels(data.test)
    cas_x, cas_y = (train_images, train_labels) if cas_samples == "train" else (None, None)
    runs = []
    for seed in seeds:
        index = _class_matched_subset(train_labels, test_labels, seed)  # (N,)
        runs.append(
            evaluate_samples(
                extractor,
                test_images,
                test_labels,
                train_images[index],
                train_labels[index],
                test_images=test_images,
                test_labels=test_labels,
                seed=seed,
                cas_epochs=cas_epochs,
                cas_images=cas_x,
                cas_labels=cas_y,
                kid_subset_size=kid_subset_size,
                kid_subsets=kid_subsets,
                k=k,
                device=device,
            )
        )
    spread = statistics.stdev if len(runs) > 1 else (lambda values: 0.0)
    return {
        key: (statistics.fmean(run[key] for run in runs), spread([run[key] for run in runs]))
        for key in runs[0]
    }


# --------------------------------------------------------------------------- Inception FID


def _torch_fidelity_available() -> bool:
    return importlib.util.find_spec("torch_fidelity") is not None


def _inception_uint8(images: Tensor, name: str) -> Tensor:
    """[-1, 1] floats (or uint8) as the 3-channel uint8 batch torchmetrics' Inception expects."""
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"{name} must be (N, 1 or 3, H, W), got shape {tuple(images.shape)}")
    if images.dtype != torch.uint8:
        if not images.is_floating_point():
            raise ValueError(f"{name} must be float in [-1, 1] or uint8, got {images.dtype}")
        if images.numel() and float(images.abs().max()) > 1.0 + RANGE_TOLERANCE:
            raise ValueError(f"{name} must lie in [-1, 1], got max |x| {float(images.abs().max())}")
        images = ((images + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return images.expand(-1, 3, -1, -1)  # (N, 3, H, W): grayscale repeated


def inception_fid(
    real: Tensor,
    fake: Tensor,
    weights_path: str | Path,
    device: torch.device | str = "cpu",
    *,
    batch_size: int = 64,
) -> float:
    """FID with Inception-v3 weights read from ``weights_path``; nothing is downloaded.

    torchmetrics' ``FrechetInceptionDistance(feature=2048, feature_extractor_weights_path=...)``
    hands the path to torch-fidelity, which ``torch.load``\\ s it as the state dict of its
    ``FeatureExtractorInceptionV3`` (the file torch-fidelity publishes as
    ``weights-inception-2015-12-05-6726825d.pth``). Needs the optional torch-fidelity package.

    Shape:
        real: ``(N, C, H, W)``, fake: ``(M, C, H, W)``, C ∈ {1, 3}, float in [-1, 1] or uint8
    """
    path = Path(weights_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"Inception weights not found at {path}: pass the path of torch-fidelity's "
            "weights-inception-2015-12-05-6726825d.pth (nothing is downloaded)"
        )
    if not _torch_fidelity_available():
        raise ModuleNotFoundError(
            "Inception FID needs torch-fidelity, which is not installed: pip install "
            "torch-fidelity (or torchmetrics[image]); the offline metrics work without it"
        )
    real_u8, fake_u8 = _inception_uint8(real, "real"), _inception_uint8(fake, "fake")
    metric = FrechetInceptionDistance(
        feature=2048, normalize=False, feature_extractor_weights_path=str(path)
    ).to(device)
    for images, is_real in ((real_u8, True), (fake_u8, False)):
        for start in range(0, images.shape[0], batch_size):
            metric.update(images[start : start + batch_size].to(device), real=is_real)
    return float(metric.compute())
