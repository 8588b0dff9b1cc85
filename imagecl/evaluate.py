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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from imagecl.attacks import fgsm_contrastive, pgd_contrastive
from imagecl.augment import SimCLRViews, to_float
from imagecl.corruptions import CORRUPTIONS, corrupt
from imagecl.data import (
    ImageData,
    ImageDataset,
    images_and_labels,
    report_skipped_images,
    stratified_subset,
)
from shared.config import parse_config, save_config
from shared.plots import plot_tsne
from shared.probes import FittedProbe, alignment_uniformity, knn_probe, linear_probe
from shared.runs import write_report, write_summary
from shared.runtime import eval_mode, runs_on_this_rank, select_device

__all__ = [
    "CollapseError",
    "EvalConfig",
    "check_not_collapsed",
    "corruption_accuracy",
    "encode",
    "encode_views",
    "evaluate_encoder",
    "main",
    "make_monitor",
    "probe_with_labels_per_class",
    "robust_accuracy",
]

Attack = Literal["fgsm", "pgd"]

# Below this mean per-dimension std of the L2-normalised features, every image maps to nearly
# the same point: the representation has collapsed (measured on SupContrast's own code, digits,
# batch 256: lr 0.5 without warm-up does it to SupCon and SimCLR within 3 steps).
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
            encoder, probe.model, data, device=device, attack=attack, eps=eps,
            steps=attack_steps, seed=seed,
        )  # fmt: skip
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
            encoder, probe.model, data, device=device, corruptions=corruptions,
            severities=severities, seed=seed,
        )  # fmt: skip
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


def make_monitor(cfg: Any, data: ImageData, device: torch.device, max_images: int = 5000) -> Any:
    """The loop's ``evaluate``: kNN accuracy (k = 20) of h on the test split, and a collapse
    check (a clear error when every image maps to the same point).

    Each split is cut to ``max_images`` by a class-stratified subset seeded with ``cfg.seed``
    (:func:`imagecl.data.stratified_subset`), chosen once: image folders are ordered by class,
    and their first ``max_images`` would hold the first classes only.
    """
    if data.num_classes < 2 or len(data.test) == 0:
        return None
    train_x, train_y = _monitor_subset(data.train, max_images, seed=cfg.seed)
    test_x, test_y = _monitor_subset(data.test, max_images, seed=cfg.seed)

    def evaluate(model: nn.Module) -> dict[str, float]:
        backbone = model.backbone
        assert isinstance(backbone, nn.Module)
        train_h = encode(backbone, train_x, data.mean, data.std, device=device)
        test_h = encode(backbone, test_x, data.mean, data.std, device=device)
        spread = check_not_collapsed(test_h, f"imagecl train ({cfg.method})")
        k = min(20, train_h.shape[0])
        accuracy = knn_probe(train_h, train_y, test_h, test_y, k=k)
        return {"knn20_acc": accuracy, "feature_std": spread}

    return evaluate


def _monitor_subset(split: ImageDataset, max_images: int, *, seed: int) -> tuple[Tensor, Tensor]:
    """At most ``max_images`` images of ``split`` and their labels, class-stratified."""
    images, labels = images_and_labels(split)
    keep = stratified_subset(labels, max_images, seed=seed)  # (M,)
    return images[keep], labels[keep]


