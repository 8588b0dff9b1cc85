"""Run folders, plots and report sections of the ``imagecl`` commands (train, eval, finetune).

:func:`finish_run` closes a training run: it exports the encoder, evaluates it
(:mod:`imagecl.evaluate`), plots, and writes ``summary.json`` and ``report.md``; the sections
and plots of ``imagecl eval`` (attacks, corruptions) are here as well.
"""

from __future__ import annotations

import copy
import csv
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from imagecl.attacks import Attack
from imagecl.augment import SimCLRViews
from imagecl.config import Config
from imagecl.data import ImageData, images_and_labels, skipped_summary
from imagecl.dual_bn import revert_dual_bn
from imagecl.evaluate import encode, evaluate_encoder
from imagecl.loco_model import LoCoModel
from imagecl.models import Built
from imagecl.networks import ImageModel
from shared.checkpoint import export_encoder
from shared.plots import plot_loss_curves, plot_tsne, save_figure, save_image_grid
from shared.runs import RunDir, write_report, write_summary
from shared.runs import open_run as shared_open_run
from shared.runtime import SINGLE_PROCESS, DistEnv, unwrap

__all__ = [
    "RUN_ATTACK_EPS",
    "RUN_ATTACK_STEPS",
    "StageReadout",
    "attack_section",
    "corruption_table",
    "describe_run",
    "finish_run",
    "open_run",
    "plot_accuracies",
    "plot_severity",
    "plot_training_curves",
    "readout_table",
    "save_views_grid",
    "skipped_section",
    "stage_readouts",
    "unnormalize",
]

# metrics.csv columns worth a panel, in this order, when present; LoCo's unit{k}_loss follow
CURVES = (
    "loss",
    "contrastive_loss",
    "adversarial_loss",
    "train_acc",
    "probe_acc",
    "classifier_acc",
    "knn20_acc",
)
UNIT_LOSS = re.compile(r"unit\d+_loss")
# An adversarial run's own robustness check: PGD-10 at 2/255 in [0, 1] pixel units, what
# `imagecl eval --attack pgd` and benchmarks/imagecl_robust_results.py use by default.
RUN_ATTACK_EPS = 2 / 255
RUN_ATTACK_STEPS = 10


def open_run(
    out: Path | None, kind: str, *, resume: bool = False, env: DistEnv = SINGLE_PROCESS
) -> RunDir:
    """The run folder: ``out``, or ``runs/imagecl/<kind>-<time>`` (see ``shared.runs.open_run``)."""
    return shared_open_run(out, Path("runs") / "imagecl" / kind, resume=resume, rank=env.rank)


def plot_training_curves(run: RunDir) -> Path | None:
    """One panel per metric of :data:`CURVES` that the run logged."""
    if not run.metrics_path.is_file():
        return None
    with run.metrics_path.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), [])
    keys = [key for key in CURVES if key in header]
    keys += [key for key in header if UNIT_LOSS.fullmatch(key)]  # LoCo: one per local unit
    if not keys:
        return None
    return plot_loss_curves(run.metrics_path, run.plots / "training.png", keys=keys)


class StageReadout(nn.Module):
    """The pooled output of one stage of a LoCo model, as an encoder for evaluation."""

    def __init__(self, model: LoCoModel, stage: int) -> None:
        super().__init__()
        self.model, self.stage = model, stage

    def forward(self, x: Tensor) -> Tensor:
        return self.model.readout(x, self.stage)  # (N, C_stage)


def unnormalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Back to [0, 1] for display; the first 3 channels (1 for grayscale).

    Shape:
        x: ``(N, C, H, W)`` normalised float; result: ``(N, 1 or 3, H, W)``.
    """
    channels = 1 if x.shape[1] < 3 else 3
    m = torch.tensor(mean[:channels], device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std[:channels], device=x.device).view(1, -1, 1, 1)
    return (x[:, :channels] * s + m).clamp(0, 1)


@torch.no_grad()
def save_views_grid(
    views: SimCLRViews,
    data: ImageData,
    path: Path,
    *,
    seed: int,
    device: torch.device,
    count: int = 8,
) -> Path:
    """Rows: ``count`` images, then each of their augmented views (the same seed every time)."""
    source = data.test if len(data.test) else data.pretrain
    images, _ = images_and_labels(source)
    images = images[:count].to(device)  # (n, C, H, W) uint8
    generator = torch.Generator(device=device).manual_seed(seed)
    x = views(images, generator=generator)  # (n, V, C, S, S)
    raw = images[:, : x.shape[2]].float().div(255)
    if raw.shape[-1] != x.shape[-1]:
        raw = torch.nn.functional.interpolate(raw, size=x.shape[-2:], mode="nearest")
    rows = [raw[:, :3] if raw.shape[1] >= 3 else raw[:, :1]]
    rows += [unnormalize(x[:, v], data.mean, data.std) for v in range(x.shape[1])]
    grid = torch.cat(rows)  # ((V + 1)·n, 1 or 3, S, S)
    scale = max(1, 96 // grid.shape[-1])
    grid = torch.nn.functional.interpolate(grid, scale_factor=scale, mode="nearest")
    return save_image_grid(grid.cpu(), path, nrow=images.shape[0])


def stage_readouts(
    model: LoCoModel, data: ImageData, *, device: torch.device, seed: int, last: float | None = None
) -> list[float]:
    """Linear-probe accuracy of the pooled output of every stage, first to last (LoCo's readout).

    ``last``: the accuracy of the whole backbone when already measured; the last stage's
    readout is the backbone's h, so its probe is not fit twice.
    """
    accuracies = []
    for stage in range(len(model.stages)):
        if stage == len(model.stages) - 1 and last is not None:
            accuracies.append(last)
            continue
        numbers = evaluate_encoder(
            StageReadout(model, stage), data, device=device, seed=seed, knn_k=()
        )
        accuracies.append(numbers["linear_probe_accuracy"])
    return accuracies


def readout_table(model: LoCoModel, accuracies: Sequence[float]) -> str:
    """Markdown: per stage, its width and the readout probe accuracy."""
    lines = ["| stage | channels | readout probe accuracy (%) |", "|---|---|---|"]
    for stage, (dim, accuracy) in enumerate(zip(model.stage_dims, accuracies, strict=True)):
        lines.append(f"| {stage + 1} | {dim} | {100 * accuracy:.1f} |")
    return "\n".join(lines)


def plot_accuracies(
    accuracies: Mapping[str, float], path: Path, *, xlabel: str, title: str = ""
) -> Path:
    """One bar per accuracy (a fraction, drawn in %), its value written above it."""
    from matplotlib.figure import Figure

    names, values = list(accuracies), [100 * v for v in accuracies.values()]
    fig = Figure(figsize=(1.2 * len(names) + 2.0, 3.2))
    ax = fig.subplots()
    bars = ax.bar(names, values, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("linear-probe accuracy (%)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def finish_run(
    run: RunDir, cfg: Config, built: Built, steps: int, device: torch.device
) -> dict[str, Any]:
    """Export the encoder, evaluate it, plot, and write ``summary.json`` and ``report.md``.

    LoCo runs add the readout of every stage (``stage{k}_probe_accuracy``, plot
    ``loco_readout.png``); adversarial runs (CLAE) the probe's accuracy under PGD
    (``pgd_robust_accuracy``, plot ``robust_accuracy.png``).
    """
    model = unwrap(built.model)
    assert isinstance(model, ImageModel | LoCoModel)
    # a CLAE backbone's adversarial batch-norm twins are a training device: the export holds
    # the clean branch only, so it loads into the plain backbone of the same architecture
    export_encoder(
        revert_dual_bn(copy.deepcopy(model.backbone)),
        run.path / "encoder.safetensors",
        metadata={"backbone": cfg.backbone, "method": cfg.method, "data": cfg.data},
    )
    data = built.data
    summary: dict[str, Any] = {
        "method": cfg.method,
        "data": cfg.data,
        "steps": steps,
        "skipped": len(data.skipped),
    }
    sections = {"Run": describe_run(cfg, data)}
    sections.update(skipped_section(data, run))
    if data.num_classes >= 2 and len(data.test):
        sections.update(_evaluate_into(summary, run, cfg, model, data, device))
        test_x, test_y = images_and_labels(data.test)
        test_h = encode(model.backbone, test_x, data.mean, data.std, device=device)
        plot_tsne(test_h, test_y, run.plots / "tsne_h.png", seed=cfg.seed, num_threads=1)
    plot_training_curves(run)
    save_views_grid(built.views, data, run.plots / "views.png", seed=cfg.seed, device=device)
    write_summary(run.summary_path, summary)
    write_report(run, f"imagecl train: {cfg.method} on {cfg.data}", sections, summary=summary)
    return summary


def _evaluate_into(
    summary: dict[str, Any],
    run: RunDir,
    cfg: Config,
    model: ImageModel | LoCoModel,
    data: ImageData,
    device: torch.device,
) -> dict[str, str]:
    """The frozen-encoder numbers into ``summary``, their plots, and report sections."""
    adversarial = cfg.is_adversarial
    numbers = evaluate_encoder(
        model.backbone,
        data,
        device=device,
        seed=cfg.seed,
        attack="pgd" if adversarial else None,
        eps=RUN_ATTACK_EPS,
        attack_steps=RUN_ATTACK_STEPS,
    )
    summary.update(numbers)
    sections: dict[str, str] = {}
    clean = numbers["linear_probe_accuracy"]
    if adversarial:
        robust = numbers["pgd_robust_accuracy"]
        label = f"PGD-{RUN_ATTACK_STEPS}, ε = {255 * RUN_ATTACK_EPS:.3g}/255"
        plot_accuracies(
            {"clean": clean, label: robust},
            run.plots / "robust_accuracy.png",
            xlabel="test images",
            title=f"{cfg.method}: clean and robust probe accuracy",
        )
        sections["Adversarial robustness"] = attack_section(
            "pgd", RUN_ATTACK_EPS, RUN_ATTACK_STEPS, clean=clean, robust=robust
        )
    if isinstance(model, LoCoModel):  # the readout of every stage (LoCo's table)
        accuracies = stage_readouts(model, data, device=device, seed=cfg.seed, last=clean)
        for stage, accuracy in enumerate(accuracies):
            summary[f"stage{stage}_probe_accuracy"] = accuracy
        plot_accuracies(
            {f"stage {k + 1}": a for k, a in enumerate(accuracies)},
            run.plots / "loco_readout.png",
            xlabel="readout after stage",
            title=f"{_loco_kind(model)}: linear probe on each stage's pooled output",
        )
        sections["Readout per stage"] = (
            f"{_loco_kind(model)}: a linear probe on the globally pooled output of each stage "
            "(frozen, un-augmented images; the last stage is the backbone's h).\n\n"
            + readout_table(model, accuracies)
        )
    return sections


def skipped_section(data: ImageData, run: RunDir) -> dict[str, str]:
    """The report's "Skipped files" section when image files could not be read, else none."""
    line = skipped_summary(data, run.skipped_path.name)
    return {} if line is None else {"Skipped files": line}


def _loco_kind(model: LoCoModel) -> str:
    if model.end_to_end:
        return "end-to-end SimCLR"
    return "LoCo (overlap 1)" if model.overlap else "Greedy InfoMax (overlap 0)"


def describe_run(cfg: Config, data: ImageData) -> str:
    """Markdown: what the run trained, on what, with which settings."""
    text = (
        f"{cfg.method} with a {cfg.backbone} backbone on {data.name} ({len(data.train)} train / "
        f"{len(data.test)} test images, {data.channels}×{data.image_size}×{data.image_size}), "
        f"batch {cfg.batch_size}, {cfg.optimizer} lr {cfg.lr}, τ = {cfg.tau}, "
        f"{cfg.num_views} view(s) per image ({cfg.augment_preset(data.channels)} augmentation). "
    )
    if cfg.method == "loco":
        kind = "end to end (one unit)" if cfg.end_to_end else f"overlap {cfg.overlap}"
        text += (
            f"Local units: {cfg.stages} stages, {kind}, decoder depth {cfg.decoder_depth}, a "
            "pooled MLP head and NT-Xent per unit. "
        )
    if cfg.is_adversarial:
        attack = "FGSM" if cfg.adv_steps == 1 else f"PGD-{cfg.adv_steps}"
        text += (
            f"Adversarial views (CLAE): {attack} from view 1 with ε = {cfg.adv_eps} in [0, 1] "
            f"pixel units, loss + {cfg.adv_alpha}·L(x1, x_adv), "
            + ("a separate adversarial batch norm. " if cfg.adv_bn else "shared batch norm. ")
        )
    return text + (
        "The linear probe is fit on frozen h of the training split (weight decay chosen on a "
        "held-out part of it) and scored once on the test split."
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
    return save_figure(fig, path)
