"""``imagecl finetune``: SimCLR's semi-supervised protocol, against training from scratch.

Chen et al. 2020 (Sec. 6, Table 7) fine-tune the whole pre-trained encoder with a linear
classifier on 1 % or 10 % of the labels (class-balanced). Here both networks — the pre-trained
encoder of a run and the same architecture at random initialisation — are trained with the same
labelled subset, augmentation (one view), optimizer, schedule and seed, and scored on the full
test split at the end of training (never a best epoch).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from imagecl.augment import to_float
from imagecl.config import FINETUNE_QUICK, Config, FinetuneConfig, finetune_config
from imagecl.data import ImageData, TensorImageDataset, images_and_labels, report_skipped_images
from imagecl.dual_bn import revert_dual_bn
from imagecl.models import build, load_trained
from imagecl.report import open_run, plot_training_curves, skipped_section
from imagecl.steps import make_step
from shared.config import parse_config, save_config
from shared.runs import RunDir, write_report, write_summary
from shared.runtime import runs_on_this_rank, select_device, unwrap
from shared.train import LoopConfig, fit

__all__ = ["label_subset", "main", "test_accuracy"]


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
    step = make_step(train_cfg, views=built.views, gather=False)
    loop_cfg = LoopConfig(max_steps=train_cfg.max_steps, log_every=10, progress=False)
    fit(
        built.model,
        built.optimizer,
        built.loader,
        step,
        loop_cfg=loop_cfg,
        run_dir=run,
        device=device,
        scheduler=built.scheduler,
        config=train_cfg,
    )
    plot_training_curves(run)
    return test_accuracy(model, data, device)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl finetune --checkpoint RUN/checkpoints/last.pt --label-fraction 0.1``."""
    cfg = parse_config(
        FinetuneConfig, argv, prog="imagecl finetune", presets={"quick": FINETUNE_QUICK}
    )
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
        "label_fraction": cfg.label_fraction,
        "labels": keep.numel(),
        "skipped": len(data.skipped),
    }
    # a CLAE run's backbone has dual batch norm: its clean branch is the encoder
    runs: dict[str, torch.nn.Module | None] = {"finetuned": revert_dual_bn(pretrained.backbone)}
    if cfg.compare_scratch:
        runs["scratch"] = None
    for name, backbone in runs.items():
        sub = RunDir.create(run.path.name, name, root=run.path.parent)
        summary[f"{name}_accuracy"] = _train_one(sub, train_cfg, subset, device, backbone)
    write_summary(run.summary_path, summary)
    write_report(
        run,
        f"imagecl finetune: {cfg.label_fraction:g} of the labels",
        {"Protocol": (__doc__ or "").split("\n\n", 1)[1], **skipped_section(data, run)},
        summary=summary,
    )
    return summary
