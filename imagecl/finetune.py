"""``imagecl finetune``: SimCLR's semi-supervised protocol, against training from scratch.

Chen et al. 2020 (Sec. 6, Table 7) fine-tune the whole pre-trained encoder with a linear
classifier on 1 % or 10 % of the labels (class-balanced). Here both networks — the pre-trained
encoder of a run and the same architecture at random initialisation — are trained with the same
labelled subset, augmentation (one view), optimizer, schedule and seed, and scored on the full
test split at the end of training (never a best epoch).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from imagecl.augment import to_float
from imagecl.data import ImageData, TensorImageDataset, images_and_labels, report_skipped_images
from imagecl.dual_bn import revert_dual_bn
from imagecl.report import open_run, plot_training_curves, skipped_section
from imagecl.train import Config, build, load_trained, train_step
from shared.config import parse_config, save_config
from shared.runs import RunDir, write_report, write_summary
from shared.runtime import runs_on_this_rank, select_device, unwrap
from shared.train import LoopConfig, fit

__all__ = ["ENCODER_FIELDS", "FinetuneConfig", "finetune_config", "label_subset", "main"]


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tune a pre-trained encoder on a fraction of the labels, against scratch."""

    # group: data
    checkpoint: Path  # a training run's checkpoints/last.pt whose encoder is fine-tuned (required)
    label_fraction: float = 0.1
    """class-balanced fraction of the training labels, in (0, 1] (SimCLR: 0.01 and 0.1)"""
    # group: optimisation
    steps: int = 300
    """optimizer steps, >= 1, whatever the subset's size (1 % of digits is 13 images)"""
    batch_size: int = 64  # labelled images per step, >= 1 (at most the subset's size)
    optimizer: Literal["sgd", "adam", "lars"] = "adam"  # sgd (momentum 0.9), adam or lars
    lr: float = 1e-3  # learning rate, > 0 (per 256 images for sgd and lars, as is for adam)
    weight_decay: float = 1e-5  # L2 weight decay, >= 0
    warmup_epochs: float = 0.0  # epochs of linear warm-up before the cosine decay, >= 0
    # group: method
    compare_scratch: bool = True
    """also train the same architecture from random initialisation on the same labels"""
    # group: data
    data_root: Path | None = None  # where the run's data set lies now, if not where it was trained
    # group: run
    out: Path | None = None  # run folder; none: runs/imagecl/finetune-<fraction>-<time>
    seed: int = 0  # random seed of the label subset, initialisation and augmentation
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        if not 0 < self.label_fraction <= 1:
            raise ValueError(f"label_fraction must be in (0, 1], got {self.label_fraction}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")


QUICK: dict[str, Any] = {"steps": 100}

# The fields of a training config that define the encoder and the images it reads; everything
# else (method, loss, views, adversarial views, queue, head, ...) concerns how it was trained.
ENCODER_FIELDS = ("data", "data_root", "image_size", "backbone", "cifar_stem", "width", "augment")


def finetune_config(
    trained: Config, cfg: FinetuneConfig, *, epochs: int, batch_size: int
) -> Config:
    """The cross-entropy config that fine-tunes (or trains from scratch) ``trained``'s encoder.

    Only :data:`ENCODER_FIELDS` come from the training run, so a run of any method (SimCLR with
    any loss or a queue, SupCon, CLAE, adversarial SupCon, LoCo, cross-entropy) gives the same
    network with a linear classifier; the optimisation comes from ``cfg``. ``cfg.data_root``
    overrides the recorded data location.

    Args:
        trained: the config of the training run whose encoder is fine-tuned.
        cfg: the fine-tuning settings.
        epochs: passes over the labelled subset (``cfg.steps`` caps the steps).
        batch_size: images per step (at most the subset's size).
    """
    encoder = {name: getattr(trained, name) for name in ENCODER_FIELDS}
    encoder["data_root"] = cfg.data_root or trained.data_root
    return Config(
        method="ce", **encoder, epochs=epochs, max_steps=cfg.steps, batch_size=batch_size,
        optimizer=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
        warmup_epochs=cfg.warmup_epochs, online_probe=False, seed=cfg.seed, device=cfg.device,
    )  # fmt: skip


