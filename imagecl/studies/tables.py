"""Tables and one-line readings of a study's results."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from imagecl.studies.runner import CellResult

__all__ = ["NOISE_POINTS", "lookup", "markdown_table", "readable", "spread_note"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats are written as percentages with one decimal."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "–" if math.isnan(value) else f"{100 * value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# Differences below this many accuracy points are not read as a direction: the seed-to-seed
# spread of such short runs is of that order (one seed per cell).
NOISE_POINTS = 2.0


def readable(values: Sequence[float]) -> bool:
    """Whether the finite ``values`` (fractions) spread beyond :data:`NOISE_POINTS`."""
    finite = [v for v in values if math.isfinite(v)]
    return len(finite) >= 2 and 100 * (max(finite) - min(finite)) >= NOISE_POINTS


def spread_note(values: Sequence[float]) -> str:
    """One sentence on the spread of ``values`` (fractions): whether a direction can be read."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return "Too few finished cells to compare."
    spread = 100 * (max(finite) - min(finite))
    if spread < NOISE_POINTS:
        return (
            f"The cells differ by {spread:.1f} points at most, below the {NOISE_POINTS:g}-point "
            "noise of one-seed short runs: no direction can be read from them."
        )
    return f"The cells span {spread:.1f} accuracy points."


def lookup(results: Sequence[CellResult], metric: str, **match: Any) -> float:
    """``metric`` of the one cell with parameters ``match``; NaN when absent or failed."""
    for r in results:
        if all(r.params.get(k) == v for k, v in match.items()):
            return r.metrics.get(metric, math.nan)
    return math.nan
