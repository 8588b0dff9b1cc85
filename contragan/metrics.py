"""Offline GAN metrics: distances, coverage and class consistency in a locally trained space.

REFERENCES.md ("GAN side"): without Inception weights the figures are computed in the feature
space of :class:`~contragan.extractor.FeatureExtractor`, a classifier trained on the real train
split; every figure is reported next to its real-vs-real value (:func:`real_vs_real`).
ContraGAN's known failure is class confusion (intra-class FID 119.6 vs 14.3 for BigGAN), which
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
- The extractor runs once per set; FD and KID are then torchmetrics'
  ``FrechetInceptionDistance`` / ``KernelInceptionDistance`` fed those features through an
  identity feature module (:class:`FeatureExtractor` itself also plugs into torchmetrics as
  ``feature=``; the tests check both routes agree).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import statistics
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance

from contragan.extractor import (
    RANGE_TOLERANCE,
    FeatureExtractor,
    check_images,
    check_labels,
    classifier_accuracy,
    fit_classifier,
    new_classifier,
)
from imagecl.data import ImageData, images_and_labels
from shared.runtime import eval_mode

__all__ = [
    "DensityCoverage",
    "PrecisionRecall",
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

NEAREST_K = 5  # Kynkäänniemi et al. 2019 §3 and Naeem et al. 2020 §4 both settle on k = 5
_BLOCK = 4096  # rows of a pairwise-distance block: memory O(block · N)


class PrecisionRecall(NamedTuple):
    precision: float
    recall: float


class DensityCoverage(NamedTuple):
    density: float
    coverage: float


class _Features(nn.Module):
    """Identity "feature network": hands torchmetrics features the extractor already computed."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features  # read by torchmetrics instead of a dummy forward

    def forward(self, features: Tensor) -> Tensor:
        return features


# --------------------------------------------------------------------------- input checks


def _check_features(real: Tensor, fake: Tensor, min_samples: int) -> tuple[Tensor, Tensor]:
    """Both sets as float64 on the CPU, after checking shapes, counts and finiteness."""
    for name, features in (("real_features", real), ("fake_features", fake)):
        if features.dim() != 2:
            raise ValueError(f"{name} must be (N, D), got shape {tuple(features.shape)}")
        if features.shape[0] < min_samples:
            raise ValueError(f"{name} needs at least {min_samples} rows, got {features.shape[0]}")
        if not bool(torch.isfinite(features).all()):
            raise ValueError(f"{name} has NaN or infinite entries")
    if real.shape[1] != fake.shape[1]:
        raise ValueError(f"feature sizes differ: real {real.shape[1]}, fake {fake.shape[1]}")
    return real.detach().to("cpu", torch.float64), fake.detach().to("cpu", torch.float64)


# --------------------------------------------------------------------------- feature-space figures


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


def frechet_distance(real_features: Tensor, fake_features: Tensor) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets (Heusel et al. 2017, Eq. 6).

    ``‖μ_r − μ_f‖² + Tr(Σ_r + Σ_f − 2 (Σ_r Σ_f)^{1/2})`` with unbiased covariances, computed in
    float64 by torchmetrics' ``FrechetInceptionDistance``. With Inception features this is FID;
    here the features are the local extractor's, so values are not comparable with published FIDs.

    Shape:
        real_features: ``(N, D)``, fake_features: ``(M, D)``, N, M ≥ 2
    """
    real, fake = _check_features(real_features, fake_features, min_samples=2)
    metric = FrechetInceptionDistance(feature=_Features(real.shape[1]), normalize=True)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    return float(metric.compute())


def kernel_distance(
    real_features: Tensor,
    fake_features: Tensor,
    *,
    subset_size: int,
    subsets: int = 100,
    seed: int = 0,
) -> tuple[float, float]:
    """KID (Bińkowski et al. 2018): unbiased MMD² with the cubic kernel ``(x·y/D + 1)³``.

    Mean and (population) std over ``subsets`` random subsets of ``subset_size`` rows of each
    set, drawn from ``seed``; torchmetrics' ``KernelInceptionDistance`` does the maths. The
    estimator is unbiased, so sets from one distribution give values around 0, a little below
    as often as above.
    ``subset_size`` must be ≤ the smaller set; at equality every subset is the whole set and the
    std is 0, hence :func:`evaluate_samples`' default of half the set.

    Shape:
        real_features: ``(N, D)``, fake_features: ``(M, D)``
    """
    real, fake = _check_features(real_features, fake_features, min_samples=2)
    smaller = min(real.shape[0], fake.shape[0])
    if not 2 <= subset_size <= smaller:
        raise ValueError(
            f"KID subset_size must be in [2, {smaller}] (the smaller set), got {subset_size}"
        )
    with warnings.catch_warnings():  # "will save all extracted features": ours are small
        warnings.filterwarnings("ignore", message=".*save all extracted features.*")
        metric = KernelInceptionDistance(
            feature=_Features(real.shape[1]), subsets=subsets, subset_size=subset_size
        )
    metric.update(real, real=True)
    metric.update(fake, real=False)
    with torch.random.fork_rng(devices=[]):  # torchmetrics draws subsets from the global RNG
        torch.manual_seed(seed)
        mean, std = metric.compute()
    return float(mean), float(std)


def _distance_blocks(a: Tensor, b: Tensor) -> Iterator[tuple[slice, Tensor]]:
    """Euclidean distances from row blocks of ``a`` to all of ``b``: ``(rows, (B, M) block)``."""
    for start in range(0, a.shape[0], _BLOCK):
        rows = slice(start, start + _BLOCK)
        # the direct (not matmul) formula: exact and symmetric, so a point at exactly the k-th
        # neighbour distance compares equal to that radius wherever it is computed
        yield rows, torch.cdist(a[rows], b, compute_mode="donot_use_mm_for_euclid_dist")  # (B, M)


def _knn_radii(features: Tensor, k: int) -> Tensor:
    """Distance from each row to its k-th nearest other row (the row itself, at 0, skipped).

    Shape:
        features: ``(N, D)`` with N > k; returns ``(N,)``
    """
    return torch.cat(
        [d.kthvalue(k + 1, dim=1).values for _, d in _distance_blocks(features, features)]
    )


def _in_any_ball(points: Tensor, centres: Tensor, radii: Tensor) -> Tensor:
    """Whether each point lies in the closed ball of at least one centre.

    Shape:
        points: ``(M, D)``, centres: ``(N, D)``, radii: ``(N,)``; returns ``(M,)`` bool
    """
    return torch.cat([(d <= radii).any(dim=1) for _, d in _distance_blocks(points, centres)])


def precision_recall(
    real_features: Tensor, fake_features: Tensor, *, k: int = NEAREST_K
) -> PrecisionRecall:
    """Improved precision and recall (Kynkäänniemi et al. 2019, Eqs. 1–2).

    The real manifold is the union of closed balls around each real feature with radius the
    distance to its k-th nearest real neighbour; precision is the share of generated features
    inside it; recall swaps the roles (share of real features inside the generated manifold).
    Written here (``torch.cdist`` in row blocks, float64, O(block · N) memory): there is no
    well-kept offline package for these figures (the authors' code is TensorFlow for
    precision/recall and the small numpy ``prdc`` package for density/coverage), and neither
    is a dependency of ours.

    Shape:
        real_features: ``(N, D)``, fake_features: ``(M, D)``, N, M > k
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    real, fake = _check_features(real_features, fake_features, min_samples=k + 1)
    precision = _in_any_ball(fake, real, _knn_radii(real, k)).double().mean()
    recall = _in_any_ball(real, fake, _knn_radii(fake, k)).double().mean()
    return PrecisionRecall(float(precision), float(recall))


