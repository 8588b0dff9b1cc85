"""``imagecl eval``: every number of a trained encoder, its plots and a report.

Linear probe, kNN, low-label probes, alignment/uniformity, corruptions and (with ``--attack``)
robust accuracy, all from :func:`imagecl.evaluate.evaluate_encoder`, in a folder beside the
run (``<run>/eval-<time>`` unless ``--out``).
"""

from __future__ import annotations

import time
from typing import Any

from imagecl.augment import SimCLRViews
from imagecl.config import EvalConfig
from imagecl.corruptions import CORRUPTIONS
from imagecl.data import images_and_labels, report_skipped_images
from imagecl.evaluate import encode, evaluate_encoder
from imagecl.models import load_trained
from imagecl.report import (
    attack_section,
    corruption_table,
    open_run,
    plot_accuracies,
    plot_severity,
    save_views_grid,
    skipped_section,
)
from shared.config import parse_config, save_config
from shared.plots import plot_tsne
from shared.runs import write_report, write_summary
from shared.runtime import runs_on_this_rank, select_device

__all__ = ["PROTOCOL", "main"]

PROTOCOL = (
    "Linear probe: L2-regularised logistic regression on frozen h of un-augmented training "
    "images (weight decay chosen on a held-out 10 % of train), scored once on the test split. "
    "kNN: cosine, weighted (InstDisc). Low-label probes: n labelled images per class, "
    "class-balanced and seeded. Corruptions: the fitted probe on corrupted test images, "
    "severities 1-5 with the CIFAR-10-C parameters."
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl eval --checkpoint RUN/checkpoints/last.pt``: every number, plots, a report."""
    cfg = parse_config(EvalConfig, argv, prog="imagecl eval")
    if not runs_on_this_rank("imagecl eval"):  # one process: under torchrun, rank 0 alone
        return {}
    device = select_device(cfg.device)
    trained_cfg, data, model = load_trained(cfg.checkpoint, data_root=cfg.data_root, device=device)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = cfg.out or cfg.checkpoint.resolve().parent.parent / f"eval-{stamp}"
    run = open_run(out, "eval")
    save_config(cfg, run.path)
    report_skipped_images(data, run)  # skipped.csv and one line
    views = SimCLRViews(
        data.image_size, data.mean, data.std, "simclr_cifar" if data.channels > 1 else "small_gray"
    ).to(device)
    numbers = evaluate_encoder(
        model.backbone,
        data,
        device=device,
        seed=cfg.seed,
        knn_k=cfg.knn_k,
        labels_per_class=cfg.labels_per_class,
        views=views,
        corruptions=CORRUPTIONS if cfg.corruptions else (),
        severities=cfg.severities,
        attack=cfg.attack,
        eps=cfg.eps,
        attack_steps=cfg.attack_steps,
    )
    table = numbers.pop("corruptions", None)
    summary = {
        "method": trained_cfg.method,
        "data": trained_cfg.data,
        "skipped": len(data.skipped),
        **numbers,
    }
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
            {"clean": clean, label: robust},
            run.plots / "robust_accuracy.png",
            xlabel="test images",
            title=f"{trained_cfg.method}: clean and robust probe accuracy",
        )
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
