"""``contragan evaluate``: offline metrics of a trained generator next to real-vs-real.

The protocol (:mod:`contragan.metrics`): the real set is the data's test split; per seed the
generator draws one sample per test image with that image's class (so counts per class match),
and every figure — Fréchet distance and KID in the feature space of a classifier trained on the
real training split, precision/recall and density/coverage (k = 5), GAN-test accuracy, CAS and
per-class FD — is computed against it. The same figures with real training images in place of
the samples (:func:`contragan.metrics.real_vs_real`) are the baseline each is reported next to.
The extractor is trained once per data set and cached (``--cache-dir``); below
``--min-extractor-accuracy`` on the test split evaluation refuses. ``--inception-weights PATH``
adds the Inception FID of torchmetrics from weights on disk (nothing downloads).

Writes ``summary.json`` (``<metric>``/``<metric>_std`` over seeds and ``real_<metric>``/
``real_<metric>_std``), ``report.md`` with the table, plots (per-class FD, a sample grid) and
``skipped.csv`` (image files that could not be read) into ``--out`` (default: ``evaluation/``
inside the run folder); a folder that already holds files is refused, never overwritten.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from contragan.extractor_cache import load_or_train_extractor
from contragan.metrics import evaluate_samples, inception_fid, real_vs_real
from contragan.train import load_generator, save_class_grid
from imagecl.data import images_and_labels, load_data, report_skipped_images, skipped_summary
from shared.config import parse_config
from shared.runs import RunDir, write_report, write_summary
from shared.runtime import eval_mode, runs_on_this_rank, select_device

__all__ = ["Config", "generate", "main", "results_table"]

# the figures of the table, in order, with their direction
FIGURES = {
    "fd": "lower", "kid_mean": "lower", "precision": "higher", "recall": "higher",
    "density": "higher", "coverage": "higher", "gan_test_acc": "higher", "cas_acc": "higher",
    "intra_fd_mean": "lower",
}  # fmt: skip


@dataclass(frozen=True)
class Config:
    """Offline metrics of a contragan checkpoint, each next to its real-vs-real value."""

    # group: data
    checkpoint: Path | None = None  # a contragan run's checkpoints/last.pt (required)
    data_root: Path | None = None  # where the run's data set lies now, if not where it was trained
    # group: method
    seeds: int = 3
    """generated sets (and real-vs-real draws) to average, >= 1: seeds seed .. seed + seeds − 1"""
    ema: bool = True  # use the EMA generator when the run kept one
    # group: model
    cache_dir: Path = Path("runs/contragan/extractors")
    """folder where the trained feature extractors are cached, per data set"""
    min_extractor_accuracy: float = 0.95
    """refuse an extractor whose test accuracy is below this, in [0, 1]"""
    extractor_epochs: int = 12  # training epochs of the feature extractor, >= 1
    # group: method
    cas_epochs: int = 12  # epochs of the CAS classifier trained on generated images, >= 1
    # group: model
    inception_weights: Path | None = None
    """torch-fidelity's Inception weights on disk, for the Inception FID; none: skipped"""
    # group: run
    out: Path | None = None  # evaluation folder; none: <run>/evaluation; refused if it holds files
    seed: int = 0  # first seed of the generated sets and the extractor; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        for name in ("seeds", "extractor_epochs", "cas_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.min_extractor_accuracy <= 1.0:
            raise ValueError(
                f"min_extractor_accuracy must be in [0, 1], got {self.min_extractor_accuracy}"
            )


QUICK: dict[str, Any] = {"seeds": 1, "cas_epochs": 4}


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


