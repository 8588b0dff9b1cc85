"""Offline metrics of a trained generator next to their real-vs-real baselines.

The protocol (:mod:`contragan.metrics`): the real set is the data's test split; per seed the
generator draws one sample per test image with that image's class (so counts per class match),
and every figure — Fréchet distance and KID in the feature space of a classifier trained on the
real training split, precision/recall and density/coverage (k = 5), GAN-test accuracy, CAS and
per-class FD — is computed against it. The same figures with real training images in place of
the samples (:func:`contragan.metrics.real_vs_real`) are the baseline each is reported next to
(:func:`evaluate_generator`). With Inception weights on disk it adds the Inception FID of
torchmetrics (nothing downloads). ``contragan evaluate`` (:mod:`contragan.commands.evaluate`)
runs it on a checkpoint and writes the run's evaluation folder.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from contragan.data import ImageData, images_and_labels
from contragan.extractor import FeatureExtractor
from contragan.metrics import (
    CasSamples,
    check_cas_samples,
    evaluate_samples,
    inception_fid,
    real_vs_real,
)
from shared.runtime import eval_mode

__all__ = [
    "CAS_SEED_OFFSET",
    "Evaluation",
    "evaluate_generator",
    "figures_summary",
    "generate",
    "mean_std",
]

# the CAS training set of seed s (cas_samples="train") is drawn from seed s + CAS_SEED_OFFSET,
# apart from the scored sets of seeds s, s + 1, ...
CAS_SEED_OFFSET = 1 << 20


@torch.no_grad()
def generate(
    generator: nn.Module,
    labels: Tensor,
    *,
    z_dim: int,
    seed: int,
    device: torch.device,
    batch_size: int = 500,
) -> Tensor:
    """One sample per label, ``z`` from ``seed`` alone; float in [-1, 1] on the CPU.

    Shape: labels ``(N,)`` -> ``(N, C, H, W)``
    """
    rng = torch.Generator().manual_seed(seed)
    out = []
    with eval_mode(generator):
        for y in torch.split(labels, batch_size):
            z = torch.randn(y.shape[0], z_dim, generator=rng).to(device)
            out.append(generator(z, y.to(device)).float().clamp(-1, 1).cpu())
    return torch.cat(out)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std of the finite ``values`` (std 0 for one; NaN, NaN for none)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


class Evaluation(NamedTuple):
    """What :func:`evaluate_generator` measured: ``(mean, std)`` over seeds of every figure."""

    generated: dict[str, tuple[float, float]]  # the generator's samples vs the test split
    real: dict[str, tuple[float, float]]  # real-vs-real: train images in place of the samples
    num_images: int  # images per set: the test split's size
    num_seeds: int
    inception_fid: float | None  # with Inception weights, of the first seed's samples
    cas_samples: CasSamples = "test"  # what CAS trained on (evaluate_generator's argument)


def evaluate_generator(
    generator: nn.Module,
    data: ImageData,
    extractor: FeatureExtractor,
    *,
    z_dim: int,
    seeds: Sequence[int],
    cas_epochs: int,
    device: torch.device,
    cas_samples: CasSamples = "test",
    inception_weights: Path | None = None,
) -> Evaluation:
    """Every offline figure of ``generator`` on ``data``'s test split, next to real-vs-real.

    Per seed, one sample per test image with its label (:func:`generate`), scored by
    :func:`contragan.metrics.evaluate_samples` in ``extractor``'s feature space; the baseline
    is :func:`contragan.metrics.real_vs_real` over the same seeds. ``cas_samples="train"``
    trains each seed's CAS classifier on a second generated set with the train split's labels
    (as many images, the same class counts; z from ``seed + CAS_SEED_OFFSET``) instead of the
    scored set, and real-vs-real's on the whole train split. ``inception_weights``
    (torch-fidelity's file) adds the Inception FID of the samples of ``seeds[0]``.
    """
    if not seeds:
        raise ValueError("evaluate_generator needs at least one seed")
    check_cas_samples(cas_samples)
    test_images, test_labels = images_and_labels(data.test)
    train_labels = images_and_labels(data.train)[1] if cas_samples == "train" else None
    runs = []
    for seed in seeds:
        fake = generate(generator, test_labels, z_dim=z_dim, seed=seed, device=device)
        cas_fake = None
        if train_labels is not None:
            cas_seed = seed + CAS_SEED_OFFSET
            cas_fake = generate(generator, train_labels, z_dim=z_dim, seed=cas_seed, device=device)
        runs.append(
            evaluate_samples(
                extractor,
                test_images,
                test_labels,
                fake,
                test_labels,
                test_images=test_images,
                test_labels=test_labels,
                seed=seed,
                cas_epochs=cas_epochs,
                cas_images=cas_fake,
                cas_labels=train_labels,
                device=device,
            )
        )
    generated = {key: mean_std([run[key] for run in runs]) for key in runs[0]}
    real = real_vs_real(
        extractor, data, seeds=seeds, cas_epochs=cas_epochs, cas_samples=cas_samples, device=device
    )
    fid = None
    if inception_weights is not None:
        fake = generate(generator, test_labels, z_dim=z_dim, seed=seeds[0], device=device)
        fid = inception_fid(test_images, fake, inception_weights, device)
    return Evaluation(generated, real, len(test_labels), len(seeds), fid, cas_samples)


def figures_summary(evaluation: Evaluation) -> dict[str, float]:
    """summary.json's figures: ``<key>``, ``<key>_std``, ``real_<key>``, ``real_<key>_std`` for
    every figure, then ``inception_fid`` when measured."""
    summary: dict[str, float] = {}
    for key, (mean, std) in evaluation.generated.items():
        summary[key], summary[f"{key}_std"] = mean, std
        summary[f"real_{key}"], summary[f"real_{key}_std"] = evaluation.real[key]
    if evaluation.inception_fid is not None:
        summary["inception_fid"] = evaluation.inception_fid
    return summary