def density_coverage(
    real_features: Tensor, fake_features: Tensor, *, k: int = NEAREST_K
) -> DensityCoverage:
    """Density and coverage (Naeem et al. 2020, Eqs. 3–4), with real k-NN balls only.

    density = (1/(kM)) Σ_j Σ_i 1[Y_j ∈ B(X_i, NND_k(X_i))]: how many real balls hold each
    generated sample, on average, over k (≈ 1 when both sets come from one distribution; it can
    exceed 1). coverage = (1/N) Σ_i 1[∃ j: Y_j ∈ B(X_i, NND_k(X_i))]: the share of real balls
    holding at least one generated sample. Balls are open (strict ``<``), so a set against
    itself has density exactly 1: each ball holds its centre and its k − 1 nearest neighbours.
    Written here for the same reason as :func:`precision_recall`.

    Shape:
        real_features: ``(N, D)``, fake_features: ``(M, D)``, N > k, M ≥ 1
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    real, fake = _check_features(real_features, fake_features, min_samples=1)
    if real.shape[0] <= k:
        raise ValueError(f"real_features needs more than k={k} rows, got {real.shape[0]}")
    radii = _knn_radii(real, k)  # (N,)
    inside = sum(int((d < radii).sum()) for _, d in _distance_blocks(fake, real))
    density = inside / (k * fake.shape[0])
    covered = torch.cat(
        [d.min(dim=1).values < radii[rows] for rows, d in _distance_blocks(real, fake)]
    )  # (N,)
    return DensityCoverage(density, float(covered.double().mean()))


def intra_class_fd(
    real_features: Tensor,
    real_labels: Tensor,
    fake_features: Tensor,
    fake_labels: Tensor,
    num_classes: int,
) -> dict[int, float]:
    """Fréchet distance between the real and generated features of each class.

    The intra-class FID of Miyato & Koyama 2018, in our feature space: it sees samples that do
    not match their conditioning class, which the class-blind FD cannot. A class with fewer than
    two samples on either side gets NaN (``evaluate_samples`` averages the others).

    Shape:
        real_features: ``(N, D)``, real_labels: ``(N,)``, fake_features: ``(M, D)``,
        fake_labels: ``(M,)``; returns one entry per class in ``0..num_classes-1``
    """
    real, fake = _check_features(real_features, fake_features, min_samples=0)
    real_labels = check_labels(real_labels, real.shape[0], num_classes, "real_labels")
    fake_labels = check_labels(fake_labels, fake.shape[0], num_classes, "fake_labels")
    distances = {}
    for c in range(num_classes):
        real_c, fake_c = real[real_labels == c], fake[fake_labels == c]
        enough = min(real_c.shape[0], fake_c.shape[0]) >= 2
        distances[c] = frechet_distance(real_c, fake_c) if enough else math.nan
    return distances


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
    left out), and ``num_samples``. ``kid_subset_size`` defaults to half the set, at most 1000.
    ``seed`` fixes the KID subsets and the CAS classifier. ``device`` (default: the extractor's)
    is where the networks run; the extractor itself is never moved (a copy is).

    Shape:
        real_images: ``(N, C, H, W)``, real_labels: ``(N,)``, fake_images: ``(N, C, H, W)``,
        fake_labels: ``(N,)``, test_images: ``(T, C, H, W)``, test_labels: ``(T,)``;
        images float in [-1, 1] or uint8
    """
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
        extractor, fake, fake_y, test, test_y, epochs=cas_epochs, seed=seed
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
    """
    if not seeds:
        raise ValueError("real_vs_real needs at least one seed")
    train_images, train_labels = images_and_labels(data.train)
    test_images, test_labels = images_and_labels(data.test)
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
