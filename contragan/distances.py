"""Distances between two feature sets: FD, KID, precision/recall, density/coverage, per-class FD.

The set-to-set figures of :mod:`contragan.metrics`, on features already extracted (float64 on
the CPU, every input checked for shape, count and finiteness). FD and KID are torchmetrics'
``FrechetInceptionDistance`` / ``KernelInceptionDistance`` fed the features through an identity
feature module; the k-NN figures are written here (reasons in :func:`precision_recall`).

Shape convention: ``real_features`` ``(N, D)``, ``fake_features`` ``(M, D)``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance

from contragan.extractor import check_labels

__all__ = [
    "NEAREST_K",
    "DensityCoverage",
    "PrecisionRecall",
    "density_coverage",
    "frechet_distance",
    "intra_class_fd",
    "kernel_distance",
    "precision_recall",
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
