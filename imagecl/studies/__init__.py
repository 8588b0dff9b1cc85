"""``imagecl study <name>``: the papers' findings as runnable, resumable experiments.

Each study trains small models on a grid and writes ``results.csv``, a heat map or line plot
(``plots/``) and ``report.md`` into its run folder (:mod:`imagecl.studies.runner`). ``--quick``
runs a tiny grid of short runs; the default is the full grid.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from shared.cli import PipelineMain, dispatch

__all__ = ["STUDIES", "main"]

# name -> (module, one-line help); modules are imported only when their study runs
STUDIES: dict[str, tuple[str, str]] = {
    "tau-lambda": ("tau_lambda", "generalized loss: probe accuracy over τ × λ (heat map)"),
    "feature-suppression": (
        "feature_suppression",
        "RandBits × τ and DigitOverlay: easy features suppress the label",
    ),
    "augmentations": ("augmentations", "pairs of augmentations, colour strength (SimCLR)"),
    "head": ("head", "no / linear / MLP head, probe on h against z (SimCLR Fig. 8)"),
    "losses": ("loss_functions", "NT-Xent vs NT-Logistic vs margin triplet, ℓ2 norm on/off"),
    "stability": ("stability", "SupCon vs cross-entropy across batch size, lr and τ"),
    "views": ("views", "InfoMin toy views: which shared factor gets learned"),
}


def _runner(module: str) -> PipelineMain:
    def run(argv: list[str]) -> Any:
        return importlib.import_module(f"imagecl.studies.{module}").main(argv)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    """``imagecl study <name> [options]``; returns the exit status."""
    pipelines = {name: (text, _runner(module)) for name, (module, text) in STUDIES.items()}
    return dispatch("imagecl study", (__doc__ or "").strip().split("\n")[0], pipelines, argv)
