"""Run folders and pictures shared by the ``imagecl`` commands (train, eval, finetune)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from imagecl.augment import SimCLRViews
from imagecl.data import ImageData, images_and_labels
from imagecl.evaluate import encode, evaluate_encoder
from imagecl.loco import LoCoModel
from imagecl.models import ImageModel
from shared.checkpoint import export_encoder
from shared.plots import plot_loss_curves, plot_tsne, save_image_grid
from shared.runs import RunDir, write_report, write_summary
from shared.runs import open_run as shared_open_run
from shared.runtime import SINGLE_PROCESS, DistEnv, unwrap

__all__ = [
    "describe_run",
    "finish_run",
    "open_run",
    "plot_training_curves",
    "save_views_grid",
    "unnormalize",
]

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


def finish_run(
    run: RunDir, cfg: Any, built: Any, steps: int, device: torch.device
) -> dict[str, Any]:
    """Export the encoder, evaluate it, plot, and write ``summary.json`` and ``report.md``."""
    model = unwrap(built.model)
    assert isinstance(model, ImageModel | LoCoModel)
    export_encoder(
        model.backbone, run.path / "encoder.safetensors",
        metadata={"backbone": cfg.backbone, "method": cfg.method, "data": cfg.data},
    )  # fmt: skip
    summary: dict[str, Any] = {"method": cfg.method, "data": cfg.data, "steps": steps}
    data = built.data
    if data.num_classes >= 2 and len(data.test):
        numbers = evaluate_encoder(model.backbone, data, device=device, seed=cfg.seed)
        summary.update(numbers)
        if isinstance(model, LoCoModel):  # the readout of every stage (LoCo's table)
            for stage in range(len(model.stages)):
                readout = evaluate_encoder(
                    StageReadout(model, stage), data, device=device, seed=cfg.seed, knn_k=()
                )
                summary[f"stage{stage}_probe_accuracy"] = readout["linear_probe_accuracy"]
        test_x, test_y = images_and_labels(data.test)
        test_h = encode(model.backbone, test_x, data.mean, data.std, device=device)
        plot_tsne(test_h, test_y, run.plots / "tsne_h.png", seed=cfg.seed, num_threads=1)
    plot_training_curves(run)
    save_views_grid(built.views, data, run.plots / "views.png", seed=cfg.seed, device=device)
    write_summary(run.summary_path, summary)
    write_report(
        run, f"imagecl train: {cfg.method} on {cfg.data}",
        {"Run": describe_run(cfg, data)}, summary=summary,
    )  # fmt: skip
    return summary


def describe_run(cfg: Any, data: ImageData) -> str:
    return (
        f"{cfg.method} with a {cfg.backbone} backbone on {data.name} ({len(data.train)} train / "
        f"{len(data.test)} test images, {data.channels}×{data.image_size}×{data.image_size}), "
        f"batch {cfg.batch_size}, {cfg.optimizer} lr {cfg.lr}, τ = {cfg.tau}, "
        f"{cfg.num_views} view(s) per image ({cfg.augment_preset(data.channels)} augmentation). "
        "The linear probe is fit on frozen h of the training split (weight decay chosen on a "
        "held-out part of it) and scored once on the test split."
    )