def label_subset(labels: torch.Tensor, fraction: float, *, seed: int) -> torch.Tensor:
    """Indices of a class-balanced, seeded subset: ``round(fraction · n_c)`` (≥ 1) per class.

    Shape:
        labels: ``(N,)``; result: ``(M,)`` sorted indices.
    """
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for label in torch.unique(labels):
        members = (labels == label).nonzero().squeeze(1)  # (n_c,)
        take = max(1, round(fraction * members.numel()))
        chosen.append(members[torch.randperm(members.numel(), generator=generator)[:take]])
    return torch.cat(chosen).sort().values


@torch.no_grad()
def test_accuracy(model: torch.nn.Module, data: ImageData, device: torch.device) -> float:
    """Accuracy of the classifier on the whole test split, eval mode."""
    images, labels = images_and_labels(data.test)
    model.eval()
    correct = 0
    for chunk, y in zip(torch.split(images, 512), torch.split(labels, 512), strict=True):
        logits = model(to_float(chunk.to(device), data.mean, data.std)).logits
        correct += int((logits.argmax(1).cpu() == y).sum())
    return correct / labels.numel()


def _train_one(
    run: RunDir, train_cfg: Config, data: ImageData, device: torch.device, backbone: Any | None
) -> float:
    """Cross-entropy training of backbone + linear classifier; the test accuracy at the end."""
    built = build(train_cfg, device=device, data=data)
    model = unwrap(built.model)
    if backbone is not None:
        model.backbone.load_state_dict(backbone.state_dict())  # type: ignore[union-attr]
    step = functools.partial(train_step, cfg=train_cfg, views=built.views, gather=False)
    loop_cfg = LoopConfig(max_steps=train_cfg.max_steps, log_every=10, progress=False)
    fit(
        built.model, built.optimizer, built.loader, step, loop_cfg=loop_cfg, run_dir=run,
        device=device, scheduler=built.scheduler, config=train_cfg,
    )  # fmt: skip
    plot_training_curves(run)
    return test_accuracy(model, data, device)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl finetune --checkpoint RUN/checkpoints/last.pt --label-fraction 0.1``."""
    cfg = parse_config(FinetuneConfig, argv, prog="imagecl finetune", presets={"quick": QUICK})
    if not runs_on_this_rank("imagecl finetune"):  # one process: under torchrun, rank 0 alone
        return {}
    device = select_device(cfg.device)
    trained, data, pretrained = load_trained(cfg.checkpoint, data_root=cfg.data_root, device=device)
    run = open_run(cfg.out, f"finetune-{cfg.label_fraction:g}")
    save_config(cfg, run.path)
    report_skipped_images(data, run)  # skipped.csv and one line
    images, labels = images_and_labels(data.train)
    keep = label_subset(labels, cfg.label_fraction, seed=cfg.seed)
    subset = data._replace(train=TensorImageDataset(images[keep], labels[keep]))
    batch_size = min(cfg.batch_size, keep.numel())
    epochs = math.ceil(cfg.steps / (keep.numel() // batch_size))  # enough epochs for the steps
    train_cfg = finetune_config(trained, cfg, epochs=epochs, batch_size=batch_size)
    summary: dict[str, Any] = {
        "label_fraction": cfg.label_fraction, "labels": keep.numel(), "skipped": len(data.skipped),
    }  # fmt: skip
    # a CLAE run's backbone has dual batch norm: its clean branch is the encoder
    runs: dict[str, torch.nn.Module | None] = {"finetuned": revert_dual_bn(pretrained.backbone)}
    if cfg.compare_scratch:
        runs["scratch"] = None
    for name, backbone in runs.items():
        sub = RunDir.create(run.path.name, name, root=run.path.parent)
        summary[f"{name}_accuracy"] = _train_one(sub, train_cfg, subset, device, backbone)
    write_summary(run.summary_path, summary)
    write_report(
        run, f"imagecl finetune: {cfg.label_fraction:g} of the labels",
        {"Protocol": (__doc__ or "").split("\n\n", 1)[1], **skipped_section(data, run)},
        summary=summary,
    )  # fmt: skip
    return summary
