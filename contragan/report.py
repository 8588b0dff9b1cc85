"""contragan's plots and report.md: sample grids, loss curves, the metrics table.

``contragan train`` writes a sample grid of the EMA generator (one row per class,
:func:`save_class_grid`), the loss curves (:func:`plot_losses`) and report.md
(:func:`write_train_report`); ``contragan evaluate`` the per-class FD bars
(:func:`plot_intra_fd`), a grid and report.md with every figure next to its real-vs-real value
(:func:`results_table`, :func:`write_evaluation_report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from contragan.arch import GanArch
from contragan.config import Config
from contragan.data import ImageData, skipped_summary
from contragan.evaluate import Evaluation
from contragan.metrics import CasSamples
from shared.plots import plot_loss_curves, save_figure, save_image_grid
from shared.runs import RunDir, write_report
from shared.runtime import eval_mode

__all__ = [
    "FIGURES",
    "class_grid",
    "class_term",
    "comparison_table",
    "curve_keys",
    "plot_grids",
    "plot_intra_fd",
    "plot_losses",
    "results_table",
    "save_class_grid",
    "write_evaluation_report",
    "write_train_report",
]

# the figures of the table, in order, with their direction
FIGURES = {
    "fd": "lower",
    "kid_mean": "lower",
    "precision": "higher",
    "recall": "higher",
    "density": "higher",
    "coverage": "higher",
    "gan_test_acc": "higher",
    "cas_acc": "higher",
    "intra_fd_mean": "lower",
}
# the logged class term of each method, plotted beside the adversarial losses
_CLASS_TERMS = {
    "contra": ["d_2c", "g_2c"],
    "reacgan": ["d_d2dce", "g_d2dce"],
    "ac": ["d_ac", "g_ac"],
    "proj": [],
}


@torch.no_grad()
def class_grid(
    generator: nn.Module,
    classes: list[int],
    per_class: int,
    *,
    z_dim: int,
    device: torch.device,
    seed: int,
) -> Tensor:
    """``per_class`` samples of every class in ``classes``, one row per class, in [0, 1].

    ``z`` comes from its own seeded generator (the global RNG is untouched), so grids of the
    same seed are comparable across training steps. Shape: ``(len(classes)·per_class, C, H, W)``.
    """
    rng = torch.Generator().manual_seed(seed)
    z = torch.randn(len(classes) * per_class, z_dim, generator=rng).to(device)
    y = torch.tensor(classes, device=device).repeat_interleave(per_class)
    with eval_mode(generator):
        images: Tensor = generator(z, y).float()
    return images.add(1).div(2).clamp(0, 1).cpu()


def save_class_grid(
    generator: nn.Module,
    arch: GanArch,
    path: Path,
    *,
    device: torch.device,
    seed: int,
    classes: list[int] | None = None,
    per_class: int = 8,
) -> Tensor:
    """:func:`class_grid` of ``classes`` (default all) saved as a PNG; returns the images."""
    classes = list(range(arch.num_classes)) if classes is None else classes
    images = class_grid(generator, classes, per_class, z_dim=arch.z_dim, device=device, seed=seed)
    save_image_grid(images, path, nrow=per_class)
    return images


def curve_keys(loss: str, adc: bool = False) -> list[str]:
    """The metrics.csv columns of a ``loss`` run (with ``adc``: its ADC terms too) that
    :func:`plot_losses` draws."""
    return [
        "d_loss",
        "g_loss",
        "d_real",
        "d_fake",
        *_CLASS_TERMS[loss],
        *(["d_adc", "g_adc"] if adc else []),
    ]


def plot_losses(run: RunDir, loss: str, adc: bool = False) -> Path:
    """The run's loss curves (:func:`curve_keys`) as ``plots/losses.png``."""
    path = run.plots / "losses.png"
    plot_loss_curves(run.metrics_path, path, keys=curve_keys(loss, adc))
    return path


def class_term(cfg: Config) -> str:
    """The method's class term with the values it trained with, e.g. ``2C (λ 1, τ 1,
    positives: all)``."""
    settings = cfg.loss_settings
    weights = f"λ {settings.lambda_2c:g}, τ {settings.tau:g}"
    if settings.g_lambda_2c is not None:
        weights = f"λ {settings.lambda_2c:g} (G: {settings.g_lambda_2c:g}), τ {settings.tau:g}"
    if cfg.lambda_2c_decay is not None:
        weights += f", both falling linearly to 0 by G step {cfg.lambda_2c_decay + 1}"
    adc = ", ADC: fakes against a fake proxy per class" if settings.adc else ""
    if cfg.proj_adv:
        adc += "; adversarial logit with ProjGAN's ⟨v(y), h⟩"
    if cfg.loss == "contra":
        return f"2C ({weights}, positives: {settings.class_positives}{adc})"
    if cfg.loss == "reacgan":
        return f"D2D-CE ({weights}, m_p {settings.margin_pos:g}{adc})"
    if cfg.loss == "ac":
        sources = "real and fake" if settings.ac_fakes else "real"
        return f"classifier cross-entropy (weight {settings.ac_weight:g}, D on {sources} images)"
    return "the projection inside the adversarial logit"


