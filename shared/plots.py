"""Figures of a run: loss curves, a t-SNE map of features, a grid of images.

Figures are drawn on matplotlib `Figure` objects with an Agg canvas, never through `pyplot`:
no window ever opens, the user's pyplot backend and figure registry are left alone, and a figure
is freed as soon as the function returns. Every function creates the parent folders of
`out_path` and returns the written `Path`.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image
from torch import Tensor
from torchvision.utils import save_image

from shared.checkpoint import atomic_write

__all__ = ["plot_loss_curves", "plot_tsne", "save_figure", "save_image_grid"]


def _prepare(out_path: str | os.PathLike[str]) -> Path:
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig: Figure, out_path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Render ``fig`` with Agg to ``out_path`` (its folders created) atomically.

    The figure is written to a temporary file beside ``out_path`` and renamed over it, so a full
    disk or a kill keeps the previous figure whole and the error names the file. The format
    follows the suffix (png when there is none).
    """
    path = _prepare(out_path)
    FigureCanvasAgg(fig)  # attaches itself to fig; savefig then renders with Agg
    with atomic_write(path) as handle:
        fig.savefig(handle, format=path.suffix.lstrip(".") or "png", dpi=dpi, bbox_inches="tight")
    return path


def _read_metrics_csv(path: Path) -> dict[str, list[float]]:
    """Columns of a metrics.csv as float lists; empty or non-numeric cells become nan."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{path} has no data rows")
    series: dict[str, list[float]] = {}
    for column in rows[0]:
        values = []
        for row in rows:
            try:
                values.append(float(row[column]))
            except (TypeError, ValueError):
                values.append(math.nan)
        series[column] = values
    return series


def plot_loss_curves(
    metrics: str | os.PathLike[str] | Mapping[str, Sequence[float]],
    out_path: str | os.PathLike[str],
    keys: Sequence[str] | None = None,
    *,
    x_key: str = "step",
    log_y: bool = False,
) -> Path:
    """One panel per series of `keys` against `x_key` (or the row index when it is absent).

    `metrics` is a `metrics.csv` path (one row per logged step; empty cells, as when a metric is
    logged less often, are skipped) or a dict of equally long series. `keys=None` plots every
    series with at least one finite value except `x_key`.
    """
    series = (
        _read_metrics_csv(Path(metrics))
        if isinstance(metrics, str | os.PathLike)
        else {name: [float(v) for v in values] for name, values in metrics.items()}
    )
    if keys is None:
        keys = [k for k, v in series.items() if k != x_key and any(math.isfinite(x) for x in v)]
    missing = [k for k in keys if k not in series]
    if missing or not keys:
        raise ValueError(f"keys {missing or list(keys)} not found among {sorted(series)}")
    lengths = {len(series[k]) for k in keys}
    if len(lengths) != 1:
        raise ValueError(f"series of keys {list(keys)} have different lengths {sorted(lengths)}")
    length = lengths.pop()
    x = np.asarray(series[x_key] if x_key in series else range(length), dtype=float)
    if x.shape != (length,):
        raise ValueError(f"{x_key!r} has {x.shape[0]} values but the series have {length}")

    fig = Figure(figsize=(6.0, 2.2 * len(keys)))
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys, strict=True):
        y = np.asarray(series[key], dtype=float)
        finite = np.isfinite(x) & np.isfinite(y)
        ax.plot(x[finite], y[finite], linewidth=1.2)
        ax.set_ylabel(key)
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(x_key if x_key in series else "row")
    return save_figure(fig, out_path)


def plot_tsne(
    features: Tensor,
    labels: Tensor,
    out_path: str | os.PathLike[str],
    *,
    seed: int,
    max_points: int = 2000,
    perplexity: float | None = None,
    num_threads: int | None = None,
) -> Path:
    """2-D t-SNE (scikit-learn) of at most `max_points` rows, one colour and legend entry per label.

    Rows are subsampled uniformly with a generator seeded by `seed`, which also seeds TSNE.
    `perplexity` None is scikit-learn's 30 (van der Maaten & Hinton 2008), lowered to a third of
    the points for small sets (t-SNE needs fewer neighbours than points); a given value that is
    not below the number of points raises.
    `num_threads` caps the OpenMP threads of the t-SNE gradient (None: scikit-learn's default).
    Set it to 1 when processes share the CPU (DDP ranks, pytest -n): oversubscribed OpenMP
    threads stall at the gradient's barriers.

    Shape:
        - features: (N, D), labels: (N,) int
    """
    # Lazy: scikit-learn (and threadpoolctl, its dependency) are only needed for this plot.
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(
            f"expected features (N, D) and labels (N,), got {tuple(features.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2, got {max_points}")
    N = features.shape[0]
    if N > max_points:
        keep = torch.randperm(N, generator=torch.Generator().manual_seed(seed))[:max_points]
        features, labels = features[keep.to(features.device)], labels[keep.to(labels.device)]
    points = features.detach().to("cpu", torch.float64).numpy()  # (n, D), a copy
    if perplexity is None:
        perplexity = min(30.0, (points.shape[0] - 1) / 3)
    if not 0 < perplexity < points.shape[0]:
        raise ValueError(
            f"perplexity={perplexity} must be < the number of points {points.shape[0]}"
        )
    classes = labels.detach().cpu().numpy()  # (n,)

    tsne = TSNE(
        n_components=2, perplexity=perplexity, init="pca", learning_rate="auto", random_state=seed
    )
    with warnings.catch_warnings(), threadpool_limits(limits=num_threads, user_api="openmp"):
        # Version-dependent notices of scikit-learn (renamed arguments, changed defaults) do not
        # concern the caller; errors still raise.
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"sklearn\.")
        embedded = tsne.fit_transform(points)  # (n, 2)

    fig = Figure(figsize=(6.0, 6.0))
    ax = fig.add_subplot()
    unique = np.unique(classes)
    cmap = matplotlib.colormaps["tab10" if len(unique) <= 10 else "tab20"]
    for i, label in enumerate(unique):
        where = classes == label
        ax.scatter(
            embedded[where, 0], embedded[where, 1], s=6, color=cmap(i % cmap.N), label=str(label)
        )
    ax.legend(markerscale=2, fontsize="small", loc="best", title="label")
    ax.set_xticks([])
    ax.set_yticks([])
    return save_figure(fig, out_path)


def save_image_grid(
    images: Tensor,
    out_path: str | os.PathLike[str],
    nrow: int = 8,
    *,
    normalize: bool = False,
    padding: int = 2,
) -> Path:
    """Save a grid of `nrow` images per row; values in [0, 1] (or min-max scaled if `normalize`).

    The layout is `torchvision.utils.make_grid`'s: `padding` pixels between and around images,
    the last row left-aligned.

    Shape:
        - images: (N, C, H, W), C in {1, 3}
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3) or images.shape[0] == 0:
        raise ValueError(f"expected images (N, C, H, W) with C in {{1, 3}}, got {images.shape}")
    if nrow < 1:
        raise ValueError(f"nrow must be >= 1, got {nrow}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    path = _prepare(out_path)
    pixels = images.detach().to("cpu", torch.float32)  # a copy unless already CPU float32
    if normalize:
        low, high = pixels.min(), pixels.max()
        pixels = (pixels - low) / (high - low).clamp_min(1e-12)  # (N, C, H, W), new tensor
    image_format = Image.registered_extensions().get(path.suffix.lower(), "PNG")
    with atomic_write(path) as handle:  # a full disk keeps the previous grid and names it
        save_image(pixels, handle, nrow=nrow, padding=padding, format=image_format)
    return path
