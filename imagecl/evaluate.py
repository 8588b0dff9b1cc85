"""Evaluation of an image encoder: linear probe, kNN, alignment/uniformity, corruptions.

The protocol of SimCLR/SupCon linear evaluation: features h of the frozen encoder on
un-augmented images, an L2-regularised logistic regression fit on the training split (weight
decay chosen on a held-out part of it, never on test) and scored once on the test split — the
final number, never the best test epoch. kNN: the weighted cosine vote of InstDisc at k = 20
and 200. Robustness: the fitted probe classifies corrupted test images (the CIFAR-10-C protocol,
:mod:`imagecl.corruptions`), accuracy per corruption and severity and the mean over all.
Adversarial robustness: the same probe on top of the frozen encoder, attacked end to end
(pixels → normalise → encoder → probe) with FGSM or PGD under an L∞ budget ε in [0, 1] pixel
units (:mod:`imagecl.attacks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from imagecl.attacks import Attack, fgsm_contrastive, pgd_contrastive
from imagecl.augment import SimCLRViews, to_float
from imagecl.corruptions import CORRUPTIONS, corrupt
from imagecl.data import ImageData, ImageDataset, images_and_labels, stratified_subset
from shared.loop_config import Evaluate
from shared.probes import FittedProbe, alignment_uniformity, knn_probe, linear_probe
from shared.runtime import eval_mode

__all__ = [
    "COLLAPSE_STD",
    "CollapseError",
    "check_not_collapsed",
    "corruption_accuracy",
    "encode",
    "encode_float",
    "encode_views",
    "evaluate_encoder",
    "make_monitor",
    "probe_with_labels_per_class",
    "robust_accuracy",
]

# Below this mean per-dimension std of the L2-normalised features, every image maps to nearly
# the same point: the representation has collapsed.
COLLAPSE_STD = 1e-4


class CollapseError(RuntimeError):
    """The encoder maps every image to (nearly) the same feature vector."""


@torch.no_grad()
def encode(
    encoder: nn.Module,
    images: Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    device: torch.device,
    batch_size: int = 512,
) -> Tensor:
    """Features of un-augmented images in eval mode, batch by batch, returned on the CPU.

    The encoder's train/eval mode is restored afterwards.

    Shape:
        images: ``(N, C, H, W)`` uint8; result: ``(N, D)`` float32.
    """
    with eval_mode(encoder):
        parts = [
            encoder(to_float(chunk.to(device), mean, std)).float().cpu()  # (B, D)
            for chunk in torch.split(images, batch_size)
        ]
    if not parts:
        raise ValueError("no images to encode")
    return torch.cat(parts)  # (N, D)


def check_not_collapsed(features: Tensor, where: str) -> float:
    """Return the mean per-dimension std of the normalised features; raise if it is ~0."""
    spread = float(F.normalize(features.float(), dim=1).std(dim=0).mean())
    if not spread > COLLAPSE_STD:
        raise CollapseError(
            f"{where}: the representation has collapsed (feature std {spread:.2e}): every image "
            "maps to the same point. Lower the learning rate or use a longer warm-up"
        )
    return spread


def corruption_accuracy(
    encoder: nn.Module,
    probe: FittedProbe,
    data: ImageData,
    *,
    device: torch.device,
    corruptions: Sequence[str] = CORRUPTIONS,
    severities: Sequence[int] = (1, 2, 3, 4, 5),
    seed: int = 0,
) -> dict[str, dict[int, float]]:
    """Accuracy of ``probe`` on the corrupted test split, per corruption and severity.

    Corruptions draw from a generator seeded with ``seed`` (the same noise for every encoder).
    """
    images, labels = images_and_labels(data.test)
    result: dict[str, dict[int, float]] = {}
    for name in corruptions:
        result[name] = {}
        for severity in severities:
            generator = torch.Generator().manual_seed(seed)
            corrupted = corrupt(images, name, severity, generator=generator)
            h = encode(encoder, corrupted, data.mean, data.std, device=device)
            correct = probe.predict(h).cpu() == labels
            result[name][severity] = float(correct.double().mean())
    return result


def robust_accuracy(
    encoder: nn.Module,
    probe: FittedProbe,
    data: ImageData,
    *,
    device: torch.device,
    attack: Attack,
    eps: float,
    steps: int = 10,
    seed: int = 0,
    batch_size: int = 256,
) -> float:
    """Accuracy of ``probe`` on the frozen encoder under an L∞ attack on the test images.

    The classifier is composed end to end and differentiable: pixels in [0, 1] → ``(x - mean)
    / std`` with ``data.mean``/``data.std`` → ``encoder`` (eval mode, restored afterwards) →
    ``probe.logits``. The attack maximises its cross-entropy with the true labels: one FGSM
    step of ``eps``, or PGD with ``steps`` steps of 2.5 ε / steps and a random start (Madry et
    al. 2018) drawn from a CPU generator seeded with ``seed`` (the same start on every device).
    ``eps`` is in [0, 1] pixel units (2/255 ≈ 0.0078 is a common CIFAR budget for such
    evaluations); ``eps = 0`` gives the clean accuracy.
    """
    if attack not in ("fgsm", "pgd"):
        raise ValueError(f"attack must be 'fgsm' or 'pgd', got {attack!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    images, labels = images_and_labels(data.test)
    if labels.numel() == 0:
        raise ValueError(f"data set {data.name!r} has no test images to attack")
    mean = torch.tensor(data.mean, device=device)[:, None, None]  # (C, 1, 1)
    std = torch.tensor(data.std, device=device)[:, None, None]  # (C, 1, 1)
    head = FittedProbe(*(t.to(device) for t in probe))
    generator = torch.Generator().manual_seed(seed)

    def classify(x: Tensor) -> Tensor:
        return head.logits(encoder((x - mean) / std))  # (B, K)

    correct = torch.zeros((), dtype=torch.long, device=device)
    with eval_mode(encoder):
        for chunk, chunk_y in zip(
            torch.split(images, batch_size), torch.split(labels, batch_size), strict=True
        ):
            x = chunk.to(device).float().div_(255)  # (B, C, H, W) in [0, 1]
            y = chunk_y.to(device)  # (B,)

            def loss_fn(x_adv: Tensor, y: Tensor = y) -> Tensor:
                return F.cross_entropy(classify(x_adv).float(), y)

            if attack == "fgsm":
                x_adv = fgsm_contrastive(loss_fn, x, eps=eps)
            else:
                x_adv = pgd_contrastive(loss_fn, x, eps=eps, steps=steps, generator=generator)
            with torch.no_grad():
                correct += (classify(x_adv).argmax(dim=1) == y).sum()
    return int(correct) / labels.numel()


def probe_with_labels_per_class(
    train_h: Tensor,
    train_y: Tensor,
    test_h: Tensor,
    test_y: Tensor,
    per_class: int,
    *,
    seed: int,
) -> float:
    """Linear-probe accuracy with only ``per_class`` labelled training images of each class.

    The subset is class-balanced and seeded; with fewer than 2 per class the weight decay is
    fixed (1e-3) instead of chosen on a held-out part.
    """
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for label in torch.unique(train_y):
        members = (train_y == label).nonzero().squeeze(1)
        order = torch.randperm(members.numel(), generator=generator)
        chosen.append(members[order[:per_class]])
    keep = torch.cat(chosen)
    if per_class < 5:  # too few to hold any out per class
        result = linear_probe(
            train_h[keep], train_y[keep], test_h, test_y, weight_decay=1e-3, val_fraction=0.0
        )
    else:
        result = linear_probe(train_h[keep], train_y[keep], test_h, test_y, seed=seed)
    return result.accuracy


def evaluate_encoder(
    encoder: nn.Module,
    data: ImageData,
    *,
    device: torch.device,
    seed: int = 0,
    knn_k: Sequence[int] = (20, 200),
    labels_per_class: Sequence[int] = (),
    corruptions: Sequence[str] = (),
    severities: Sequence[int] = (1, 2, 3, 4, 5),
    views: SimCLRViews | None = None,
    attack: Attack | None = None,
    eps: float = 2 / 255,
    attack_steps: int = 10,
) -> dict[str, Any]:
    """Every number of ``imagecl eval`` for a frozen encoder; accuracies are fractions.

    Keys: ``linear_probe_accuracy``, ``knn{k}_accuracy``, ``feature_std``, with ``views``
    also ``alignment``/``uniformity`` (two augmented views of each test image),
    ``probe_{n}_per_class_accuracy``, with ``corruptions`` a nested ``corruptions`` table
    plus ``corruption_mean_accuracy``, and with ``attack`` ``{attack}_robust_accuracy``: the
    probe under that attack with budget ``eps`` (pixel units; :func:`robust_accuracy`).
    """
    if data.num_classes < 2 or len(data.test) == 0:
        raise ValueError(f"data set {data.name!r} has no labelled test split to evaluate on")
    train_x, train_y = images_and_labels(data.train)
    test_x, test_y = images_and_labels(data.test)
    train_h = encode(encoder, train_x, data.mean, data.std, device=device)
    test_h = encode(encoder, test_x, data.mean, data.std, device=device)
    out: dict[str, Any] = {"feature_std": check_not_collapsed(test_h, "evaluation")}
    probe = linear_probe(train_h, train_y, test_h, test_y, seed=seed)
    out["linear_probe_accuracy"] = probe.accuracy
    if attack is not None:
        assert probe.model is not None
        out[f"{attack}_robust_accuracy"] = robust_accuracy(
            encoder,
            probe.model,
            data,
            device=device,
            attack=attack,
            eps=eps,
            steps=attack_steps,
            seed=seed,
        )
    for k in knn_k:
        k_used = min(k, train_h.shape[0])
        out[f"knn{k}_accuracy"] = knn_probe(train_h, train_y, test_h, test_y, k=k_used)
    for per_class in labels_per_class:
        out[f"probe_{per_class}_per_class_accuracy"] = probe_with_labels_per_class(
            train_h, train_y, test_h, test_y, per_class, seed=seed
        )
    if views is not None:
        out.update(alignment_uniformity(*encode_views(encoder, test_x, views, device, seed)))
    if corruptions:
        assert probe.model is not None
        table = corruption_accuracy(
            encoder,
            probe.model,
            data,
            device=device,
            corruptions=corruptions,
            severities=severities,
            seed=seed,
        )
        out["corruptions"] = table
        values = [acc for per in table.values() for acc in per.values()]
        out["corruption_mean_accuracy"] = sum(values) / len(values) if values else math.nan
    return out


@torch.no_grad()
def encode_float(encoder: nn.Module, x: Tensor, batch_size: int = 512) -> Tensor:
    """Features of already normalised float images, eval mode, on the CPU.

    Shape:
        x: ``(N, C, H, W)`` float; result: ``(N, D)``.
    """
    with eval_mode(encoder):
        return torch.cat([encoder(chunk).float().cpu() for chunk in torch.split(x, batch_size)])


def encode_views(
    encoder: nn.Module,
    images: Tensor,
    views: SimCLRViews,
    device: torch.device,
    seed: int,
    batch_size: int = 512,
) -> tuple[Tensor, Tensor]:
    """Features of two augmented views of every image, chunk by chunk like :func:`encode`, so
    the device holds ``batch_size`` images' views at a time, not the whole split's.

    The views are drawn from one generator seeded with ``seed``, chunk after chunk.

    Shape:
        images: ``(N, C, H, W)`` uint8; result: two ``(N, D)`` float32 on the CPU.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    z1, z2 = [], []
    for chunk in torch.split(images, batch_size):
        with torch.no_grad():
            pair = views(chunk.to(device), generator=generator)  # (B, 2, C, S, S)
        z1.append(encode_float(encoder, pair[:, 0]))  # (B, D)
        z2.append(encode_float(encoder, pair[:, 1]))
    return torch.cat(z1), torch.cat(z2)  # (N, D) each