def _mean_std(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def results_table(
    generated: dict[str, tuple[float, float]], real: dict[str, tuple[float, float]]
) -> str:
    """Markdown: every figure, generated (mean ± std) next to real-vs-real."""
    lines = ["| figure | better | generated | real vs real |", "|---|---|---|---|"]
    for key, better in FIGURES.items():
        g, r = generated[key], real[key]
        lines.append(f"| {key} | {better} | {g[0]:.4g} ± {g[1]:.2g} | {r[0]:.4g} ± {r[1]:.2g} |")
    return "\n".join(lines)


def _plot_intra_fd(
    generated: dict[str, tuple[float, float]], real: dict[str, tuple[float, float]], path: Path
) -> Path:
    from matplotlib.figure import Figure

    classes = sorted(int(k.split("/")[1]) for k in generated if k.startswith("intra_fd/"))
    fig = Figure(figsize=(max(4.0, 0.5 * len(classes) + 2), 3.2))
    ax = fig.subplots()
    width = 0.4
    bars = ((-width / 2, "generated", generated), (width / 2, "real vs real", real))
    for shift, label, source in bars:
        values = [source[f"intra_fd/{c}"][0] for c in classes]
        ax.bar([c + shift for c in classes], values, width, label=label)
    ax.set_xlabel("class")
    ax.set_ylabel("Fréchet distance within the class")
    ax.set_xticks(classes)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


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
    cfg = parse_config(Config, argv, prog="contragan evaluate", presets={"quick": QUICK})
    if not runs_on_this_rank("contragan evaluate"):  # one process: under torchrun, rank 0 alone
        return {}
    if cfg.checkpoint is None:
        raise ValueError("--checkpoint is required (a run's checkpoints/last.pt)")
    if cfg.inception_weights is not None and not cfg.inception_weights.expanduser().is_file():
        raise FileNotFoundError(f"--inception-weights {cfg.inception_weights} does not exist")
    device = select_device(cfg.device)
    train_cfg, arch, generator = load_generator(cfg.checkpoint, device=device, ema=cfg.ema)
    out = _open_out(cfg.out or Path(cfg.checkpoint).resolve().parent.parent / "evaluation")
    data = load_data(
        train_cfg.data, root=cfg.data_root or train_cfg.data_root, seed=train_cfg.seed,
        image_size=train_cfg.image_size,
    )  # fmt: skip
    cached = load_or_train_extractor(
        data, train_cfg.data, cache_dir=cfg.cache_dir, seed=cfg.seed, device=device,
        min_accuracy=cfg.min_extractor_accuracy, epochs=cfg.extractor_epochs,
    )  # fmt: skip
    # after the extractor's refusal: a refused evaluation leaves no file that blocks the next
    report_skipped_images(data, out)  # skipped.csv and one line
    test_images, test_labels = images_and_labels(data.test)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    runs = []
    for seed in seeds:
        fake = generate(generator, test_labels, z_dim=arch.z_dim, seed=seed, device=device)
        runs.append(
            evaluate_samples(
                cached.extractor,
                test_images,
                test_labels,
                fake,
                test_labels,
                test_images=test_images,
                test_labels=test_labels,
                seed=seed,
                cas_epochs=cfg.cas_epochs,
                device=device,
            )
        )
    generated = {key: _mean_std([run[key] for run in runs]) for key in runs[0]}
    real = real_vs_real(
        cached.extractor, data, seeds=seeds, cas_epochs=cfg.cas_epochs, device=device
    )
    summary: dict[str, Any] = {
        "checkpoint": str(cfg.checkpoint), "data": train_cfg.data, "loss": train_cfg.loss,
        "seeds": len(seeds), "skipped": len(data.skipped),
        "extractor_test_accuracy": cached.test_accuracy,
    }  # fmt: skip
    for key in generated:
        summary[key], summary[f"{key}_std"] = generated[key]
        summary[f"real_{key}"], summary[f"real_{key}_std"] = real[key]
    if cfg.inception_weights is not None:
        fake = generate(generator, test_labels, z_dim=arch.z_dim, seed=cfg.seed, device=device)
        summary["inception_fid"] = inception_fid(test_images, fake, cfg.inception_weights, device)
    _plot_intra_fd(generated, real, out.plots / "intra_class_fd.png")
    save_class_grid(generator, arch, out.plots / "samples.png", device=device, seed=cfg.seed)
    write_summary(out.summary_path, summary)
    sections = {
        "Protocol": (
            f"{len(test_labels)} generated images per seed (the test split's classes) against "
            f"the {len(test_labels)} test images of {train_cfg.data}, in the feature space of a "
            f"classifier trained on its train split (test accuracy "
            f"{100 * cached.test_accuracy:.1f} %); {len(seeds)} seed(s), mean ± std. Real vs "
            "real: train images in place of the samples."
        ),
        "Figures": results_table(generated, real),
    }
    skipped = skipped_summary(data, out.skipped_path.name)
    if skipped is not None:
        sections["Skipped files"] = skipped
    title = f"contragan evaluate: {train_cfg.loss} on {train_cfg.data}"
    write_report(out, title, sections, summary=summary)
    print(results_table(generated, real))
    return summary
