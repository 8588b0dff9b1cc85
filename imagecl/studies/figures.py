"""The two figures of the studies: a heat map of a 2-D grid and panels of lines.

Drawn on matplotlib ``Figure`` objects with an Agg canvas (never ``pyplot``), as
:mod:`shared.plots` does; NaN cells (a cell that failed or was not run) are left blank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from matplotlib.figure import Figure

from shared.plots import save_figure

__all__ = ["Panel", "heat_map", "line_panels"]


def _save(fig: Figure, path: Path) -> Path:
    return save_figure(fig, path)


def heat_map(
    values: Sequence[Sequence[float]],
    rows: Sequence[str],
    columns: Sequence[str],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    scale: float = 100.0,
) -> Path:
    """``values[r][c] · scale`` as coloured cells with their numbers written in (one decimal).

    Shape:
        values: ``len(rows)`` rows of ``len(columns)`` numbers
    """
    grid = np.asarray(values, dtype=float) * scale  # (R, C)
    if grid.shape != (len(rows), len(columns)):
        raise ValueError(f"values have shape {grid.shape}, labels ({len(rows)}, {len(columns)})")
    fig = Figure(figsize=(1.0 + 0.9 * len(columns), 1.0 + 0.6 * len(rows)))
    ax = fig.add_subplot()
    finite = grid[np.isfinite(grid)]
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    image = ax.imshow(
        np.ma.masked_invalid(grid), cmap="viridis", vmin=low, vmax=max(high, low + 1e-9)
    )
    middle = (low + high) / 2
    for r in range(len(rows)):
        for c in range(len(columns)):
            value = grid[r, c]
            if math.isfinite(value):
                colour = "black" if value > middle else "white"
                ax.text(c, r, f"{value:.1f}", ha="center", va="center", color=colour, fontsize=8)
    ax.set_xticks(range(len(columns)), [str(label) for label in columns], rotation=30)
    ax.set_yticks(range(len(rows)), [str(label) for label in rows])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, path)


class Panel(NamedTuple):
    """One panel of :func:`line_panels`: a line per label, ``(x values, y values)``."""

    title: str
    xlabel: str
    ylabel: str
    lines: Mapping[str, tuple[Sequence[float], Sequence[float]]]
    log_x: bool = False


def line_panels(panels: Sequence[Panel], path: Path, *, scale: float = 100.0) -> Path:
    """Panels side by side, y values times ``scale`` (fractions shown as percent)."""
    if not panels:
        raise ValueError("line_panels needs at least one panel")
    fig = Figure(figsize=(4.2 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels, strict=True):
        for label, (xs, ys) in panel.lines.items():
            x = np.asarray(xs, dtype=float)
            y = np.asarray(ys, dtype=float) * scale
            keep = np.isfinite(x) & np.isfinite(y)
            ax.plot(x[keep], y[keep], marker="o", label=label)
        if panel.log_x:
            ax.set_xscale("log")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        if panel.lines:
            ax.legend(fontsize=7)
    return _save(fig, path)