@dataclass(frozen=True)
class EvalConfig:
    """Evaluate a trained encoder: linear probe, kNN, alignment/uniformity, corruptions."""

    # group: data
    checkpoint: Path  # a training run's checkpoints/last.pt (or best.pt) to evaluate (required)
    data_root: Path | None = None  # where the run's data set lies now, if not where it was trained
    # group: run
    out: Path | None = None  # evaluation folder; none: <run>/eval-<time>
    # group: method
    corruptions: bool = True
    """also score the probe on corrupted test images (the CIFAR-10-C protocol)"""
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)  # corruption severities to test, each in 1..5
    labels_per_class: tuple[int, ...] = (1, 5, 10)
    """also fit the probe on only n labelled images per class (the low-label regime), each >= 1"""
    knn_k: tuple[int, ...] = (20, 200)
    """neighbours of the weighted cosine kNN classifier (InstDisc: 20 and 200), each >= 1"""
    attack: Attack | None = None
    """probe accuracy under an L∞ attack on the frozen encoder: fgsm or pgd; none: no attack"""
    eps: float = field(
        default=2 / 255,
        metadata={"help": "attack budget in [0, 1] pixel units (0.00784 = 2/255, 0.0314 = 8/255)"},
    )
    attack_steps: int = 10  # PGD steps, >= 1 (step size 2.5·eps / steps, Madry et al.)
    # group: run
    seed: int = 0  # random seed of the probe's split and the views; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        if any(not 1 <= s <= 5 for s in self.severities):
            raise ValueError(f"severities must lie in 1..5, got {self.severities}")
        if any(n < 1 for n in (*self.labels_per_class, *self.knn_k)):
            raise ValueError("labels_per_class and knn_k must be >= 1")
        if not (math.isfinite(self.eps) and 0.0 <= self.eps <= 1.0):
            raise ValueError(f"eps must lie in [0, 1] (pixel units), got {self.eps}")
        if self.attack_steps < 1:
            raise ValueError(f"attack_steps must be >= 1, got {self.attack_steps}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl eval --checkpoint RUN/checkpoints/last.pt``: every number, plots, a report."""
    # imagecl.train and imagecl.report import this module
    from imagecl.report import open_run, plot_accuracies, save_views_grid, skipped_section
    from imagecl.train import load_trained

    cfg = parse_config(EvalConfig, argv, prog="imagecl eval")
    if not runs_on_this_rank("imagecl eval"):  # one process: under torchrun, rank 0 alone
        return {}
    device = select_device(cfg.device)
    trained_cfg, data, model = load_trained(cfg.checkpoint, data_root=cfg.data_root, device=device)
    out = (
        cfg.out or cfg.checkpoint.resolve().parent.parent / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    run = open_run(out, "eval")
    save_config(cfg, run.path)
    report_skipped_images(data, run)  # skipped.csv and one line
    views = SimCLRViews(
        data.image_size, data.mean, data.std, "simclr_cifar" if data.channels > 1 else "small_gray"
    ).to(device)
    numbers = evaluate_encoder(
        model.backbone, data, device=device, seed=cfg.seed, knn_k=cfg.knn_k,
        labels_per_class=cfg.labels_per_class, views=views,
        corruptions=CORRUPTIONS if cfg.corruptions else (), severities=cfg.severities,
        attack=cfg.attack, eps=cfg.eps, attack_steps=cfg.attack_steps,
    )  # fmt: skip
    table = numbers.pop("corruptions", None)
    summary = {
        "method": trained_cfg.method, "data": trained_cfg.data, "skipped": len(data.skipped),
        **numbers,
    }  # fmt: skip
    test_x, test_y = images_and_labels(data.test)
    test_h = encode(model.backbone, test_x, data.mean, data.std, device=device)
    plot_tsne(test_h, test_y, run.plots / "tsne_h.png", seed=cfg.seed, num_threads=1)
    save_views_grid(views, data, run.plots / "views.png", seed=cfg.seed, device=device)
    sections = {"Protocol": PROTOCOL, **skipped_section(data, run)}
    if cfg.attack is not None:
        clean, robust = numbers["linear_probe_accuracy"], numbers[f"{cfg.attack}_robust_accuracy"]
        sections["Adversarial robustness"] = attack_section(
            cfg.attack, cfg.eps, cfg.attack_steps, clean=clean, robust=robust
        )
        label = f"{cfg.attack.upper()}, ε = {255 * cfg.eps:.3g}/255"
        plot_accuracies(
            {"clean": clean, label: robust}, run.plots / "robust_accuracy.png",
            xlabel="test images", title=f"{trained_cfg.method}: clean and robust probe accuracy",
        )  # fmt: skip
    if table is not None:
        plot_severity(
            table, run.plots / "corruption_accuracy.png", clean=numbers["linear_probe_accuracy"]
        )
        sections["Corruptions"] = corruption_table(table)
        summary["corruption_accuracy"] = {
            name: [round(per[s], 4) for s in sorted(per)] for name, per in table.items()
        }
    write_summary(run.summary_path, summary)
    write_report(run, f"imagecl eval: {cfg.checkpoint}", sections, summary=summary)
    return summary


PROTOCOL = (
    "Linear probe: L2-regularised logistic regression on frozen h of un-augmented training "
    "images (weight decay chosen on a held-out 10 % of train), scored once on the test split. "
    "kNN: cosine, weighted (InstDisc). Low-label probes: n labelled images per class, "
    "class-balanced and seeded. Corruptions: the fitted probe on corrupted test images, "
    "severities 1-5 with the CIFAR-10-C parameters."
)


def attack_section(attack: Attack, eps: float, steps: int, *, clean: float, robust: float) -> str:
    """Markdown: the attack's settings and the probe's clean and robust accuracy."""
    how = (
        "one FGSM step"
        if attack == "fgsm"
        else f"PGD, {steps} steps of 2.5 ε / {steps}, random start in the ε-ball"
    )
    return (
        f"L∞ attack on the test images, ε = {eps:.5g} in [0, 1] pixel units ({255 * eps:.3g}/255), "
        f"{how}, maximising the cross-entropy of the linear probe on the frozen encoder "
        f"(pixels → normalise → encoder → probe, eval mode). Accuracy: clean "
        f"{100 * clean:.1f} %, under attack {100 * robust:.1f} %."
    )


def corruption_table(table: dict[str, dict[int, float]]) -> str:
    """Markdown: one row per corruption, one column per severity, and the row mean."""
    severities = sorted({s for per in table.values() for s in per})
    head = "| corruption | " + " | ".join(f"s{s}" for s in severities) + " | mean |"
    lines = [head, "|---" * (len(severities) + 2) + "|"]
    for name, per in table.items():
        cells = [f"{100 * per[s]:.1f}" for s in severities]
        mean = 100 * sum(per.values()) / len(per)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean:.1f} |")
    return "\n".join(lines)


def plot_severity(table: dict[str, dict[int, float]], path: Path, *, clean: float) -> Path:
    """Accuracy against severity, one line per corruption, the clean accuracy dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 3.6))
    ax = fig.subplots()
    for name, per in table.items():
        severities = sorted(per)
        ax.plot(severities, [100 * per[s] for s in severities], marker="o", label=name)
    ax.axhline(100 * clean, linestyle="--", color="gray", label="clean")
    ax.set_xlabel("severity")
    ax.set_ylabel("probe accuracy (%)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
