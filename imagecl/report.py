"""Run folders and pictures shared by the ``imagecl`` commands (train, eval, finetune)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from imagecl.augment import SimCLRViews
from imagecl.data import ImageData, images_and_labels
from shared.plots import plot_loss_curves, save_image_grid
from shared.runs import RunDir
from shared.runs import open_run as shared_open_run
from shared.runtime import SINGLE_PROCESS, DistEnv

__all__ = ["open_run", "plot_training_curves", "save_views_grid", "unnormalize"]

# metrics.csv columns worth a panel, in this order, when present
CURVES = ("loss", "contrastive_loss", "train_acc", "probe_acc", "classifier_acc", "knn20_acc")


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
    if not keys:
        return None
    return plot_loss_curves(run.metrics_path, run.plots / "training.png", keys=keys)


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