def write_train_report(
    run: RunDir,
    cfg: Config,
    arch: GanArch,
    data: ImageData,
    steps: int,
    summary: dict[str, Any],
) -> None:
    """``contragan train``'s report.md: the summary, the plots, what ran, the skipped files."""
    sections = {
        "Run": (
            f"{cfg.loss} GAN ({arch.name} networks, {arch.image_size}×{arch.image_size}×"
            f"{arch.channels}, {arch.num_classes} classes) on {cfg.data}: {steps} G steps "
            f"of batch {cfg.batch_size}, {cfg.n_dis} D steps each; class term: "
            f"{class_term(cfg)}; samples from the "
            f"{'EMA ' if cfg.ema else ''}generator, one row per class (`plots/samples.png`). "
            "`contragan evaluate --checkpoint checkpoints/last.pt` measures it."
        )
    }
    skipped = skipped_summary(data, run.skipped_path.name)
    if skipped is not None:
        sections["Skipped files"] = skipped
    write_report(run, f"contragan train: {cfg.loss} on {cfg.data}", sections, summary=summary)


def results_table(
    generated: dict[str, tuple[float, float]], real: dict[str, tuple[float, float]]
) -> str:
    """Markdown: every figure, generated (mean ± std) next to real-vs-real."""
    return comparison_table({"generated": generated}, real)


def comparison_table(
    columns: Mapping[str, Mapping[str, tuple[float, float]]],
    real: Mapping[str, tuple[float, float]],
) -> str:
    """Markdown: every figure (mean ± std) of each named generator, then real-vs-real."""
    names = list(columns)
    lines = [
        "| figure | better | " + " | ".join(names) + " | real vs real |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for key, better in FIGURES.items():
        cells = [f"{columns[n][key][0]:.4g} ± {columns[n][key][1]:.2g}" for n in names]
        r = real[key]
        lines.append(f"| {key} | {better} | " + " | ".join(cells) + f" | {r[0]:.4g} ± {r[1]:.2g} |")
    return "\n".join(lines)


def plot_grids(grids: Mapping[str, Path], path: Path) -> Path:
    """Sample grids (image files) side by side, each under its title, in one figure."""
    from matplotlib.figure import Figure
    from matplotlib.image import imread

    fig = Figure(figsize=(4.2 * len(grids), 4.6))
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, (title, grid) in zip(axes, grids.items(), strict=True):
        ax.imshow(imread(grid))
        ax.set_title(title, fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_intra_fd(
    generated: dict[str, tuple[float, float]], real: dict[str, tuple[float, float]], path: Path
) -> Path:
    """Bars of the Fréchet distance within each class, generated next to real-vs-real."""
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
    return save_figure(fig, path)


def _cas_protocol(cas_samples: CasSamples, num_test: int, num_train: int) -> str:
    """The report's sentence on what the CAS classifier trained on."""
    if cas_samples == "train":
        return (
            f"CAS: a classifier trained on {num_train} generated images per seed (the train "
            f"split's classes; real vs real: the {num_train} train images), tested on the "
            f"{num_test} test images."
        )
    return (
        f"CAS: a classifier trained on the {num_test} generated images of each seed (real vs "
        f"real: the {num_test} train images), tested on the {num_test} test images."
    )


def write_evaluation_report(
    out: RunDir,
    evaluation: Evaluation,
    summary: dict[str, Any],
    *,
    data: ImageData,
    data_name: str,
    loss: str,
    extractor_accuracy: float,
) -> None:
    """``contragan evaluate``'s report.md: the protocol, the table, the skipped files."""
    n, seeds = evaluation.num_images, evaluation.num_seeds
    sections = {
        "Protocol": (
            f"{n} generated images per seed (the test split's classes) against "
            f"the {n} test images of {data_name}, in the feature space of a "
            f"classifier trained on its train split (test accuracy "
            f"{100 * extractor_accuracy:.1f} %); {seeds} seed(s), mean ± std. Real vs "
            "real: train images in place of the samples. "
            + _cas_protocol(evaluation.cas_samples, n, len(data.train))
        ),
        "Figures": results_table(evaluation.generated, evaluation.real),
    }
    skipped = skipped_summary(data, out.skipped_path.name)
    if skipped is not None:
        sections["Skipped files"] = skipped
    title = f"contragan evaluate: {loss} on {data_name}"
    write_report(out, title, sections, summary=summary)
