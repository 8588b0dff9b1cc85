"""``contragan evaluate``: offline metrics of a trained generator next to real-vs-real.

The protocol is :func:`contragan.evaluate.evaluate_generator`'s: per seed one sample per test
image with its class, every figure (FD, KID, precision/recall, density/coverage, GAN-test, CAS,
per-class FD) in the feature space of a classifier trained on the real training split, each
next to the same figure with real training images in place of the samples. The extractor is
trained once per data set and cached (``--cache-dir``); below ``--min-extractor-accuracy`` on
the test split evaluation refuses. ``--inception-weights PATH`` adds the Inception FID of
torchmetrics from weights on disk (nothing downloads).

Writes ``summary.json`` (``<metric>``/``<metric>_std`` over seeds and ``real_<metric>``/
``real_<metric>_std``), ``report.md`` with the table, plots (per-class FD, a sample grid) and
``skipped.csv`` (image files that could not be read) into ``--out`` (default: ``evaluation/``
inside the run folder); a folder that already holds files is refused, never overwritten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contragan.config import EVALUATE_QUICK, EvaluateConfig
from contragan.data import load_data, report_skipped_images
from contragan.evaluate import evaluate_generator, figures_summary
from contragan.extractor_cache import load_or_train_extractor
from contragan.models import load_generator
from contragan.report import (
    plot_intra_fd,
    results_table,
    save_class_grid,
    write_evaluation_report,
)
from shared.config import parse_config
from shared.runs import RunDir, write_summary
from shared.runtime import runs_on_this_rank, select_device

__all__ = ["main"]


def _open_out(path: Path) -> RunDir:
    """The evaluation's folder, created; one that already holds files is refused, as every
    command refuses to mix two runs' files (:meth:`shared.runs.RunDir.create`)."""
    path = path.expanduser().resolve()
    try:
        return RunDir.create(path.parent.name, path.name, root=path.parent.parent)
    except FileExistsError:
        raise FileExistsError(
            f"{path} already holds files (an earlier evaluation?); pass --out DIR for a new "
            "folder, or delete it first"
        ) from None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``contragan evaluate --checkpoint RUN/checkpoints/last.pt [options]``."""
    cfg = parse_config(
        EvaluateConfig, argv, prog="contragan evaluate", presets={"quick": EVALUATE_QUICK}
    )
    if not runs_on_this_rank("contragan evaluate"):  # one process: under torchrun, rank 0 alone
        return {}
    assert cfg.checkpoint is not None  # EvaluateConfig requires it
    if cfg.inception_weights is not None and not cfg.inception_weights.expanduser().is_file():
        raise FileNotFoundError(f"--inception-weights {cfg.inception_weights} does not exist")
    device = select_device(cfg.device)
    train_cfg, arch, generator = load_generator(cfg.checkpoint, device=device, ema=cfg.ema)
    out = _open_out(cfg.out or Path(cfg.checkpoint).resolve().parent.parent / "evaluation")
    data = load_data(
        train_cfg.data,
        root=cfg.data_root or train_cfg.data_root,
        seed=train_cfg.seed,
        image_size=train_cfg.image_size,
    )
    cached = load_or_train_extractor(
        data,
        train_cfg.data,
        cache_dir=cfg.cache_dir,
        seed=cfg.seed,
        device=device,
        min_accuracy=cfg.min_extractor_accuracy,
        epochs=cfg.extractor_epochs,
        data_seed=train_cfg.seed,
    )
    # after the extractor's refusal: a refused evaluation leaves no file that blocks the next
    report_skipped_images(data, out)  # skipped.csv and one line
    evaluation = evaluate_generator(
        generator,
        data,
        cached.extractor,
        z_dim=arch.z_dim,
        seeds=[cfg.seed + i for i in range(cfg.seeds)],
        cas_epochs=cfg.cas_epochs,
        device=device,
        cas_samples=cfg.cas_samples,
        inception_weights=cfg.inception_weights,
    )
    summary: dict[str, Any] = {
        "checkpoint": str(cfg.checkpoint),
        "data": train_cfg.data,
        "loss": train_cfg.loss,
        "seeds": evaluation.num_seeds,
        "cas_samples": cfg.cas_samples,
        "skipped": len(data.skipped),
        "extractor_test_accuracy": cached.test_accuracy,
        **figures_summary(evaluation),
    }
    plot_intra_fd(evaluation.generated, evaluation.real, out.plots / "intra_class_fd.png")
    save_class_grid(generator, arch, out.plots / "samples.png", device=device, seed=cfg.seed)
    write_summary(out.summary_path, summary)
    write_evaluation_report(
        out,
        evaluation,
        summary,
        data=data,
        data_name=train_cfg.data,
        loss=train_cfg.loss,
        extractor_accuracy=cached.test_accuracy,
    )
    print(
        f"feature extractor: {cached.test_accuracy:.1%} on the {train_cfg.data} test split"
        f" ({cached.weights_path})"
    )
    print(results_table(evaluation.generated, evaluation.real))
    return summary