def make_monitor(
    data: ImageData, device: torch.device, *, seed: int, where: str, max_images: int = 5000
) -> Evaluate | None:
    """The loop's ``evaluate``: kNN accuracy (k = 20) of h on the test split, and a collapse
    check (a clear error, naming ``where``, when every image maps to the same point); none
    without a labelled test split.

    Each split is cut to ``max_images`` by a class-stratified subset seeded with ``seed``
    (:func:`imagecl.data.stratified_subset`), chosen once: image folders are ordered by class,
    and their first ``max_images`` would hold the first classes only.
    """
    if data.num_classes < 2 or len(data.test) == 0:
        return None
    train_x, train_y = _monitor_subset(data.train, max_images, seed=seed)
    test_x, test_y = _monitor_subset(data.test, max_images, seed=seed)

    def evaluate(model: nn.Module) -> dict[str, float]:
        backbone = model.backbone
        assert isinstance(backbone, nn.Module)
        train_h = encode(backbone, train_x, data.mean, data.std, device=device)
        test_h = encode(backbone, test_x, data.mean, data.std, device=device)
        spread = check_not_collapsed(test_h, where)
        k = min(20, train_h.shape[0])
        accuracy = knn_probe(train_h, train_y, test_h, test_y, k=k)
        return {"knn20_acc": accuracy, "feature_std": spread}

    return evaluate


def _monitor_subset(split: ImageDataset, max_images: int, *, seed: int) -> tuple[Tensor, Tensor]:
    """At most ``max_images`` images of ``split`` and their labels, class-stratified."""
    images, labels = images_and_labels(split)
    keep = stratified_subset(labels, max_images, seed=seed)  # (M,)
    return images[keep], labels[keep]
